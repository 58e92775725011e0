"""The fetch run's pieces, each on its own: the layout that chooses them (:mod:`qdebug.capture.compose`), the
segmented run (:mod:`qdebug.capture.segmented_run`), batching (:mod:`qdebug.capture.batch_run`) and pipelining
(:mod:`qdebug.capture.pipelined`) — what each decides from :class:`~qdebug.capture.tuning.CaptureTuning`, and that
the run composed from them gives the plain run's sums."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdebug.capture import CaptureTuning
from qdebug.capture.base import ModelPair, OpenOptions, SampleSums
from qdebug.capture.batch_run import Batching
from qdebug.capture.compose import fetch_layout, open_fetch_run
from qdebug.capture.fetch import FetchRun
from qdebug.capture.pipelined import Pipelining
from qdebug.capture.segmented_run import SegmentedRun
from qdebug.capture.tuning import SegmentRule
from qdebug.data import open_data
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models

PROVIDERS = ("CPUExecutionProvider",)


def _pair(tiny_float: Path, quant: Path) -> ModelPair:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(quant))
    return ModelPair(fm, qm, pair_models(fm, qm), PROVIDERS)


def _samples(fm: onnx.ModelProto, n: int) -> list[dict[str, np.ndarray]]:
    return [dict(s) for s in open_data(None, input_specs(fm), num_samples=n, seed=5)]


def _shapes(sample: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sample.items()}


def _reduce(run: FetchRun | SegmentedRun, samples: list[dict[str, np.ndarray]]) -> list[SampleSums]:
    """What the capture loop does: announce ``lookahead`` samples ahead, reduce each in order."""
    got = []
    try:
        for i, s in enumerate(samples):
            for j in range(i + 1, min(len(samples), i + 1 + run.lookahead)):
                run.prefetch(j, samples[j])
            got.append(run.reduce(i, s))
    finally:
        run.close()
    return got


def _rows(sums: list[SampleSums]) -> np.ndarray:
    return np.array([[*x.cumulative.noise, *x.cumulative.signal, *x.outputs.noise] for x in sums])


def test_the_layout_is_decided_from_the_tuning(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    """Pipelined by the segment rule (else the usable cores), segmented only above the rule's threshold."""
    pair = _pair(tiny_float, tiny_quant("u8"))
    shapes = _shapes(_samples(pair.float_model, 1)[0])
    for cores in (1, 2):
        layout = fetch_layout(pair, OpenOptions(input_shapes=shapes, tuning=CaptureTuning(cores=cores)))
        assert layout.pipelined is (cores >= 2) and layout.cut is None and layout.weight is not None
    one_core = SegmentRule(False, 0, 1 << 12)  # a Ray worker's rule: one core, every sample cut
    layout = fetch_layout(pair, OpenOptions(input_shapes=shapes, segment_rule=one_core))
    assert not layout.pipelined and layout.cut is not None and layout.cut.count > 1
    assert fetch_layout(pair, OpenOptions(segment_rule=one_core)).cut is None  # no shapes: nothing to size


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("batch", [1, 4])
def test_each_composition_gives_the_plain_runs_sums(
    pipelined: bool, batch: int, tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """The plain run (one thread, one sample per call) and the run with pipelining, batching or both: the same sums,
    bit for bit one sample per call, to rounding in batches (a batch is reduced at once: another summation order,
    :mod:`qdebug.capture.batching`); the strategies are there only when chosen."""
    pair = _pair(tiny_float, tiny_quant("u8"))
    samples = _samples(pair.float_model, 7)
    plain = _reduce(FetchRun(*pair), samples)
    tuning = CaptureTuning(cores=2 if pipelined else 1)
    options = OpenOptions(samples=7, input_shapes=_shapes(samples[0]), batch=batch, tuning=tuning)
    run = open_fetch_run(pair, options, fetch_layout(pair, options), batch=batch)
    assert isinstance(run, FetchRun)
    assert (run.pipeline is not None) is pipelined and (run.batches is not None) is (batch > 1)
    got = _reduce(run, samples)
    if batch == 1:
        np.testing.assert_array_equal(_rows(got), _rows(plain))
    else:
        np.testing.assert_allclose(_rows(got), _rows(plain), rtol=1e-6)
    assert run.batching() == (batch if batch > 1 else 1, None)


def test_a_segmented_composition_gives_the_plain_runs_sums(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    """Segments chosen by the layout: the segmented run, its sums the whole run's, one sample per call."""
    pair = _pair(tiny_float, tiny_quant("u8"))
    samples = _samples(pair.float_model, 4)
    plain = _reduce(FetchRun(*pair), samples)
    tuning = dataclasses.replace(CaptureTuning(cores=2), segment_above=0, pipelined_above=0, segment_bytes=1 << 12)
    options = OpenOptions(samples=4, input_shapes=_shapes(samples[0]), batch=4, tuning=tuning)
    run = open_fetch_run(pair, options, fetch_layout(pair, options), batch=4)
    assert isinstance(run, SegmentedRun) and run.segment_count > 1 and run.pipelining
    assert run.rethreadable() is not None and run.batch_size == 1
    got = _reduce(run, samples)
    assert run.batching() == (1, run.batch_reason) and "run in segments" in (run.batch_reason or "")
    np.testing.assert_array_equal(_rows(got), _rows(plain))


def test_batching_sizes_its_calls_by_the_tuning(tiny_float: Path) -> None:
    """Up to ``limit`` samples per call, fewer when their tensors would exceed ``batch_bytes``; one until a sample's
    size is known or once batching has stopped, with the reason."""
    tuning = CaptureTuning(batch_bytes=1000)
    batching = Batching(8, onnx.load(str(tiny_float)), tuning)
    assert batching.stackable and batching.size(None) == 1
    assert batching.size(100) == 8 and batching.size(300) == 3 and batching.size(2000) == 1
    assert batching.expected(300, min_batch=4) == 1 and batching.expected(300, min_batch=2) == 3
    assert batching.info(600) == (1, "one sample's tensors take 0 MB: two do not fit in 0 MB")
    batching.reason = "an input has no axis to stack samples on"
    assert batching.size(100) == 1 and batching.info(100) == (1, batching.reason)


def test_pipelining_is_active_only_when_a_call_fits() -> None:
    """Once one sample's size is known and a call's tensors fit in ``pipeline_bytes``; its worker is made on first
    use and stopped by ``close``, which also lets go of an untaken buffer."""
    pipelining = Pipelining(CaptureTuning(pipeline_bytes=1000))
    assert not pipelining.active(None, 1)
    assert pipelining.active(500, 2) and not pipelining.active(500, 3)
    assert pipelining.pool is None and pipelining.take_arena() is None
    pipelining.arena_bytes = 64
    pipelining.touch_arena()
    assert pipelining.pool is not None and pipelining.arena_bytes == 0 and len(pipelining.arenas) == 1
    pipelining.close()
    assert pipelining.pool is None and pipelining.arenas == []


def test_a_composed_run_is_freed_as_soon_as_it_is_dropped(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    """No reference cycle between a run and its pieces (the segmented run and the factory of its whole-model stand-in,
    the plain run and its strategies): its sessions and arrays go when the run does, not at the next collection."""
    import gc
    import weakref

    pair = _pair(tiny_float, tiny_quant("u8"))
    samples = _samples(pair.float_model, 3)
    segmenting = CaptureTuning(cores=2, segment_above=0, pipelined_above=0, segment_bytes=1 << 12)
    gc.collect()
    gc.disable()
    try:
        for batch, tuning in ((4, CaptureTuning(cores=2)), (1, segmenting)):
            options = OpenOptions(samples=3, input_shapes=_shapes(samples[0]), batch=batch, tuning=tuning)
            run = open_fetch_run(pair, options, fetch_layout(pair, options), batch=batch)
            _reduce(run, samples)
            ref = weakref.ref(run)
            del run
            assert ref() is None
    finally:
        gc.enable()
