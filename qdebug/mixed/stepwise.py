"""The step-by-step measured greedy: the core of the ``stepwise`` search strategy (issue 14).

The pool is the demotion sweep's candidates (:func:`~qdebug.mixed.candidates.measure_demotions`) that add noise,
ranked by noise per 16-bit element. A step looks at a window of the next ``width`` candidates of that ranking (not
yet taken, whose region still fits the cost budget): each is added *alone* to the current set and measured, and the
one with the best **measured gain per added 16-bit element** is kept (its measured cost, not the sweep's, counts
against the budget). When none of them gains, the window is added as a *group* (one more evaluation): promotions
that only help together (an 8↔16-bit boundary moved past a neighbour) show up there. When the group gains nothing
either, the window slides to the next ``width`` candidates; those tried stay in the pool (they may gain once others
are in). It stops at the goal, when a window slides past the end of the pool, after ``max_steps`` kept additions, or
after ``max_evaluations``.

Measuring after each addition counts a candidate at its gain *next to those already promoted*, which single
promotions from the 8-bit base (masked by every other tensor's noise) and one-shot prefixes do not. Every evaluation
is a real re-quantization (calibration reused) and debug pass, cached per tensor set in :class:`Measurements`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qdebug.mixed.candidates import Candidate, Ranking, Sensitivity
from qdebug.mixed.evaluation import Evaluation, sixteen_bit_cost
from qdebug.mixed.promote import PromotionPlan

__all__ = ["Measurements", "Trial", "Walk", "stepwise_greedy", "stepwise_pool"]

#: a measured cost increase below this counts as this (a promotion inside an already 16-bit region costs ~nothing)
_MIN_COST_STEP = 1e-4


@dataclass(frozen=True)
class Trial:
    """One promotion set measured: the candidates promoted (in the order taken), its evaluation and plan, and its
    measured cost (share of activation elements in 16 bits)."""

    units: tuple[Candidate, ...]
    evaluation: Evaluation
    plan: PromotionPlan | None
    cost: float
    label: str

    @property
    def tensors(self) -> tuple[str, ...]:
        """The promoted tensors (every candidate's, a group's all of them)."""
        return tuple(dict.fromkeys(t for c in self.units for t in c.tensors))

    @property
    def db(self) -> float:
        """The worst output's SQNR (``-inf`` when it has none)."""
        v = self.evaluation.output_sqnr_db
        return -math.inf if v is None else v


class Measurements:
    """Evaluations of one session by promoted tensor set: a set is measured once, whoever asks for it (a walk that
    tries a set again, or several walks sharing a trajectory, reuse it). ``asked`` counts the requests,
    ``len(seen)`` the evaluations actually run."""

    def __init__(self, session: Any, to: str = "uint16") -> None:
        self.session, self.to = session, to
        self.seen: dict[frozenset[str], tuple[Evaluation, PromotionPlan, float]] = {}
        self.asked = 0

    def measure(self, units: Sequence[Candidate], label: str) -> Trial:
        """``units`` promoted together, measured (or recalled)."""
        self.asked += 1
        tensors = tuple(dict.fromkeys(t for c in units for t in c.tensors))
        key = frozenset(tensors)
        if key not in self.seen:
            plan = self.session.promote(tensors, self.to)
            ev = self.session.evaluate(plan, name=f"stepwise{len(self.seen)}")
            self.seen[key] = (ev, plan, sixteen_bit_cost(ev.report)[0])
        ev, plan, cost = self.seen[key]
        return Trial(tuple(units), ev, plan, cost, label)


@dataclass(frozen=True)
class Walk:
    """A run of the greedy: every distinct set it measured (in order), the accepted steps, and how it ended."""

    trials: tuple[Trial, ...]
    path: tuple[Trial, ...]
    #: "goal met", else why the walk ended
    reason: str
    #: evaluations the walk asked for (``new``: those not already in the cache)
    asked: int
    new: int

    @property
    def reached(self) -> bool:
        """Whether the last kept point meets the goal."""
        return self.reason == "goal met"


def stepwise_pool(sens: Sensitivity) -> tuple[list[Candidate], dict[str, float]]:
    """The demotion sweep's candidates that add noise, by noise per 16-bit element, and each one's 16-bit share."""
    share = {m.candidate.name: m.cost_fraction_16bit for m in sens.measured}
    moved = {m.candidate.name: sens.noise_moved(m) for m in sens.measured}
    return [c for c in sens.ranking(Ranking.EFFICIENCY) if c.name in share and moved[c.name] > 0], share


def _best_addition(
    memo: Measurements,
    cur: Trial,
    window: list[Candidate],
    budget: float,
    left: Callable[[], bool],
    seen: list[Trial],
    step: int,
) -> Trial | None:
    """The window's best single addition by measured gain per added element, else the window as a group; ``None``
    when neither gains within the budget (or the evaluations ran out). Every set measured is appended to ``seen``,
    labelled with ``step`` (the addition it would be)."""
    best: tuple[float, Trial] | None = None
    for c in window:
        if not left():
            return None if best is None else best[1]
        t = memo.measure((*cur.units, c), f"step {step}: +{c.name}")
        seen.append(t)
        if t.cost <= budget and t.db > cur.db:
            score = (t.db - cur.db) / max(t.cost - cur.cost, _MIN_COST_STEP)
            if best is None or score > best[0]:
                best = (score, t)
    if best is None and len(window) > 1 and left():
        t = memo.measure((*cur.units, *window), f"step {step}: +group of {len(window)}")
        seen.append(t)
        if t.cost <= budget and t.db > cur.db:
            best = (0.0, t)
    return None if best is None else best[1]


def stepwise_greedy(
    memo: Measurements,
    sens: Sensitivity,
    meets: Callable[[Evaluation], bool],
    *,
    width: int = 3,
    budget: float = 1.0,
    max_evaluations: int = 40,
    max_steps: int | None = None,
) -> Walk:
    """The greedy of the module docstring from ``memo.session``'s base, on the sweep ``sens``: stop when ``meets``
    the current point, at ``max_evaluations`` requests or ``max_steps`` kept additions, or when no window gains within
    ``budget`` (16-bit share)."""
    pool, share = stepwise_pool(sens)
    asked0, new0 = memo.asked, len(memo.seen)
    cur = Trial((), memo.session.base, None, 0.0, "base")
    path: list[Trial] = []
    seen: list[Trial] = []
    offset, reason = 0, "every window tried: no candidate gains within the budget"

    def left() -> bool:
        return memo.asked - asked0 < max_evaluations

    while not meets(cur.evaluation):
        if not left():
            reason = f"max evaluations ({max_evaluations}) reached"
            break
        if max_steps is not None and len(path) >= max_steps:
            reason = f"max steps ({max_steps}) reached"
            break
        window = [c for c in pool if cur.cost + share[c.name] <= budget][offset : offset + width]
        if not window:
            break
        picked = _best_addition(memo, cur, window, budget, left, seen, len(path) + 1)
        if picked is None:
            offset += width  # nothing here gains now: the next window (these stay for later steps)
            continue
        pool = [c for c in pool if c not in picked.units]
        cur, offset = picked, 0
        path.append(cur)
    reached = meets(cur.evaluation)
    unique = {frozenset(t.tensors): t for t in reversed(seen)}  # the first request of each set, its label
    trials = tuple(t for t in seen if unique[frozenset(t.tensors)] is t)
    return Walk(trials, tuple(path), "goal met" if reached else reason, memo.asked - asked0, len(memo.seen) - new0)
