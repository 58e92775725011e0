"""QNN's compile log: ORT's verbose log of a QNN compile parsed into what QNN took, what it refused and why
(:func:`parse_compile_log`), the only place node placement and QNN's rejection reasons are visible."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qdebug.targets.qnn_options import CPU_EP

__all__ = ["BY_DESIGN_REASONS", "CompileLog", "NodeUnitValidation", "parse_compile_log"]

#: Reasons for which QNN leaves a node on the CPU on purpose (``offload_graph_io_quantization``): the
#: graph-input QuantizeLinear and graph-output DequantizeLinear. Not a fallback the user has to fix.
BY_DESIGN_REASONS = (
    "QNN EP is configured to not take Q nodes that consume a graph input",
    "QNN EP is configured to not take DQ nodes that generate a graph output",
)


@dataclass(frozen=True)
class NodeUnitValidation:
    """One ``Validation PASSED/FAILED for N nodes in OrtNodeUnit (Op)`` entry of the verbose log."""

    op_type: str
    passed: bool
    nodes: int
    node_names: tuple[str, ...]
    reason: str = ""
    #: QNN backend errors logged while building this unit, e.g. ``"FullyConnected: error 3110"``.
    backend_errors: tuple[str, ...] = ()

    @property
    def by_design(self) -> bool:
        """A graph-input Q / graph-output DQ that QNN leaves on the CPU on purpose."""
        return any(self.reason.startswith(r) for r in BY_DESIGN_REASONS)

    def describe(self) -> str:
        """The backend's reason, with QNN's own error codes when it logged any."""
        text = self.reason or "no reason logged"
        if self.backend_errors:
            text += f" (QNN backend: {', '.join(self.backend_errors)})"
        return text


@dataclass(frozen=True)
class CompileLog:
    """What ORT's verbose log says about a QNN compile.

    ``units`` are from the *last* capability pass only: ORT asks QNN twice (before and after the layout
    transformation to NHWC), and only the last answer decides the partitioning. ``placements`` counts
    nodes per provider in the partitioned graph (where a whole QNN partition is *one* node);
    ``cpu_placed`` lists (op type, node name) of what ORT placed on the CPU provider.
    """

    units: tuple[NodeUnitValidation, ...]
    passes: int
    placements: Mapping[str, int]
    cpu_placed: tuple[tuple[str, str], ...]

    @property
    def failed(self) -> tuple[NodeUnitValidation, ...]:
        """The node units QNN refused."""
        return tuple(u for u in self.units if not u.passed)


_PASS_RE = re.compile(r"GetCapability pass (\d+)")
_UNIT_RE = re.compile(r"Validation (PASSED|FAILED) for (\d+) nodes? in OrtNodeUnit \(([^)]*)\)")
_UNIT_NODE_RE = re.compile(r"^\s*Operator type: (\S+) Node name: (.*?) Node index: \d+\s*$")
_REASON_RE = re.compile(r"^\s*REASON\s*:\s*(.*?)\s*$")
_PLACED_RE = re.compile(r"(?:Node\(s\)|All nodes) placed on \[([^\]]+)\]\. Number of nodes: (\d+)")
_PLACED_NODE_RE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s{3,}(\S+) \((.*)\)\s*$")
_BACKEND_RE = re.compile(r"backendValidateOpConfig\(\) failed for node `[^`]*` of type `([^`]*)` with error code (\d+)")


def parse_compile_log(text: str) -> CompileLog:
    """Parse ORT's verbose log of a QNN compile (see :class:`CompileLog`)."""
    units: list[NodeUnitValidation] = []
    passes = 0
    placements: dict[str, int] = {}
    cpu_placed: list[tuple[str, str]] = []
    current: dict[str, Any] | None = None
    pending_backend: list[str] = []
    placing: str | None = None

    def flush() -> None:
        nonlocal current
        if current is not None:
            units.append(NodeUnitValidation(**{**current, "node_names": tuple(current["node_names"])}))
            current = None

    for line in text.splitlines():
        if m := _PASS_RE.search(line):
            flush()
            units.clear()
            pending_backend.clear()
            passes = max(passes, int(m.group(1)))
            continue
        if m := _UNIT_RE.search(line):
            flush()
            passed = m.group(1) == "PASSED"
            current = {
                "op_type": m.group(3),
                "passed": passed,
                "nodes": int(m.group(2)),
                "node_names": [],
                "reason": "",
                # QNN's backend errors are logged just before the unit they belong to.
                "backend_errors": () if passed else tuple(dict.fromkeys(pending_backend)),
            }
            pending_backend.clear()
            continue
        if m := _BACKEND_RE.search(line):
            pending_backend.append(f"{m.group(1)}: error {m.group(2)}")
            continue
        if current is not None:
            if m := _UNIT_NODE_RE.match(line):
                current["node_names"].append(m.group(2))
                continue
            if m := _REASON_RE.match(line):
                current["reason"] = m.group(1)
                continue
        if m := _PLACED_RE.search(line):
            flush()
            placing = m.group(1)
            placements[placing] = placements.get(placing, 0) + int(m.group(2))
            continue
        if placing is not None:
            if m := _PLACED_NODE_RE.search(line):
                if placing == CPU_EP:
                    cpu_placed.append((m.group(1), m.group(2)))
                continue
            placing = None
    flush()
    return CompileLog(tuple(units), passes, placements, tuple(cpu_placed))
