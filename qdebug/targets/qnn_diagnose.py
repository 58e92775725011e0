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
   HTP's fp16 precision on). The best one that gains at least
   :data:`~qdebug.targets.qnn_diagnosis_record.MIN_GAIN_DB` without more partitions or CPU nodes than the build is
   chosen and written next to the build (``<stem>.remedy.*``: its QDQ model, compiled model and, when the remedy
   is a quantization one, its overrides JSON).

Everything lands in the manifest under :data:`~qdebug.targets.qnn_diagnosis_record.MANIFEST_KEY` as a
:class:`~qdebug.targets.qnn_diagnosis_record.QnnDiagnosis`.

Rooms: this module locates the region and runs the whole diagnosis; the remedies are
:mod:`qdebug.targets.qnn_remedies`'s, the record and its description :mod:`qdebug.targets.qnn_diagnosis_record`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from qdebug.io import temp_dir
from qdebug.model_io import load_model
from qdebug.report import TargetAccuracy
from qdebug.targets.base import BisectMode, Compiled, CompileJob, Diagnosis, DiagnosisBudget, register_target
from qdebug.targets.divergence import EXCESS_NOISE_THRESHOLD, sqnr_drop_db, upstream_compared
from qdebug.targets.htp_numerics import find_behaviours
from qdebug.targets.qnn import QnnTarget, compiled_options
from qdebug.targets.qnn_bisect import bisect_divergence, candidate_tensors
from qdebug.targets.qnn_diagnosis_record import MANIFEST_KEY, LocatedBy, QnnDiagnosis
from qdebug.targets.qnn_options import QnnOptions
from qdebug.targets.qnn_remedies import _Ctx, _other_socs, _worst, try_remedies

__all__ = ["DiagnosingQnnTarget", "bisect_reason", "diagnose_build"]
#: The output loss (CPU-QDQ vs float minus HTP vs float, dB) at which ``--bisect auto`` searches without a probe
#: verdict: the excess-noise threshold's 3 dB (ratio 1), applied at the output.
OUTPUT_LOSS_DB = sqnr_drop_db(EXCESS_NOISE_THRESHOLD)


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


# --------------------------------------------------------------------------- the whole diagnosis


def diagnose_build(job: CompileJob, compiled: Compiled, acc: TargetAccuracy | None) -> QnnDiagnosis | None:
    """Locate (bisection or probe) and, if asked, try the remedies; ``None`` when there is nothing to diagnose
    (fp16, no accuracy). What did not run (not asked for, or over ``job.budget``) is in :func:`skipped_steps`."""
    return _diagnose(job, compiled, acc, [])


def _budget(job: CompileJob) -> DiagnosisBudget:
    """The job's budget, else the options' (asked by ``remedies`` or a time budget, no deadline known here)."""
    if job.budget is not None:
        return job.budget
    return DiagnosisBudget(asked=job.options.remedies or job.options.time_budget_s is not None)


def _diagnose(
    job: CompileJob, compiled: Compiled, acc: TargetAccuracy | None, skipped: list[str]
) -> QnnDiagnosis | None:
    """:func:`diagnose_build`, appending to ``skipped`` one line per step not run."""
    if acc is None or job.qdq_model is None or job.float_model is None or not acc.outputs:
        return None
    t0 = time.perf_counter()
    opts = compiled_options(job, compiled)
    fmodel = load_model(job.float_model, "float model")
    qmodel = load_model(job.qdq_model, "QDQ model")
    candidates = candidate_tensors(fmodel, qmodel)
    reason = bisect_reason(job.options.bisect, acc)
    budget = _budget(job)
    if reason is not None and candidates and job.options.bisect is BisectMode.AUTO:
        # --bisect always is a request; auto's prefix compiles are extra work, run when asked and when they fit
        refusal = budget.refusal(f"bisection ({reason})", math.ceil(math.log2(max(len(candidates), 2))) + 1)
        if refusal is not None:
            skipped.append(refusal)
            reason = None
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
        if skipped:
            reason = "not run (the probe's verdict stands): " + skipped[-1]
    remedies = None
    if first is not None:
        trials = _trial_count(job, opts, qmodel, nodes)
        # The first trial must fit; each later one is checked before it starts (try_remedies skips what no longer fits).
        refusal = budget.refusal("remedies", 1)
        if refusal is not None:
            skipped.append(refusal)
        else:
            each = f", ~{budget.trial_s:.0f} s each (compile + simulator)" if budget.trial_s else ""
            job.progress(f"trying ~{trials} remedies{each}")
            htp, cpu = _worst(acc)
            counted = replace(job, progress=_Numbered(job.progress, trials, budget.trial_s))
            with temp_dir(prefix="qdebug-remedy-") as tmp:
                rep = compiled.report
                ctx = _Ctx(counted, opts, htp, Path(tmp), rep.accelerator_partitions, rep.cpu_nodes, budget)
                remedies = try_remedies(ctx, nodes, tensors, cpu)
    secs = time.perf_counter() - t0
    causes = find_behaviours(qmodel)
    return QnnDiagnosis(by, first, nodes, tensors, reason, bis, acc.first_divergent, remedies, secs, causes)


def _trial_count(job: CompileJob, opts: QnnOptions, qmodel: onnx.ModelProto, nodes: Sequence[Any]) -> int:
    """About how many remedy trials :func:`try_remedies` runs (each a compile and a simulator run): the rewrite of
    known HTP behaviours, the two quantization ones that apply, the other SoCs, the fp16 region."""
    cfg = job.config
    quant = 0
    if cfg is not None and job.requantizer is not None:
        quant = int(not cfg.activation_type.endswith("16")) + int(not cfg.per_channel)
    rewrite = int(bool(find_behaviours(qmodel)))
    return max(1, rewrite + quant + len(_other_socs(opts, qmodel)) + int(bool(nodes)))


class _Numbered:
    """The job's progress with each trial's ``remedy: …`` line numbered ``remedy i/k`` and the time the trials
    left are estimated to take."""

    def __init__(self, say: Any, total: int, trial_s: float) -> None:
        self.say, self.total, self.trial_s, self.done = say, total, trial_s, 0

    def __call__(self, message: str) -> None:
        if not message.startswith("remedy: "):
            self.say(message)
            return
        self.done += 1
        left = max(self.total - self.done + 1, 1) * self.trial_s
        eta = f", ETA ~{left:.0f} s" if self.trial_s else ""
        self.say(f"remedy {self.done}/{max(self.total, self.done)}{eta}: {message.removeprefix('remedy: ')}")


class DiagnosingQnnTarget(QnnTarget):
    """The QNN target with :meth:`diagnose` (bisection and remedies; this module sits above the target's own)."""

    def diagnose(self, job: CompileJob, compiled: Compiled, accuracy: TargetAccuracy | None) -> Diagnosis:
        """Bisection when the probe cannot be trusted, then the remedies (docs/qnn.md)."""
        skipped: list[str] = []
        d = _diagnose(job, compiled, accuracy, skipped)
        if d is None:
            return Diagnosis()
        files = dict(d.remedies.files) if d.remedies is not None else {}
        return Diagnosis(manifest={MANIFEST_KEY: d.to_dict()}, files=files, skipped=tuple(skipped))

    def qdq_notes(self, qdq_model: onnx.ModelProto) -> list[str]:
        """The known HTP numeric behaviours in the QDQ model (:mod:`qdebug.targets.htp_numerics`), and the remedy."""
        found = find_behaviours(qdq_model)
        if not found:
            return []
        lines = [f"on qnn, known HTP behaviour: {f.describe()}" for f in found[:3]]
        more = f" ({len(found) - 3} more)" if len(found) > 3 else ""
        return [*lines, f"qdebug build --target qnn --remedies measures their rewrite (htp_rewrite){more}"]

    def describe_manifest(self, manifest: Mapping[str, Any]) -> list[str]:
        """The diagnosis, when the build has one."""
        entry = manifest.get(MANIFEST_KEY)
        return [] if entry is None else QnnDiagnosis.from_dict(entry).describe()


register_target("qnn", DiagnosingQnnTarget)
