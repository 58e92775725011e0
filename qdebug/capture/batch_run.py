"""Batching for a whole-model fetch run (:class:`~qdebug.capture.fetch.FetchRun`): up to ``limit`` announced
samples of the same input shapes run as one inference call, checked on the first batch against a sample alone
(:mod:`qdebug.capture.batching` says what is checked and why); a batch is reduced whole when its first sample is
asked for (:func:`~qdebug.capture.kernels.batched.reduce_batch`).

:class:`Batching` is the strategy a fetch run delegates its grouping and its batched calls to when it is opened
with ``batch`` > 1 (a run opened with one sample per call has none); ``auto`` ends it after sample 0 through
:meth:`~qdebug.capture.fetch.FetchRun.stop_batching` when batches would not pay. What it needs of the run is
:class:`BatchHost`: the sessions, the plan, one sample inferred alone, one sample's values reduced.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import onnx

from qdebug.capture.base import SampleSums
from qdebug.capture.batching import InputKey, Shapes, batch_axes, batch_views, input_key, mismatch, stack, stackable
from qdebug.capture.bound import Batch, Values, batch_tensors
from qdebug.capture.dequant import Dequantized, DequantSpec
from qdebug.capture.kernels.batched import reduce_batch
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.capture.tuning import CaptureTuning
from qdebug.ort import ort_errors, ort_message

__all__ = ["BatchHost", "Batching", "reduce_from_batch"]

Indexed = tuple[int, Mapping[str, np.ndarray]]


class BatchHost(Protocol):
    """What batching uses of the fetch run it serves."""

    plan: ReductionPlan
    q_names: list[str]
    q_specs: dict[str, DequantSpec]
    f_sess: Any
    q_sess: Any
    batch_kernel: Any
    tuning: CaptureTuning

    @property
    def reducer(self) -> Any: ...

    def infer_alone(self, index: int, sample: Mapping[str, np.ndarray]) -> Values: ...

    def reduce_values(self, values: Values) -> SampleSums: ...


class Batching:
    """Up to ``limit`` samples per inference call (``reason``: why batching stopped or never started, ``None``
    while it holds); :attr:`used` is the largest batch that ran."""

    def __init__(
        self, limit: int, float_model: onnx.ModelProto, tuning: CaptureTuning, reason: str | None = None
    ) -> None:
        self.limit, self.used, self.reason, self.tuning = limit, 1, reason, tuning
        self.verified = False  # the first batch has been checked against a sample alone
        self.axes = batch_axes(float_model)
        #: every real input of the model has an axis to stack samples on (batching is possible at all)
        self.stackable = stackable(float_model)
        self.alone: dict[InputKey, tuple[Shapes, Shapes]] = {}  # tensor shapes of one sample, per input shapes

    def expected(self, sample_bytes: int, min_batch: int) -> int:
        """Samples per call expected from an estimate of one sample's exposed bytes: those that fit a batch when at
        least ``min_batch`` do, else one (``auto`` then runs one sample per call)."""
        fit = min(self.limit, self.tuning.batch_bytes // sample_bytes)
        return fit if self.stackable and fit >= min_batch else 1

    def size(self, sample_bytes: int | None) -> int:
        """How many samples the next inference call may take (1 until the first sample's size is known)."""
        if self.limit <= 1 or self.reason is not None or not sample_bytes:
            return 1
        return max(1, min(self.limit, self.tuning.batch_bytes // sample_bytes))

    def info(self, sample_bytes: int | None) -> tuple[int, str | None]:
        """The most samples one inference call took, and why batching stopped or never started."""
        if self.limit <= 1 or self.reason is not None or self.used > 1:
            return self.used, self.reason
        room = self.tuning.batch_bytes
        if sample_bytes and 2 * sample_bytes > room:
            mb = sample_bytes / (1 << 20)
            return 1, f"one sample's tensors take {mb:.0f} MB: two do not fit in {room >> 20} MB"
        return 1, "no two consecutive samples had the same input shapes"

    def saw(self, sample: Mapping[str, np.ndarray], f_vals: Sequence[np.ndarray], q_vals: Sequence[np.ndarray]) -> None:
        """A sample inferred alone: its tensors' shapes are how a batch of its input shapes splits."""
        self.alone.setdefault(
            input_key(sample), (tuple(tuple(v.shape) for v in f_vals), tuple(tuple(v.shape) for v in q_vals))
        )

    def group(self, queued: list[Indexed], group: list[Indexed], sample_bytes: int | None) -> list[Indexed]:
        """``group`` (one sample) and the next announced samples of the same input shapes, up to :meth:`size`;
        taken out of ``queued``. A sample of input shapes not seen alone yet runs alone (its shapes are needed to
        split)."""
        key = input_key(group[0][1])
        if key not in self.alone:
            return group
        while queued and len(group) < self.size(sample_bytes):
            i, s = queued[0]
            if i != group[-1][0] + 1 or input_key(s) != key:
                break
            group.append(queued.pop(0))
        return group

    def infer(self, host: BatchHost, group: list[Indexed]) -> Batch | None:
        """The group's values from one batched call, or ``None`` (and :attr:`reason` set) when the model does not
        batch; a sample the batch fails on is then run alone, which names it if it is bad."""
        n, errors = len(group), ort_errors()
        stacked = stack([s for _, s in group], self.axes)
        if stacked is None:
            self.reason = "an input has no axis to stack samples on"
            return None
        try:
            f_b = host.f_sess.run(host.plan.float_names, stacked)
            q_b = host.q_sess.run(host.q_names, stacked)
        except errors as exc:
            self.reason = f"ONNX Runtime cannot run {n} samples at once: {ort_message(exc)}"
            return None
        f_shapes, q_shapes = self.alone[input_key(group[0][1])]
        f_views = batch_views(f_b, host.plan.float_names, f_shapes, n)
        q_views = batch_views(q_b, host.q_names, q_shapes, n)
        if isinstance(f_views, str) or isinstance(q_views, str):
            self.reason = f_views if isinstance(f_views, str) else str(q_views)
            return None
        batch = Batch(
            [i for i, _ in group],
            batch_tensors(host.plan.float_names, f_views, f_shapes, n),
            batch_tensors(host.q_names, q_views, q_shapes, n, host.q_specs),
        )
        if not self.verified:  # once per run: the first batched sample against itself alone
            f1, q1 = host.infer_alone(*group[0])
            f0, q0 = batch.values(0, (host.plan.float_names, host.q_names))
            # integers standing for post-Q/DQ tensors are compared as the floats they stand for: a rounding
            # difference the float tolerance accepts can move an integer by one
            q0, q1 = _posts(host, q0), _posts(host, q1)
            why = mismatch(f0, f1, host.plan.float_names) or mismatch(q0, q1, host.plan.quant_names)
            if why is not None:
                self.reason = f"batching changes the values: {why}"
                return None
            self.verified = True
        self.used = max(self.used, n)
        return batch


def _posts(host: BatchHost, q_values: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The quantized model's values in plan order, post-Q/DQ tensors computed from their integers."""
    q = dict(zip(host.q_names, q_values, strict=True))
    got = Dequantized(q, host.q_specs) if host.q_specs else q
    return [got[n] for n in host.plan.quant_names]


def reduce_from_batch(host: BatchHost, batch: Batch, index: int) -> tuple[SampleSums, float | None]:
    """Sample ``index``'s sums from its batch, which is reduced whole the first time one of its samples is asked
    for (:func:`~qdebug.capture.kernels.batched.reduce_batch`: a few numpy calls per tensor for all its samples,
    the compiled kernel for large tensors when the run reduces with it; another reducer: sample by sample), and
    then the seconds per sample that took (``None``: reduced before)."""
    seconds = None
    if batch.sums is None:
        assert batch.tensors is not None
        t0 = time.perf_counter()
        if host.reducer is reduce_sample or host.batch_kernel is not None:
            chunk = host.tuning.chunk_elements
            batch.sums = reduce_batch(host.plan, *batch.tensors, host.batch_kernel, chunk_elements=chunk)
        else:
            names = (host.plan.float_names, host.q_names)
            batch.sums = [host.reduce_values(batch.values(k, names)) for k in range(len(batch.indices))]
        batch.tensors = None
        seconds = (time.perf_counter() - t0) / len(batch.indices)
    return batch.sums[batch.indices.index(index)], seconds
