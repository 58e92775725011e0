"""The ``measured`` search strategy: sensitivity measured, then joint prefixes measured.

1. The candidates (:func:`qdebug.mixed.candidates.candidates`: tensors, and decomposed LayerNorms / attention cores
   as one candidate each) are ranked by estimate; the top ``goal.measure_top`` are promoted one at a time and
   measured (:func:`~qdebug.mixed.candidates.measure_sensitivity`). Early stop: the cheapest single candidate that
   meets the goal ends the search.
2. The ranking by *measured* gain (unmeasured candidates after, by estimate) is searched like ``prefix``: growing
   prefixes 1, 2, 4, … then bisection, each prefix promoted and measured *together* — interactions between
   candidates (a promotion that only helps next to another, or two that fix the same noise) are measured, never
   assumed additive. At most ``measure_top + 2·⌈log2 N⌉`` evaluations for N candidates.

Every point (singles, prefixes, base) is in the result, so :meth:`SearchResult.pareto` is a front of measured
points only.
"""

from __future__ import annotations

import math
import time

from qdebug.mixed.candidates import Candidate, candidates, measure_sensitivity
from qdebug.mixed.evaluation import Evaluation
from qdebug.mixed.promote import PromotionPlan
from qdebug.mixed.search import (
    SearchGoal,
    SearchPoint,
    SearchResult,
    SearchSession,
    _met,
    _point,
    smallest_passing_prefix,
)


def _tensors(order: tuple[Candidate, ...], n: int) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for c in order[:n] for t in c.tensors))


def measured_search(session: SearchSession, goal: SearchGoal) -> SearchResult:
    """See the module docstring."""
    t0 = time.perf_counter()
    start = session.requantizations
    base = session.base
    float_acc = session.float_accuracy
    points: list[tuple[SearchPoint, PromotionPlan | None]] = [(_point(0, (), base, True, "base"), None)]

    def done(chosen: int, reached: bool, reason: str, sens: object = None) -> SearchResult:
        from dataclasses import replace

        # The curve in cost order (then SQNR), so that drawn as a line it does not zigzag in evaluation order.
        order = sorted(
            range(len(points)),
            key=lambda i: (points[i][0].cost_fraction_16bit, points[i][0].output_sqnr_db or -math.inf),
        )
        steps = tuple(replace(points[i][0], step=k, chosen=(i == chosen)) for k, i in enumerate(order))
        return SearchResult(
            goal=goal,
            steps=steps,
            evaluated=(),
            reached=reached,
            stop_reason=reason,
            requantizations=session.requantizations - start,
            seconds=round(time.perf_counter() - t0, 3),
            float_accuracy=float_acc,
            plan=points[chosen][1],
            chosen_step=order.index(chosen),
            sensitivity=sens,
        )

    if _met(goal, base, float_acc):
        return done(0, True, "goal met by the base quantization")
    cands = candidates(session.float_proto, base.report)
    if not cands:
        return done(0, False, "no promotable tensors")
    sens, singles = measure_sensitivity(session, cands, goal.measure_top, goal.to)
    hits: list[int] = []
    for m, ev in singles:
        if ev is None:
            continue
        points.append((_point(0, m.candidate.tensors, ev, False, f"single {m.candidate.name}"), None))
        if _met(goal, ev, float_acc):
            hits.append(len(points) - 1)
    if hits:  # early stop: one candidate alone is enough; the cheapest such one
        best = min(hits, key=lambda i: points[i][0].cost_fraction_16bit)
        tensors = points[best][0].promoted
        points[best] = (points[best][0], session.promote(tensors, goal.to))
        return done(best, True, "goal met by one candidate alone", sens)
    order = sens.ranking()
    by_n: dict[int, int] = {}

    def meets(n: int) -> bool:
        tensors = _tensors(order, n)
        plan = session.promote(tensors, goal.to)
        ev: Evaluation = session.evaluate(plan, name=f"mprefix{n}")
        points.append((_point(0, tensors, ev, False, f"prefix {n} of {len(order)}"), plan))
        by_n[n] = len(points) - 1
        return _met(goal, ev, float_acc)

    budget = max(1, goal.max_steps)
    lo, hi = smallest_passing_prefix(len(order), meets, budget)
    if hi is None:
        best = max(range(len(points)), key=lambda i: points[i][0].output_sqnr_db or -math.inf)
        if points[best][1] is None and best != 0:
            points[best] = (points[best][0], session.promote(points[best][0].promoted, goal.to))
        why = "even every candidate misses the goal" if lo == len(order) else f"max_steps ({goal.max_steps})"
        return done(best, False, why, sens)
    reason = "goal met"
    if hi - lo > 1:
        reason = f"goal met; max_steps ({goal.max_steps}) ended the bisection with {lo + 1}–{hi - 1} candidates untried"
    return done(by_n[hi], True, reason, sens)


__all__ = ["measured_search"]
