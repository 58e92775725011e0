"""Ctrl-C and SIGTERM during a command on a local Ray cluster (``--workers 2``): exit 130 / 143 with one line, and
nothing of the cluster left — no process (the control store, the raylet, its agents, the workers, the monitors) and
no folder in TMPDIR (Ray's session folder lives in a temporary folder of qdebug's).

Ray's start replaces the process's SIGTERM handler (its own exits with status 15) and its blocking calls turn a
handler's exception into a plain KeyboardInterrupt: qdebug puts its handlers back after the start and takes the exit
code from the signal received. Each case is a real ``qdebug`` process, signalled once its cluster reaches a state
(polled with psutil, never a sleep): the workers up, or — for a start cut short — the control store up and no
raylet yet. Every LISTEN socket of the run is checked too (tests/test_ray_security.py).

Five cluster start-ups. Ray is an optional extra: without it these tests skip locally and FAIL under ``CI=true``."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SAMPLE_MODELS
from ray_watch import is_loopback, leftovers, require_ray, wait_until_gone, watch, workers_up

from qdebug.config import QuantConfig
from qdebug.quantizer import quantize

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::ResourceWarning"
)

F = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """The run's TMPDIR, with a short path (Ray's socket paths in the cluster's folder must fit in 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="qdt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def qdq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits CNN's 8-bit QDQ model."""
    q = tmp_path_factory.mktemp("ray-signals") / "digits_cnn.qdq.onnx"
    quantize(F, CALIB, QuantConfig(), q)
    return q


def _starting(names: set[str]) -> bool:
    """The control store is up, the raylet not yet: inside ``ray.init``, where Ray's own SIGTERM handler is
    installed and Ray does not yet know every process it started."""
    return "gcs_server" in names and "raylet" not in names


#: command → its argv (the output file, if any, in ``{out}``): each runs long enough on two workers to be signalled
#: while they work (debug: 20 000 samples; quantize: 50 000 calibration samples; search: debug passes of 64 samples).
COMMANDS = {
    "debug": ["debug", "-f", str(F), "-q", "{q}", "--samples", "20000", "--workers", "2"],
    "quantize": ["quantize", "-f", str(F), "--samples", "50000", "-o", "{out}/q.onnx", "--workers", "2"],
    "search": [
        *("search", "-f", str(F), "--calib", str(CALIB), "--strategy", "greedy", "--goal-sqnr", "90"),
        *("--debug-samples", "64", "-o", "{out}/overrides.json", "--workers", "2"),
    ],
}
CASES = [
    ("debug", signal.SIGINT, workers_up),
    ("debug", signal.SIGTERM, _starting),
    ("quantize", signal.SIGTERM, workers_up),
    ("search", signal.SIGTERM, workers_up),
    ("search", signal.SIGINT, workers_up),
]


@pytest.mark.parametrize(
    ("command", "signum", "when"),
    CASES,
    ids=[f"{c}-{s.name}-{'starting' if w is _starting else 'working'}" for c, s, w in CASES],
)
def test_a_signal_stops_the_command_and_its_cluster(
    command: str,
    signum: signal.Signals,
    when: Callable[[set[str]], bool],
    qdq: Path,
    short_tmp: Path,
    tmp_path: Path,
) -> None:
    require_ray()

    def send(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signum)

    argv = [a.format(q=qdq, out=tmp_path) for a in COMMANDS[command]]
    run = watch(argv, short_tmp, until=when, then=send)
    assert run.triggered, (run.code, run.stderr, run.names())
    expected = (130, "qdebug: interrupted") if signum == signal.SIGINT else (143, "qdebug: terminated")
    assert (run.code, run.stderr.strip()) == expected, run.stderr
    assert wait_until_gone(run, str(short_tmp)) == []
    assert leftovers(short_tmp) == []
    assert list(tmp_path.iterdir()) == []  # no output, not even a partial one
    assert [str(s) for s in run.sockets if not is_loopback(s.ip)] == []
