"""Where qdebug's sample-parallel work runs: a Ray cluster, started here on this machine's cores (``workers``)
or an existing one (``address``; ``"auto"``: the one in ``RAY_ADDRESS``). See docs/scale.md.

Ray is an optional extra (``pip install 'qdebug[ray]'``), imported on first use through
:func:`qdebug._lazy.require`. qdebug shuts down only what it started: a local cluster it started is stopped when
the job ends (Ctrl-C included); from a cluster it connected to it only disconnects, and a Ray that was already
initialised in this process (a notebook, a test) is left as it was.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from qdebug._lazy import require
from qdebug.errors import ClusterError, ConfigError

__all__ = ["Cluster", "ClusterSpec", "connect"]

#: Object store of a local cluster qdebug starts: only sums and shard descriptions travel (docs/scale.md), so a
#: small store is enough and leaves the machine's memory to ONNX Runtime.
LOCAL_OBJECT_STORE_BYTES = 96 << 20


@dataclass(frozen=True)
class ClusterSpec:
    """How to reach the workers: ``address`` of an existing Ray cluster (``"auto"``: ``RAY_ADDRESS``), or ``None``
    to start a local one on 127.0.0.1; ``workers``: how many capture actors (default: the cluster's CPUs)."""

    workers: int | None = None
    address: str | None = None

    def __post_init__(self) -> None:
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ConfigError(f"workers must be a positive integer, got {self.workers!r}")
        if self.address is not None and not self.address.strip():
            raise ConfigError("the Ray address is empty (use 'auto' for the cluster in RAY_ADDRESS)")
        if self.address == "auto" and not os.environ.get("RAY_ADDRESS"):
            raise ConfigError("--ray auto needs RAY_ADDRESS (the address of a running Ray cluster)")

    def describe(self) -> str:
        """One line: where the work runs."""
        where = f"Ray cluster at {self.address}" if self.address else "a local Ray cluster on 127.0.0.1"
        return f"{self.workers or 'all'} worker(s) on {where}"


@dataclass(frozen=True)
class Cluster:
    """A connected cluster: the ``ray`` module and the number of workers to start on it."""

    ray: Any
    workers: int
    started: bool  # qdebug started this cluster (and stops it)


def _workers(ray: Any, spec: ClusterSpec) -> int:
    if spec.workers is not None:
        return spec.workers
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


@contextlib.contextmanager
def connect(spec: ClusterSpec) -> Iterator[Cluster]:
    """The cluster of ``spec`` for the duration of the block; what qdebug started or connected is stopped or
    disconnected at the end, however the block ends."""
    ray = require("ray")
    if ray.is_initialized():  # a notebook's or a test's Ray: use it, never shut it down
        yield Cluster(ray, _workers(ray, spec), started=False)
        return
    kwargs: dict[str, Any] = {
        "log_to_driver": False,  # workers' logs stay in Ray's session folder: qdebug's stderr is its one-line errors
        "configure_logging": True,
        "logging_level": logging.ERROR,
    }
    try:
        if spec.address is not None:
            ray.init(address=spec.address, **kwargs)
        else:
            ray.init(
                address="local",
                num_cpus=spec.workers or os.cpu_count() or 1,
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _node_ip_address="127.0.0.1",
                **kwargs,
            )
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError and plain Exception here
        ray.shutdown()  # whatever a failed start left running goes with it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"cannot start or reach Ray ({spec.describe()}): {first}") from exc
    try:
        yield Cluster(ray, _workers(ray, spec), started=spec.address is None)
    finally:
        ray.shutdown()  # stops a local cluster this process started; from an existing one it only disconnects
