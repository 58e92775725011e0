"""What a target's compile produced (:class:`CompileReport`: where the graph ran, why parts stayed on the CPU),
when that counts as a failure (:func:`compile_problems`), and the report of a compile that failed before producing
anything (:func:`failed_report`).

Every target writes one (:meth:`~qdebug.targets.base.Target.compile` returns it inside
:class:`~qdebug.targets.base.Compiled`); ``build`` and ``recompile`` read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from qdebug.passes import PassReport

__all__ = ["CompileReport", "FallbackNode", "FixReport", "compile_problems", "failed_report"]


SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FallbackNode:
    """A group of nodes the backend refused (left on the CPU), with the backend's own reason."""

    op_type: str
    nodes: int
    reason: str
    by_design: bool = False  # e.g. QNN leaves graph-input Q / graph-output DQ on the CPU on purpose
    #: the nodes of the group as the backend named them (QNN: the node unit, e.g. DQ → Einsum → Q)
    node_names: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FallbackNode:
        """Inverse of :func:`dataclasses.asdict` (reports written before ``node_names`` existed read too)."""
        return cls(**{**d, "node_names": tuple(d.get("node_names", ()))})


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
    accelerator: bool = True  # False: the target is the CPU itself, so partitions and fallback mean nothing there

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
        kw["fallback"] = tuple(FallbackNode.from_dict(f) for f in kw.get("fallback", ()))
        kw["warnings"] = tuple(kw.get("warnings", ()))
        return cls(**kw)

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def compile_problems(report: CompileReport, fail_on_fallback: bool = False) -> list[str]:
    """Why a compile report is a failure: an error, zero nodes on the accelerator, or (asked for) CPU fallback."""
    name = report.target.upper()
    if not report.ok:
        return [f"{name} compile failed: {report.error or 'no reason given'}"]
    out = []
    if report.accelerator_partitions == 0 or report.accelerator_nodes == 0:
        by_op = ", ".join(f"{op} {n}" for op, n in sorted(report.fallback_by_op().items())) or "see the compile log"
        out.append(f"{name} took no node of the model: everything would run on the CPU ({by_op})")
    elif fail_on_fallback and report.cpu_nodes > 0:
        by_op = ", ".join(f"{op} {n}" for op, n in sorted(report.fallback_by_op().items()))
        out.append(f"--fail-on-fallback: {report.cpu_nodes} node(s) fall back to the CPU ({by_op})")
    return out


def failed_report(target: str, device: str, t0: float, error: str, nodes: int = 0) -> CompileReport:
    """A :class:`CompileReport` for a compile that failed before producing anything."""
    import time

    return CompileReport(
        target=target,
        ok=False,
        compiled_model=None,
        compile_seconds=round(time.perf_counter() - t0, 4),
        accelerator_partitions=0,
        accelerator_nodes=nodes,
        cpu_nodes=0,
        graph_io_qdq_on_cpu=0,
        device=device,
        error=error,
    )
