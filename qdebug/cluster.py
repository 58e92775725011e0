"""Where qdebug's sample-parallel work runs: a Ray cluster, started here on this machine's cores (``workers``)
or an existing one (``address``; ``"auto"``: the one in ``RAY_ADDRESS``). See docs/scale.md.

Ray is an optional extra (``pip install 'qdebug[ray]'``), imported on first use through
:func:`qdebug._lazy.require`. qdebug shuts down only what it started: a local cluster it started is stopped when
the job ends (Ctrl-C included); from a cluster it connected to it only disconnects, and a Ray that was already
initialised in this process (a notebook, a test) is left as it was.

A local cluster is private to the job (docs/scale.md, "Security"): Ray's control store has no authentication, so
every process of it listens on 127.0.0.1 only, its session folder lives in a temporary folder of qdebug's that is
removed with it, and no process of it outlives the job. Ray starts in a thread of its own, so that Ctrl-C or SIGTERM
never cuts its start short, and its start does not change the process: the environment and the SIGINT/SIGTERM
handlers are as they were.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qdebug._lazy import require
from qdebug._signals import signals_held
from qdebug.errors import ClusterError, ConfigError
from qdebug.io import temp_dir

__all__ = [
    "MAX_ATTEMPTS",
    "OVERSUBSCRIBE_PER_CORE",
    "SHARDS_PER_WORKER",
    "Cluster",
    "ClusterSpec",
    "connect",
    "local_worker_limit",
    "parse_address",
    "plan_shards",
    "ray_temp_base",
    "usable_cores",
]

#: Object store of a local cluster qdebug starts: only sums and shard descriptions travel (docs/scale.md), so a
#: small store is enough and leaves the machine's memory to ONNX Runtime.
LOCAL_OBJECT_STORE_BYTES = 96 << 20
#: Most workers per usable core a local cluster may have when oversubscription is allowed: each worker is a process
#: holding two ONNX Runtime sessions, and beyond a few per core they only take turns on it.
OVERSUBSCRIBE_PER_CORE = 4
#: Tries of one shard or task (the first included) before the job fails: a worker that dies on every try of the same
#: shard (out of memory on a huge sample, say) is not a passing fault.
MAX_ATTEMPTS = 3
#: Shards per worker by default: enough that a fast worker takes over a slow one's share and a lost shard is a small
#: loss, few enough that the per-shard round trip (milliseconds) stays negligible.
SHARDS_PER_WORKER = 4
#: Seconds an existing cluster's address gets to accept a connection before qdebug gives up on it.
REACH_TIMEOUT_S = 5.0
#: Seconds a process of a local cluster that outlives Ray's shutdown gets to stop when asked, before it is killed.
EXIT_GRACE_S = 3.0
#: Ray's connection timeouts while the driver connects to an existing cluster (RayConfig entries, which Ray reads
#: from ``RAY_<name>``): a port that answers but is not Ray's fails in seconds; Ray's defaults retry for minutes.
CONNECT_ENV: Mapping[str, str] = {
    "RAY_gcs_server_port_wait_time_s": "1",
    "RAY_gcs_rpc_server_connect_timeout_s": "2",
    "RAY_py_gcs_connect_timeout_s": "5",
}
#: The environment of a local cluster's processes: Ray makes a node whose address is loopback listen on loopback
#: only, but takes 127.0.0.1 as "this machine's external address" unless this Windows/macOS switch says the node
#: is local; and no usage statistics leave the machine. (Each cluster also gets a token of its own in
#: ``RAY_AUTH_TOKEN``: a Ray with token authentication requires it of every client, and would otherwise make one
#: and leave it in the user's home folder.)
LOCAL_ENV: Mapping[str, str] = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
#: Ray's settings for a local cluster: no metrics collection (an exporter nobody reads).
LOCAL_SYSTEM_CONFIG: Mapping[str, Any] = {"enable_metrics_collection": False}
#: Inherited by every process a local cluster's start spawns (and what those spawn): its value, the cluster's
#: temporary folder, finds the processes that outlive Ray's shutdown.
MARKER = "QDEBUG_RAY_CLUSTER"
#: Prefix of a local cluster's temporary folder (short: Ray's socket paths inside it are bounded, see below).
TEMP_PREFIX = "qdebug-ray-"
#: Longest path of a unix socket (bytes, without the final NUL): Ray refuses to start beyond it.
SOCKET_PATH_MAX = 107
#: Ray's longest socket path below its temporary folder; the session folder is named by the date and the driver's pid.
RAY_SOCKET = "/session_2000-01-01_00-00-00_000000_{pid}/sockets/plasma_store"

_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"  # one dot-separated part of a host name
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
_HOST_PORT = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]/\s]+)):(?P<port>\d{1,5})")
#: A line of Ray's C++ log ("[date time W pid tid] file.cc:123: message"): its message.
_RAY_LOG_LINE = re.compile(r"^\[[^\]]*\] \S+:\d+: (.+)$")
_QUIET: Mapping[str, Any] = {
    "log_to_driver": False,  # workers' logs stay in Ray's session folder: qdebug's stderr is its one-line errors
    "configure_logging": True,
    "logging_level": logging.ERROR,
}


def plan_shards(samples: int, workers: int, per_worker: int = SHARDS_PER_WORKER) -> list[tuple[int, int]]:
    """Contiguous index ranges ``[start, stop)`` covering ``range(samples)``, about ``per_worker`` per worker."""
    size = max(1, math.ceil(samples / (workers * per_worker)))
    return [(s, min(s + size, samples)) for s in range(0, samples, size)]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def local_worker_limit(allow_oversubscribe: bool = False) -> int:
    """Most workers of a local cluster: one per usable core, or :data:`OVERSUBSCRIBE_PER_CORE` per core."""
    return usable_cores() * (OVERSUBSCRIBE_PER_CORE if allow_oversubscribe else 1)


def parse_address(address: str, source: str = "the Ray address") -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT`` (HOST a name, an IPv4 address or a bracketed IPv6
    one, PORT in 1..65535); a :class:`ConfigError` naming ``address`` (as ``source``) otherwise."""
    match = _HOST_PORT.fullmatch(address.removeprefix("ray://"))
    if match is None:
        raise ConfigError(
            f"{source} {address!r} is not HOST:PORT, ray://HOST:PORT or 'auto' (a local cluster: --workers N alone)"
        )
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ConfigError(f"{source} {address!r}: port {port} is not in 1..65535")
    host = match["v6"] or match["host"]
    if not (
        _is_ip(host, ipaddress.IPv6Address)
        if match["v6"]
        else _is_ip(host, ipaddress.IPv4Address) or (len(host) <= 253 and _HOSTNAME.fullmatch(host))
    ):
        raise ConfigError(f"{source} {address!r}: {host!r} is not a host name or an IP address")
    return host, port


def _is_ip(host: str, kind: type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address]) -> bool:
    try:
        kind(host)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True)
class ClusterSpec:
    """How to reach the workers: ``address`` of an existing Ray cluster (``"auto"``: ``RAY_ADDRESS``), or ``None``
    to start a local one on 127.0.0.1; ``workers``: how many capture actors (default: the cluster's CPUs; a local
    cluster: at most one per usable core, :data:`OVERSUBSCRIBE_PER_CORE` per core with ``allow_oversubscribe``)."""

    workers: int | None = None
    address: str | None = None
    allow_oversubscribe: bool = False

    def __post_init__(self) -> None:
        if self.workers is not None and (type(self.workers) is not int or self.workers < 1):
            raise ConfigError(f"workers must be a positive integer, got {self.workers!r}")
        if self.address is not None:
            self._check_address()
        elif self.workers is not None and self.workers > local_worker_limit(self.allow_oversubscribe):
            raise ConfigError(self._too_many())

    def _check_address(self) -> None:
        if self.allow_oversubscribe:
            raise ConfigError(
                "--allow-oversubscribe is for a local cluster (--workers N alone): on an existing cluster each "
                "worker needs a CPU of its own"
            )
        if not str(self.address).strip():
            raise ConfigError("the Ray address is empty (use 'auto' for the cluster in RAY_ADDRESS)")
        if self.address == "auto":
            if not os.environ.get("RAY_ADDRESS"):
                raise ConfigError("--ray auto needs RAY_ADDRESS (the address of a running Ray cluster)")
            parse_address(os.environ["RAY_ADDRESS"], "RAY_ADDRESS")
        else:
            parse_address(str(self.address), "--ray")

    def _too_many(self) -> str:
        cores = usable_cores()
        if self.allow_oversubscribe:
            return (
                f"--workers {self.workers}: more than {local_worker_limit(True)}, the most --allow-oversubscribe "
                f"permits ({OVERSUBSCRIBE_PER_CORE} per usable core, {cores} core(s) here)"
            )
        return (
            f"--workers {self.workers}: more than the {cores} usable core(s) of this machine, the most workers of a "
            f"local cluster (one per core; --allow-oversubscribe permits up to {local_worker_limit(True)})"
        )

    @property
    def target(self) -> str | None:
        """The address to connect to (``"auto"`` read from ``RAY_ADDRESS``), ``None`` for a local cluster."""
        return os.environ.get("RAY_ADDRESS") if self.address == "auto" else self.address

    def describe(self) -> str:
        """One line: where the work runs."""
        where = f"Ray cluster at {self.target}" if self.address else "a local Ray cluster on 127.0.0.1"
        return f"{self.workers or 'all'} worker(s) on {where}"


@dataclass(frozen=True)
class Cluster:
    """A connected cluster: the ``ray`` module and the number of workers to start on it."""

    ray: Any
    workers: int
    started: bool  # qdebug started this cluster (and stops it)


def _workers(ray: Any, spec: ClusterSpec) -> int:
    """The workers to start: each needs a CPU of the cluster, or it waits for one forever (and its shards with it)."""
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if spec.workers is None:
        return max(1, cpus)
    if spec.workers > cpus:
        raise ClusterError(
            f"{spec.describe()}: the cluster has {cpus} CPU(s) and each worker needs one (the others would wait "
            "forever)"
        )
    return spec.workers


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def connect(spec: ClusterSpec) -> Iterator[Cluster]:
    """The cluster of ``spec`` for the duration of the block; what qdebug started or connected is stopped or
    disconnected at the end, however the block ends."""
    ray = _import_ray(spec)
    if ray.is_initialized():  # a notebook's or a test's Ray: use it, never shut it down
        yield Cluster(ray, _workers(ray, spec), started=False)
        return
    with _local(ray, spec) if spec.address is None else _existing(ray, spec) as cluster:
        yield cluster


def _import_ray(spec: ClusterSpec) -> Any:
    """The ``ray`` module, loaded with :data:`CONNECT_ENV` for an existing cluster: Ray's C++ client reads its
    connection timeouts once, when Ray is loaded (a Ray loaded before keeps its own; :func:`_reach` still bounds an
    address where nothing listens)."""
    if spec.address is None or "ray" in sys.modules:
        return require("ray")
    with _environment(CONNECT_ENV):
        return require("ray")


@contextlib.contextmanager
def _local(ray: Any, spec: ClusterSpec) -> Iterator[Cluster]:
    """A Ray cluster on this machine for the block: on 127.0.0.1, in a temporary folder of its own, removed with
    every process of it at the end."""
    with temp_dir(prefix=TEMP_PREFIX, dir=ray_temp_base()) as root:
        init = {
            "address": "local",
            "num_cpus": spec.workers or usable_cores(),
            "include_dashboard": False,
            "object_store_memory": LOCAL_OBJECT_STORE_BYTES,
            "_node_ip_address": "127.0.0.1",
            "_temp_dir": root,
            "_system_config": dict(LOCAL_SYSTEM_CONFIG),
        }
        # TMPDIR: a temporary file of a task cut short by the end of the job (Ctrl-C, SIGTERM) goes with the folder
        env = {**LOCAL_ENV, MARKER: root, "RAY_AUTH_TOKEN": secrets.token_hex(32), "TMPDIR": root}
        try:
            with _Owner(ray, spec, init, env, loopback=True).running():
                node = ray.util.get_node_ip_address()
                if not _is_loopback(node):  # a Ray that ignores the switch: never a cluster open to the network
                    raise ClusterError(f"Ray {ray.__version__} started its node on {node}, not on 127.0.0.1")
                yield Cluster(ray, _workers(ray, spec), started=True)
        finally:
            with signals_held():  # a second Ctrl-C must not cut the clean-up short
                _reap(root)
                shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _existing(ray: Any, spec: ClusterSpec) -> Iterator[Cluster]:
    """The existing cluster of ``spec`` for the block (disconnected at the end; it keeps running)."""
    address = str(spec.target)
    host, port = parse_address(address, "RAY_ADDRESS" if spec.address == "auto" else "--ray")
    _reach(address, host, port)
    with _Owner(ray, spec, {"address": spec.address}, CONNECT_ENV, loopback=_is_loopback(host)).running(quiet=True):
        yield Cluster(ray, _workers(ray, spec), started=False)


class _Owner(threading.Thread):
    """The thread that starts Ray (``ray.init``) and shuts it down when asked. In a thread of its own, Ray's start
    cannot be cut short by a signal (handlers run on the main thread, which waits for it with Ctrl-C and SIGTERM
    held): a start cut short by Ray's own SIGTERM handler left a driver that crashed at exit and processes Ray did not
    know of. (Nor does Ray replace the process's SIGTERM handler from there.) The thread lives as long as the
    cluster: Ray's processes are killed when the thread that started them ends."""

    def __init__(
        self, ray: Any, spec: ClusterSpec, init: Mapping[str, Any], env: Mapping[str, str], loopback: bool
    ) -> None:
        super().__init__(name="qdebug-ray", daemon=True)
        self.ray, self.spec, self.init, self.env, self.loopback = ray, spec, init, env, loopback
        self.up, self.done = threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        """Start Ray with :attr:`env` set and Ray's switches for this job (:func:`_ray_switches`), wait to be done,
        shut Ray down (also after a failed start: whatever it left running goes with it)."""
        token = "RAY_AUTH_TOKEN" in self.env
        try:
            with _environment(self.env), _ray_switches(self.loopback):
                if token:
                    _forget_token()
                self.ray.init(**self.init, **_QUIET)
        except BaseException as exc:  # handed to the caller's thread, which raises it
            self.error = exc
        finally:
            self.up.set()
        self.done.wait()
        self.ray.shutdown()  # from an existing cluster it only disconnects
        if token:
            _forget_token()

    def _failure(self, exc: Exception, said: list[str]) -> ClusterError:
        """The one-line error of a failed start; Ray's last log message on stderr, if any, added."""
        why = "".join(f" ({m[1]})" for m in [m for m in map(_RAY_LOG_LINE.search, said) if m][-1:])
        return ClusterError(f"cannot start or reach Ray ({self.spec.describe()}): {_first_line(exc)}{why}")

    @contextlib.contextmanager
    def running(self, quiet: bool = False) -> Iterator[None]:
        """Ray up for the block, shut down at the end, however the block ends; ``quiet``: what Ray writes on stderr
        while it starts is kept off it (its last message is added to a failed start's error)."""
        said: list[str] = []
        try:
            with _own_signal_handlers(), _stderr_into(said) if quiet else contextlib.nullcontext(), signals_held():
                self.start()
                self.up.wait()
            if isinstance(self.error, Exception):  # ConnectionError, RuntimeError, ValueError, plain Exception
                raise self._failure(self.error, said) from self.error
            if self.error is not None:
                raise self.error
            yield
        finally:
            with signals_held():
                self.done.set()
                if self.ident is not None:
                    self.join()


def _forget_token() -> None:
    """Ray keeps the first authentication token it loads for the life of the process: forgotten before a local
    cluster with a token of its own starts (the driver loads that one) and after it stops (a later Ray in this
    process loads its own). A Ray without tokens has nothing to forget."""
    loader = getattr(sys.modules.get("ray._raylet"), "AuthenticationTokenLoader", None)
    reset = getattr(loader.instance(), "reset_cache", None) if loader is not None else None
    if reset is not None:
        reset()


@contextlib.contextmanager
def _stderr_into(lines: list[str]) -> Iterator[None]:
    """What is written to file descriptor 2 during the block, into ``lines`` rather than on stderr: Ray's C++ client
    writes its connection warnings there, and an error of qdebug is one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:  # no name: nothing to leave behind
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def _reach(address: str, host: str, port: int) -> None:
    """Refuse an address where nothing accepts a connection within :data:`REACH_TIMEOUT_S` (Ray itself would retry
    for minutes)."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or _first_line(exc)
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {why}") from exc


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """The process's SIGINT/SIGTERM handlers, put back after the block: a Ray whose C++ crash reporter could not be
    kept off (:func:`_ray_switches`) installs it for SIGTERM too, which would bypass the caller's clean-up (the CLI's
    exit 143). Signal handlers belong to the main thread: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: a handler not set from Python, which Python cannot put back
                signal.signal(sig, handler)


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` for the block (the processes started meanwhile inherit them), and as it was
    before afterwards — also without what Ray's start exports for its driver (its authentication mode, a debugger
    hook), which would reach every process qdebug starts later."""
    before = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextlib.contextmanager
def _ray_switches(loopback: bool) -> Iterator[None]:
    """Ray's start with two of the switches Ray read when it was imported (maybe before this job) set for this
    process: the one of :data:`LOCAL_ENV` if ``loopback`` (without it Ray replaces a loopback node or cluster
    address by the machine's external one: a local cluster would listen on every interface, ``--ray
    127.0.0.1:PORT`` would dial another address), and no C++ crash reporter in this process (it takes SIGTERM too:
    the process aborted, leaving the cluster behind). An unknown Ray is left as it is: the node's address is checked
    after the start."""
    constants: Any = sys.modules.get("ray._private.ray_constants")
    switches = {"RAY_DISABLE_FAILURE_SIGNAL_HANDLER": True} | ({"ENABLE_RAY_CLUSTER": False} if loopback else {})
    before = {name: getattr(constants, name) for name in switches if hasattr(constants, name)}
    for name in before:
        setattr(constants, name, switches[name])
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(constants, name, value)


def ray_temp_base(pid: int | None = None) -> str:
    """The folder a local cluster's temporary folder is made in: the temporary folder (``TMPDIR``), or ``/tmp``
    where Ray's socket paths would be too long for the first (:data:`SOCKET_PATH_MAX`)."""
    inside = len(os.fsencode(f"/{TEMP_PREFIX}xxxxxxxx{RAY_SOCKET.format(pid=pid or os.getpid())}"))
    first = tempfile.gettempdir()
    for base in dict.fromkeys((first, "/tmp")):
        if len(os.fsencode(base)) + inside <= SOCKET_PATH_MAX and os.path.isdir(base):
            return base
    raise ClusterError(
        f"the temporary folder {first} is too long a path for Ray's sockets (at most {SOCKET_PATH_MAX - inside} "
        "bytes here): set TMPDIR to a shorter folder"
    )


def _marked(root: str) -> list[int]:
    """The processes whose environment marks them as the local cluster's in ``root`` (Linux; elsewhere none is
    found, and Ray's own shutdown is all there is)."""
    needle = b"\0" + os.fsencode(f"{MARKER}={root}") + b"\0"
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):  # gone meanwhile, or another user's
                if needle in b"\0" + Path(entry.path, "environ").read_bytes():
                    found.append(int(entry.name))
    return found


def _reap(root: str) -> None:
    """Stop the local cluster's processes that outlive Ray's shutdown: Ray stops the processes it knows of, but a
    start cut short (SIGTERM inside ``ray.init``) leaves some it never knew. Asked to stop (SIGTERM: a raylet stops
    its workers), killed if still there after :data:`EXIT_GRACE_S`."""
    for sig, grace in ((signal.SIGTERM, EXIT_GRACE_S), (signal.SIGKILL, 1.0)):
        left = _marked(root)
        for pid in left:
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = _marked(root)
