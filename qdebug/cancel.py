"""Stopping long work when asked (the dashboard's Cancel): a :class:`CancelToken` set from another thread, checked
by the work where it can stop cleanly.

The work runs inside :func:`cancellable` (the token is a context variable: the thread that runs the work sees it,
helper threads and other sessions do not). The engine checks it with :func:`check_cancelled` once per sample (the
capture loop, ORT's calibration reader) and every progress report, and :func:`run_process` runs a worker process
(QNN's compile, the Deeploy and PTQ workers, the host compiler) so that a cancel kills it with everything it started
and the caller's clean-up removes its folder. A cancel raises :class:`Cancelled`, a ``KeyboardInterrupt``: every
clean-up a Ctrl-C runs runs, and no ``except Exception`` mistakes it for a failure of the step.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

__all__ = ["POLL_S", "CancelToken", "Cancelled", "cancellable", "check_cancelled", "run_process"]

#: How often a waiting :func:`run_process` looks at the token (s): a cancel stops a worker within this.
POLL_S = 0.2


class Cancelled(KeyboardInterrupt):
    """The work was cancelled through its :class:`CancelToken` (handled like a Ctrl-C: clean-ups run, nothing is
    half-written)."""


class CancelToken:
    """A request to stop, set once (:meth:`cancel`, from any thread) and checked by the work (:meth:`check`)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        """Ask the work to stop at its next check."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._event.is_set()

    def check(self) -> None:
        """Raise :class:`Cancelled` if :meth:`cancel` was called."""
        if self._event.is_set():
            raise Cancelled("cancelled")


_CURRENT: ContextVar[CancelToken | None] = ContextVar("qdebug_cancel_token", default=None)


@contextlib.contextmanager
def cancellable(token: CancelToken) -> Iterator[CancelToken]:
    """Run the block with ``token`` as the current token (what :func:`check_cancelled` checks)."""
    reset = _CURRENT.set(token)
    try:
        yield token
    finally:
        _CURRENT.reset(reset)


def check_cancelled() -> None:
    """Raise :class:`Cancelled` when the current token (:func:`cancellable`) was cancelled; no token: nothing."""
    token = _CURRENT.get()
    if token is not None:
        token.check()


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the worker's process group (it and whatever it started); gone already: nothing."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


#: The workers :func:`run_process` is waiting for: in a group of their own, they would outlive an interpreter that
#: exits while a thread waits for one (a dashboard kernel shut down mid-compile), so its exit kills them.
_RUNNING: set[subprocess.Popen[Any]] = set()
_RUNNING_LOCK = threading.Lock()


@atexit.register
def _kill_running() -> None:
    with _RUNNING_LOCK:
        for proc in list(_RUNNING):
            _kill_group(proc)


def run_process(cmd: Sequence[str], *, timeout: float | None = None, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(cmd, check=False, **kwargs)`` for a worker process: it runs in its own process group, which
    is killed when the current token is cancelled (:class:`Cancelled` raised), past ``timeout``
    (``subprocess.TimeoutExpired`` raised, as ``run`` does) or when anything else interrupts the caller (Ctrl-C)."""
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    deadline = None if timeout is None else time.monotonic() + timeout
    with subprocess.Popen(list(cmd), start_new_session=True, **kwargs) as proc:
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            while True:
                try:
                    out, err = proc.communicate(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass  # still running: look at the token and the deadline
                check_cancelled()
                if deadline is not None and time.monotonic() > deadline:
                    _kill_group(proc)
                    out, err = proc.communicate()
                    raise subprocess.TimeoutExpired(proc.args, timeout or 0.0, output=out, stderr=err)
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
