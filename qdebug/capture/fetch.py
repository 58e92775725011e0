"""The whole-model fetch run (the ``fetch`` backend's, opened by :mod:`qdebug.capture.compose`): every paired
tensor is exposed as an extra output of its model (ONNX Runtime activation augmentation, optimizations off),
fetched, and reduced by the run's reducer — the reference definition
(:func:`~qdebug.capture.kernels.reference.reduce_sample`) or the compiled pass. Robust on any model ORT can run; it
moves every tensor out of ORT, into bound arrays (:mod:`qdebug.capture.bound`) alternated by sample parity when
pipelined (:mod:`qdebug.capture.output_sets`), or in batches (:mod:`qdebug.capture.batching`). A sample too large
to expose at once runs in segments instead (:mod:`qdebug.capture.segmented_run`, chosen when the run is opened).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from qdebug.capture.arena import estimate_bytes
from qdebug.capture.base import FALLBACK_BACKEND, RunInfo, SampleSums
from qdebug.capture.batch_run import Batching, reduce_from_batch
from qdebug.capture.batching import input_key, relax_batch_dim
from qdebug.capture.bound import Batch, BoundFetch, Ready, Reducer, Values
from qdebug.capture.constants import ConstantSums, constant_tensors, constant_values, fold, split
from qdebug.capture.dequant import Dequantized, DequantSpec, whole_run_specs
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.capture.output_sets import OutputSets
from qdebug.capture.pipelined import Pipelining
from qdebug.capture.segmented import exposed_bytes, mean_elements
from qdebug.capture.tuning import CaptureTuning
from qdebug.errors import DataError, ModelError
from qdebug.ort import expose_outputs, make_session, ort_message
from qdebug.pairing import Pairing

__all__ = ["FetchRun", "usable_cores"]


def usable_cores(tuning: CaptureTuning | None = None) -> int:
    """The cores a run may use: ``tuning.cores`` when set, else this process's CPU affinity, and inside a Ray task or
    actor the CPUs Ray reserved for it (Ray does not pin workers to cores but puts one worker per reserved CPU on a
    node, so a task that used more would take its neighbour's)."""
    if tuning is not None and tuning.cores is not None:
        return tuning.cores
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ray = sys.modules.get("ray")  # only when Ray is already loaded: never imported for this
    # only inside a started Ray: get_runtime_context() starts a local Ray cluster in a process that imported Ray
    # without starting it (a notebook, a benchmark that starts Ray after a local capture)
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        try:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except Exception:  # the driver, or no Ray context: not a Ray worker's reservation
            cpus = None
        if cpus:
            n = min(n, max(1, int(cpus)))
    return n


class FetchRun(OutputSets):
    """Two sessions whose outputs include every tensor of the :class:`ReductionPlan`.

    **Pipelined** (``pipeline``: the :class:`~qdebug.capture.pipelined.Pipelining` its opener chose — with two or
    more cores, :mod:`qdebug.capture.compose` — which this run delegates its worker to): once the first sample has
    shown that the
    tensors fit in ``tuning.pipeline_bytes``, the capture loop's :meth:`prefetch` starts the next samples' inference
    on a worker thread while this thread reduces the current ones — ONNX Runtime and numpy each keep a core busy
    instead of taking turns. The sessions' idle threads then sleep instead of spinning, so the reduction is not
    slowed by ORT's busy-waiting. The sums are those of the sequential run (same arrays, same order). Its second
    set of bound outputs is carved from a buffer the worker populates while sample 0 is inferred
    (:mod:`qdebug.capture.arena`), and the worker is handed the GIL at each submission
    (:func:`~qdebug.capture.threads.submit_started`): neither new pages nor a wait for the GIL fall in a sample.

    **Batched** (``batching``: the :class:`~qdebug.capture.batch_run.Batching` its opener chose for ``batch`` > 1,
    :mod:`qdebug.capture.batching`): up to ``batch`` announced samples of the same
    input shapes run as one inference call (fewer if their tensors would exceed
    ``tuning.batch_bytes``), checked on the first batch; :attr:`batch_reason` says why
    batching stopped, :meth:`batching` the largest batch that ran (:mod:`qdebug.capture.batch_run` groups and checks).

    Opened in place of a segmented run whose segment could not load (:mod:`qdebug.capture.segmented_run`), it
    neither folds constants apart (``split_constants``) nor exposes integers, and says why (``segment_note``).
    ``weight``: one sample's estimated exposed bytes per float tensor, when the opener has it (else estimated from
    ``input_shapes``).

    **Threads**: a pipelined whole-model run whose inference calls handle small tensors (estimated from
    ``input_shapes``; a call holds the samples that would fit a batch when at least ``min_batch`` do) gives its
    sessions one intra-op thread fewer than the cores (``tuning.small_call_elements``, :attr:`thread_note`).
    """

    def __init__(
        self,
        float_model: onnx.ModelProto,
        quant_model: onnx.ModelProto,
        pairing: Pairing,
        providers: Sequence[str],
        pipeline: Pipelining | None = None,
        batching: Batching | None = None,
        reducer: Reducer = reduce_sample,
        batch_kernel: Any = None,
        input_shapes: Mapping[str, tuple[int, ...]] | None = None,
        dequant_whole: bool = False,
        min_batch: int = 2,
        tuning: CaptureTuning | None = None,
        name: str = FALLBACK_BACKEND,
        weight: Mapping[str, int] | None = None,
        split_constants: bool = True,
        segment_note: str | None = None,
    ) -> None:
        self.tuning = tuning = tuning or CaptureTuning()
        self.name = name  # the backend this run is, for the report (fetch, or compiled)
        self.plan = ReductionPlan.of(pairing)
        self.reducer = reducer  # the numpy reference, or the compiled pass (qdebug.capture.compiled)
        self.batch_kernel = batch_kernel  # with the compiled pass: its kernel module, for a batch's large tensors
        self.reduce_seconds: float | None = None  # the last sample's reduction alone (auto's cost model)
        self.infer_seconds: float | None = None  # the last unbatched inference, per sample (auto's cost model)
        #: the next samples inferred on a worker while this one is reduced (:mod:`qdebug.capture.pipelined`;
        #: ``None``: one thread)
        self.pipeline = pipeline
        #: several samples per inference call (:mod:`qdebug.capture.batch_run`; ``None``: one per call)
        self.batches = batching
        self._unbatched: tuple[int, str | None] = (1, None)  # batching() without (or after) batching
        self.models, self.providers = (float_model, quant_model), tuple(providers)
        self.segment_note: str | None = None  # what the run does once instead of every sample, or why not segmented
        if weight is None and input_shapes:
            weight = exposed_bytes(float_model, self.plan, input_shapes, tuning.probe_model_bytes)
        self.segment_count = 1
        #: a whole-model run's intra-op threads (``None``: ORT's default) and why (``small_call_elements``)
        self.threads: int | None = None
        self.thread_note: str | None = None
        #: post-Q/DQ tensors a whole-model run computes from their integers (``dequant_whole``), and what the
        #: quantized session exposes in their place
        self.q_specs: dict[str, DequantSpec] = {}
        #: a whole-model run's activations computed from constants alone, reduced once (``None``: none), and how
        #: many nodes of its models compute constants from constants, folded once (:mod:`.constants`)
        self.constants: ConstantSums | None = None
        self.folded_nodes = 0
        self.unfolded_bytes = 0  # est. bytes of constants left to compute every call (above ``fold_max_bytes``)
        if split_constants:
            self._split_constants(pairing)
        if dequant_whole:
            self.q_specs = whole_run_specs(quant_model, self.plan.pairing, providers, tuning.wide_checks)
        swapped = (self.q_specs[n].ints if n in self.q_specs else n for n in self.plan.quant_names)
        self.q_names = list(dict.fromkeys(swapped))  # two post tensors may share one QuantizeLinear's integers
        self._open_whole_run(weight, min_batch)
        if segment_note is not None:  # opened in place of a segmented run: why
            self.segment_note = segment_note
        self.sample_bytes: int | None = None  # exposed bytes of one sample, both models (after the first)
        self._queued: list[tuple[int, Mapping[str, np.ndarray]]] = []
        self._ready: dict[int, Ready] = {}
        self._plain, self._adopted, self._reduced = None, False, -1  # see OutputSets

    def _split_constants(self, pairing: Pairing) -> None:
        """Take the activations computed from constants alone out of the run's plan and reduce them once, from
        their values (:attr:`constants`; :mod:`~qdebug.capture.constants`); if those cannot be had, keep them."""
        (f_model, q_model), providers = self.models, self.providers
        f_const, q_const = constant_tensors(f_model), constant_tensors(q_model)
        varying, fixed = split(pairing, f_const, q_const)
        if not fixed.activations:
            return
        fixed_plan = ReductionPlan.of(fixed)
        f_vals = constant_values(f_model, fixed_plan.float_names, providers, f_const)
        q_vals = constant_values(q_model, fixed_plan.quant_names, providers, q_const)
        if f_vals is None or q_vals is None:
            return
        self.constants = ConstantSums(pairing, varying, reduce_sample(fixed_plan, f_vals, q_vals))
        self.plan = ReductionPlan.of(varying)

    def _open_whole_run(self, weight: Mapping[str, int] | None, min_batch: int) -> None:
        """The whole models' sessions, their threads, and the buffer for a second set of bound outputs: one
        sample's estimated size (:mod:`qdebug.capture.arena`) when the run will pipeline one sample per call —
        not when it is expected to batch (a batch's outputs are new arrays) or a sample is above ``prep_bytes``."""
        self.threads, self.thread_note = self._whole_threads(weight, min_batch)
        self._open_whole()
        notes = [f"{len(self.q_specs)} post-Q/DQ tensors computed from their integers"] if self.q_specs else []
        if self.folded_nodes:
            notes.append(f"{self.folded_nodes} nodes of constants alone run once, not every sample")
        if self.unfolded_bytes:
            mb = self.unfolded_bytes / (1 << 20)
            notes.append(
                f"nodes of constants alone not folded: est. {mb:.0f} MB (> {self.tuning.fold_max_bytes >> 20} MB)"
            )
        if self.constants is not None:
            notes.append(f"{self.constants.count} activations of constants alone reduced once")
        self.segment_note = "; ".join(notes) or None
        est = estimate_bytes(self.plan, weight, self.q_specs) if self.pipeline_allowed and weight else None
        if est is None or not 0 < est <= self.tuning.prep_bytes:
            return
        if self.pipeline is not None and (self.batches is None or self.batches.expected(est, min_batch) == 1):
            self.pipeline.arena_bytes = est

    @property
    def reducer(self) -> Reducer:
        """How a sample is reduced: :func:`~qdebug.capture.kernels.reference.reduce_sample` (the numpy reference) or the
        compiled pass; settable (``auto`` switches it). Whole-model samples go through its ``cached()`` form when
        it has one (their tensors are the same bound arrays every sample), segments through it as it is."""
        return self._reducer

    @reducer.setter
    def reducer(self, reducer: Reducer) -> None:
        self._reducer = reducer
        cached = getattr(reducer, "cached", None)
        self._whole_reducer: Reducer = cached() if cached is not None else reducer

    def _whole_threads(self, weight: Mapping[str, int] | None, min_batch: int) -> tuple[int | None, str | None]:
        """The whole-model sessions' intra-op threads and why: one fewer than the cores when the run pipelines and
        its inference calls handle small tensors (``small_call_elements``, estimated from the first sample's
        input shapes: the sessions are made before any sample runs), else ORT's default (``None``, no note)."""
        cores = usable_cores(self.tuning)
        if not self.pipeline_allowed or weight is None or cores < 2:
            return None, None
        mean = mean_elements(weight, self.plan)
        # what it would batch; fewer: auto runs one per call
        per_call = self.batches.expected(max(1, sum(weight.values())), min_batch) if self.batches else 1
        if mean * per_call > self.tuning.small_call_elements:
            return None, None
        calls = f"{per_call} samples per call x " if per_call > 1 else ""
        return cores - 1, (
            f"inference on {cores - 1} intra-op thread(s), a core left to the reduction: calls of est. {calls}"
            f"{mean:,.0f} elements per tensor on average (<= {self.tuning.small_call_elements:,})"
        )

    def _open_whole(self) -> None:
        """The two sessions exposing every tensor of the plan (a model ORT cannot load: :class:`ModelError`)."""
        spin, threads = not self.pipeline_allowed, self.threads
        f_model = self._run_model(0, self.plan.float_names)
        self.f_sess: Any = make_session(f_model, self.providers, role="float model", spin=spin, threads=threads)
        del f_model  # a copy of the whole model: not kept next to the session
        q_model = self._run_model(1, self.q_names)
        self.q_sess: Any = make_session(q_model, self.providers, role="quantized model", spin=spin, threads=threads)
        # two sets of bound outputs: a pipelined run infers sample i + 1 into one while sample i is reduced from
        # the other (fresh arrays instead cost the kernel's page faults and zeroing on every sample, and a
        # sample's arrays would be new objects each time, so the compiled pass could not reuse its call tables)
        self.fetches = tuple(
            (BoundFetch(self.f_sess, self.plan.float_names), BoundFetch(self.q_sess, self.q_names)) for _ in range(2)
        )

    def _run_model(self, which: int, names: Sequence[str]) -> onnx.ModelProto:
        """The model a whole-model session runs: a copy exposing ``names``, its constant-only nodes folded
        (:func:`~qdebug.capture.constants.fold`: a QDQ model's weights are otherwise dequantized every call) and
        its batch axis free when the run may batch; changed in place, one copy of the model at a time."""
        model = expose_outputs(self.models[which], names)
        done = fold(model, self.providers, self.tuning.fold_max_bytes)
        self.folded_nodes += done.nodes
        if done.estimated_bytes > self.tuning.fold_max_bytes:
            self.unfolded_bytes += done.estimated_bytes
        return relax_batch_dim(model, copy=False) if self.batches is not None else model

    @property
    def batch_size(self) -> int:
        """How many samples the next inference call may take (1 until the first sample's size is known)."""
        return self.batches.size(self.sample_bytes) if self.batches is not None else 1

    @property
    def lookahead(self) -> int:
        """How many samples past the current one the capture loop should announce through :meth:`prefetch`: the
        rest of this batch and, when pipelining, the next one."""
        return max(1, self.batch_size * (2 if self.pipelining else 1) - 1)

    @property
    def fresh(self) -> bool:
        """Whether each inference returns new arrays (values are kept past the next call), not bound ones: when
        batching (a batch's samples are kept past the next call). A pipelined run keeps at most two samples, the
        one reduced and the one inferred, each in its own set of bound arrays (:attr:`fetches`, by parity)."""
        return self.batches is not None

    @property
    def pipeline_allowed(self) -> bool:
        """Whether the run was opened to pipeline (its sessions then sleep instead of spinning)."""
        return self.pipeline is not None

    @property
    def pipelining(self) -> bool:
        """Whether the next samples' inference may run while this one is reduced."""
        return self.pipeline is not None and self.pipeline.active(self.sample_bytes, self.batch_size)

    def batching(self) -> tuple[int, str | None]:
        """The most samples one inference call took, and why batching stopped or never started (asked for and
        not used: the reason; not asked for: ``None``)."""
        return self.batches.info(self.sample_bytes) if self.batches is not None else self._unbatched

    @property
    def batch_limit(self) -> int:
        """At most this many samples per inference call."""
        return self.batches.limit if self.batches is not None else 1

    @property
    def batch_reason(self) -> str | None:
        """Why batching stopped or never started (``None``: it holds, or was not asked for)."""
        return self.batches.reason if self.batches is not None else self._unbatched[1]

    def stop_batching(self, reason: str | None = None) -> None:
        """One sample per call from here (``auto``, once sample 0 shows batching would not pay; ``reason``: why,
        when that is worth saying)."""
        if self.batches is not None:
            self._unbatched = (self.batches.used, reason if reason is not None else self.batches.reason)
        elif reason is not None:
            self._unbatched = (self._unbatched[0], reason)
        self.batches = None

    def use_reducer(self, reducer: Reducer, batch_kernel: Any) -> None:
        """Reduce with ``reducer`` from the next sample on (``auto`` switches to the compiled pass; ``batch_kernel``:
        its kernel module, for a batch's large tensors)."""
        self.reducer, self.batch_kernel = reducer, batch_kernel

    def rethreadable(self) -> None:
        """None: a whole-model run's threads are set when its sessions are made (:meth:`_whole_threads`)."""
        return None

    def prefetch(self, index: int, sample: Mapping[str, np.ndarray]) -> None:
        """Announce a sample after the one :meth:`reduce` gets next: it may join that sample's batch, or, when
        pipelining, the batch inferred on the worker thread while the current one is reduced."""
        if index not in self._ready and all(index != i for i, _ in self._queued):
            self._queued.append((index, sample))

    def close(self) -> None:
        """Stop the worker thread (a pending inference finishes first)."""
        if self.pipeline is not None:
            self.pipeline.close()

    @property
    def fallback(self) -> None:
        """None: a fetch run reduces every sample itself (or raises)."""
        return None

    def info(self) -> RunInfo:
        """This backend, its batching and its segments."""
        return RunInfo(self.name, None, *self.batching(), self.segment_count, self.segment_note)

    def reduce(
        self, index: int, sample: Mapping[str, np.ndarray], sized: Callable[[], None] | None = None
    ) -> SampleSums:
        """Run both models on the sample (or take its values from a batch or the worker) and reduce. ``sized`` is
        called once the first sample's size is known, before it is reduced (``auto`` decides batching there)."""
        sums = self._reduce_varying(index, sample, sized)
        return sums if self.constants is None else self.constants.complete(sums)

    def _reduce_varying(
        self, index: int, sample: Mapping[str, np.ndarray], sized: Callable[[], None] | None
    ) -> SampleSums:
        """:meth:`reduce` of the plan's activations (those not computed from constants alone)."""
        if self.pipeline is not None:
            self.pipeline.touch_arena()
        item = self._take(index, sample)
        if isinstance(item[0], Batch):
            self._start_next(index)
            batched, seconds = reduce_from_batch(self, item[0], index)
            if seconds is not None:
                self.reduce_seconds = seconds
            self._reduced = index
            return batched
        f_vals, q_vals = item
        if self.sample_bytes is None:
            self.sample_bytes = sum(v.nbytes for v in f_vals) + sum(v.nbytes for v in q_vals)
            if sized is not None:
                sized()
            if self.fresh and self.pipeline is not None:  # batching: no set of bound outputs, nothing to carve
                self.pipeline.arenas.clear()
        self._start_next(index)
        self._prepare_set(index)
        t0 = time.perf_counter()
        sums = self.reduce_values((f_vals, q_vals))
        self.reduce_seconds = time.perf_counter() - t0
        self._reduced = index
        return sums

    def reduce_values(self, values: Values) -> SampleSums:
        """One sample's tensors reduced by the run's reducer."""
        f = dict(zip(self.plan.float_names, values[0], strict=True))
        q: Mapping[str, np.ndarray] = dict(zip(self.q_names, values[1], strict=True))
        if self.q_specs:  # post-Q/DQ tensors computed from their integers (the compiled pass reads those)
            q = Dequantized(q, self.q_specs)
        return self._whole_reducer(self.plan, f, q)

    def _take(self, index: int, sample: Mapping[str, np.ndarray]) -> Ready:
        """The sample's values: already in a batch, being inferred on the worker, or inferred now (with the
        announced samples that can share its batch)."""
        self._queued = [(i, s) for i, s in self._queued if i > index]
        if self.pipeline is not None:  # the worker may be inferring it
            self.pipeline.collect(index, self._ready)
        if index in self._ready:
            return self._ready.pop(index)
        group = self._group(index, sample)
        self._ready.update(self.infer_group(group))
        return self._ready.pop(index)

    def _group(self, index: int, sample: Mapping[str, np.ndarray]) -> list[tuple[int, Mapping[str, np.ndarray]]]:
        """``sample`` and the next announced samples of the same input shapes, up to :attr:`batch_size`; taken
        out of the queue. A sample of input shapes not seen alone yet runs alone (its shapes are needed to split)."""
        group: list[tuple[int, Mapping[str, np.ndarray]]] = [(index, sample)]
        return group if self.batches is None else self.batches.group(self._queued, group, self.sample_bytes)

    def _start_next(self, current: int) -> None:
        """When pipelining and the worker is idle, start inferring the next announced batch on it."""
        if self.pipeline is not None:
            self.pipeline.start_next(self, current)

    def next_group(self, current: int) -> list[tuple[int, Mapping[str, np.ndarray]]] | None:
        """The next announced group (taken out of the queue) if it follows sample ``current`` and the values
        already inferred, else ``None``."""
        if not self._queued:
            return None
        first, last = self._queued[0][0], max(self._ready, default=current)
        if first != last + 1:
            return None
        return self._group(*self._queued.pop(0))

    def prime_next(self, group: list[tuple[int, Mapping[str, np.ndarray]]], current: int) -> None:
        """Bind the set of bound outputs a group of one sample will be inferred into on the worker, here first:
        binding is Python under the GIL, which this thread's call-table building would otherwise hold while the
        worker waits to bind."""
        (index, sample), which = group[0], group[0][0] % 2
        prep = self.pipeline.prep if self.pipeline is not None else None
        if len(group) == 1 and not self.fresh and (prep is None or prep[0] != which):
            self._prime(self.fetches[which], index, sample)
            self._bind_plain_early(current)

    def infer_alone(self, index: int, sample: Mapping[str, np.ndarray]) -> Values:
        """Both models' values for one sample (fresh arrays when they are kept past the next call, see
        :attr:`fresh`; else the bound ones, overwritten by the next call).

        A sample the float model cannot run is a :class:`DataError`; a sample the float model runs but the quantized
        model cannot (e.g. a zero point whose shape differs from its scale's, an axis out of range: ORT checks
        those at run time only) is the quantized model's fault, a :class:`ModelError` with that role.
        """
        which = index % 2 if self.pipelining else 0
        fresh, (f_fetch, q_fetch) = self.fresh, self.fetches[which]
        pipe = self.pipeline
        if pipe is not None and pipe.prep is not None and (pipe.prep[0] == which or pipe.prep[1].done()):
            prep, pipe.prep = pipe.prep[1], None
            prep.result()  # its MemoryError, if any, is raised here
            self._drop_spares()
        if not fresh:
            self._prime((f_fetch, q_fetch), index, sample)
        try:
            f_vals = list(self.f_sess.run(self.plan.float_names, dict(sample))) if fresh else f_fetch.run(sample)
        except Exception as exc:  # ORT's own error types carry no common public base
            raise DataError(f"sample {index}: the float model cannot run on it: {ort_message(exc)}") from exc
        try:
            q_vals = list(self.q_sess.run(self.q_names, dict(sample))) if fresh else q_fetch.run(sample)
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime cannot run it on sample {index}, which the float model runs on: {ort_message(exc)}",
                role="quantized model",
            ) from exc
        if self.batches is not None:
            self.batches.saw(sample, f_vals, q_vals)
        if fresh:
            self._plain, self._adopted = (index, input_key(sample), f_vals, q_vals), False
        return f_vals, q_vals

    def infer_group(self, group: list[tuple[int, Mapping[str, np.ndarray]]]) -> dict[int, Ready]:
        """Each sample's values, from one batched inference when the group has several samples and batching
        holds (checked on the first batch), else one inference per sample."""
        t0 = time.perf_counter()
        if len(group) > 1 and self.batches is not None and self.batches.reason is None:
            batch = self.batches.infer(self, group)
            if batch is not None:
                self._plain = None  # batching: the sets of bound outputs are not used
                self.infer_seconds = (time.perf_counter() - t0) / len(group)
                return {i: (batch, k) for k, i in enumerate(batch.indices)}
            t0 = time.perf_counter()
        values: dict[int, Ready] = {i: self.infer_alone(i, s) for i, s in group}
        self.infer_seconds = (time.perf_counter() - t0) / len(group)
        return values
