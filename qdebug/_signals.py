"""Ctrl-C and SIGTERM put off while a temporary file or folder is made (:func:`signals_held`).

Kept apart from :mod:`qdebug.io` (the file layer) so that the CLI installs its handlers before importing anything
else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["deferring", "signals_held"]


class _Held:
    """The main thread's :func:`signals_held` depth, and the raise a :func:`deferring` handler put off."""

    depth = 0
    pending: Callable[[], None] | None = None


@contextmanager
def signals_held() -> Iterator[None]:
    """Put off what a :func:`deferring` signal handler raises (qdebug's CLI installs them for Ctrl-C and SIGTERM)
    while a temporary file or folder is made and its clean-up set up: raised in between, it would leave that behind.
    The put-off raise happens on leaving the block, where the clean-up is in place. (The signal mask cannot do this:
    a signal sent to the process is taken by whichever thread does not block it, and ONNX Runtime's threads do not.)
    Signal handlers run on the main thread only: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Held.depth += 1
    try:
        yield
    finally:
        _Held.depth -= 1
        if _Held.depth == 0 and _Held.pending is not None:
            pending, _Held.pending = _Held.pending, None
            pending()


def deferring(raise_it: Callable[[], None]) -> Callable[[int, Any], None]:
    """A signal handler that calls ``raise_it`` now, or at the end of the current :func:`signals_held` block."""

    def handler(signum: int, frame: Any) -> None:
        if _Held.depth:
            _Held.pending = raise_it
            return
        raise_it()

    return handler
