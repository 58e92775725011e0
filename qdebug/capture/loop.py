"""The one sample loop: every capture — one process (:func:`qdebug.capture.capture`) or a Ray worker's shard
(:mod:`qdebug.capture.ray_backend`) — reduces its samples through :class:`SampleLoop`.

Samples are read ahead of the current one, as many as the run's ``lookahead`` asks, and announced to its
``prefetch`` (a pipelining or batching run infers them early or together); a sample the run hands back as a
:class:`~qdebug.capture.base.Fallback` is redone by the fallback backend, its reason counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from qdebug.cancel import check_cancelled
from qdebug.capture.base import (
    FALLBACK_BACKEND,
    CaptureRun,
    CaptureSums,
    Fallback,
    ModelPair,
    OpenOptions,
    SampleSums,
    get_backend,
)
from qdebug.capture.tuning import CaptureTuning
from qdebug.errors import DataError

__all__ = ["SampleLoop"]

Indexed = tuple[int, Mapping[str, np.ndarray]]


class SampleLoop:
    """A run and, opened on first need, the fallback run that redoes its :class:`Fallback` samples; kept for
    several calls of :meth:`reduce_all` (a Ray worker's shards)."""

    def __init__(self, run: CaptureRun, pair: ModelPair, tuning: CaptureTuning) -> None:
        self.run, self.pair, self.tuning = run, pair, tuning
        self._opened: CaptureRun | None = None  # a fallback run this loop opened (and closes)

    def reduce_all(
        self,
        samples: Iterator[Indexed],
        sums: CaptureSums,
        done: Callable[[int], None] | None = None,
        where: str | None = None,
    ) -> None:
        """Reduce every ``(index, sample)`` of ``samples`` into ``sums``, in order; ``done(index)`` after each.
        ``where`` (the data's description) prefixes a :class:`DataError` a run raises: a run sees one sample."""
        run, ahead = self.run, deque[Indexed]()
        first = True

        def top_up() -> None:
            nonlocal first
            want = 1 + run.lookahead  # asked once per sample, as a run's answer changes only when it reduces
            while len(ahead) < want:
                item = next(samples, None)
                if item is None:
                    return
                ahead.append(item)
                if not first:  # every sample read after the first comes after the current one
                    run.prefetch(*item)
                first = False

        top_up()
        while ahead:
            check_cancelled()  # the dashboard's Cancel stops a capture between two samples
            index, sample = ahead.popleft()
            top_up()
            try:
                res = self._reduce(index, sample, sums)
            except DataError as exc:
                if where is None:
                    raise
                raise DataError(f"{where}: {exc}") from exc
            sums.add(index, res)
            if done is not None:
                done(index)

    def _reduce(self, index: int, sample: Mapping[str, np.ndarray], sums: CaptureSums) -> SampleSums:
        res = self.run.reduce(index, sample)
        if isinstance(res, Fallback):
            sums.fallbacks[res.reason] += 1
            res = self._fallback().reduce(index, sample)
            assert isinstance(res, SampleSums), "the fallback backend reduces every sample or raises"
        return res

    def _fallback(self) -> CaptureRun:
        """The run's own fallback run, else one of the fallback backend opened now (once)."""
        held = self.run.fallback
        if held is not None:
            return held
        if self._opened is None:
            self._opened = get_backend(FALLBACK_BACKEND).open(self.pair, OpenOptions(tuning=self.tuning))
        return self._opened

    def close(self) -> None:
        """Close the run and a fallback run this loop opened."""
        self.run.close()
        if self._opened is not None:
            self._opened.close()
