"""The thread trial's decisions (:mod:`qdebug.capture.threads`), fed known sample times: the run that uses it is
tested in tests/test_capture_segmented.py."""

from __future__ import annotations

import pytest

from qdebug.capture import threads
from qdebug.capture.threads import ThreadTrial


class Fetch:
    """Records the thread counts a trial asks for."""

    def __init__(self) -> None:
        self.asked: list[int | None] = []

    def set_threads(self, n: int | None) -> None:
        self.asked.append(n)


def _feed(trial: ThreadTrial, default: float, fewer: float) -> None:
    for _ in range(threads.SAMPLES):
        trial.record(default)
    trial.record(99.0)  # the sample that makes the sessions again: not timed
    for _ in range(threads.SAMPLES):
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


@pytest.mark.parametrize(("cores", "remaining"), [(1, 1000), (2, threads.MIN_REMAINING - 1)])
def test_no_trial_on_one_core_or_a_short_run(cores: int, remaining: int) -> None:
    fetch = Fetch()
    trial = ThreadTrial(fetch, cores=cores, remaining=remaining)
    _feed(trial, 0.160, 0.100)
    assert fetch.asked == [] and not trial.active and trial.note is None
