"""The standard remedies for a located HTP divergence, each quantized/compiled and measured on the HTP simulator.

For a region of the float model (:mod:`qdebug.targets.qnn_diagnose` locates it), :func:`try_remedies` tries its
activations in 16 bits and per-channel weights (through the build's :class:`~qdebug.targets.base.Requantizer`),
the same QDQ model on other SoCs, the region in fp16 (:func:`float_region`) and, when the QDQ model holds a known
HTP behaviour (:mod:`qdebug.targets.htp_numerics`), its rewrite on the same grids; the best one that gains at least
:data:`~qdebug.targets.qnn_diagnosis_record.MIN_GAIN_DB` without more partitions or CPU nodes than the build
itself is written next to the build.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.errors import ConfigError, QDebugError
from qdebug.graph_index import constant_values, decode_constant
from qdebug.model_io import is_dq, is_q, load_model
from qdebug.qdq_values import dequantize
from qdebug.report import TargetAccuracy
from qdebug.targets.base import CompileJob, DiagnosisBudget
from qdebug.targets.htp_numerics import find_behaviours, rewrite_qdq
from qdebug.targets.qnn_accuracy import htp_accuracy
from qdebug.targets.qnn_compile import compile_qnn, has_16bit_weights
from qdebug.targets.qnn_diagnosis_record import MIN_GAIN_DB, Remedies, RemedyKind, RemedyTrial
from qdebug.targets.qnn_options import DEFAULT_HTP_ARCH, SOC_MODELS, V73_SOC, QnnOptions

__all__ = ["float_region", "try_remedies"]


# --------------------------------------------------------------------------- where


def _worst(acc: TargetAccuracy) -> tuple[float | None, float | None]:
    """(HTP vs float, CPU-QDQ vs float) at the output where the HTP is furthest from float."""
    rows = [o for o in acc.outputs if o.target_vs_float_db is not None]
    if not rows:
        return None, None
    o = min(rows, key=lambda r: r.target_vs_float_db if r.target_vs_float_db is not None else math.inf)
    return o.target_vs_float_db, o.cpu_vs_float_db


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
    #: the build's own placement: a remedy may not add partitions or CPU nodes (a model with a node QNN never
    #: takes, such as a Clip with a dynamic bound, keeps that CPU node in every trial)
    partitions: int = 1
    cpu_nodes: int = 0
    budget: DiagnosisBudget | None = None  # checked before each trial: the ones that no longer fit are skipped
    over_budget: list[tuple[RemedyKind, str]] = field(default_factory=list)


def _measure(
    ctx: _Ctx, kind: RemedyKind, label: str, qdq: Path, options: QnnOptions
) -> tuple[RemedyTrial | None, Path | None]:
    """Compile ``qdq`` with ``options`` and run it on the build's debug samples: the trial and its compiled model
    (``None, None`` when the budget has no room left for it; the reason is in ``ctx.over_budget``)."""
    refusal = ctx.budget.refusal(f"remedy {kind.value} ({label})", 1) if ctx.budget is not None else None
    if refusal is not None:
        ctx.over_budget.append((kind, refusal))
        return None, None
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
        if trial is not None:
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
        if trial is not None:
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
        if trial is not None:
            out.append((trial, path, compiled, soc))
    return out


def _rewrite_trials(ctx: _Ctx) -> list[tuple[RemedyTrial, Path, Path | None, Any]]:
    """The QDQ model rewritten around the known HTP behaviours it holds (same grids, no re-quantization)."""
    assert ctx.job.qdq_model is not None
    qmodel = load_model(ctx.job.qdq_model, "QDQ model")
    found = find_behaviours(qmodel)
    if not found:
        return []
    fixed, done = rewrite_qdq(qmodel, found)
    path = ctx.work / "htp_rewrite.qdq.onnx"
    onnx.save(fixed, str(path))
    kinds = ", ".join(sorted({f.behaviour.value for f in found}))
    label = f"{len(done)} node(s) rewritten ({kinds})"
    ctx.job.progress(f"remedy: {label}")
    trial, compiled = _measure(ctx, RemedyKind.HTP_REWRITE, label, path, ctx.options)
    return [] if trial is None else [(trial, path, compiled, None)]


def _choose(trials: Sequence[RemedyTrial], partitions: int = 1, cpu_nodes: int = 0) -> int | None:
    """The trial with the largest gain ≥ :data:`MIN_GAIN_DB` whose compile has no more partitions (at least one
    allowed) and no more CPU nodes than the build's (``partitions``, ``cpu_nodes``)."""
    ok = [
        (t.gain_db, k)
        for k, t in enumerate(trials)
        if t.ok
        and 1 <= t.partitions <= max(1, partitions)
        and t.cpu_nodes <= cpu_nodes
        and t.gain_db is not None
        and t.gain_db >= MIN_GAIN_DB
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
    every = _rewrite_trials(ctx) + quant + _graph_trials(ctx, [n for _, n in nodes])
    trials = tuple(t for t, *_ in every)
    chosen = _choose(trials, ctx.partitions, ctx.cpu_nodes)
    files: dict[str, str] = {}
    if chosen is not None:
        trial, qdq, compiled, extra = every[chosen]
        assert compiled is not None
        files = _export(ctx, trial, qdq, compiled, extra, tensors)
    return Remedies(ctx.baseline, cpu_db, trials, tuple(skipped + ctx.over_budget), chosen, files)
