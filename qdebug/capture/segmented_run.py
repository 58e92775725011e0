"""The segmented fetch run: a :class:`~qdebug.capture.base.CaptureRun` over :class:`SegmentedFetch` for a pair
whose one sample would expose too many bytes at once (:mod:`qdebug.capture.segmented` cuts the models; this runs
the cut, one sample at a time, and says how).

It is chosen, not discovered: :func:`segment_cut` gives the cut for the first sample's input shapes (``None``: the
whole models fit), and whoever opens the fetch run (:mod:`qdebug.capture.compose`) opens a :class:`SegmentedRun`
for a cut, a plain :class:`~qdebug.capture.fetch.FetchRun` otherwise. A segment ORT cannot load on the first
sample (an op that needs what a cut separates) sends the run back to the whole models: the run opens them through
the factory it was given and reduces every sample through that run from then on, with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import onnx

from qdebug.capture.base import RunInfo, SampleSums
from qdebug.capture.dequant import find_specs, verified
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.capture.segmented import SegmentedFetch, SegmentPlan, exposed_bytes, plan_segments
from qdebug.capture.tuning import CaptureTuning, SegmentRule
from qdebug.errors import ModelError

__all__ = ["SegmentedRun", "WholeRun", "segment_cut"]

Reducer = Any  # Callable[[ReductionPlan, Mapping, Mapping], SampleSums] (qdebug.capture.bound.Reducer)


class WholeRun(Protocol):
    """What a segmented run hands its samples to once a segment could not be loaded: the whole models' fetch run."""

    reduce_seconds: float | None
    infer_seconds: float | None

    @property
    def lookahead(self) -> int: ...

    @property
    def pipelining(self) -> bool: ...

    def prefetch(self, index: int, sample: Mapping[str, np.ndarray]) -> None: ...

    def stop_batching(self, reason: str | None = None) -> None: ...

    def use_reducer(self, reducer: Reducer, batch_kernel: Any) -> None: ...

    def reduce(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums: ...

    def close(self) -> None: ...


def segment_cut(
    models: tuple[onnx.ModelProto, onnx.ModelProto],
    plan: ReductionPlan,
    shapes: Mapping[str, tuple[int, ...]],
    rule: SegmentRule,
    dequant: bool,
    providers: tuple[str, ...],
    tuning: CaptureTuning,
) -> tuple[SegmentPlan | None, dict[str, int] | None]:
    """The segments for samples of input ``shapes`` (``None``: the whole models) and one sample's estimated
    exposed bytes per float tensor (:func:`~qdebug.capture.segmented.exposed_bytes`; ``None``: unknown)."""
    float_model, quant_model = models
    weight = exposed_bytes(float_model, plan, shapes, tuning.probe_model_bytes)
    specs = find_specs(quant_model, plan.pairing) if dequant else None
    args = (float_model, quant_model, plan, shapes, rule.above, rule.budget)
    cut = plan_segments(*args, specs, weight)
    if cut is not None and cut.dequant:  # checked only when used; a spec ORT does not confirm is exposed
        good = verified(cut.dequant, quant_model, providers, tuning.wide_checks)
        if len(good) < len(cut.dequant):
            cut = plan_segments(*args, good, weight)
    return cut, weight


class SegmentedRun:
    """One sample at a time, segment by segment (:class:`SegmentedFetch`), reduced by the run's reducer; pipelined
    by segment (the next segment inferred while this one is reduced), never by sample: two samples' tensors are what
    segmenting avoids. ``whole(note, batch_reason)`` opens the whole models' run should a segment not load on the first
    sample (it holds no reference to this run: the run is freed as soon as it is dropped)."""

    def __init__(
        self,
        cut: SegmentPlan,
        models: tuple[onnx.ModelProto, onnx.ModelProto],
        providers: tuple[str, ...],
        rule: SegmentRule,
        whole: Callable[[str, str | None], WholeRun],
        pipelined: bool,
        batch: int = 1,
        reducer: Reducer = None,
        batch_kernel: Any = None,
        tuning: CaptureTuning | None = None,
        name: str = "fetch",
    ) -> None:
        self.tuning = tuning = tuning or CaptureTuning()
        self.name, self._whole_factory = name, whole
        self.reducer, self.batch_kernel = reducer, batch_kernel
        self.reduce_seconds: float | None = None  # the last sample's reductions alone (auto's cost model)
        self.infer_seconds: float | None = None  # the last sample's inference not hidden by them (auto's cost model)
        self.segmented: SegmentedFetch | None = SegmentedFetch(cut, models, providers, tuning, pipelined=pipelined)
        self.whole: WholeRun | None = None  # the whole models' run, once a segment could not be loaded
        self.segment_count = cut.count
        self.segment_note: str | None = (
            f"{cut.count} segments: one sample's tensors would take {cut.exposed_bytes / (1 << 20):.0f} MB "
            f"at once (more than {rule.above >> 20} MB)"
        )
        if cut.dequant:
            self.segment_note += f"; {len(cut.dequant)} post-Q/DQ tensors computed from their integers"
        #: a sample that has to be cut in parts cannot share a call with another one
        self.batch_reason = f"one sample is run in segments ({self.segment_note})" if batch > 1 else None
        self._no_batching = False  # batching decided off before the whole models' run took over

    @property
    def lookahead(self) -> int:
        """One sample read ahead, as a whole-model run that does not batch (announcing it changes nothing here);
        the whole models' run's once it took over."""
        return self.whole.lookahead if self.whole is not None else 1

    def prefetch(self, index: int, sample: Mapping[str, np.ndarray]) -> None:
        """Nothing: one sample at a time, an announced one would only be kept alive (the whole models' run, once it
        took over, may infer it early)."""
        if self.whole is not None:
            self.whole.prefetch(index, sample)

    @property
    def batch_size(self) -> int:
        """One sample per inference call."""
        return 1

    #: a segmented run's sessions keep ORT's default intra-op threads until a trial says otherwise (auto's)
    thread_note: str | None = None

    def stop_batching(self, reason: str | None = None) -> None:
        """Batching was decided off (``auto``, after sample 0): a segmented run never batches, but the whole models'
        run that took over does not either then."""
        self._no_batching = True
        if self.whole is not None:
            self.whole.stop_batching(reason)

    def use_reducer(self, reducer: Reducer, batch_kernel: Any) -> None:
        """Reduce with ``reducer`` from the next sample on (``auto`` switches to the compiled pass; ``batch_kernel``:
        its kernel module), the whole models' run too once it took over."""
        self.reducer, self.batch_kernel = reducer, batch_kernel
        if self.whole is not None:
            self.whole.use_reducer(reducer, batch_kernel)

    def rethreadable(self) -> SegmentedFetch | None:
        """The pipelined segments whose intra-op threads a trial may set (:class:`~qdebug.capture.threads.ThreadTrial`),
        while they run."""
        return self.segmented if self.segmented is not None and self.segmented.pipelined else None

    @property
    def fallback(self) -> None:
        """None: a fetch run reduces every sample itself (or raises)."""
        return None

    @property
    def pipelining(self) -> bool:
        """Whether the next segment's inference runs while this one is reduced (the whole models' run's, once it
        took over)."""
        if self.whole is not None:
            return self.whole.pipelining
        return self.segmented is not None and self.segmented.pipelined

    def batching(self) -> tuple[int, str | None]:
        """One sample per call, and why when more were asked for."""
        return 1, self.batch_reason

    def info(self) -> RunInfo:
        """This backend, its batching and its segments."""
        return RunInfo(self.name, None, *self.batching(), self.segment_count, self.segment_note)

    def close(self) -> None:
        """Stop the segments' worker thread (and the whole models' run's, if it took over)."""
        if self.segmented is not None:
            self.segmented.close()
        if self.whole is not None:
            self.whole.close()

    def reduce(
        self, index: int, sample: Mapping[str, np.ndarray], sized: Callable[[], None] | None = None
    ) -> SampleSums:
        """Segment by segment; if a segment cannot be made into a session on the first sample (an op that needs
        what a cut separates), the run goes back to the whole models, and says so. ``sized`` is not called: a
        segmented sample's size is not one call's tensors."""
        if self.whole is not None:
            return self._by_whole(index, sample)
        assert self.segmented is not None
        t0 = time.perf_counter()
        try:
            sums, reduce_s, infer_s = self.segmented.reduce(index, sample, self.reducer)
        except ModelError as exc:
            if self.segmented.ran or self.segmented.load_failure is None:
                raise
            self.segmented.close()
            self.segmented, self.segment_count = None, 1
            self.segment_note = f"not segmented: a segment could not be loaded ({exc})"
            self.whole = self._whole_factory(self.segment_note, self.batch_reason)
            self.whole.use_reducer(self.reducer, self.batch_kernel)  # auto may have switched it
            if self._no_batching:
                self.whole.stop_batching()
            return self._by_whole(index, sample)
        # with the segments pipelined, inference ran beside the reduction: auto weighs the part above it
        self.reduce_seconds = reduce_s
        self.infer_seconds = infer_s if self.segmented.pipelined else time.perf_counter() - t0 - reduce_s
        return sums

    def _by_whole(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums:
        """A sample on the whole models' run."""
        assert self.whole is not None
        sums = self.whole.reduce(index, sample)
        self.reduce_seconds, self.infer_seconds = self.whole.reduce_seconds, self.whole.infer_seconds
        return sums
