"""What a mixed-precision search is made of: its goal, its measured points and its result, with the records a
result carries (a point compiled for a target, the choice checked on held-out samples).

The records sit below the search and the modules that fill them in (:mod:`qdebug.mixed.search`,
:mod:`qdebug.mixed.holdout`, :mod:`qdebug.mixed.target_cost`), so those import them from here and never each other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from qdebug.errors import ConfigError
from qdebug.mixed.candidates import Ranking
from qdebug.mixed.promote import PromotionPlan
from qdebug.mixed.target_fixes import TargetFixes
from qdebug.report import decode_number, encode_number

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "SCHEMA_VERSION",
    "STRATEGIES",
    "HeldOutPoint",
    "HoldoutCheck",
    "SearchGoal",
    "SearchPoint",
    "SearchResult",
    "TargetCost",
]

#: 2: a compiled point's ``target_cost`` also carries its output SQNR measured on the target (``target_sqnr_db``, with
#: ``cpu_sqnr_db`` on the same samples); schema-1 documents read as before (those fields ``None``)
#: 3: ``target_fixes`` — the target's compatibility fixes applied to the float model before the search
#: (:class:`~qdebug.mixed.target_fixes.TargetFixes`; ``None``: the model was searched as given, as in every older
#: document)
#: 4: ``holdout`` — the choice measured again on held-out samples (:class:`~qdebug.mixed.holdout.HoldoutCheck`;
#: ``None`` when the session had none, as in every older document); ``goal.holdout_checks``
SCHEMA_VERSION = 4

#: ``prefix``: estimated ranking, doubling + bisection; ``greedy``: best of the next few, one at a time;
#: ``measured``: the top candidates (groups merged) measured alone, then prefixes of the *measured* ranking, each
#: measured jointly (interactions measured, never assumed additive).
#: ``efficient``: the all-16-bit model measured, then each candidate left alone in 8 bits (its own noise, measured),
#: then prefixes of the ranking by noise per 16-bit element, starting at the prefix that ranking predicts.
#: ``stepwise``: the same sweep, then one candidate at a time (the best measured gain per added element of the next
#: ``candidates_per_step``), measured after each addition.
STRATEGIES = ("prefix", "greedy", "measured", "efficient", "stepwise")


@dataclass(frozen=True)
class SearchGoal:
    """Stop when the worst output reaches ``output_sqnr_db`` and/or the top-1 accuracy drop vs float is at
    most ``max_accuracy_drop`` (a fraction, e.g. 0.005 for half a point) and/or the task metric's score reaches
    ``task_value`` (at least it, or at most it for a metric where lower is better: e.g. 0.99 top-1 agreement; the
    session's ``debug_options.task_metric`` names the metric, and every debug pass scores it)."""

    output_sqnr_db: float | None = None
    max_accuracy_drop: float | None = None
    max_steps: int = 8
    candidates_per_step: int = 4
    min_gain_db: float = 0.05
    to: str = "uint16"
    strategy: str = "prefix"
    #: stop within this many dB of the all-16-bit-activations model (measured first: one more evaluation)
    near_all16_db: float | None = None
    #: ``measured``/``efficient``: how many of the best-estimated candidates are measured one at a time (``None``:
    #: 8 for ``measured``, every candidate for ``efficient``)
    measure_top: int | None = None
    #: ``measured``: rank the measured candidates by gain or by gain per 16-bit element (``efficient`` always uses
    #: the latter)
    rank: str = "gain"
    #: ``stepwise``: the share of activation elements in 16 bits a point may reach (``None``: no limit)
    max_cost_fraction: float | None = None
    #: ``stepwise``: the search's evaluations at most, the all-16-bit ceiling, the demotion sweep (which
    #: ``measure_top`` also bounds) and the greedy included; ``None``: N + 2·⌈log2 N⌉ for N candidates
    #: (:func:`evaluation_bound`). ``max_steps`` bounds the greedy's kept additions.
    max_evaluations: int | None = None
    #: with held-out samples in the session: how many points (the choice, then costlier front points that met the
    #: goal) are measured on them at most until one holds (:mod:`qdebug.mixed.holdout`)
    holdout_checks: int = 3
    #: the task metric's score to reach (``None``: no task goal)
    task_value: float | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"search strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        goals = (self.output_sqnr_db, self.max_accuracy_drop, self.near_all16_db, self.task_value)
        if all(g is None for g in goals):
            raise ConfigError("a search goal needs output_sqnr_db, near_all16_db, max_accuracy_drop and/or task_value")
        if self.task_value is not None and not math.isfinite(self.task_value):
            raise ConfigError(f"task_value must be a finite number, got {self.task_value}")
        if self.near_all16_db is not None and not (math.isfinite(self.near_all16_db) and self.near_all16_db >= 0):
            raise ConfigError(f"near_all16_db must be a finite number of dB >= 0, got {self.near_all16_db}")
        if self.measure_top is not None and self.measure_top < 1:
            raise ConfigError("measure_top must be positive")
        if self.rank not in tuple(Ranking):
            raise ConfigError(f"rank must be one of {', '.join(Ranking)}, got {self.rank!r}")
        if self.max_accuracy_drop is not None and not 0 <= self.max_accuracy_drop < 1:
            raise ConfigError(f"max_accuracy_drop is a fraction in [0, 1), got {self.max_accuracy_drop}")
        if self.max_cost_fraction is not None and not 0 < self.max_cost_fraction <= 1:
            raise ConfigError(f"max_cost_fraction is a share in (0, 1], got {self.max_cost_fraction}")
        if self.max_evaluations is not None and self.max_evaluations < 1:
            raise ConfigError(f"max_evaluations must be positive, got {self.max_evaluations}")
        if self.holdout_checks < 1:
            raise ConfigError(f"holdout_checks must be positive, got {self.holdout_checks}")
        if self.max_steps < 1 or self.candidates_per_step < 1:
            raise ConfigError("max_steps and candidates_per_step must be positive")


# ------------------------------------------------------------------------------------------ a point compiled
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
    #: the compiled model on the target (QNN: the HTP simulator): its worst output's SQNR vs the float model, over
    #: ``accuracy_samples`` debug samples (``None``: not run, or no target-side check for this target)
    target_sqnr_db: float | None = None
    #: the CPU QDQ model's worst output SQNR vs float on the same samples (the point's own ``output_sqnr_db`` is over
    #: the whole debug set)
    cpu_sqnr_db: float | None = None
    accuracy_samples: int = 0
    #: what the target-side run printed (e.g. "HTP simulator (SM8550)")
    device: str = ""
    #: why the target-side run failed, if it did (the compile itself may still be fine)
    accuracy_error: str | None = None

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

    @property
    def target_loss_db(self) -> float | None:
        """How much SQNR vs float the target loses against the CPU QDQ model on the same samples (positive: worse
        on the target)."""
        if self.target_sqnr_db is None or self.cpu_sqnr_db is None:
            return None
        if math.isinf(self.target_sqnr_db) and math.isinf(self.cpu_sqnr_db):
            return 0.0
        return self.cpu_sqnr_db - self.target_sqnr_db

    def describe_accuracy(self) -> str:
        """One short phrase for a table cell: the target's output SQNR next to the CPU's on the same samples."""
        if self.accuracy_error is not None:
            return f"run failed: {self.accuracy_error}"[:80]
        if self.target_sqnr_db is None:
            return "-"
        n = self.accuracy_samples
        return f"{_db(self.target_sqnr_db)} (CPU {_db(self.cpu_sqnr_db)}, {n} sample{'s' if n != 1 else ''})"

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
            "target_sqnr_db": encode_number(self.target_sqnr_db),
            "cpu_sqnr_db": encode_number(self.cpu_sqnr_db),
            "accuracy_samples": self.accuracy_samples,
            "device": self.device,
            "accuracy_error": self.accuracy_error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetCost:
        """Inverse of :meth:`to_dict` (a search result of schema 1 has no target-side accuracy: ``None``)."""
        return cls(
            target=d["target"], ok=d["ok"], partitions=d["partitions"], cpu_nodes=d["cpu_nodes"],
            fallback_by_op=tuple((str(op), int(n)) for op, n in d.get("fallback_by_op", ())),
            error=d.get("error"), compile_seconds=d.get("compile_seconds", 0.0),
            target_sqnr_db=decode_number(d.get("target_sqnr_db")), cpu_sqnr_db=decode_number(d.get("cpu_sqnr_db")),
            accuracy_samples=int(d.get("accuracy_samples", 0)), device=str(d.get("device", "")),
            accuracy_error=d.get("accuracy_error"),
        )  # fmt: skip

    @classmethod
    def from_report(cls, report: Any, accuracy: Any = None, accuracy_error: str | None = None) -> TargetCost:
        """From a :class:`~qdebug.targets.compile_report.CompileReport` and, if the compiled model ran on the target,
        its :class:`~qdebug.report.TargetAccuracy` (the worst output of each side)."""
        by_op = sorted(report.fallback_by_op().items(), key=lambda x: (-x[1], x[0]))
        tgt = cpu = None
        n, device = 0, ""
        if accuracy is not None and accuracy.outputs:
            tgt = _worst(o.target_vs_float_db for o in accuracy.outputs)
            cpu = _worst(o.cpu_vs_float_db for o in accuracy.outputs)
            n, device = accuracy.num_samples, accuracy.device
        return cls(
            target=report.target, ok=report.ok, partitions=report.accelerator_partitions, cpu_nodes=report.cpu_nodes,
            fallback_by_op=tuple(by_op), error=report.error, compile_seconds=round(report.compile_seconds, 3),
            target_sqnr_db=tgt, cpu_sqnr_db=cpu, accuracy_samples=n, device=device, accuracy_error=accuracy_error,
        )  # fmt: skip


def _worst(values: Iterable[float | None]) -> float | None:
    """The lowest SQNR of the outputs that have one."""
    vs = [v for v in values if v is not None]
    return min(vs) if vs else None


def _db(v: float | None) -> str:
    if v is None:
        return "n/a"
    return "identical" if math.isinf(v) and v > 0 else f"{v:.2f} dB"


# ------------------------------------------------------------------------------------------ held-out check
def _num(v: Any) -> float | None:
    """A JSON number back (``None``, or a float; ``encode_number`` writes infinities as strings)."""
    return None if v is None else float(v)


@dataclass(frozen=True)
class HeldOutPoint:
    """A point of the search measured again on the held-out samples."""

    label: str
    cost_fraction_16bit: float
    #: worst output SQNR on the debug samples (what the search saw) and on the held-out ones
    search_db: float | None
    holdout_db: float | None
    #: meets the held-out goal
    holds: bool
    #: the task metric's score on the debug samples and on the held-out ones (``None``: no task metric)
    search_task: float | None = None
    holdout_task: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: encode_number(v) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeldOutPoint:
        """Inverse of :meth:`to_dict` (a point written before task metrics has no task scores)."""
        return cls(
            str(d["label"]), float(d["cost_fraction_16bit"]), _num(d["search_db"]), _num(d["holdout_db"]),
            bool(d["holds"]), _num(d.get("search_task")), _num(d.get("holdout_task")),
        )  # fmt: skip


@dataclass(frozen=True)
class HoldoutCheck:
    """The search's choice checked on held-out samples (the module docstring)."""

    samples: int
    base_db: float | None
    ceiling_db: float | None
    #: the goal on the held-out samples (held-out all-16 minus the goal's margin, or the absolute goal)
    goal_db: float | None
    #: the points checked, in order (the search's own choice first)
    points: tuple[HeldOutPoint, ...]
    #: the final choice meets the held-out goal
    holds: bool
    #: the choice moved to a costlier front point that holds
    moved: bool
    note: str
    #: held-out debug passes run (each a re-quantization from the cached ranges and a debug pass)
    evaluations: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (part of the search result's)."""
        d = {k: encode_number(v) if isinstance(v, float) else v for k, v in asdict(self).items()}
        d["points"] = [p.to_dict() for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HoldoutCheck:
        """Inverse of :meth:`to_dict`."""
        return cls(
            samples=int(d["samples"]), base_db=_num(d["base_db"]), ceiling_db=_num(d["ceiling_db"]),
            goal_db=_num(d["goal_db"]), points=tuple(HeldOutPoint.from_dict(p) for p in d["points"]),
            holds=bool(d["holds"]), moved=bool(d["moved"]), note=str(d["note"]),
            evaluations=int(d["evaluations"]), seconds=float(d["seconds"]),
        )  # fmt: skip


# ------------------------------------------------------------------------------------------ points and result
@dataclass(frozen=True)
class SearchPoint:
    """One measured configuration: a point of the cost/quality curve."""

    step: int
    promoted: tuple[str, ...]
    cost_fraction_16bit: float
    num_16bit_tensors: int
    output_sqnr_db: float | None
    accuracy: float | None
    chosen: bool
    seconds: float
    #: what the point is ("base", "all16", "single layernorm@x", "prefix 3"…)
    label: str = ""
    #: 8↔16-bit conversions (ORT ``convert`` entries: a DQ→Q pair each) the promotion adds — the cost axis for a
    #: target where every boundary is a requantize op (QNN HTP) rather than memory
    num_converts: int = 0
    #: the point compiled for a target (:func:`qdebug.mixed.target_cost.compile_points`), if it was picked
    target_cost: TargetCost | None = None
    #: the task metric's score (``None``: the session scores none)
    task_value: float | None = None


@dataclass(frozen=True)
class SearchResult:
    """The accepted steps (the curve), every evaluated point, and whether the goal was reached."""

    goal: SearchGoal
    steps: tuple[SearchPoint, ...]
    evaluated: tuple[SearchPoint, ...]
    reached: bool
    stop_reason: str
    requantizations: int
    seconds: float
    float_accuracy: float | None
    plan: PromotionPlan | None = field(default=None, compare=False)
    chosen_step: int = -1
    #: the all-16-bit-activations model's worst output (measured when the goal is relative to it)
    ceiling_db: float | None = None
    #: predicted vs measured gain of the candidates measured alone (``measured`` strategy), as its ``to_dict()``
    sensitivity: Any = field(default=None, compare=False)
    #: the target's compatibility fixes applied to the float model before the search (``None``: searched as given)
    target_fixes: TargetFixes | None = None
    #: the choice measured again on held-out samples (``None``: the session had none)
    holdout: HoldoutCheck | None = None

    @property
    def evaluations(self) -> int:
        """Measured variants (each one re-quantization from the cached ranges and one debug pass)."""
        return self.requantizations

    @property
    def final(self) -> SearchPoint:
        """The chosen point: the smallest measured set meeting the goal (else the best tried)."""
        return self.steps[self.chosen_step]

    def pareto(self, cost: str = "elements") -> tuple[SearchPoint, ...]:
        """Evaluated points not dominated in (lower cost, higher output SQNR); ``cost`` is ``"elements"`` (share of
        activation elements in 16 bits) or ``"converts"`` (8↔16-bit boundaries)."""
        if cost not in ("elements", "converts"):
            raise ConfigError(f"pareto cost must be 'elements' or 'converts', got {cost!r}")
        pts = [p for p in (*self.steps, *self.evaluated) if p.output_sqnr_db is not None]
        if cost == "converts":
            pts = [p for p in pts if p.label != "all16"]  # a different recipe: no boundaries, yet not free
        front: list[SearchPoint] = []

        # Ties (same cost and SQNR, e.g. a prefix whose last candidate added nothing): the chosen point, then the
        # fewest promoted tensors.
        def key(p: SearchPoint) -> tuple[float, float, bool, int]:
            c = p.cost_fraction_16bit if cost == "elements" else float(p.num_converts)
            return c, -(p.output_sqnr_db or 0.0), not p.chosen, len(p.promoted)

        for p in sorted(pts, key=key):
            if not front or (p.output_sqnr_db or 0.0) > (front[-1].output_sqnr_db or 0.0):
                front.append(p)
        return tuple(front)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""

        def pt(p: SearchPoint) -> dict[str, Any]:
            d = {k: encode_number(v) if isinstance(v, float) else v for k, v in asdict(p).items()}
            d["target_cost"] = None if p.target_cost is None else p.target_cost.to_dict()  # with ``splits``
            return d

        return {
            "schema_version": SCHEMA_VERSION,
            "goal": asdict(self.goal),
            "steps": [pt(p) for p in self.steps],
            "evaluated": [pt(p) for p in self.evaluated],
            "reached": self.reached,
            "stop_reason": self.stop_reason,
            "requantizations": self.requantizations,
            "seconds": self.seconds,
            "float_accuracy": self.float_accuracy,
            "promoted": list(self.final.promoted),
            "chosen_step": self.chosen_step,
            "ceiling_db": encode_number(self.ceiling_db),
            "pareto": [pt(p) for p in self.pareto()],
            "sensitivity": None if self.sensitivity is None else self.sensitivity.to_dict(),
            "target_fixes": None if self.target_fixes is None else self.target_fixes.to_dict(),
            "holdout": None if self.holdout is None else self.holdout.to_dict(),
        }

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def to_dataframe(self) -> pd.DataFrame:
        """The curve: one row per accepted step."""
        import pandas as pd

        return pd.DataFrame([asdict(p) for p in self.steps])
