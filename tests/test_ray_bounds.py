"""Bounds and timeouts of the Ray options (docs/scale.md): ``--workers`` is capped by the usable cores (with an
explicit override), ``--ray``'s address is checked before Ray is needed, and a cluster that cannot be reached fails
within 30 s in one line naming the address (exit 8). No cluster is started here.

Ray is an optional extra: the tests that reach for it skip locally without it and FAIL under ``CI=true``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLE_MODELS, assert_one_line_error
from ray_watch import leftovers, require_ray

from qdebug.cluster import (
    OVERSUBSCRIBE_PER_CORE,
    SOCKET_PATH_MAX,
    ClusterSpec,
    local_worker_limit,
    parse_address,
    ray_temp_base,
    usable_cores,
)
from qdebug.config import QuantConfig
from qdebug.errors import EXIT_CLUSTER, EXIT_USAGE, ClusterError, ConfigError
from qdebug.quantizer import quantize

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::ResourceWarning"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The digits CNN and its 8-bit QDQ model."""
    q = tmp_path_factory.mktemp("ray-bounds") / "digits_cnn.qdq.onnx"
    quantize(SAMPLE_MODELS / "digits_cnn.onnx", SAMPLE_MODELS / "digits_calib.npz", QuantConfig(), q)
    return str(SAMPLE_MODELS / "digits_cnn.onnx"), str(q)


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray cannot be imported: a refusal must come before Ray is needed (``--workers 100000`` would otherwise fork
    until a limit stops it)."""
    monkeypatch.setitem(sys.modules, "ray", None)


# ------------------------------------------------------------------------------------------------------------ --ray
@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.1:6379", ("10.0.0.1", 6379)),
        ("head-node.example.org:6379", ("head-node.example.org", 6379)),
        ("localhost:1", ("localhost", 1)),
        ("[::1]:65535", ("::1", 65535)),
        ("ray://10.0.0.1:10001", ("10.0.0.1", 10001)),
    ],
)
def test_a_ray_address_is_host_and_port(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("10.0.0.1:0", "port 0 is not in 1..65535"),
        ("10.0.0.1:65536", "port 65536 is not in 1..65535"),
        ("10.0.0.1", "is not HOST:PORT"),
        ("10.0.0.1:http", "is not HOST:PORT"),
        ("local", "--workers N alone"),
        ("http://10.0.0.1:6379", "is not HOST:PORT"),
        ("[::1:6379", "is not HOST:PORT"),
        ("[10.0.0.1]:6379", "not a host name or an IP address"),
        ("bad-.example:6379", "not a host name or an IP address"),
        ("a b:1", "is not HOST:PORT"),
        ("10.0.0.1:6379\nx", "is not HOST:PORT"),
    ],
)
def test_a_malformed_ray_address_is_refused_before_ray(
    address: str, words: str, models: tuple[str, str], run_cli: Any, no_ray: None
) -> None:
    f, q = models
    assert_one_line_error(run_cli("debug", "-f", f, "-q", q, "--ray", address), EXIT_USAGE, "--ray", words)


def test_ray_auto_checks_the_address_in_ray_address(
    models: tuple[str, str], run_cli: Any, no_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    f, q = models
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:99999")
    assert_one_line_error(run_cli("debug", "-f", f, "-q", q, "--ray", "auto"), EXIT_USAGE, "RAY_ADDRESS", "99999")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_nobody_listens_on_fails_at_once(models: tuple[str, str], run_cli: Any) -> None:
    """Ray would retry for minutes, dialling another address (it replaces 127.0.0.1 by the machine's external one):
    qdebug refuses an address where nothing accepts a connection, naming it."""
    require_ray()
    f, q = models
    address = f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    result = run_cli("debug", "-f", f, "-q", q, "--samples", "2", "--ray", address)
    assert_one_line_error(result, EXIT_CLUSTER, f"cannot reach the Ray cluster at {address}", "refused")
    assert time.monotonic() - start <= 30


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never says a word (a service that is not Ray)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_an_address_that_is_not_ray_fails_within_30_s(
    models: tuple[str, str], silent_server: int, tmp_path: Path
) -> None:
    """Something listens, but it is not Ray: Ray's own connection timeouts, bounded by qdebug, end it in one line
    (in a real process: Ray reads those timeouts when it is loaded)."""
    require_ray()
    f, q = models
    address = f"127.0.0.1:{silent_server}"
    argv = [sys.executable, "-m", "qdebug.cli", "debug", "-f", f, "-q", q, "--samples", "2", "--ray", address]
    start = time.monotonic()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120, env=env)
    seconds = time.monotonic() - start
    assert proc.returncode == EXIT_CLUSTER, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("qdebug: error: "), proc.stderr
    assert address in proc.stderr and "Traceback" not in proc.stderr
    assert seconds <= 30, seconds
    assert leftovers(tmp_path) == []


# -------------------------------------------------------------------------------------------------------- --workers
def test_workers_are_capped_by_the_usable_cores(models: tuple[str, str], run_cli: Any, no_ray: None) -> None:
    """One line before any work, naming the cap; ``--allow-oversubscribe`` raises it to
    :data:`OVERSUBSCRIBE_PER_CORE` per core, and no further."""
    f, q = models
    cores = usable_cores()
    debug = ("debug", "-f", f, "-q", q, "--samples", "2")
    result = run_cli(*debug, "--workers", "100000")
    assert_one_line_error(
        result, EXIT_USAGE, "--workers 100000", f"the {cores} usable core(s)", "--allow-oversubscribe"
    )
    assert_one_line_error(run_cli(*debug, "--workers", str(cores + 1)), EXIT_USAGE, f"--workers {cores + 1}")
    over = cores * OVERSUBSCRIBE_PER_CORE + 1
    assert_one_line_error(
        run_cli(*debug, "--workers", str(over), "--allow-oversubscribe"),
        EXIT_USAGE,
        f"more than {over - 1}",
        "--allow-oversubscribe",
    )
    assert_one_line_error(run_cli(*debug, "--allow-oversubscribe"), EXIT_USAGE, "--allow-oversubscribe needs --workers")
    assert_one_line_error(
        run_cli(*debug, "--ray", "10.0.0.1:6379", "--workers", "2", "--allow-oversubscribe"),
        EXIT_USAGE,
        "--allow-oversubscribe is for a local cluster",
    )
    for command in (
        ("quantize", "-f", f, "-o", str(Path(q).with_name("o.onnx"))),
        ("search", "-f", f, "-o", str(Path(q).with_name("o.json"))),
    ):
        goal = ("--goal-sqnr", "30") if command[0] == "search" else ()
        assert_one_line_error(run_cli(*command, *goal, "--workers", "100000"), EXIT_USAGE, "--workers 100000")


def test_the_cap_in_the_library() -> None:
    cores = usable_cores()
    assert local_worker_limit() == cores and local_worker_limit(True) == cores * OVERSUBSCRIBE_PER_CORE
    assert ClusterSpec(workers=cores).workers == cores
    assert ClusterSpec(workers=cores + 1, allow_oversubscribe=True).workers == cores + 1
    with pytest.raises(ConfigError, match="usable core"):
        ClusterSpec(workers=cores + 1)
    with pytest.raises(ConfigError, match="positive integer"):
        ClusterSpec(workers=True)  # type: ignore[arg-type]
    assert ClusterSpec(workers=100000, address="10.0.0.1:6379").workers == 100000  # checked against its CPUs


# --------------------------------------------------------------------------------------------- Ray's temporary folder
def test_ray_temp_folder_falls_back_to_tmp_when_its_sockets_would_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's unix socket paths (``<folder>/session_<date>_<pid>/sockets/plasma_store``) must fit in 107 bytes: a
    long TMPDIR is replaced by /tmp; when nothing fits, one line says to shorten TMPDIR."""
    long = tmp_path / ("d" * 60)
    long.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(long))
    assert ray_temp_base() == "/tmp"
    monkeypatch.setattr("tempfile.tempdir", "/tmp")
    assert ray_temp_base() == "/tmp"
    with pytest.raises(ClusterError, match=f"too long a path for Ray's sockets.*{SOCKET_PATH_MAX}|set TMPDIR"):
        ray_temp_base(pid=10**80)
