"""How far a build is: one line per phase (quantize → compile → simulate N samples → remedies i/k → top-1), and for
a stretch of samples done/total, seconds per sample and the time left (the CLI puts the elapsed time in front).

:class:`BuildProgress` wraps the caller's :data:`~qdebug.targets.base.ProgressFn` (a line of text each call);
:meth:`BuildProgress.counted` wraps a :class:`~qdebug.data.DataSource` so that whoever iterates it (the target's
check, a remedy trial) reports its samples without knowing about progress. Sample lines are spaced at least
:attr:`BuildProgress.every_s` apart (first and last always), so a log holds a few lines per phase, not one per sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from qdebug.data import DataSource, Sample
from qdebug.targets.base import ProgressFn

__all__ = ["BuildProgress", "clock"]


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour)."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class BuildProgress:
    """The build's progress lines; :attr:`start` is when the build started (``now``'s clock: a time budget's
    deadline is measured from it)."""

    def __init__(self, say: ProgressFn, *, every_s: float = 5.0, now: Callable[[], float] = time.monotonic) -> None:
        self.say, self.every_s, self.now = say, every_s, now
        self.start = now()

    def __call__(self, message: str) -> None:
        """One line."""
        self.say(message)

    def samples(self, what: str, done: int, total: int, seconds: float) -> None:
        """``what: done/total samples, s per sample, ETA m:ss`` (the rate of the samples done so far)."""
        per = seconds / done if done else 0.0
        eta = per * (total - done)
        tail = f", ETA {clock(eta)}" if done < total else f", {clock(seconds)} in all"
        self(f"{what}: {done}/{total} samples, {per:.2f} s/sample{tail}")

    def counted(self, source: DataSource, what: str) -> DataSource:
        """``source``, reporting each sample as the next is asked for (or the iteration ends)."""
        return _Counted(source, what, self)


class _Counted:
    """A data source that reports the samples taken from it (:meth:`BuildProgress.samples`)."""

    def __init__(self, source: DataSource, what: str, progress: BuildProgress) -> None:
        self.source, self.what, self.progress = source, what, progress
        self.description = source.description

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)  # anything else a consumer asks of the source (e.g. sample(i))

    def __iter__(self) -> Iterator[Sample]:
        total, now = len(self.source), self.progress.now
        t0 = last = now()
        for done, sample in enumerate(self.source, 1):
            yield sample  # the consumer asks for the next one: this one is done
            t = now()
            if done in (1, total) or t - last >= self.progress.every_s:
                self.progress.samples(self.what, done, total, t - t0)
                last = t
