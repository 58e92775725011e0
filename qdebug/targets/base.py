"""The target interface and its registry: every target-specific fact and step lives behind :class:`Target`.

Targets import their backend lazily (``qdebug._lazy.require``), so listing targets never needs the backend;
``available()`` says why a target cannot be used here (the UI's target dropdown shows that reason).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol

from qdebug.errors import ConfigError
from qdebug.passes import PassReport

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FallbackNode:
    """A group of nodes the backend refused (left on the CPU), with the backend's own reason."""

    op_type: str
    nodes: int
    reason: str
    by_design: bool = False  # e.g. QNN leaves graph-input Q / graph-output DQ on the CPU on purpose


#: A compatibility fix is a pass like any other (:mod:`qdebug.passes`); the old name stays for its users.
FixReport = PassReport


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


@dataclass(frozen=True)
class Precision:
    """One ``--precision`` a target offers: the :class:`~qdebug.config.QuantConfig` settings it stands for.

    ``config`` is ``None`` for a precision that quantizes nothing (e.g. QNN fp16: the float model is compiled).
    """

    name: str
    config: Mapping[str, Any] | None
    help: str = ""

    @property
    def quantized(self) -> bool:
        """False when the float model is compiled as it is."""
        return self.config is not None


class Availability(NamedTuple):
    """Whether a target can be used on this machine, and a short description or the reason it cannot."""

    ok: bool
    reason: str


class Target(Protocol):
    """A compile target: everything target-specific lives behind this interface (see docs/architecture.md).

    The attributes below are what the rest of qdebug reads instead of branching on a target's name: the CLI's
    choices, the dashboard's target and precision lists, the mixed-precision type checks and ``build``.
    """

    #: the registry name, e.g. ``"qnn"``
    name: str
    #: one line for listings, e.g. ``"Qualcomm QNN HTP (EPContext, HTP simulator)"``
    description: str
    #: ``--precision`` name → what it means, in display order (the first is the default)
    precisions: Mapping[str, Precision]
    #: activation types the target runs (what a 16-bit promotion may use)
    activation_types: frozenset[str]

    def available(self) -> Availability:
        """Usable here, and why not — never raises and never imports the backend."""
        ...


TargetFactory = Callable[[], Target]

#: Modules of the built-in targets, imported by name on first use; each calls :func:`register_target`.
#: (Imported by name rather than statically so that listing targets never loads a backend, and so that the
#: targets can build on the engine below them without this registry depending on them.)
BUILTIN_TARGET_MODULES: tuple[str, ...] = ("qdebug.targets.qnn",)

_REGISTRY: dict[str, TargetFactory] = {}
_LOADED = False


def register_target(name: str, factory: TargetFactory) -> None:
    """Register a target factory under ``name`` (a plug-in target calls this when imported)."""
    _REGISTRY[name] = factory


def _load_builtin() -> None:
    global _LOADED  # noqa: PLW0603 - a once-only import of the built-in target modules
    if _LOADED:
        return
    _LOADED = True
    for module in BUILTIN_TARGET_MODULES:
        importlib.import_module(module)


def target_names() -> tuple[str, ...]:
    """Every registered target name, in registration order (built-ins first)."""
    _load_builtin()
    return tuple(_REGISTRY)


def get_target(name: str) -> Target:
    """The target registered as ``name``; an unknown name is a :class:`ConfigError` listing the known ones."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown target {name!r}; known: {list(_REGISTRY)}")
    return _REGISTRY[name]()


def available_targets() -> dict[str, Availability]:
    """Every registered target with (available, reason)."""
    return {name: Availability(*get_target(name).available()) for name in target_names()}
