"""Watching the processes of a Ray cluster qdebug starts (tests/test_ray_security.py, tests/test_ray_signals.py):
which processes it has, which sockets they listen on, what is left of them afterwards.

A process of a local cluster is found two ways: as a descendant of the driver while it runs, and by the variable
qdebug puts in the environment of every process the cluster's start spawns (:data:`qdebug.cluster.MARKER`, whose
value is the cluster's temporary folder) — the second also finds a process that outlived its parent.

Ray is an optional extra: without it these tests skip locally and FAIL under ``CI=true``."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from qdebug.cluster import MARKER

#: Seconds a watched run may take (a local cluster's start on a loaded 2-core machine included).
RUN_TIMEOUT_S = 240.0


def require_ray() -> Any:
    """The ``ray`` module; a missing Ray skips the test locally and fails it under ``CI=true``."""
    try:
        import ray
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("ray is not installed; make test installs it (the dev extras include qdebug[ray])")
        pytest.skip("ray is not installed (pip install 'qdebug[ray]')")
    return ray


def is_loopback(ip: str) -> bool:
    """127.0.0.1 or ::1 — also as an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``: Ray's gRPC servers bind a
    dual-stack socket to the IPv4 loopback address, which accepts IPv4 loopback connections only)."""
    address = ipaddress.ip_address(ip.split("%", maxsplit=1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclass(frozen=True)
class Listener:
    """A LISTEN socket of a process: which process (pid, name, what it runs) and the address it is bound to."""

    pid: int
    name: str
    ip: str
    port: int

    def __str__(self) -> str:
        return f"{self.name}[{self.pid}] on {self.ip}:{self.port}"


def _marked(root_prefix: str) -> list[psutil.Process]:
    """Live processes whose environment marks them as a cluster with its temporary folder under ``root_prefix``."""
    found = []
    for proc in psutil.process_iter():
        try:
            value = proc.environ().get(MARKER)
        except (psutil.Error, OSError):
            continue
        if value and value.startswith(root_prefix) and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def cluster_processes(driver: psutil.Process | None, root_prefix: str) -> list[psutil.Process]:
    """The driver, its descendants and every process marked as a cluster under ``root_prefix``."""
    procs: dict[int, psutil.Process] = {}
    if driver is not None:
        with contextlib.suppress(psutil.Error):
            procs |= {p.pid: p for p in [driver, *driver.children(recursive=True)]}
    procs |= {p.pid: p for p in _marked(root_prefix)}
    return list(procs.values())


def listeners(procs: Sequence[psutil.Process]) -> set[Listener]:
    """The LISTEN sockets (TCP, IPv4 and IPv6) of ``procs``."""
    found = set()
    for proc in procs:
        try:
            name = proc.name()
            conns = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        found |= {Listener(proc.pid, name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return found


@dataclass
class Watched:
    """What a watched run did: its pid, exit code, stderr and duration, every process seen (pid → (create time,
    name)), every LISTEN socket seen, and whether the trigger fired."""

    pid: int = 0
    code: int | None = None
    stderr: str = ""
    seconds: float = 0.0
    seen: dict[int, tuple[float, str]] = field(default_factory=dict)
    sockets: set[Listener] = field(default_factory=set)
    triggered: bool = False

    def names(self) -> set[str]:
        """The names of the processes seen."""
        return {name for _, name in self.seen.values()}

    def alive(self, root_prefix: str) -> list[str]:
        """The processes seen (same pid and start time) or marked under ``root_prefix`` that still run."""
        left = []
        for pid, (created, name) in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{name}[{pid}]")
            except psutil.Error:
                pass
        return sorted(set(left) | {f"{p.name()}[{p.pid}] (marked)" for p in _marked(root_prefix)})

    def note(self, procs: Sequence[psutil.Process]) -> None:
        """Record ``procs`` and their LISTEN sockets."""
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                self.seen[proc.pid] = (proc.create_time(), proc.name())  # a Ray worker renames itself once up
        self.sockets |= listeners(procs)


def workers_up(names: set[str]) -> bool:
    """A raylet and at least one Ray worker process (named ``ray::<what it runs>``, agents aside)."""
    return "raylet" in names and any(n.startswith("ray::") and not n.endswith("Agent") for n in names)


#: ``python -m qdebug.cli`` with Python's own Ctrl-C, whatever this process passes on: a test runner started in the
#: background by a non-interactive shell ignores SIGINT, and a child inherits that (as qdebug should: it is the
#: user's choice), which would make every Ctrl-C test here pass or fail by how the runner was started.
WITH_CTRL_C = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "runpy.run_module('qdebug.cli', run_name='__main__', alter_sys=True)"
)


def watch(
    argv: Sequence[str],
    tmpdir: Path,
    until: Callable[[set[str]], bool] = workers_up,
    then: Callable[[subprocess.Popen[str]], None] | None = None,
    env: Mapping[str, str | None] | None = None,
) -> Watched:
    """Run ``python -m qdebug.cli argv`` with ``TMPDIR=tmpdir`` (and ``env``'s changes: ``None`` unsets), noting its
    cluster's processes and sockets every 50 ms; once the names of the processes seen satisfy ``until``, call
    ``then`` with the process (once). Killed, with its cluster, after :data:`RUN_TIMEOUT_S`."""
    changes = {"TMPDIR": str(tmpdir), **(env or {})}
    environ = {k: v for k, v in {**os.environ, **changes}.items() if v is not None}
    proc = subprocess.Popen(
        [sys.executable, "-c", WITH_CTRL_C, *argv],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = Watched(pid=proc.pid)
    driver = psutil.Process(proc.pid)
    start = time.monotonic()
    deadline = start + RUN_TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            out.note(cluster_processes(driver, str(tmpdir)))
            if not out.triggered and until(out.names()):
                out.triggered = True
                if then is not None:
                    then(proc)
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            for p in cluster_processes(driver, str(tmpdir)):
                p.kill()
        out.stderr = proc.communicate(timeout=60)[1]
        out.code = proc.returncode
        out.seconds = time.monotonic() - start
    return out


def still_running(procs: Sequence[psutil.Process], timeout: float = 10.0) -> list[str]:
    """Those of ``procs`` (same pid and start time) still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.name()}[{proc.pid}]")
            except psutil.Error:
                pass
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def wait_until_gone(watched: Watched, root_prefix: str, timeout: float = 10.0) -> list[str]:
    """The processes of a finished run still alive after ``timeout`` seconds (a process Ray has just killed may take
    a moment to exit)."""
    deadline = time.monotonic() + timeout
    while (left := watched.alive(root_prefix)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def leftovers(tmpdir: Path) -> list[str]:
    """Folders left in ``tmpdir`` (Ray's session folder, qdebug's temporary folders). ONNX Runtime's own ``.ses``
    file there is not a folder, and not Ray's."""
    return sorted(p.name for p in tmpdir.iterdir() if p.is_dir())
