"""After a QNN build: locate the HTP's divergence in the real graph and try the standard remedies on it.

``qdebug build --target qnn`` registers :class:`DiagnosingQnnTarget` (the QNN target plus
:meth:`~qdebug.targets.base.Target.diagnose`), which runs after the simulator check:

1. **Where** — the probe (every quantized tensor exposed as an output) can change the HTP graph (on the corpus
   detector at uint16 it named a tensor one step late, docs/qnn.md). When it did (``--bisect auto``, the default)
   or always (``--bisect always``), the first divergent tensor is located by bisection over prefix compiles
   (:func:`qdebug.targets.qnn_bisect.bisect_divergence`, ≤ ``⌈log2 N⌉ + 1`` compiles), else the probe's verdict
   is taken. The *region* is the float model's nodes computing that tensor from the nearest compared tensors.
2. **What to do** — for a located region, each standard remedy is quantized/compiled and measured on the HTP
   simulator (worst model output, HTP vs float, on the build's debug samples): the region's activations in 16 bits
   (the mixed-precision overrides, through the build's :class:`~qdebug.targets.base.Requantizer`), per-channel
   weights, the same QDQ model on other SoCs (HTP architectures), and the region in fp16 (its Q/DQ removed, the
   HTP's fp16 precision on). The best one that gains at least :data:`MIN_GAIN_DB` and compiles to one partition is
   chosen and written next to the build (``<stem>.remedy.*``: its QDQ model, compiled model and, when the remedy
   is a quantization one, its overrides JSON).

Everything lands in the manifest under :data:`MANIFEST_KEY` as a :class:`QnnDiagnosis`.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.errors import ConfigError, QDebugError
from qdebug.graph_index import constant_values, decode_constant
from qdebug.io import temp_dir
from qdebug.model_io import is_dq, is_q, load_model
from qdebug.qdq_values import dequantize
from qdebug.report import TargetAccuracy, decode_number, encode_number
from qdebug.targets.base import BisectMode, Compiled, CompileJob, Diagnosis, register_target
from qdebug.targets.divergence import EXCESS_NOISE_THRESHOLD, sqnr_drop_db, upstream_compared
from qdebug.targets.qnn import QnnTarget, compiled_options
from qdebug.targets.qnn_accuracy import htp_accuracy
from qdebug.targets.qnn_bisect import PrefixBisection, bisect_divergence, candidate_tensors
from qdebug.targets.qnn_compile import compile_qnn, has_16bit_weights
from qdebug.targets.qnn_options import DEFAULT_HTP_ARCH, SOC_MODELS, V73_SOC, QnnOptions

__all__ = [
    "MANIFEST_KEY",
    "MIN_GAIN_DB",
    "DiagnosingQnnTarget",
    "LocatedBy",
    "QnnDiagnosis",
    "Remedies",
    "RemedyKind",
    "RemedyTrial",
    "diagnose_build",
    "float_region",
]

MANIFEST_KEY = "qnn_divergence"
DIAGNOSIS_SCHEMA_VERSION = 1
#: A remedy is chosen only when its worst output gains at least this much (HTP vs float, dB).
MIN_GAIN_DB = 1.0
#: The output loss (CPU-QDQ vs float minus HTP vs float, dB) at which ``--bisect auto`` searches without a probe
#: verdict: the excess-noise threshold's 3 dB (ratio 1), applied at the output.
OUTPUT_LOSS_DB = sqnr_drop_db(EXCESS_NOISE_THRESHOLD)


class LocatedBy(StrEnum):
    """Which measurement named the first divergent tensor."""

    BISECTION = "bisection"
    PROBE = "probe"
    NONE = "none"


class RemedyKind(StrEnum):
    """The standard remedies tried on a located region."""

    REGION_16BIT = "region_16bit"
    PER_CHANNEL = "per_channel"
    SOC = "soc"
    FP16_REGION = "fp16_region"


def _db(v: Any) -> float | None:
    return decode_number(v)


@dataclass(frozen=True)
class RemedyTrial:
    """One remedy compiled and run on the HTP simulator (``ok`` False: it could not be built; ``detail`` says why)."""

    kind: RemedyKind
    label: str
    ok: bool
    partitions: int = 0
    cpu_nodes: int = 0
    target_vs_float_db: float | None = None  # worst model output
    gain_db: float | None = None  # vs the build's compiled model
    seconds: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "kind": self.kind.value,
            "label": self.label,
            "ok": self.ok,
            "partitions": self.partitions,
            "cpu_nodes": self.cpu_nodes,
            "target_vs_float_db": encode_number(self.target_vs_float_db),
            "gain_db": encode_number(self.gain_db),
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RemedyTrial:
        """Inverse of :meth:`to_dict`."""
        return cls(
            RemedyKind(d["kind"]),
            d["label"],
            bool(d["ok"]),
            int(d.get("partitions", 0)),
            int(d.get("cpu_nodes", 0)),
            _db(d.get("target_vs_float_db")),
            _db(d.get("gain_db")),
            float(d.get("seconds", 0.0)),
            d.get("detail", ""),
        )


@dataclass(frozen=True)
class Remedies:
    """Every remedy tried on the region, the one chosen (index into ``trials``) and the files written for it."""

    baseline_db: float | None  # the build's compiled model, worst output, HTP vs float
    cpu_vs_float_db: float | None  # the CPU-QDQ model at the same output
    trials: tuple[RemedyTrial, ...]
    skipped: tuple[tuple[RemedyKind, str], ...] = ()
    chosen: int | None = None
    files: Mapping[str, str] = field(default_factory=dict)  # role → file name in the build folder

    @property
    def best(self) -> RemedyTrial | None:
        """The chosen trial, ``None`` when no remedy gained :data:`MIN_GAIN_DB` in one partition."""
        return None if self.chosen is None else self.trials[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "baseline_db": encode_number(self.baseline_db),
            "cpu_vs_float_db": encode_number(self.cpu_vs_float_db),
            "min_gain_db": MIN_GAIN_DB,
            "trials": [t.to_dict() for t in self.trials],
            "skipped": [{"kind": k.value, "why": why} for k, why in self.skipped],
            "chosen": self.chosen,
            "files": dict(self.files),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Remedies:
        """Inverse of :meth:`to_dict`."""
        return cls(
            _db(d.get("baseline_db")),
            _db(d.get("cpu_vs_float_db")),
            tuple(RemedyTrial.from_dict(t) for t in d.get("trials", ())),
            tuple((RemedyKind(s["kind"]), s["why"]) for s in d.get("skipped", ())),
            d.get("chosen"),
            dict(d.get("files", {})),
        )


@dataclass(frozen=True)
class QnnDiagnosis:
    """Where the HTP diverges in the real graph, how it was found, and what the remedies measured."""

    located_by: LocatedBy
    first_divergent: str | None
    region_nodes: tuple[tuple[str, str], ...]  # (op type, node name) of the float model, graph order
    region_tensors: tuple[str, ...]  # the region's activations (what a 16-bit promotion covers)
    bisect_reason: str  # why bisection ran or did not
    bisection: PrefixBisection | None = None
    probe_first_divergent: str | None = None
    remedies: Remedies | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": DIAGNOSIS_SCHEMA_VERSION,
            "located_by": self.located_by.value,
            "first_divergent": self.first_divergent,
            "region_nodes": [{"op_type": op, "node": n} for op, n in self.region_nodes],
            "region_tensors": list(self.region_tensors),
            "bisect_reason": self.bisect_reason,
            "bisection": None if self.bisection is None else self.bisection.to_dict(),
            "probe_first_divergent": self.probe_first_divergent,
            "remedies": None if self.remedies is None else self.remedies.to_dict(),
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QnnDiagnosis:
        """Inverse of :meth:`to_dict`; refuses other schema versions."""
        if d.get("schema_version") != DIAGNOSIS_SCHEMA_VERSION:
            raise QDebugError(f"qnn_divergence schema_version {d.get('schema_version')!r} is not supported")
        return cls(
            LocatedBy(d["located_by"]),
            d.get("first_divergent"),
            tuple((n["op_type"], n["node"]) for n in d.get("region_nodes", ())),
            tuple(d.get("region_tensors", ())),
            d.get("bisect_reason", ""),
            None if d.get("bisection") is None else PrefixBisection.from_dict(d["bisection"]),
            d.get("probe_first_divergent"),
            None if d.get("remedies") is None else Remedies.from_dict(d["remedies"]),
            float(d.get("seconds", 0.0)),
        )

    def describe(self) -> list[str]:
        """What ``qdebug build`` prints about it."""
        return _describe(self)


# --------------------------------------------------------------------------- where


def _worst(acc: TargetAccuracy) -> tuple[float | None, float | None]:
    """(HTP vs float, CPU-QDQ vs float) at the output where the HTP is furthest from float."""
    rows = [o for o in acc.outputs if o.target_vs_float_db is not None]
    if not rows:
        return None, None
    o = min(rows, key=lambda r: r.target_vs_float_db if r.target_vs_float_db is not None else math.inf)
    return o.target_vs_float_db, o.cpu_vs_float_db


def bisect_reason(mode: BisectMode, acc: TargetAccuracy) -> str | None:
    """Why to bisect (``None``: do not). ``auto`` bisects when there is something to locate — a flagged tensor or
    an output losing ≥ 3 dB on the HTP — and the probe's verdict cannot be trusted (it changed the compiled graph's
    numbers or partitioning, or did not run)."""
    if mode is BisectMode.NEVER:
        return None
    if mode is BisectMode.ALWAYS:
        return "asked for (--bisect always)"
    htp, cpu = _worst(acc)
    loss = None if htp is None or cpu is None else cpu - htp
    if not acc.flagged and (loss is None or loss < OUTPUT_LOSS_DB):
        return None
    if acc.probe_vs_compiled is None:
        return f"no per-tensor probe ran and the HTP loses {loss:.1f} dB at an output" if loss is not None else None
    if acc.probe_vs_compiled > 0.0:
        diff = acc.probe_vs_compiled
        return f"the probe changed the HTP graph (its outputs differ from the compiled model's by up to {diff:.3g})"
    if acc.probe_single_partition is False:
        return "the probe split the HTP graph"
    return None


def _region(
    fmodel: onnx.ModelProto, candidates: Sequence[str], first: str
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The nodes computing ``first`` from the nearest candidates before it, and their activations."""
    up = upstream_compared(fmodel, list(dict.fromkeys([*candidates, first])))[first]
    names = {n for _, n in up.nodes}
    weights = {t.name for t in fmodel.graph.initializer}
    tensors: list[str] = []
    for node in fmodel.graph.node:
        if node.name in names:
            tensors += [t for t in (*node.input, *node.output) if t and t not in weights]
    return up.nodes, tuple(dict.fromkeys(tensors))


# --------------------------------------------------------------------------- remedies


def _bypass_output_qdq(g: onnx.GraphProto, o: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> list[Any]:
    """Point every reader of ``o``'s Q→DQ pair at ``o`` itself; the Q/DQ nodes to drop."""
    drop: list[onnx.NodeProto] = []
    for q in [c for c in consumers.get(o, []) if is_q(c)]:
        for dq in [c for c in consumers.get(q.output[0], []) if is_dq(c)]:
            for user in consumers.get(dq.output[0], []):
                for k, i in enumerate(user.input):
                    if i == dq.output[0]:
                        user.input[k] = o
            for out in g.output:
                if out.name == dq.output[0]:
                    out.name = o
            drop.append(dq)
        if all(is_dq(c) for c in consumers.get(q.output[0], [])):
            drop.append(q)
    return drop


def _restore_fused(g: onnx.GraphProto, node: onnx.NodeProto, fmodel: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The activations the quantizer fused into ``node``'s output Q (a Relu/Clip after it: the Q's clamp did its
    work), as float nodes again, since the output Q goes: ``node`` writes ``<o>_pre`` and the activation ``o``."""
    fprod = {o: n for n in fmodel.graph.node for o in n.output}
    finits = {t.name: t for t in fmodel.graph.initializer}
    have = {t.name for t in g.initializer}
    added = []
    for k, o in enumerate(node.output):
        act = fprod.get(o)
        if act is None or act.op_type == node.op_type or act.op_type not in ("Relu", "Clip"):
            continue
        pre = f"{o}_pre"
        node.output[k] = pre
        copy = onnx.NodeProto()
        copy.CopyFrom(act)
        copy.input[0] = pre
        added.append(copy)
        g.initializer.extend(finits[i] for i in copy.input[1:] if i in finits and i not in have)
    return added


def float_region(qmodel: onnx.ModelProto, nodes: Sequence[str], fmodel: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the QDQ model in which the named nodes compute in float, for the HTP's fp16 precision: their weights
    become float initializers, the Q/DQ pair after each of their outputs goes (so they no longer form a quantized
    node unit, and their consumers read the float output), and an activation the quantizer had fused into that Q
    (a Relu or Clip of ``fmodel``) is put back as a float node. Their activation inputs keep their DequantizeLinear.
    """
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    drop: list[onnx.NodeProto] = []
    consts = constant_values(m)
    added: list[tuple[onnx.NodeProto, list[onnx.NodeProto]]] = []
    for node in [n for n in g.node if n.name in set(nodes)]:
        for k, i in enumerate(node.input):
            dq = producer.get(i)
            if dq is not None and is_dq(dq) and dq.input[0] in consts:
                # The HTP refuses a float op with quantized weights ("unsupported datatype"): float values instead.
                node.input[k] = _float_weight(g, dq, consts)
        for o in node.output:
            drop += _bypass_output_qdq(g, o, consumers)
        added.append((node, _restore_fused(g, node, fmodel)))
    keep: list[onnx.NodeProto] = []
    for n in g.node:
        if not any(n is d for d in drop):
            keep.append(n)
            keep += next((extra for node, extra in added if node is n), [])
    # The weight DQs the region no longer reads go too (a dangling DequantizeLinear fails on the HTP: error 3110).
    used = {i for n in keep for i in n.input} | {o.name for o in g.output}
    keep = [n for n in keep if not (is_dq(n) and n.output[0] not in used)]
    used = {i for n in keep for i in n.input}
    inits = [t for t in g.initializer if t.name in used]
    del g.node[:]
    g.node.extend(keep)
    del g.initializer[:]
    g.initializer.extend(inits)
    return m


def _float_weight(g: onnx.GraphProto, dq: onnx.NodeProto, consts: Mapping[str, Any]) -> str:
    """Add ``dq``'s output as a float32 initializer (``<output>_float``) and return its name."""
    name = f"{dq.output[0]}_float"
    if not any(t.name == name for t in g.initializer):
        values = decode_constant(consts[dq.input[0]])
        scale = decode_constant(consts[dq.input[1]])
        zp = decode_constant(consts[dq.input[2]]) if len(dq.input) > 2 and dq.input[2] in consts else None
        axis = next((int(a.i) for a in dq.attribute if a.name == "axis"), 1)
        g.initializer.append(numpy_helper.from_array(dequantize(values, scale, zp, axis).astype(np.float32), name))
    return name


@dataclass(frozen=True)
class _Ctx:
    """What every trial needs."""

    job: CompileJob
    options: QnnOptions  # what the build compiled with
    baseline: float | None
    work: Path


def _measure(
    ctx: _Ctx, kind: RemedyKind, label: str, qdq: Path, options: QnnOptions
) -> tuple[RemedyTrial, Path | None]:
    """Compile ``qdq`` with ``options`` and run it on the build's debug samples: the trial and its compiled model."""
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f"{kind.value}-", dir=ctx.work))
    rep = compile_qnn(qdq, work, replace(options, fail_on_fallback=False), name=kind.value)
    if not rep.ok or rep.compiled_model is None:
        return RemedyTrial(
            kind, label, False, seconds=time.perf_counter() - t0, detail=rep.error or "compile failed"
        ), None
    assert ctx.job.float_model is not None
    try:
        acc = htp_accuracy(
            ctx.job.float_model,
            qdq,
            rep.compiled_model,
            ctx.job.samples,
            out_dir=work,
            options=options,
            probe_tensors=False,
        )
    except QDebugError as exc:
        return RemedyTrial(kind, label, False, rep.accelerator_partitions, rep.cpu_nodes, detail=str(exc)), None
    db, _ = _worst(acc)
    gain = None if db is None or ctx.baseline is None else db - ctx.baseline
    trial = RemedyTrial(
        kind, label, True, rep.accelerator_partitions, rep.cpu_nodes, db, gain, time.perf_counter() - t0, rep.device
    )
    return trial, Path(rep.compiled_model)


def _quant_trials(
    ctx: _Ctx, tensors: Sequence[str]
) -> tuple[list[tuple[RemedyTrial, Path, Path | None, Any]], list[tuple[RemedyKind, str]]]:
    """The region in 16 bits and per-channel weights: re-quantized through the build's requantizer."""
    job, out, skipped = ctx.job, [], []
    cfg, rq = job.config, job.requantizer
    if cfg is None or rq is None:
        why = "no quantization config or re-quantizer (not a build)"
        return [], [(RemedyKind.REGION_16BIT, why), (RemedyKind.PER_CHANNEL, why)]
    plans: list[tuple[RemedyKind, str, Any]] = []
    if cfg.activation_type.endswith("16"):
        skipped.append((RemedyKind.REGION_16BIT, f"activations are already {cfg.activation_type}"))
    else:
        try:
            plans.append(
                (
                    RemedyKind.REGION_16BIT,
                    f"{len(tensors)} region tensor(s) in uint16",
                    rq.promote(cfg, tensors, "uint16"),
                )
            )
        except ConfigError as exc:
            skipped.append((RemedyKind.REGION_16BIT, str(exc)))
    if cfg.per_channel:
        skipped.append((RemedyKind.PER_CHANNEL, "weights are per-channel already"))
    else:
        try:
            plans.append((RemedyKind.PER_CHANNEL, "per-channel weights", cfg.replace(per_channel=True)))
        except ConfigError as exc:
            skipped.append((RemedyKind.PER_CHANNEL, str(exc)))
    for kind, label, new_cfg in plans:
        job.progress(f"remedy: {label}")
        try:
            qdq = rq.quantize(new_cfg, ctx.work / f"{kind.value}.qdq.onnx")
        except QDebugError as exc:
            skipped.append((kind, f"quantizing failed: {exc}"))
            continue
        opts = ctx.options
        if opts.soc is None and has_16bit_weights(load_model(qdq, "QDQ model")):
            opts = replace(opts, soc=V73_SOC)
        trial, compiled = _measure(ctx, kind, label, qdq, opts)
        out.append((trial, qdq, compiled, new_cfg))
    return out, skipped


def _other_socs(options: QnnOptions, qdq: onnx.ModelProto) -> list[str]:
    """The next HTP architecture above the build's and the newest one (one SoC each; each SoC tried costs a compile
    and a simulator run), v73+ when the model has 16-bit weights."""
    archs: dict[int, str] = {}
    for soc, (_, arch) in SOC_MODELS.items():
        archs.setdefault(int(arch[1:]), soc)
    floor = 73 if has_16bit_weights(qdq) else 0
    newer = sorted(a for a in archs if a > int(options.htp_arch[1:]) and a >= floor)
    return [archs[a] for a in dict.fromkeys(newer[:1] + newer[-1:])]


def _graph_trials(ctx: _Ctx, nodes: Sequence[str]) -> list[tuple[RemedyTrial, Path, Path | None, Any]]:
    """Other SoCs for the same QDQ model, and the region in fp16."""
    job, out = ctx.job, []
    assert job.qdq_model is not None
    qmodel = load_model(job.qdq_model, "QDQ model")
    for soc in _other_socs(ctx.options, qmodel):
        opts = replace(ctx.options, soc=soc)
        job.progress(f"remedy: the same model on {opts.device_label()}")
        trial, compiled = _measure(ctx, RemedyKind.SOC, opts.device_label(), job.qdq_model, opts)
        out.append((trial, job.qdq_model, compiled, soc))
    if nodes:
        # HTP v68 has no float unit: fp16 needs a newer SoC.
        soc = ctx.options.soc if ctx.options.htp_arch != DEFAULT_HTP_ARCH and ctx.options.soc else V73_SOC
        opts = replace(ctx.options, soc=soc, enable_fp16=True)
        path = ctx.work / "fp16_region.qdq.onnx"
        assert job.float_model is not None
        onnx.save(float_region(qmodel, nodes, load_model(job.float_model, "float model")), str(path))
        label = f"{len(nodes)} region node(s) in fp16 on {opts.device_label()}"
        job.progress(f"remedy: {label}")
        trial, compiled = _measure(ctx, RemedyKind.FP16_REGION, label, path, opts)
        out.append((trial, path, compiled, soc))
    return out


def _choose(trials: Sequence[RemedyTrial]) -> int | None:
    """The trial with the largest gain ≥ :data:`MIN_GAIN_DB` that compiled to one partition without CPU nodes."""
    ok = [
        (t.gain_db, k)
        for k, t in enumerate(trials)
        if t.ok and t.partitions == 1 and t.cpu_nodes == 0 and t.gain_db is not None and t.gain_db >= MIN_GAIN_DB
    ]
    return max(ok)[1] if ok else None


def _export(
    ctx: _Ctx, trial: RemedyTrial, qdq: Path, compiled: Path, extra: Any, tensors: Sequence[str]
) -> dict[str, str]:
    """The chosen remedy's QDQ model, compiled model and (quantization remedies, SoC) overrides JSON, in the build
    folder: role → file name."""
    out, stem = ctx.job.out_dir, ctx.job.stem
    files = {
        "remedy_qdq_model": f"{stem}.remedy.qdq.onnx",
        "remedy_compiled_model": f"{stem}.remedy.qnn_ctx.onnx",
    }
    shutil.copyfile(qdq, out / files["remedy_qdq_model"])
    shutil.copyfile(compiled, out / files["remedy_compiled_model"])
    rq, cfg = ctx.job.requantizer, ctx.job.config
    if rq is not None and trial.kind in (RemedyKind.REGION_16BIT, RemedyKind.PER_CHANNEL):
        note = f"qdebug build remedy {trial.kind.value}: {trial.label} (+{trial.gain_db:.1f} dB HTP vs float)"
        files["remedy_overrides"] = f"{stem}.remedy.overrides.json"
        rq.save_overrides(extra, out / files["remedy_overrides"], tensors, note)
    elif rq is not None and cfg is not None and trial.kind is RemedyKind.SOC:
        note = f"qdebug build remedy soc: compile with --soc {extra} (+{trial.gain_db:.1f} dB HTP vs float)"
        files["remedy_overrides"] = f"{stem}.remedy.overrides.json"
        rq.save_overrides(cfg, out / files["remedy_overrides"], (), note)
    return files


def try_remedies(ctx: _Ctx, nodes: Sequence[tuple[str, str]], tensors: Sequence[str], cpu_db: float | None) -> Remedies:
    """Every applicable remedy, measured; the best one exported."""
    quant, skipped = _quant_trials(ctx, tensors)
    every = quant + _graph_trials(ctx, [n for _, n in nodes])
    trials = tuple(t for t, *_ in every)
    chosen = _choose(trials)
    files: dict[str, str] = {}
    if chosen is not None:
        trial, qdq, compiled, extra = every[chosen]
        assert compiled is not None
        files = _export(ctx, trial, qdq, compiled, extra, tensors)
    return Remedies(ctx.baseline, cpu_db, trials, tuple(skipped), chosen, files)


# --------------------------------------------------------------------------- the whole diagnosis


def diagnose_build(job: CompileJob, compiled: Compiled, acc: TargetAccuracy | None) -> QnnDiagnosis | None:
    """Locate (bisection or probe) and, if asked, try the remedies; ``None`` when there is nothing to diagnose
    (fp16, no accuracy)."""
    if acc is None or job.qdq_model is None or job.float_model is None or not acc.outputs:
        return None
    t0 = time.perf_counter()
    opts = compiled_options(job, compiled)
    fmodel = load_model(job.float_model, "float model")
    qmodel = load_model(job.qdq_model, "QDQ model")
    candidates = candidate_tensors(fmodel, qmodel)
    reason = bisect_reason(job.options.bisect, acc)
    bis = None
    if reason is not None and candidates:
        job.progress(f"locating the divergence by prefix compiles ({reason})")
        bis = bisect_divergence(
            job.float_model, job.qdq_model, job.samples, options=replace(opts, fail_on_fallback=False)
        )
    first = bis.first_divergent if bis is not None else acc.first_divergent
    by = LocatedBy.NONE if first is None else LocatedBy.BISECTION if bis is not None else LocatedBy.PROBE
    nodes, tensors = _region(fmodel, candidates, first) if first is not None else ((), ())
    if reason is None:
        reason = (
            f"not needed ({job.options.bisect.value}: the probe's verdict stands)"
            if job.options.bisect is not BisectMode.NEVER
            else "off (--bisect never)"
        )
    remedies = None
    if first is not None and job.options.remedies:
        htp, cpu = _worst(acc)
        with temp_dir(prefix="qdebug-remedy-") as tmp:
            remedies = try_remedies(_Ctx(job, opts, htp, Path(tmp)), nodes, tensors, cpu)
    return QnnDiagnosis(by, first, nodes, tensors, reason, bis, acc.first_divergent, remedies, time.perf_counter() - t0)


def _describe(d: QnnDiagnosis) -> list[str]:
    """Plain lines for the CLI."""
    lines: list[str] = []
    if d.bisection is not None:
        b = d.bisection
        ratio = b.ratio_of(b.first_divergent) if b.first_divergent else None
        what = (
            f"{b.first_divergent} (ratio {ratio:.3g})"
            if b.first_divergent
            else "nothing (the last tensor is within its quantization error)"
        )
        lines.append(
            f"bisection over prefix compiles ({d.bisect_reason}): first divergent {what}; {b.compiles} compile(s) "
            f"for {b.candidates} tensors (bound {b.max_compiles}), {b.seconds:.1f} s; the probe said "
            f"{d.probe_first_divergent or 'nothing'}"
        )
    if d.first_divergent is not None:
        ops = ", ".join(f"{op} {n}" for op, n in d.region_nodes) or "-"
        lines.append(f"divergent region ({d.located_by.value}): {ops}")
    r = d.remedies
    if r is None:
        return lines
    base = "-" if r.baseline_db is None else f"{r.baseline_db:.2f} dB"
    cpu = "-" if r.cpu_vs_float_db is None else f"{r.cpu_vs_float_db:.2f} dB"
    lines.append(f"remedies for the region (worst output, HTP vs float; build {base}, CPU-QDQ {cpu}):")
    for k, t in enumerate(r.trials):
        mark = "*" if k == r.chosen else " "
        if t.ok:
            db = "-" if t.target_vs_float_db is None else f"{t.target_vs_float_db:.2f} dB"
            gain = "-" if t.gain_db is None else f"{t.gain_db:+.2f} dB"
            lines.append(
                f" {mark} {t.kind.value:13s} {t.label}: {db} ({gain}), {t.partitions} partition(s), "
                f"{t.cpu_nodes} CPU node(s)"
            )
        else:
            lines.append(f" {mark} {t.kind.value:13s} {t.label}: failed: {t.detail}")
    for kind, why in r.skipped:
        lines.append(f"   {kind.value:13s} not tried: {why}")
    best = r.best
    if best is None:
        lines.append(f"no remedy gained {MIN_GAIN_DB:g} dB in one partition")
    else:
        lines.append(
            f"chosen: {best.kind.value} ({best.label}), {best.partitions} partition(s); "
            f"wrote {', '.join(r.files.values())}"
        )
    return lines


class DiagnosingQnnTarget(QnnTarget):
    """The QNN target with :meth:`diagnose` (bisection and remedies; this module sits above the target's own)."""

    def diagnose(self, job: CompileJob, compiled: Compiled, accuracy: TargetAccuracy | None) -> Diagnosis:
        """Bisection when the probe cannot be trusted, then the remedies (docs/qnn.md)."""
        d = diagnose_build(job, compiled, accuracy)
        if d is None:
            return Diagnosis()
        files = dict(d.remedies.files) if d.remedies is not None else {}
        return Diagnosis(manifest={MANIFEST_KEY: d.to_dict()}, files=files)

    def describe_manifest(self, manifest: Mapping[str, Any]) -> list[str]:
        """The diagnosis, when the build has one."""
        entry = manifest.get(MANIFEST_KEY)
        return [] if entry is None else QnnDiagnosis.from_dict(entry).describe()


register_target("qnn", DiagnosingQnnTarget)
