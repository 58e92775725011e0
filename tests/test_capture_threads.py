"""The thread trial's decisions (:mod:`qdebug.capture.threads`), fed known sample times: the run that uses it is
tested in tests/test_capture_segmented.py. And a pipelined whole-model run's intra-op threads
(:attr:`~qdebug.capture.tuning.CaptureTuning.small_call_elements`), on a real tiny model in ONNX Runtime."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest

from qdebug.capture import CaptureTuning, threads
from qdebug.capture.batch_run import Batching
from qdebug.capture.fetch import FetchRun
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.capture.pipelined import Pipelining
from qdebug.capture.segmented import exposed_bytes, mean_elements
from qdebug.capture.threads import ThreadTrial
from qdebug.data import open_data
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models


class Fetch:
    """Records the thread counts a trial asks for."""

    def __init__(self) -> None:
        self.asked: list[int | None] = []

    def set_threads(self, n: int | None) -> None:
        self.asked.append(n)


def _feed(trial: ThreadTrial, default: float, fewer: float) -> None:
    for _ in range(trial.tuning.trial_samples):
        trial.record(default)
    trial.record(99.0)  # the sample that makes the sessions again: not timed
    for _ in range(trial.tuning.trial_samples):
        trial.record(fewer)


def test_fewer_threads_are_kept_when_faster_by_the_margin() -> None:
    fetch = Fetch()
    trial = ThreadTrial(fetch, cores=2, remaining=100)
    _feed(trial, 0.160, 0.140)
    assert fetch.asked == [1] and not trial.active
    assert trial.note is not None and "on 1 intra-op thread" in trial.note and "140 vs 160 ms" in trial.note


@pytest.mark.parametrize("fewer", [0.155, 0.200])
def test_the_default_comes_back_otherwise(fewer: float) -> None:
    fetch = Fetch()
    trial = ThreadTrial(fetch, cores=2, remaining=100)
    _feed(trial, 0.160, fewer)
    assert fetch.asked == [1, None] and not trial.active
    assert trial.note is not None and "default threads kept" in trial.note


@pytest.mark.parametrize(("cores", "remaining"), [(1, 1000), (2, CaptureTuning().trial_min_remaining - 1)])
def test_no_trial_on_one_core_or_a_short_run(cores: int, remaining: int) -> None:
    fetch = Fetch()
    trial = ThreadTrial(fetch, cores=cores, remaining=remaining)
    _feed(trial, 0.160, 0.100)
    assert fetch.asked == [] and not trial.active and trial.note is None


# -- a pipelined whole-model run's threads: decided from the first sample's input shapes, before any sample runs --


def _whole_run(
    tiny_float: Path, quant: Path, cores: int = 2, tuning: CaptureTuning | None = None, **kw: Any
) -> FetchRun:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(quant))
    tuning = dataclasses.replace(tuning or CaptureTuning(), cores=cores)
    kw["pipeline"] = Pipelining(tuning) if kw.get("pipeline", True) else None
    batch = kw.pop("batch", 1)
    kw["batching"] = Batching(batch, fm, tuning) if batch > 1 else None
    return FetchRun(
        fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], input_shapes=_shapes(fm), tuning=tuning, **kw
    )


def _shapes(fm: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """One sample's input shapes (what ``debug`` passes as ``input_shapes``)."""
    sample = next(iter(open_data(None, input_specs(fm), num_samples=1, seed=0)))
    return {k: tuple(v.shape) for k, v in sample.items()}


def _intra_op(sess: Any) -> int:
    return int(sess.get_session_options().intra_op_num_threads)


def test_small_tensors_leave_a_core_to_the_reduction(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    run = _whole_run(tiny_float, tiny_quant("u8"), cores=2)
    assert run.threads == 1 and _intra_op(run.f_sess) == 1 and _intra_op(run.q_sess) == 1
    assert run.thread_note is not None and "a core left to the reduction" in run.thread_note
    run4 = _whole_run(tiny_float, tiny_quant("u8"), cores=4)
    assert run4.threads == 3 and _intra_op(run4.f_sess) == 3


@pytest.mark.parametrize("case", ["large", "sequential", "one core", "no shapes"])
def test_otherwise_ort_keeps_its_threads(case: str, tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    # large: every tiny tensor counts as large
    tuning = CaptureTuning(small_call_elements=1) if case == "large" else None
    kw: dict[str, Any] = {"pipeline": case != "sequential"}
    run = _whole_run(tiny_float, tiny_quant("u8"), cores=1 if case == "one core" else 2, tuning=tuning, **kw)
    if case == "no shapes":
        fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
        run = FetchRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], pipeline=Pipelining(CaptureTuning()))
    assert run.threads is None and run.thread_note is None
    assert _intra_op(run.f_sess) == 0 and _intra_op(run.q_sess) == 0  # 0: ORT's default, one per core


def test_a_run_that_will_batch_is_judged_by_its_calls(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm = onnx.load(str(tiny_float))
    shapes = _shapes(fm)
    plan = ReductionPlan.of(pair_models(fm, onnx.load(str(tiny_quant("u8")))))
    weight = exposed_bytes(fm, plan, shapes)
    assert weight is not None
    per_sample = mean_elements(weight, plan)
    # small per sample, large per call of 8 samples
    tuning = CaptureTuning(small_call_elements=int(per_sample * 2))
    assert _whole_run(tiny_float, tiny_quant("u8"), tuning=tuning, batch=8).threads is None
    assert _whole_run(tiny_float, tiny_quant("u8"), tuning=tuning, batch=1).threads == 1
    # fewer than min_batch would fit: auto runs one sample per call, judged per sample
    tuning = dataclasses.replace(tuning, batch_bytes=3 * sum(weight.values()))
    assert _whole_run(tiny_float, tiny_quant("u8"), tuning=tuning, batch=8, min_batch=4).threads == 1
    assert _whole_run(tiny_float, tiny_quant("u8"), tuning=tuning, batch=8, min_batch=2).threads is None


def test_submit_started_returns_once_the_worker_has_begun() -> None:
    """The caller goes on once the worker is inside the task — not when it ends, not after the bound — so the
    worker's first Python never waits for the GIL behind the caller's; a worker still busy with an earlier task is
    waited for at most the bound, without blocking."""
    from concurrent.futures import ThreadPoolExecutor

    go = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        future = threads.submit_started(pool, 60.0, lambda: go.wait(60) and 7)  # returning on the bound: a minute
        assert time.monotonic() - t0 < 30 and not future.done()  # returned on "began", the task still runs
        go.set()
        assert future.result() == 7
        release = threading.Event()
        busy = pool.submit(release.wait, 60)
        later = threads.submit_started(pool, 0.01, lambda: 8)  # returns although the worker has not begun it
        assert not later.done() and not busy.done()
        release.set()
        assert later.result() == 8
