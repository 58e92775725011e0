"""Target-aware cost of search points: compile the Pareto points the user picks for a target (QNN: onnxruntime-qnn,
HTP simulator on x86) and record how the compiled graph came out — accelerator partitions and CPU-fallback nodes.

Why: on the HTP, 16-bit elements are not the whole cost. A promotion whose 8↔16-bit boundaries or 16-bit ops the
backend refuses leaves nodes on the CPU and splits the accelerator graph into several partitions, each boundary a
round trip. Such a point is marked (:attr:`TargetCost.splits`) in the front's ``to_dict()`` and the CLI table.

Each picked point is re-quantized from the cached calibration (the recipe it was measured with) and compiled through
the target's own steps (:func:`qdebug.targets.recompile.recompile`); nothing is re-measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from qdebug.errors import ConfigError

if TYPE_CHECKING:
    from qdebug.mixed.search import SearchPoint, SearchResult

__all__ = ["TargetCost", "compile_points", "pick_points"]


@dataclass(frozen=True)
class TargetCost:
    """A search point compiled for ``target``: how many accelerator partitions and CPU nodes it came out as."""

    target: str
    ok: bool
    partitions: int
    cpu_nodes: int
    #: CPU-fallback nodes by op type (by-design graph-I/O Q/DQ excluded), most first
    fallback_by_op: tuple[tuple[str, int], ...] = ()
    error: str | None = None
    compile_seconds: float = 0.0

    @property
    def splits(self) -> bool:
        """The point does not compile to one accelerator partition with nothing on the CPU."""
        return not self.ok or self.partitions != 1 or self.cpu_nodes > 0

    def describe(self) -> str:
        """One short phrase for a table cell."""
        if not self.ok:
            return f"compile failed: {self.error or 'no reason given'}"[:80]
        head = f"{self.partitions} partition{'s' if self.partitions != 1 else ''}, {self.cpu_nodes} CPU nodes"
        if not self.splits:
            return head
        ops = ", ".join(f"{op} {n}" for op, n in self.fallback_by_op[:3])
        return f"SPLIT: {head}" + (f" ({ops})" if ops else "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``splits``)."""
        return {
            "target": self.target,
            "ok": self.ok,
            "partitions": self.partitions,
            "cpu_nodes": self.cpu_nodes,
            "fallback_by_op": [list(x) for x in self.fallback_by_op],
            "error": self.error,
            "compile_seconds": self.compile_seconds,
            "splits": self.splits,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetCost:
        """Inverse of :meth:`to_dict`."""
        return cls(
            target=d["target"], ok=d["ok"], partitions=d["partitions"], cpu_nodes=d["cpu_nodes"],
            fallback_by_op=tuple((str(op), int(n)) for op, n in d.get("fallback_by_op", ())),
            error=d.get("error"), compile_seconds=d.get("compile_seconds", 0.0),
        )  # fmt: skip

    @classmethod
    def from_report(cls, report: Any) -> TargetCost:
        """From a :class:`~qdebug.targets.base.CompileReport`."""
        by_op = sorted(report.fallback_by_op().items(), key=lambda x: (-x[1], x[0]))
        return cls(
            target=report.target, ok=report.ok, partitions=report.accelerator_partitions, cpu_nodes=report.cpu_nodes,
            fallback_by_op=tuple(by_op), error=report.error, compile_seconds=round(report.compile_seconds, 3),
        )  # fmt: skip


def pick_points(result: SearchResult, spec: str) -> tuple[SearchPoint, ...]:
    """The points ``spec`` names: ``chosen``, ``front`` (every Pareto point) or comma-separated indices into the
    Pareto front as printed (0 = cheapest)."""
    front = result.pareto()
    spec = spec.strip()
    if spec == "chosen":
        return (result.final,)
    if spec == "front":
        return front
    try:
        idx = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--compile-points takes 'chosen', 'front' or front indices like 0,2; got {spec!r}") from None
    bad = [i for i in idx if not 0 <= i < len(front)]
    if not idx or bad:
        raise ConfigError(f"--compile-points: the Pareto front has points 0–{len(front) - 1}; got {spec!r}")
    return tuple(front[i] for i in dict.fromkeys(idx))


def _config(session: Any, result: SearchResult, p: SearchPoint) -> Any:
    """The recipe the point was measured with."""
    base = session.base.config
    if p.label == "all16":
        return base.replace(activation_type=result.goal.to, tensor_overrides=())
    if not p.promoted:
        return base
    return session.promote(p.promoted, result.goal.to).config


def compile_points(
    session: Any, result: SearchResult, points: Sequence[SearchPoint], target: str, options: Any = None
) -> SearchResult:
    """``result`` with each of ``points`` compiled for ``target`` (its :class:`TargetCost` set on the point, in the
    curve and the evaluated points alike). ``session`` is the search's
    :class:`~qdebug.mixed.session.MixedPrecisionSession` (its calibration is reused to rebuild each point's model)."""
    from qdebug.targets.recompile import recompile

    costs: dict[int, TargetCost] = {}
    for i, p in enumerate(points):
        q = session.requantize(_config(session, result, p), name=f"compile_point{i}")
        r = recompile(q.model_path, session.workdir / f"compile_point{i}.{target}", target, options=options)
        costs[id(p)] = TargetCost.from_report(r.compile)

    def mark(ps: tuple[SearchPoint, ...]) -> tuple[SearchPoint, ...]:
        return tuple(replace(p, target_cost=costs[id(p)]) if id(p) in costs else p for p in ps)

    return replace(result, steps=mark(result.steps), evaluated=mark(result.evaluated))
