"""The target interface: ``compile(qdq_model, out_dir, options) -> CompileReport``, registered by name.

Targets import their backend lazily (``qdebug._lazy.require``), so listing targets never needs the backend;
``available()`` says why a target cannot be used here (the UI's target dropdown shows that reason).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qdebug.errors import ConfigError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FallbackNode:
    """A group of nodes the backend refused (left on the CPU), with the backend's own reason."""

    op_type: str
    nodes: int
    reason: str
    by_design: bool = False  # e.g. QNN leaves graph-input Q / graph-output DQ on the CPU on purpose


@dataclass(frozen=True)
class FixReport:
    """One compatibility rewrite applied before quantizing/compiling, and what it changed."""

    name: str
    changed: bool
    detail: str


@dataclass(frozen=True)
class CompileReport:
    """What a compile produced, where the graph ran, and why parts did not go to the accelerator."""

    target: str
    ok: bool
    compiled_model: str | None
    compile_seconds: float
    accelerator_partitions: int  # e.g. EPContext nodes for QNN
    accelerator_nodes: int  # nodes of the input graph taken by the accelerator
    cpu_nodes: int  # nodes left on the CPU, excluding graph-I/O Q/DQ kept there by design
    graph_io_qdq_on_cpu: int
    fallback: tuple[FallbackNode, ...] = ()
    context_bytes: int = 0
    device: str = ""  # e.g. "SM8650 (HTP v75)"
    options: Mapping[str, str] = field(default_factory=dict)
    log_path: str | None = None
    error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def single_partition(self) -> bool:
        """Exactly one accelerator partition and nothing else on the CPU (graph-I/O Q/DQ aside)."""
        return self.ok and self.accelerator_partitions == 1 and self.cpu_nodes == 0

    def fallback_by_op(self) -> dict[str, int]:
        """CPU-fallback node counts by op type (by-design graph-I/O Q/DQ excluded)."""
        out: dict[str, int] = {}
        for f in self.fallback:
            if not f.by_design:
                out[f.op_type] = out.get(f.op_type, 0) + f.nodes
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        d = asdict(self)
        d["options"] = dict(self.options)
        d["schema_version"] = SCHEMA_VERSION
        d["single_partition"] = self.single_partition
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompileReport:
        """Inverse of :meth:`to_dict`."""
        kw = {k: v for k, v in d.items() if k not in ("schema_version", "single_partition")}
        kw["fallback"] = tuple(FallbackNode(**f) for f in kw.get("fallback", ()))
        kw["warnings"] = tuple(kw.get("warnings", ()))
        return cls(**kw)

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)


class Target(Protocol):
    """A compile target."""

    name: str

    def available(self) -> tuple[bool, str]:
        """(usable here, why not) — never raises."""
        ...

    def compile(self, qdq_model: Path, out_dir: Path, options: Mapping[str, Any]) -> CompileReport:
        """Compile a QDQ model into ``out_dir``; failures are reported in the result, bad input raises."""
        ...


_REGISTRY: dict[str, Callable[[], Target]] = {}


def register_target(name: str, factory: Callable[[], Target]) -> None:
    """Register a target factory under ``name``."""
    _REGISTRY[name] = factory


def get_target(name: str) -> Target:
    """The target registered as ``name``."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown target {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]()


def available_targets() -> dict[str, tuple[bool, str]]:
    """Every registered target with (available, reason)."""
    _load_builtin()
    return {name: factory().available() for name, factory in sorted(_REGISTRY.items())}


def _load_builtin() -> None:
    # Importing the modules registers them; neither imports its backend at module level.
    import qdebug.targets.qnn  # noqa: F401
