"""Target-aware cost of search points: compile the Pareto points the user picks for a target (QNN: onnxruntime-qnn,
HTP simulator on x86) and record how the compiled graph came out — accelerator partitions and CPU-fallback nodes.

Why: on the HTP, 16-bit elements are not the whole cost. A promotion whose 8↔16-bit boundaries or 16-bit ops the
backend refuses leaves nodes on the CPU and splits the accelerator graph into several partitions, each boundary a
round trip. Such a point is marked (:attr:`TargetCost.splits`) in the front's ``to_dict()`` and the CLI table.

Each picked point is re-quantized from the cached calibration (the recipe it was measured with) and compiled through
the target's own steps (:func:`qdebug.targets.recompile.recompile`). With ``samples`` > 0 the compiled model also
runs on the target over the first ``samples`` debug samples (QNN: the EPContext model on the HTP simulator) and its
worst output's SQNR vs the float model is recorded next to the CPU QDQ model's on the same samples
(:attr:`TargetCost.target_sqnr_db`, :attr:`TargetCost.cpu_sqnr_db`): the accuracy the point really has on the target,
beside the one the search measured on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.errors import ConfigError, MissingExtraError, QDebugError, TargetError
from qdebug.report import decode_number, encode_number

if TYPE_CHECKING:
    from qdebug.mixed.search import SearchPoint, SearchResult

__all__ = ["TargetCost", "compile_points", "pick_points", "preflight"]


@dataclass(frozen=True)
class TargetCost:
    """A search point compiled for ``target``: how many accelerator partitions and CPU nodes it came out as."""

    target: str
    ok: bool
    partitions: int
    cpu_nodes: int
    #: CPU-fallback nodes by op type (by-design graph-I/O Q/DQ excluded), most first
    fallback_by_op: tuple[tuple[str, int], ...] = ()
    error: str | None = None
    compile_seconds: float = 0.0
    #: the compiled model on the target (QNN: the HTP simulator): its worst output's SQNR vs the float model, over
    #: ``accuracy_samples`` debug samples (``None``: not run, or no target-side check for this target)
    target_sqnr_db: float | None = None
    #: the CPU QDQ model's worst output SQNR vs float on the same samples (the point's own ``output_sqnr_db`` is over
    #: the whole debug set)
    cpu_sqnr_db: float | None = None
    accuracy_samples: int = 0
    #: what the target-side run printed (e.g. "HTP simulator (SM8550)")
    device: str = ""
    #: why the target-side run failed, if it did (the compile itself may still be fine)
    accuracy_error: str | None = None

    @property
    def splits(self) -> bool:
        """The point does not compile to one accelerator partition with nothing on the CPU."""
        return not self.ok or self.partitions != 1 or self.cpu_nodes > 0

    def describe(self) -> str:
        """One short phrase for a table cell."""
        if not self.ok:
            return f"compile failed: {self.error or 'no reason given'}"[:80]
        head = f"{self.partitions} partition{'s' if self.partitions != 1 else ''}, {self.cpu_nodes} CPU nodes"
        if not self.splits:
            return head
        ops = ", ".join(f"{op} {n}" for op, n in self.fallback_by_op[:3])
        return f"SPLIT: {head}" + (f" ({ops})" if ops else "")

    @property
    def target_loss_db(self) -> float | None:
        """How much SQNR vs float the target loses against the CPU QDQ model on the same samples (positive: worse
        on the target)."""
        if self.target_sqnr_db is None or self.cpu_sqnr_db is None:
            return None
        if math.isinf(self.target_sqnr_db) and math.isinf(self.cpu_sqnr_db):
            return 0.0
        return self.cpu_sqnr_db - self.target_sqnr_db

    def describe_accuracy(self) -> str:
        """One short phrase for a table cell: the target's output SQNR next to the CPU's on the same samples."""
        if self.accuracy_error is not None:
            return f"run failed: {self.accuracy_error}"[:80]
        if self.target_sqnr_db is None:
            return "-"
        n = self.accuracy_samples
        return f"{_db(self.target_sqnr_db)} (CPU {_db(self.cpu_sqnr_db)}, {n} sample{'s' if n != 1 else ''})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``splits``)."""
        return {
            "target": self.target,
            "ok": self.ok,
            "partitions": self.partitions,
            "cpu_nodes": self.cpu_nodes,
            "fallback_by_op": [list(x) for x in self.fallback_by_op],
            "error": self.error,
            "compile_seconds": self.compile_seconds,
            "splits": self.splits,
            "target_sqnr_db": encode_number(self.target_sqnr_db),
            "cpu_sqnr_db": encode_number(self.cpu_sqnr_db),
            "accuracy_samples": self.accuracy_samples,
            "device": self.device,
            "accuracy_error": self.accuracy_error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetCost:
        """Inverse of :meth:`to_dict` (a search result of schema 1 has no target-side accuracy: ``None``)."""
        return cls(
            target=d["target"], ok=d["ok"], partitions=d["partitions"], cpu_nodes=d["cpu_nodes"],
            fallback_by_op=tuple((str(op), int(n)) for op, n in d.get("fallback_by_op", ())),
            error=d.get("error"), compile_seconds=d.get("compile_seconds", 0.0),
            target_sqnr_db=decode_number(d.get("target_sqnr_db")), cpu_sqnr_db=decode_number(d.get("cpu_sqnr_db")),
            accuracy_samples=int(d.get("accuracy_samples", 0)), device=str(d.get("device", "")),
            accuracy_error=d.get("accuracy_error"),
        )  # fmt: skip

    @classmethod
    def from_report(cls, report: Any, accuracy: Any = None, accuracy_error: str | None = None) -> TargetCost:
        """From a :class:`~qdebug.targets.base.CompileReport` and, if the compiled model ran on the target, its
        :class:`~qdebug.report.TargetAccuracy` (the worst output of each side)."""
        by_op = sorted(report.fallback_by_op().items(), key=lambda x: (-x[1], x[0]))
        tgt = cpu = None
        n, device = 0, ""
        if accuracy is not None and accuracy.outputs:
            tgt = _worst(o.target_vs_float_db for o in accuracy.outputs)
            cpu = _worst(o.cpu_vs_float_db for o in accuracy.outputs)
            n, device = accuracy.num_samples, accuracy.device
        return cls(
            target=report.target, ok=report.ok, partitions=report.accelerator_partitions, cpu_nodes=report.cpu_nodes,
            fallback_by_op=tuple(by_op), error=report.error, compile_seconds=round(report.compile_seconds, 3),
            target_sqnr_db=tgt, cpu_sqnr_db=cpu, accuracy_samples=n, device=device, accuracy_error=accuracy_error,
        )  # fmt: skip


def _worst(values: Iterable[float | None]) -> float | None:
    """The lowest SQNR of the outputs that have one."""
    vs = [v for v in values if v is not None]
    return min(vs) if vs else None


def _db(v: float | None) -> str:
    if v is None:
        return "n/a"
    return "identical" if math.isinf(v) and v > 0 else f"{v:.2f} dB"


@dataclass(frozen=True)
class _Job:
    qdq: Path
    out: Path
    target: str
    options: Any


def _compile_one(job: _Job, float_model: Path | None, data: Any) -> TargetCost:
    """One point compiled (and, given ``float_model``, run on the target). What fails is recorded on the point, not
    raised: a search's measurements are not lost to one point the target refuses (e.g. dynamic input shapes for
    QNN). A missing backend still raises — no point could compile."""
    from qdebug.targets.recompile import recompile

    try:
        r = recompile(job.qdq, job.out, job.target, options=job.options, float_model=float_model, data=data)
        return TargetCost.from_report(r.compile, r.target_accuracy)
    except MissingExtraError:
        raise
    except QDebugError as exc:
        why = f"{type(exc).__name__}: {exc}"
    if float_model is not None:  # did the compile go through and only the run on the target fail?
        try:
            r = recompile(job.qdq, job.out, job.target, options=job.options)
            return TargetCost.from_report(r.compile, None, why)
        except MissingExtraError:
            raise
        except QDebugError as exc:
            why = f"{type(exc).__name__}: {exc}"
    return TargetCost(job.target, False, 0, 0, error=why)


def pick_points(result: SearchResult, spec: str) -> tuple[SearchPoint, ...]:
    """The points ``spec`` names: ``chosen``, ``front`` (every Pareto point) or comma-separated indices into the
    Pareto front as printed (0 = cheapest)."""
    front = result.pareto()
    spec = spec.strip()
    if spec == "chosen":
        return (result.final,)
    if spec == "front":
        return front
    try:
        idx = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--compile-points takes 'chosen', 'front' or front indices like 0,2; got {spec!r}") from None
    bad = [i for i in idx if not 0 <= i < len(front)]
    if not idx or bad:
        raise ConfigError(f"--compile-points: the Pareto front has points 0–{len(front) - 1}; got {spec!r}")
    return tuple(front[i] for i in dict.fromkeys(idx))


def _config(session: Any, result: SearchResult, p: SearchPoint) -> Any:
    """The recipe the point was measured with."""
    base = session.base.config
    if p.label == "all16":
        return base.replace(activation_type=result.goal.to, tensor_overrides=())
    if not p.promoted:
        return base
    return session.promote(p.promoted, result.goal.to).config


def compile_points(
    session: Any,
    result: SearchResult,
    points: Sequence[SearchPoint],
    target: str,
    options: Any = None,
    *,
    samples: int = 0,
) -> SearchResult:
    """``result`` with each of ``points`` compiled for ``target`` (its :class:`TargetCost` set on the point, in the
    curve and the evaluated points alike). ``session`` is the search's
    :class:`~qdebug.mixed.session.MixedPrecisionSession` (its calibration is reused to rebuild each point's model).

    ``samples`` > 0: each compiled model also runs on the target over the first ``samples`` debug samples (the
    target's own check, per-tensor probe off: only the outputs are compared); its worst output SQNR vs float goes
    into the point's :class:`TargetCost` beside the CPU QDQ model's on the same samples. A run that fails is noted
    on the point (``accuracy_error``), not raised: the compile result still stands; a compile that fails (or that the
    target refuses, e.g. QNN and dynamic input shapes) is a point with ``ok`` False and the reason, not an error that
    throws the search's measurements away."""
    from qdebug.targets.recompile import build_options

    if samples < 0:
        raise ConfigError(f"the number of samples to run on the target must be >= 0, got {samples}")
    opts = build_options(target, options, probe_tensors=False) if samples else options
    data = session.target_data(samples) if samples else None
    costs: dict[int, TargetCost] = {}
    for i, p in enumerate(points):
        q = session.requantize(_config(session, result, p), name=f"compile_point{i}")
        job = _Job(Path(q.model_path), session.workdir / f"compile_point{i}.{target}", target, opts)
        costs[id(p)] = _compile_one(job, session.float_path if samples else None, data)

    def mark(ps: tuple[SearchPoint, ...]) -> tuple[SearchPoint, ...]:
        return tuple(replace(p, target_cost=costs[id(p)]) if id(p) in costs else p for p in ps)

    return replace(result, steps=mark(result.steps), evaluated=mark(result.evaluated))


def preflight(session: Any, target: str, options: Any = None) -> tuple[TargetCost, tuple[str, ...]]:
    """Compile the base quantization for ``target`` before a search whose points will be compiled: a model the
    target cannot take at all (e.g. QNN and dynamic input shapes: the corpus' ppocr-cls) is said in one line before
    the search's minutes of measuring, not after. Raises :class:`~qdebug.errors.TargetError` when it does not
    compile; returns its cost (a split base is fine: the search shows what promotions change) and notes: the
    target's compatibility fixes that would change the model (what ``qdebug build`` applies before quantizing), when
    the session searches the model as given (``target_fixes=False``, ``--no-target-fixes``); on ppocr-cls the
    unfixed model's standalone BatchNormalization nodes made the HTP lose 2.5 dB at 8 bits and 22 dB at 16 against
    the CPU, while the fixed model's HTP and CPU agree."""
    q = session.requantize(session.base.config, name="compile_preflight")
    job = _Job(Path(q.model_path), session.workdir / f"compile_preflight.{target}", target, options)
    cost = _compile_one(job, None, None)
    if not cost.ok:
        raise TargetError(
            f"{target} cannot compile this model's base quantization, so no search point would compile: "
            f"{cost.error}; fix the model first (`qdebug build --target {target}` lists the target's fixes; `search` "
            "applies them unless --no-target-fixes)"
        )
    if getattr(session, "target_fixes", None) is not None:  # the session searches the fixed model already
        return cost, ()
    return cost, _fix_notes(session, target, options)


def _fix_notes(session: Any, target: str, options: Any) -> tuple[str, ...]:
    """What the target's own fixes would change in the float model, as one note (none: they change nothing)."""
    from qdebug.targets.base import ShapeSource, get_target
    from qdebug.targets.recompile import build_options

    o = session.debug_options
    shapes = ShapeSource(o.input_shapes, session.debug_data)
    try:
        prepared = get_target(target).prepare(session.float_proto, session.base_config,
                                              build_options(target, options), shapes)  # fmt: skip
    except QDebugError as exc:  # the note is advice: a fix that cannot run here is not the search's failure
        return (f"could not check {target}'s compatibility fixes on this model: {exc}",)
    changed = [f for f in prepared.fixes if f.changed]
    if not changed:
        return ()
    what = "; ".join(f"{f.name}: {f.detail}" for f in changed)
    return (
        f"{target}'s compatibility fixes would change this model ({what}). The search measures the model as given "
        f"and compiles it as given (--no-target-fixes); `qdebug build --target {target}` applies them before "
        "quantizing, so search without --no-target-fixes to measure what that build will run",
    )
