"""Pipelining for a whole-model fetch run (:class:`~qdebug.capture.fetch.FetchRun`): the next announced samples
are inferred on a worker thread while this thread reduces the current ones — ONNX Runtime and numpy each keep a
core busy instead of taking turns; the sums are those of the sequential run (same arrays, same order).

:class:`Pipelining` is the strategy a fetch run is opened with when it may pipeline (two or more cores:
:func:`~qdebug.capture.compose.fetch_layout`); it holds the worker, the samples being inferred on it, the set of
bound outputs being made on it (:mod:`qdebug.capture.output_sets`) and the buffer it touches during sample 0 for
that set (:mod:`qdebug.capture.arena`). It pipelines only once the first sample has shown that the tensors fit in
``tuning.pipeline_bytes`` (:meth:`Pipelining.active`); above it peak memory stays one sample's (or batch's)
tensors. Each submission hands the worker the GIL (:func:`~qdebug.capture.threads.submit_started`).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from qdebug.capture.arena import touched
from qdebug.capture.bound import Ready
from qdebug.capture.threads import submit_started
from qdebug.capture.tuning import CaptureTuning

__all__ = ["PipelineHost", "Pipelining"]

Group = list[tuple[int, Mapping[str, np.ndarray]]]


class PipelineHost(Protocol):
    """What pipelining uses of the fetch run it serves."""

    @property
    def pipelining(self) -> bool: ...

    def next_group(self, current: int) -> Group | None: ...

    def prime_next(self, group: Group, current: int) -> None: ...

    def infer_group(self, group: Group) -> dict[int, Ready]: ...


class Pipelining:
    """The worker thread of a pipelined fetch run and what runs on it."""

    def __init__(self, tuning: CaptureTuning) -> None:
        self.tuning = tuning
        self.pool: ThreadPoolExecutor | None = None
        #: the samples being inferred on the worker, and their values to come
        self.pending: tuple[frozenset[int], Future[dict[int, Ready]]] | None = None
        #: a set of bound outputs being made on the worker (its index in the run's sets)
        self.prep: tuple[int, Future[None]] | None = None
        #: one sample's estimated exposed bytes (:func:`~qdebug.capture.arena.estimate_bytes`) when the worker
        #: touches a buffer that size during sample 0's inference for the second set of bound outputs (0: not)
        self.arena_bytes = 0
        self.arenas: list[Future[np.ndarray]] = []  # that buffer, until a set takes it (``pop()``: one set only)

    def active(self, sample_bytes: int | None, batch_size: int) -> bool:
        """Whether the next samples' inference may run while this one is reduced: once one sample's size is known
        and a call's tensors (``batch_size`` samples) fit in ``pipeline_bytes``."""
        return sample_bytes is not None and sample_bytes * batch_size <= self.tuning.pipeline_bytes

    def worker(self) -> ThreadPoolExecutor:
        """The one worker thread that infers ahead (made on first use)."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="qdebug-infer")
        return self.pool

    def touch_arena(self) -> None:
        """Sample 0: its inference runs on this thread, the worker is idle — it populates the buffer then."""
        if self.arena_bytes:
            self.arenas.append(self.worker().submit(touched, self.arena_bytes))
            self.arena_bytes = 0

    def take_arena(self) -> np.ndarray | None:
        """The touched buffer, to the one set that takes it (``None``: none left). Called on either thread."""
        try:
            return self.arenas.pop().result()
        except IndexError:
            return None

    def collect(self, index: int, ready: dict[int, Ready]) -> None:
        """Sample ``index``'s values into ``ready`` if the worker is inferring them (waiting for it; its
        DataError / ModelError is raised here)."""
        pending = self.pending
        if index not in ready and pending is not None and index in pending[0]:
            self.pending = None
            ready.update(pending[1].result())

    def start_next(self, run: PipelineHost, current: int) -> None:
        """When pipelining and the worker is idle, start inferring the run's next announced group on it."""
        if not run.pipelining or self.pending is not None:
            return
        group = run.next_group(current)
        if group is None:
            return
        run.prime_next(group, current)
        idle = self.prep is None or self.prep[1].done()  # else the worker is making a set: do not wait for it
        wait = self.tuning.started_wait_s if idle else 0.0
        self.pending = (frozenset(i for i, _ in group), submit_started(self.worker(), wait, run.infer_group, group))

    def close(self) -> None:
        """Stop the worker thread (a pending inference finishes first) and let go of an untaken buffer."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        self.arenas.clear()
