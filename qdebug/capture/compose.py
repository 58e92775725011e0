"""How a fetch run is put together, by explicit decisions from :class:`~qdebug.capture.tuning.CaptureTuning` and
the first sample's input shapes: :func:`fetch_layout` decides whether one sample runs whole or in segments (and
whether the run pipelines), :func:`open_fetch_run` opens the run that layout calls for — a
:class:`~qdebug.capture.segmented_run.SegmentedRun` for a cut, else a plain
:class:`~qdebug.capture.fetch.FetchRun` — and :class:`FetchBackend` is the ``fetch`` backend that does both.
``auto`` and ``compiled`` open their fetch runs here too, so every fetch run is chosen the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from qdebug.capture.base import FALLBACK_BACKEND, CaptureRun, ModelPair, OpenOptions, SampleSums
from qdebug.capture.batch_run import Batching
from qdebug.capture.fetch import FetchRun, usable_cores
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.capture.pipelined import Pipelining
from qdebug.capture.segmented import SegmentPlan
from qdebug.capture.segmented_run import SegmentedRun, segment_cut
from qdebug.capture.threads import Rethreadable
from qdebug.capture.tuning import SegmentRule

__all__ = ["FetchBackend", "FetchLayout", "FetchingRun", "fetch_layout", "open_fetch_run"]


class FetchingRun(CaptureRun, Protocol):
    """What ``auto`` reads and sets on the fetch run it keeps (a plain or a segmented one): its costs, its
    reducer, its batching and segments."""

    reducer: Any
    batch_kernel: Any
    reduce_seconds: float | None
    infer_seconds: float | None
    segment_count: int
    segment_note: str | None
    thread_note: str | None

    @property
    def pipelining(self) -> bool: ...

    @property
    def batch_size(self) -> int: ...

    def batching(self) -> tuple[int, str | None]: ...

    def stop_batching(self, reason: str | None = None) -> None: ...

    def use_reducer(self, reducer: Any, batch_kernel: Any) -> None: ...

    def rethreadable(self) -> Rethreadable | None: ...

    def reduce(
        self, index: int, sample: Mapping[str, np.ndarray], sized: Callable[[], None] | None = None
    ) -> SampleSums: ...


@dataclass(frozen=True)
class FetchLayout:
    """How a fetch run is laid out: pipelined or not, by which segment rule, the segments (``None``: the whole
    models) and one sample's estimated exposed bytes per float tensor (``None``: unknown)."""

    pipelined: bool
    rule: SegmentRule
    cut: SegmentPlan | None
    weight: dict[str, int] | None


def fetch_layout(pair: ModelPair, options: OpenOptions, dequant: bool = False) -> FetchLayout:
    """The layout of a fetch run for ``pair``: pipelined by ``options.segment_rule`` (default: two or more usable
    cores), segmented when one sample of ``options.input_shapes`` would expose more than the rule's threshold
    (``dequant``: exposing quantized integers in place of the post-Q/DQ floats where ORT confirms them)."""
    rule = options.segment_rule
    pipelined = rule.pipelined if rule is not None else usable_cores(options.tuning) >= 2
    rule = rule or SegmentRule.for_cores(2 if pipelined else 1, options.tuning)
    if not options.input_shapes:
        return FetchLayout(pipelined, rule, None, None)
    plan = ReductionPlan.of(pair.pairing)
    models, providers = (pair.float_model, pair.quant_model), tuple(pair.providers)
    cut, weight = segment_cut(models, plan, options.input_shapes, rule, dequant, providers, options.tuning)
    return FetchLayout(pipelined, rule, cut, weight)


def open_fetch_run(
    pair: ModelPair,
    options: OpenOptions,
    layout: FetchLayout,
    batch: int,
    reducer: Any = reduce_sample,
    batch_kernel: Any = None,
    dequant_whole: bool = False,
    min_batch: int = 2,
    name: str = FALLBACK_BACKEND,
) -> FetchRun | SegmentedRun:
    """The run ``layout`` calls for: segmented (and, should a segment not load, the whole models in its place),
    else the whole models' :class:`FetchRun` (a model ORT cannot load: :class:`~qdebug.errors.ModelError`)."""
    tuning, cut = options.tuning, layout.cut

    def pipelining() -> Pipelining | None:
        """The worker that infers ahead, when the layout pipelines (whole models: by sample)."""
        return Pipelining(tuning) if layout.pipelined else None

    def batching(reason: str | None = None) -> Batching | None:
        """Several samples per inference call, when more than one is asked for (``reason``: why it cannot)."""
        return Batching(batch, pair.float_model, tuning, reason) if batch > 1 else None

    if cut is None:
        return FetchRun(
            *pair,
            pipeline=pipelining(),
            batching=batching(),
            reducer=reducer,
            batch_kernel=batch_kernel,
            dequant_whole=dequant_whole,
            min_batch=min_batch,
            tuning=tuning,
            name=name,
            weight=layout.weight,
        )

    def whole(note: str, batch_reason: str | None) -> FetchRun:
        """The whole models in place of the segments (nothing folded apart, no integers exposed), with the reason
        (opened by the segmented run, once it has failed to load a segment)."""
        return FetchRun(
            *pair,
            pipeline=pipelining(),
            batching=batching(batch_reason),
            reducer=reducer,
            batch_kernel=batch_kernel,
            tuning=tuning,
            name=name,
            split_constants=False,
            segment_note=note,
        )

    segmented = SegmentedRun(
        cut,
        (pair.float_model, pair.quant_model),
        tuple(pair.providers),
        layout.rule,
        whole,
        pipelined=layout.pipelined,
        batch=batch,
        reducer=reducer,
        batch_kernel=batch_kernel,
        tuning=tuning,
        name=name,
    )

    return segmented


class FetchBackend:
    """Fetch every paired tensor and reduce it by the reference definition."""

    name = FALLBACK_BACKEND

    def open(self, pair: ModelPair, options: OpenOptions) -> FetchRun | SegmentedRun:
        """Two augmented sessions (a model ORT cannot load is a :class:`~qdebug.errors.ModelError`), or segments
        when one sample of ``options.input_shapes`` would expose too much at once (:func:`fetch_layout`)."""
        return open_fetch_run(pair, options, fetch_layout(pair, options), batch=options.batch or 1)
