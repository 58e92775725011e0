"""A Ray cluster qdebug starts is private to the job (docs/scale.md, "Security"): every process of it listens on
127.0.0.1 only (Ray's control store has no authentication: a listener on another address lets anyone who reaches it
run code as the user), and nothing of it is left afterwards — no process, no session folder — whether the job ends
normally or with an error. Each test lists every LISTEN socket of every process of a real cluster (psutil).

Two cluster start-ups: one through :func:`qdebug.cluster.connect` in this process (also reached over ``--ray`` by a
second driver), one by a real ``qdebug debug --workers 2``. Ray is an optional extra: without it these tests skip
locally and FAIL under ``CI=true``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import SAMPLE_MODELS
from ray_watch import (
    Listener,
    cluster_processes,
    is_loopback,
    leftovers,
    listeners,
    require_ray,
    still_running,
    wait_until_gone,
    watch,
)

from qdebug.cluster import MARKER, TEMP_PREFIX, ClusterSpec, connect
from qdebug.config import QuantConfig
from qdebug.errors import EXIT_CLUSTER, ClusterError
from qdebug.quantizer import quantize

# Ray's own modules warn about their deprecated internals at import and start-up, and its process handles warn when
# collected after a shutdown: not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::ResourceWarning"
)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path (a local cluster's folder goes in it: Ray's socket paths inside must fit
    in 107 bytes, which pytest's own tmp_path does not leave room for)."""
    path = Path(tempfile.mkdtemp(prefix="qdt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def digits_qdq(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The bundled digits CNN and its 8-bit QDQ model."""
    q = tmp_path_factory.mktemp("ray-security") / "digits_cnn.qdq.onnx"
    quantize(SAMPLE_MODELS / "digits_cnn.onnx", SAMPLE_MODELS / "digits_calib.npz", QuantConfig(), q)
    return SAMPLE_MODELS / "digits_cnn.onnx", q


def _open(sockets: set[Listener]) -> list[str]:
    return sorted(str(s) for s in sockets if not is_loopback(s.ip))


def _with_sockets(sockets: set[Listener]) -> set[str]:
    return {s.name for s in sockets}


class JobError(Exception):
    """An error the job raises inside the cluster's block."""


def test_a_local_cluster_listens_on_127_0_0_1_only_and_leaves_nothing(
    short_tmp: Path, tmp_path: Path, digits_qdq: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process, through ``connect()``: the listeners of the control store, the raylet (node and object
    managers), two workers, the driver and Ray's agents are all on loopback; the environment and the signal handlers
    are this process's own inside the block; a second driver reaches the cluster over ``--ray 127.0.0.1:PORT`` and
    listens on loopback too, one without the cluster's token is refused; an error inside the block stops every process
    and removes the folder (and no token is left in the home folder)."""
    ray = require_ray()
    assert not ray.is_initialized(), "another test left Ray running in this process"
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    monkeypatch.setenv("HOME", str(tmp_path))  # where a Ray with token authentication leaves its token, unasked
    env, handlers = dict(os.environ), [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    seen: list[psutil.Process] = []
    # this process's children from before (a browser test's chromium in the same session) are not the cluster's
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(JobError), connect(ClusterSpec(workers=2)) as cluster:
        assert cluster.started and cluster.workers == 2
        assert dict(os.environ) == env and [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == handlers
        (root,) = [p for p in short_tmp.iterdir() if p.name.startswith(TEMP_PREFIX)]
        seen = _check_listeners(ray, root, before)
        _check_a_second_driver(ray, digits_qdq, short_tmp, root)
        # more workers than the cluster has CPUs: refused (oversubscription is allowed only to pass the core limit)
        with pytest.raises(ClusterError, match="has 2 CPU"), connect(ClusterSpec(3, allow_oversubscribe=True)):
            pass
        raise JobError
    assert not ray.is_initialized()
    assert still_running(seen) == []
    assert leftovers(short_tmp) == []
    assert not (tmp_path / ".ray").exists()  # no token left in the home folder (ONNX Runtime leaves its .cache there)
    assert MARKER not in os.environ


def _check_listeners(ray: Any, root: Path, before: set[int]) -> list[psutil.Process]:
    """Two workers up; every process of the cluster (this driver's descendants but those in ``before``, and every
    marked one) listens on loopback only, and the listing is not vacuous. Returns the processes, to check they are
    gone afterwards."""

    @ray.remote(num_cpus=1)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    probes = [Probe.remote() for _ in range(2)]
    pids = ray.get([p.pid.remote() for p in probes])
    procs = [p for p in cluster_processes(psutil.Process(), str(root)) if p.pid not in before]
    sockets = listeners(procs)
    assert _open(sockets) == [], sockets
    names = _with_sockets(sockets)
    assert {"gcs_server", "raylet"} <= names, sockets
    assert set(pids) <= {s.pid for s in sockets}, (pids, sockets)  # both workers' gRPC servers
    assert os.getpid() in {s.pid for s in sockets}  # the driver's own server
    assert sum(1 for s in sockets if s.name == "raylet") >= 2  # node manager and object manager
    for probe in probes:
        ray.kill(probe)
    return [p for p in procs if p.pid != os.getpid()]


def _check_a_second_driver(ray: Any, digits_qdq: tuple[Path, Path], short_tmp: Path, root: Path) -> None:
    """``qdebug debug --ray 127.0.0.1:PORT --workers 2`` against this cluster: with the cluster's token (in the
    environment of its processes: readable by this user only) it runs, and its driver listens on loopback only (Ray
    would otherwise dial, and bind, this machine's external address); without the token it is refused, in one line
    and within 30 s."""
    address = ray.get_runtime_context().gcs_address
    assert address.startswith("127.0.0.1:"), address
    gcs = next(p for p in cluster_processes(None, str(root)) if p.name() == "gcs_server")
    token = gcs.environ().get("RAY_AUTH_TOKEN")
    assert token, "the cluster has no token of its own"
    f, q = digits_qdq
    argv = ["debug", "-f", str(f), "-q", str(q), "--samples", "400", "--ray", address, "--workers", "2"]
    run = watch(argv, short_tmp, until=lambda names: False, env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    assert run.code == 0, run.stderr
    assert _open(run.sockets) == [], run.sockets
    assert any(s.pid == run.pid for s in run.sockets), run.sockets  # the second driver's own server, on loopback
    if gcs.environ().get("RAY_AUTH_MODE") == "token":  # a Ray with token authentication
        outsider = watch(argv, short_tmp, until=lambda names: False, env={"RAY_AUTH_MODE": "token"})
        assert outsider.code == EXIT_CLUSTER and outsider.stderr.count("\n") == 1, outsider.stderr
        assert address in outsider.stderr and outsider.seconds <= 30, (outsider.seconds, outsider.stderr)


def test_debug_on_workers_listens_on_127_0_0_1_only_and_leaves_nothing(
    short_tmp: Path, digits_qdq: tuple[Path, Path]
) -> None:
    """A real ``qdebug debug --workers 2``, its processes' sockets sampled while it runs: loopback only (the control
    store, both raylet ports, the driver, the workers, the agents, the autoscaler monitor); afterwards no process and
    no folder left in its TMPDIR."""
    require_ray()
    f, q = digits_qdq
    run = watch(["debug", "-f", str(f), "-q", str(q), "--samples", "3000", "--workers", "2"], short_tmp)
    assert run.code == 0, run.stderr
    assert run.stderr == "", run.stderr
    assert run.triggered, run.names()
    assert _open(run.sockets) == [], run.sockets
    names = _with_sockets(run.sockets)
    assert {"gcs_server", "raylet", "ray::CaptureWorker"} <= names, run.sockets
    assert wait_until_gone(run, str(short_tmp)) == []
    assert leftovers(short_tmp) == []


def test_the_security_test_can_fail() -> None:
    """What the tests above reject: a listener on every interface or on an external address."""
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert _open({Listener(1, "gcs_server", "::", 6379), Listener(2, "raylet", "127.0.0.1", 1)}) == [
        "gcs_server[1] on :::6379"
    ]


def test_the_listing_finds_a_process_that_left_its_parent() -> None:
    """The listing sees a process that left its parent (a Ray agent whose raylet died): by the marker in its
    environment, not by the process tree."""
    root = tempfile.mkdtemp(prefix="qdt", dir="/tmp")
    try:
        env = {**os.environ, MARKER: os.path.join(root, TEMP_PREFIX + "x")}
        code = "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); time.sleep(60)"
        orphan = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not (found := listeners(cluster_processes(None, root))) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert [(s.pid, s.ip) for s in found] == [(orphan.pid, "0.0.0.0")]
        finally:
            orphan.kill()
            orphan.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
