"""How many intra-op threads a pipelined segmented run's inference gets: measured on the run, not guessed.

A pipelined segmented run (:mod:`qdebug.capture.segmented`) infers the next segment on a worker thread while the
main thread reduces this one. With ONNX Runtime's default — one intra-op thread per core — the two compete: three
busy threads on two cores. Whether leaving the reduction a core of its own wins depends on which side is longer,
and neither is known before the run (it goes either way on the corpus: ``benchmarks/bench_segment_threads.py``).

So :class:`ThreadTrial` measures both on the run's own samples once the compiled reduction is running: a few
samples with the default, the segment sessions rebuilt with one thread fewer than the cores, a few samples with that,
and it keeps the fewer threads only if they are faster by ``trial_margin``, else goes back. A run too short to repay
two rebuilds (fewer than ``trial_min_remaining`` samples left) keeps the default without trying.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from qdebug.capture.tuning import CaptureTuning

__all__ = ["ThreadTrial", "submit_started"]

_T = TypeVar("_T")


def submit_started(pool: ThreadPoolExecutor, wait_s: float, fn: Callable[..., _T], *args: Any) -> Future[_T]:
    """``pool.submit(fn, *args)``, returning once the worker has begun ``fn`` or after ``wait_s`` (the worker may
    still be finishing an earlier task; past it nothing is wrong, only the hand-over is not ensured; 0: no wait).

    The worker's few lines of Python before ONNX Runtime lets go of the GIL need the GIL; if the caller goes straight
    on to Python of its own (building a call table), the worker waits for it up to the interpreter's switch
    interval. Waiting here hands the GIL over at once: the worker runs until ORT releases it, then the caller
    goes on."""
    if wait_s <= 0:
        return pool.submit(fn, *args)
    began = threading.Event()

    def run() -> _T:
        began.set()
        return fn(*args)

    future = pool.submit(run)
    began.wait(wait_s)
    return future


class Rethreadable(Protocol):
    """What the trial needs of the run: set the segment sessions' intra-op threads (``None``: ORT's default)."""

    def set_threads(self, threads: int | None) -> None: ...


@dataclass
class ThreadTrial:
    """A/B of the segments' intra-op threads, fed one sample's wall time after another (:meth:`record`)."""

    fetch: Rethreadable
    cores: int
    remaining: int  # samples left when the trial is created
    tuning: CaptureTuning = field(default_factory=CaptureTuning)
    default: list[float] = field(default_factory=list)
    fewer: list[float] = field(default_factory=list)
    phase: str = "default"  # "default" -> "rebuild" -> "fewer" -> "done"
    note: str | None = None  # what was measured and kept, for the report

    def __post_init__(self) -> None:
        if self.cores < 2 or self.remaining < self.tuning.trial_min_remaining:
            self.phase = "done"

    @property
    def active(self) -> bool:
        """Whether samples are still being timed."""
        return self.phase != "done"

    def record(self, seconds: float) -> None:
        """One sample's wall time under the current thread count."""
        if self.phase == "default":
            self.default.append(seconds)
            if len(self.default) == self.tuning.trial_samples:
                self.fetch.set_threads(self.cores - 1)
                self.phase = "rebuild"  # the next sample also makes the sessions: not timed
        elif self.phase == "rebuild":
            self.phase = "fewer"
        elif self.phase == "fewer":
            self.fewer.append(seconds)
            if len(self.fewer) == self.tuning.trial_samples:
                self._decide()

    def _decide(self) -> None:
        base, alt = statistics.median(self.default), statistics.median(self.fewer)
        both = f"{alt * 1e3:.0f} vs {base * 1e3:.0f} ms/sample ({self.tuning.trial_samples} samples each)"
        threads = self.cores - 1
        if alt < (1 - self.tuning.trial_margin) * base:
            self.note = f"segment inference on {threads} intra-op thread(s), a core left to the reduction: {both}"
        else:
            self.fetch.set_threads(None)
            self.note = f"ONNX Runtime's default threads kept: {threads} thread(s) measured {both}"
        self.phase = "done"
