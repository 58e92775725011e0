"""What the dashboard says while it works and when it is done: each long step with its count and an estimate of the
time left (:class:`StepClock`), and a verdict on an output SQNR instead of a green "success" at any value
(:func:`verdict`). Pure Python, no widget: the views render the strings.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from qdebug.render.bands import SQNR_HIGH, SQNR_LOW
from qdebug.render.fmt import fmt_db_text


def _stage(message: str) -> str:
    """The part of a progress message that names the step ("base model: debugging sample 3/64" → "base model:
    debugging sample"), so the clock restarts when the step changes, not on every sample."""
    head = message.split("(", maxsplit=1)[0]
    return "".join(c for c in head if not c.isdigit()).strip()


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


@dataclass
class StepClock:
    """Turns ``progress(done, total, message)`` calls into "message — 12 s, about 40 s left".

    The estimate is the mean time per unit so far times the units left; it appears once one unit of a counted step
    (``total > 1``) is done and a second has passed. ``clock`` is injectable for tests.
    """

    clock: Callable[[], float] = time.monotonic
    _stage: str = ""
    _start: float = 0.0
    _done: int = 0

    def text(self, done: int, total: int, message: str) -> str:
        """The line to show for this progress call."""
        now = self.clock()
        stage = _stage(message)
        if stage != self._stage or done < self._done:  # a new step, or the same step started over
            self._stage, self._start = stage, now
        self._done = done
        elapsed = now - self._start
        if total > 1 and 0 < done < total and elapsed >= 1:  # under a second, "about 0 s left" would be noise
            left = elapsed / done * (total - done)
            return f"{message} — {_duration(elapsed)}, about {_duration(left)} left"
        if elapsed >= 1 and done < total:
            return f"{message} — {_duration(elapsed)}"
        return message


@dataclass(frozen=True)
class Verdict:
    """A reading of an output SQNR: ``kind`` is ``good`` / ``fair`` / ``poor`` / ``unknown``; ``text`` says it."""

    kind: str
    text: str

    @property
    def colour(self) -> str:
        """The colour of its band (the heatmap's reading)."""
        return {"good": "#2b8a3e", "fair": "#e67700", "poor": "#c92a2a"}.get(self.kind, "#495057")


def verdict(output_db: float | None) -> Verdict:
    """What a worst output SQNR means for the user (bands of :mod:`qdebug.render.bands`)."""
    shown = fmt_db_text(output_db)
    if output_db is None or (isinstance(output_db, float) and math.isnan(output_db)):
        return Verdict("unknown", "worst output SQNR n/a (the output could not be compared)")
    if output_db < SQNR_LOW:
        return Verdict(
            "poor",
            f"worst output SQNR {shown}: poor — below {SQNR_LOW:g} dB the quantized output is far from the float "
            "model's; look for the red tensors and promote them",
        )
    if output_db <= SQNR_HIGH:
        return Verdict("fair", f"worst output SQNR {shown}: fair — between {SQNR_LOW:g} and {SQNR_HIGH:g} dB")
    return Verdict("good", f"worst output SQNR {shown}: good — above {SQNR_HIGH:g} dB")


def hide_paths(text: str, folders: Iterable[Path]) -> str:
    """``text`` with every path inside one of ``folders`` (the page's private folders on the server: uploads, runs)
    written as its file name only: the user knows the file by the name they uploaded, and the server's temporary
    folders are none of the page's business."""
    for folder in folders:
        for root in dict.fromkeys((str(folder), str(folder.resolve()))):  # /tmp may be a link: both spellings
            text = re.sub(re.escape(root) + r"(/[^\s:;,()'\"]*)?", _name, text)
    return text


def _name(match: re.Match[str]) -> str:
    """A matched path inside a page's folder as the page writes it: its file name, or the folder itself."""
    inside = Path(match.group(1) or "/").name
    return inside or "this page's folder"


def user_text(exc: BaseException, folders: Iterable[Path] = ()) -> str:
    """An error as the page says it, on one line: a qdebug error's own sentence (it names the file and the fix); any
    other kind is a bug, said as one with its kind and where its traceback is. Paths inside ``folders`` are written
    by their file names (:func:`hide_paths`)."""
    from qdebug.errors import QDebugError

    text = " ".join(str(exc).split())
    if not isinstance(exc, QDebugError):
        text = f"Unexpected error ({type(exc).__name__}: {text}); the details are in this page's error.log"
    return hide_paths(text or type(exc).__name__, list(folders))


__all__ = ["StepClock", "Verdict", "hide_paths", "user_text", "verdict"]
