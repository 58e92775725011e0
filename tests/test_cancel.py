"""The cooperative cancel (:mod:`qdebug.cancel`, the dashboard's Cancel): a cancelled token stops the capture loop and
ORT's calibration between two samples, and a worker process (with what it started) within a poll; a timeout still
kills it as ``subprocess.run`` did; outside a token nothing changes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from qdebug.cancel import POLL_S, Cancelled, CancelToken, cancellable, check_cancelled, run_process
from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions, debug
from qdebug.quantizer import quantize

#: A worker that starts a grandchild and writes its pid, then both sleep.
_WORKER = (
    "import subprocess, sys, time; "
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "open(sys.argv[1], 'w').write(str(g.pid)); time.sleep(60)"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie (killed, not yet reaped by its parent) is gone too
        return fh.read().split()[2] != "Z"


def test_cancel_kills_a_worker_and_what_it_started(tmp_path: Path) -> None:
    token = CancelToken()
    pid_file = tmp_path / "grandchild.pid"

    def cancel_once_started() -> None:
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.05)
        token.cancel()

    threading.Thread(target=cancel_once_started, daemon=True).start()
    t0 = time.monotonic()
    with cancellable(token), pytest.raises(Cancelled):
        run_process([sys.executable, "-c", _WORKER, str(pid_file)], stdin=subprocess.DEVNULL)
    assert time.monotonic() - t0 < 20  # the worker alone would sleep 60 s
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert not _alive(grandchild), "the worker's child outlived the cancel"


def test_run_process_is_subprocess_run_without_a_cancel() -> None:
    out = run_process([sys.executable, "-c", "print('hi')"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "hi\n"
    with pytest.raises(subprocess.TimeoutExpired):
        run_process([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    check_cancelled()  # no token: nothing to raise


def test_a_cancelled_token_stops_debug_and_quantize(tiny_float: Path, tiny_quant, tmp_path: Path) -> None:
    token = CancelToken()
    token.cancel()
    with cancellable(token):
        with pytest.raises(Cancelled):
            debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=4))
        with pytest.raises(Cancelled):
            quantize(tiny_float, None, QuantConfig(num_samples=4), tmp_path / "q.onnx")
    assert not list(tmp_path.iterdir())  # nothing half-written
    assert debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=2)).activations  # the token is gone


def test_an_interpreter_that_exits_mid_wait_kills_its_worker(tmp_path: Path) -> None:
    """A dashboard kernel shut down while a job's thread waits for a worker: the worker (in a process group of its
    own) must not outlive it."""
    pid_file = tmp_path / "worker.pid"
    code = (
        "import sys, threading, time, subprocess\n"
        "from qdebug.cancel import run_process\n"
        "def job():\n"
        f"    run_process([sys.executable, '-c', {_WORKER!r}, {str(pid_file)!r}], stdin=subprocess.DEVNULL)\n"
        "threading.Thread(target=job, daemon=True).start()\n"
        f"while not __import__('os').path.getsize({str(pid_file)!r}) if __import__('os').path.exists("
        f"{str(pid_file)!r}) else True:\n"
        "    time.sleep(0.05)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert not _alive(grandchild), "the worker's group outlived the interpreter"
