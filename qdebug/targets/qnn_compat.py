"""QNN compatibility as a loop (:func:`compat_loop`): ask QNN which nodes it rejects and why, apply the catalogue's
rewrite that answers each rejection (:data:`qdebug.targets.qnn_rewrites.CATALOGUE`), check it on ORT's CPU, and
ask again, until QNN takes every node, nothing in the catalogue answers, or the round limit is reached.

QNN is asked by a *probe* (:func:`qnn_probe`): the float model quantized with ORT's QNN recipe on a few synthetic
samples (op support does not depend on calibration quality) and compiled by
:func:`~qdebug.targets.qnn_compile.compile_qnn`, whose report lists each refused node unit with QNN's reason. A
model with no node any catalogue rewrite could touch is not probed: no answer could change it.

Each rewrite is checked against the model before it on ORT's CPU with synthetic inputs (:func:`check_rewrite`): a
rewrite that promised bit-identical outputs must give them, one that reorders sums must stay within float rounding;
one that fails is rolled back and recorded as such. The record (:class:`CompatReport`) lists, per round, what QNN
rejected and why and which rewrites ran; it becomes the ``qnn_compat`` fix of the build manifest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.io import temp_dir
from qdebug.model_io import input_specs
from qdebug.passes import PassReport
from qdebug.targets.compile_report import CompileReport, FallbackNode
from qdebug.targets.qnn_compile import COMPILE_FAILED, compile_qnn
from qdebug.targets.qnn_options import V73_SOC, QnnOptions
from qdebug.targets.qnn_rewrites import CATALOGUE, Exactness, Rewrite

__all__ = [
    "COMPAT_FIX",
    "MAX_ROUNDS",
    "AppliedRewrite",
    "CompatReport",
    "CompatRound",
    "StopReason",
    "check_rewrite",
    "compat_loop",
    "data_feeds",
    "qnn_probe",
    "run_compat_loop",
    "synthetic_feeds",
]

#: The fix name of the loop in a QNN build's manifest (``--skip-fix qnn_compat`` turns it off).
COMPAT_FIX = "qnn_compat"
#: Rewrite rounds before the loop stops; one more probe then says what QNN still rejects.
MAX_ROUNDS = 3
#: A rewrite that reorders sums may differ from the model before it by this much, relative to the output's scale.
ROUNDING_RTOL = 1e-4
SCHEMA_VERSION = 1

Probe = Callable[[onnx.ModelProto, int], CompileReport]


class StopReason(StrEnum):
    """Why the loop ended."""

    CLEAN = "QNN takes every node"
    NO_CANDIDATE = "no node any catalogue rewrite could change: QNN not asked"
    NO_MATCH = "no catalogue rewrite answers what QNN rejects"
    NOTHING_APPLIED = "every matching rewrite was refused or failed its check"
    ROUNDS = "round limit reached"
    PROBE_FAILED = "the probe could not quantize or compile the model (the build goes on without the loop's answer)"
    SKIPPED = "skipped on request"


@dataclass(frozen=True)
class AppliedRewrite:
    """One catalogue rewrite tried in a round: the nodes it rewrote or refused, its check, whether it was kept."""

    name: str
    nodes: tuple[str, ...]
    refused: tuple[str, ...]
    check: str  # an Exactness value, or why it failed
    max_abs_diff: float | None
    kept: bool

    def describe(self) -> str:
        """One line for the manifest."""
        if not self.nodes:
            return f"{self.name} refused: {'; '.join(self.refused)}"
        what = f"{self.name} rewrote {len(self.nodes)} ({_listing(self.nodes)})"
        diff = "" if self.max_abs_diff is None else f", max |diff| {self.max_abs_diff:.3g}"
        state = f"kept, {self.check} on ORT CPU{diff}" if self.kept else f"rolled back: {self.check}"
        refused = f"; refused {'; '.join(self.refused)}" if self.refused else ""
        return f"{what}: {state}{refused}"


@dataclass(frozen=True)
class CompatRound:
    """One probe of QNN and what the loop did about its answer."""

    index: int
    compiled: bool
    partitions: int
    cpu_nodes: int
    rejected: tuple[FallbackNode, ...]
    rewrites: tuple[AppliedRewrite, ...] = ()

    def describe(self) -> list[str]:
        """Lines for the manifest: what QNN rejected, then each rewrite."""
        head = f"round {self.index}: QNN {self.partitions} partition(s), {self.cpu_nodes} CPU node(s)"
        if not self.compiled:
            head += " (the probe compile failed)"
        rejected = [f"  QNN rejects {line}" for line in _grouped(self.rejected)]
        return [head, *rejected, *(f"  {r.describe()}" for r in self.rewrites)]


@dataclass(frozen=True)
class CompatReport:
    """The loop's record: its rounds, why it stopped, and its round limit."""

    rounds: tuple[CompatRound, ...]
    stop: StopReason
    max_rounds: int = MAX_ROUNDS
    nodes_before: int | None = None
    nodes_after: int | None = None
    seconds: float | None = None  # the whole loop: probes, rewrites and checks
    error: str | None = None  # why the probe failed (PROBE_FAILED)

    @property
    def applied(self) -> tuple[str, ...]:
        """The rewrites kept, in order (a name once per round it ran in)."""
        return tuple(r.name for rnd in self.rounds for r in rnd.rewrites if r.kept)

    @property
    def still_rejected(self) -> tuple[FallbackNode, ...]:
        """What QNN rejected at the last probe."""
        return self.rounds[-1].rejected if self.rounds else ()

    def pass_report(self) -> PassReport:
        """The loop as the ``qnn_compat`` fix of a build (``details``: one line per round and rewrite)."""
        applied = list(dict.fromkeys(self.applied))
        detail = f"{', '.join(applied) if applied else 'no rewrite'} ({len(self.rounds)} probe(s)); {self.stop.value}"
        still = _grouped(self.still_rejected) if self.stop is not StopReason.CLEAN else []
        warnings = tuple(f"QNN still rejects {line}" for line in still)
        if self.error:
            warnings += (f"the QNN probe failed in round {len(self.rounds) + 1}: {self.error}",)
        return PassReport(
            COMPAT_FIX,
            changed=bool(applied),
            detail=detail,
            rewrites=len(self.applied),
            details=tuple(line for rnd in self.rounds for line in rnd.describe()),
            warnings=warnings,
            nodes_before=self.nodes_before,
            nodes_after=self.nodes_after,
            seconds=self.seconds,
            skipped=self.stop is StopReason.SKIPPED,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {"schema_version": SCHEMA_VERSION, **asdict(self), "stop": self.stop.name}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompatReport:
        """Inverse of :meth:`to_dict`."""
        rounds = tuple(
            CompatRound(
                index=int(r["index"]),
                compiled=bool(r["compiled"]),
                partitions=int(r["partitions"]),
                cpu_nodes=int(r["cpu_nodes"]),
                rejected=tuple(FallbackNode.from_dict(f) for f in r["rejected"]),
                rewrites=tuple(
                    AppliedRewrite(**{**w, "nodes": tuple(w["nodes"]), "refused": tuple(w["refused"])})
                    for w in r["rewrites"]
                ),
            )
            for r in d["rounds"]
        )
        return cls(
            rounds,
            StopReason[d["stop"]],
            int(d.get("max_rounds", MAX_ROUNDS)),
            d.get("nodes_before"),
            d.get("nodes_after"),
            d.get("seconds"),
            d.get("error"),
        )


def _listing(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _grouped(rejected: Sequence[FallbackNode]) -> list[str]:
    """Rejections of the same op for the same reason as one line: units (QNN's node groups, e.g. DQ → op → Q),
    nodes in them, the reason."""
    out: dict[tuple[str, str], list[int]] = {}
    for f in rejected:
        counts = out.setdefault((f.op_type, f.reason), [0, 0])
        counts[0] += 1
        counts[1] += f.nodes
    return [f"{op} ({units} unit(s), {nodes} node(s)): {reason}" for (op, reason), (units, nodes) in out.items()]


# ------------------------------------------------------------------------------------------------ the check
def synthetic_feeds(model: onnx.ModelProto, n: int = 2, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` seeded synthetic samples for the model's (static) inputs."""
    from qdebug.data import open_data

    source = open_data(None, input_specs(model), num_samples=n, seed=seed)
    return [dict(s) for s in source]


def _compare(x: np.ndarray, y: np.ndarray) -> float | None:
    """Max |x - y| when the outputs agree up to float rounding (0.0: bit-identical); ``None`` when they do not."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return None
    if np.array_equal(x, y, equal_nan=np.issubdtype(x.dtype, np.floating)):
        return 0.0
    if not np.issubdtype(x.dtype, np.floating):
        return None
    finite = np.isfinite(x)
    if not np.array_equal(finite, np.isfinite(y)):
        return None
    diff = float(np.max(np.abs(x[finite].astype(np.float64) - y[finite]), initial=0.0))
    scale = max(1.0, float(np.max(np.abs(x[finite]), initial=0.0)))
    return diff if diff <= ROUNDING_RTOL * scale else None


def _cpu_session(model: onnx.ModelProto) -> Any:
    """An ORT CPU session with graph optimizations and weight pre-packing off: a constant weight is otherwise
    pre-packed into another summation order than a weight fed as an input, which would hide what the graph
    computes behind how ORT's kernels run it."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    so.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def check_rewrite(
    before: onnx.ModelProto, after: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], promised: Exactness
) -> tuple[str, float | None, bool]:
    """Run both models on ORT's CPU (optimizations off) on ``feeds``: (the exactness measured or why the check
    failed, the max absolute difference, passed). A rewrite that promised bit-identical outputs must give them."""
    names = [o.name for o in before.graph.output]
    try:
        sb, sa = _cpu_session(before), _cpu_session(after)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        from qdebug.ort import ort_message

        return f"ORT cannot run it ({ort_message(exc)})", None, False
    worst = 0.0
    for feed in feeds:
        try:
            pairs = list(zip(names, sb.run(names, dict(feed)), sa.run(names, dict(feed)), strict=True))
        except Exception as exc:  # ORT's run errors share no base class
            from qdebug.ort import ort_message

            return f"ORT cannot run it ({ort_message(exc)})", None, False
        for name, x, y in pairs:
            d = _compare(np.asarray(x), np.asarray(y))
            if d is None:
                return f"output {name!r} differs beyond float rounding", None, False
            worst = max(worst, d)
    if worst == 0.0:
        return Exactness.BIT_IDENTICAL.value, 0.0, True
    if promised is Exactness.BIT_IDENTICAL:
        return f"promised bit-identical, differs by {worst:.3g}", worst, False
    return Exactness.FLOAT_ROUNDING.value, worst, True


# ------------------------------------------------------------------------------------------------ the loop
def _round_rewrites(
    model: onnx.ModelProto,
    rejected: Sequence[FallbackNode],
    feeds: Sequence[Mapping[str, np.ndarray]],
    catalogue: Sequence[Rewrite],
) -> tuple[onnx.ModelProto, list[AppliedRewrite]]:
    """Each catalogue rewrite that answers one of the rejections, applied to the nodes QNN named and checked."""
    applied: list[AppliedRewrite] = []
    for rw in catalogue:
        hits = [f for f in rejected if rw.answers(f, model)]
        if not hits:
            continue
        result = rw.apply(model, [n for f in hits for n in f.node_names])
        if result.model is None:
            applied.append(
                AppliedRewrite(rw.name, (), result.refused or ("nothing to rewrite",), "refused", None, False)
            )
            continue
        check, diff, ok = check_rewrite(model, result.model, feeds, rw.exactness)
        applied.append(AppliedRewrite(rw.name, result.rewritten, result.refused, check, diff, ok))
        if ok:
            model = result.model
    return model, applied


def compat_loop(
    model: onnx.ModelProto,
    probe: Probe,
    *,
    max_rounds: int = MAX_ROUNDS,
    catalogue: Sequence[Rewrite] = CATALOGUE,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> tuple[onnx.ModelProto, CompatReport]:
    """Probe QNN (``probe(model, round)``), rewrite what the catalogue answers, repeat: at most ``max_rounds``
    rounds of rewrites, then one probe more to record what QNN still rejects. ``model`` is never modified; the
    checks run on ``feeds`` (default: two synthetic samples)."""
    if not any(rw.present(model) for rw in catalogue):
        return model, CompatReport((), StopReason.NO_CANDIDATE, max_rounds)
    feeds = synthetic_feeds(model) if feeds is None else feeds
    rounds: list[CompatRound] = []
    stop = StopReason.ROUNDS
    error = None
    for index in range(1, max_rounds + 2):
        try:
            report = probe(model, index)
        except Exception as exc:  # a model ORT's quantizer or QNN cannot take: the build itself will say why
            stop, error = StopReason.PROBE_FAILED, (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:400]
            break
        rejected = tuple(f for f in report.fallback if not f.by_design)
        rnd = CompatRound(index, report.ok, report.accelerator_partitions, report.cpu_nodes, rejected)
        if not rejected:
            rounds.append(rnd)
            stop = StopReason.CLEAN
            break
        if index > max_rounds:
            rounds.append(rnd)
            break
        model, applied = _round_rewrites(model, rejected, feeds, catalogue)
        rounds.append(replace(rnd, rewrites=tuple(applied)))
        if not any(a.kept for a in applied):
            stop = StopReason.NOTHING_APPLIED if applied else StopReason.NO_MATCH
            break
    return model, CompatReport(tuple(rounds), stop, max_rounds, error=error)


# ------------------------------------------------------------------------------------------------ the probe
def _reader(feeds: Sequence[Mapping[str, np.ndarray]]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it = iter([dict(f) for f in feeds])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    return Reader()


def qnn_probe(
    options: QnnOptions,
    ort_config: Callable[[Path, Any], Any] | None,
    work: Path,
    feeds: Callable[[onnx.ModelProto], Sequence[Mapping[str, np.ndarray]]] = synthetic_feeds,
) -> Probe:
    """A probe that quantizes the float model with ``ort_config`` (a path and a calibration reader → ORT's
    ``StaticQuantConfig``; ``None``: compile it in fp16) and compiles it in ``work``; with no SoC named and a
    compile that fails, it asks the oldest SoC with float and 16-bit support, as the QNN target's compile does."""

    def probe(model: onnx.ModelProto, index: int) -> CompileReport:
        fpath = work / f"round{index}.float.onnx"
        onnx.save(model, str(fpath))
        path = fpath
        if ort_config is not None:
            from onnxruntime.quantization import quantize as ort_quantize

            path = work / f"round{index}.qdq.onnx"
            ort_quantize(str(fpath), str(path), ort_config(fpath, _reader(feeds(model))))
        report = compile_qnn(path, work, replace(options, fail_on_fallback=False), name=f"round{index}")
        if options.soc is None and not report.ok and (report.error or "").startswith(COMPILE_FAILED):
            report = compile_qnn(path, work / "v73", replace(options, soc=V73_SOC, fail_on_fallback=False), name="r")
        return report

    return probe


def data_feeds(model: onnx.ModelProto, data: Any, label_key: str = "label", n: int = 2) -> list[dict[str, np.ndarray]]:
    """The first ``n`` samples of the build's data (a path, mapping or data source) when they fit the model's
    static inputs; otherwise (no data, other shapes) ``n`` synthetic ones."""
    if data is None:
        return synthetic_feeds(model, n)
    from qdebug.data import open_data
    from qdebug.errors import DataError

    specs = input_specs(model)
    try:
        feeds = [dict(s) for s in open_data(data, specs, num_samples=n, ignore=(label_key,))]
    except DataError:  # the build's quantize step reads the same data and says what is wrong with it
        return synthetic_feeds(model, n)
    fits = all(tuple(f[s.name].shape) == tuple(s.shape) for f in feeds for s in specs if s.name in f)
    return feeds if feeds and fits else synthetic_feeds(model, n)


def run_compat_loop(
    model: onnx.ModelProto,
    options: QnnOptions,
    ort_config: Callable[[Path, Any], Any] | None,
    data: Any = None,
    label_key: str = "label",
) -> tuple[onnx.ModelProto, CompatReport]:
    """:func:`compat_loop` with :func:`qnn_probe` in a temporary folder (removed after); the first samples of
    ``data`` (:func:`data_feeds`; synthetic ones without it) calibrate the probes and feed the checks."""
    t0 = time.perf_counter()
    needed = any(rw.present(model) for rw in CATALOGUE)
    samples = data_feeds(model, data, label_key) if needed else []
    with temp_dir(prefix="qdebug-qnn-compat-") as tmp:
        out, report = compat_loop(model, qnn_probe(options, ort_config, Path(tmp), lambda m: samples), feeds=samples)
    seconds = round(time.perf_counter() - t0, 4)
    return out, replace(report, nodes_before=len(model.graph.node), nodes_after=len(out.graph.node), seconds=seconds)
