"""The estimate-ranked search strategies: ``prefix`` (growing prefixes of one ranking by estimated output gain, then
bisection) and ``greedy`` (at each step the best few candidates of the current report measured, the best kept).

Both rank tensors by :func:`qdebug.mixed.suggest.analyse` and promote a candidate group (decomposed LayerNorm,
attention core) whole. :mod:`qdebug.mixed.search` describes every strategy and chooses between them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from qdebug.mixed.candidates import candidates
from qdebug.mixed.evaluation import Evaluation
from qdebug.mixed.points import SearchGoal, SearchPoint, SearchResult
from qdebug.mixed.promote import PromotionPlan
from qdebug.mixed.search_base import (
    SearchSession,
    curve_point,
    evaluate_all,
    meets_goal,
    smallest_passing_prefix,
)
from qdebug.mixed.suggest import Role, analyse


def _candidates(ev: Evaluation, promoted: tuple[str, ...], k: int) -> list[str]:
    ranked = analyse(ev.report)
    by_name = {a.tensor_name: a for a in ev.report.activations}
    out: list[str] = []

    def add(name: str) -> None:
        if name not in promoted and name not in out and len(out) < k:
            out.append(name)

    for s in ranked:
        if s.role == Role.ORIGINATOR.value:
            add(s.tensor_name)
    for s in ranked:  # an amplifier is fixed upstream: try its quantized inputs
        if s.role == Role.AMPLIFIER.value:
            for i in by_name[s.tensor_name].inputs:
                if i in by_name and by_name[i].quantized and not (by_name[i].quant_type or "").endswith("16"):
                    add(i)
    for s in ranked:
        add(s.tensor_name)
    # Then every other quantized 8-bit tensor, in graph order: views with no rounding of their own (Transpose,
    # Slice, Reshape after a promoted MatMul) are not ranked, yet left in 8 bits they re-quantize what their
    # promoted producer computed — "every candidate" must mean every tensor, or the last prefix is not all-16-bit.
    for a in sorted(ev.report.activations, key=lambda a: a.topo_index):
        if a.quantized and not (a.quant_type or "").endswith("16"):
            add(a.tensor_name)
    return out


def _group_map(session: SearchSession, ev: Evaluation) -> dict[str, tuple[str, ...]]:
    """Each tensor of a candidate group (decomposed LayerNorm, attention core) → the group's tensors: the prefix and
    greedy strategies promote a group whole, since one member alone cannot help."""
    return {t: c.tensors for c in candidates(session.float_proto, ev.report) if len(c.tensors) > 1 for t in c.tensors}


def _grouped(order: Sequence[str], groups: dict[str, tuple[str, ...]]) -> list[tuple[str, ...]]:
    """``order`` (tensors, best first) as candidates: a grouped tensor brings its whole group, at its best rank."""
    out: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for t in order:
        if t not in seen:
            unit = tuple(m for m in groups.get(t, (t,)) if m not in seen)
            seen.update(unit)
            out.append(unit)
    return out


def _flat(units: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for u in units for t in u))


def prefix_search(session: SearchSession, goal: SearchGoal) -> SearchResult:
    t0 = time.perf_counter()
    start_requant = session.requantizations
    base = session.base
    float_acc = session.float_accuracy
    results: dict[int, tuple[SearchPoint, Evaluation, PromotionPlan | None]] = {
        0: (curve_point(0, (), base, True), base, None)
    }
    if meets_goal(goal, base, float_acc):
        return _result(goal, results, 0, True, "goal met by the base quantization", session, start_requant, t0)
    order = _grouped(_candidates(base, (), 1 << 30), _group_map(session, base))
    if not order:
        return _result(goal, results, 0, False, "no promotable tensors", session, start_requant, t0)

    def measure(n: int) -> bool:
        tensors = _flat(order[:n])
        plan = session.promote(tensors, goal.to)
        ev = session.evaluate(plan, name=f"prefix{n}")
        results[n] = (curve_point(len(results), tensors, ev, False), ev, plan)
        return meets_goal(goal, ev, float_acc)

    lo, hi = smallest_passing_prefix(len(order), measure, goal.max_steps)
    if hi is None:
        why = "even promoting every candidate misses the goal" if lo == len(order) else f"max_steps ({goal.max_steps})"
        return _result(goal, results, lo, False, why, session, start_requant, t0)
    reason = "goal met"
    if hi - lo > 1:  # max_steps cut the bisection short: a smaller set may also meet the goal
        reason = f"goal met; max_steps ({goal.max_steps}) ended the bisection with {lo + 1}–{hi - 1} candidates untried"
    return _result(goal, results, hi, True, reason, session, start_requant, t0)


def _result(
    goal: SearchGoal,
    results: dict[int, tuple[SearchPoint, Evaluation, PromotionPlan | None]],
    chosen: int,
    reached: bool,
    reason: str,
    session: SearchSession,
    start_requant: int,
    t0: float,
) -> SearchResult:
    curve = tuple(replace(results[n][0], step=i, chosen=(n == chosen)) for i, n in enumerate(sorted(results)))
    return SearchResult(
        goal=goal,
        steps=curve,
        evaluated=(),
        reached=reached,
        stop_reason=reason,
        requantizations=session.requantizations - start_requant,
        seconds=round(time.perf_counter() - t0, 3),
        float_accuracy=session.float_accuracy,
        plan=results[chosen][2],
        chosen_step=next(i for i, n in enumerate(sorted(results)) if n == chosen),
    )


def greedy_search(session: SearchSession, goal: SearchGoal) -> SearchResult:
    t0 = time.perf_counter()
    start_requant = session.requantizations
    base = session.base
    float_acc = session.float_accuracy
    current = base
    promoted: tuple[str, ...] = ()
    steps = [curve_point(0, (), base, True)]
    evaluated: list[SearchPoint] = []
    plan: PromotionPlan | None = None
    reason = "goal met by the base quantization"
    reached = meets_goal(goal, base, float_acc)
    groups = _group_map(session, base) if not reached else {}
    while not reached:
        if len(steps) - 1 >= goal.max_steps:
            reason = f"max_steps ({goal.max_steps}) reached"
            break
        cands = _grouped(_candidates(current, promoted, 1 << 30), groups)[: goal.candidates_per_step]
        if not cands:
            reason = "no candidates left"
            break
        trials: list[tuple[float, tuple[str, ...], PromotionPlan, Evaluation]] = []
        plans = [session.promote(_flat((promoted, c)), goal.to) for c in cands]
        evs = evaluate_all(session, plans, [f"step{len(steps)}_{k}" for k in range(len(cands))])
        for c, p, ev in zip(cands, plans, evs, strict=True):
            evaluated.append(curve_point(len(steps), _flat((promoted, c)), ev, False))
            score = ev.output_sqnr_db if ev.output_sqnr_db is not None else -math.inf
            trials.append((score, c, p, ev))
        best_score, best_c, best_plan, best_ev = max(trials, key=lambda t: t[0])
        cur_score = current.output_sqnr_db if current.output_sqnr_db is not None else -math.inf
        if best_score - cur_score < goal.min_gain_db and not meets_goal(goal, best_ev, float_acc):
            reason = f"stalled: no candidate gains ≥ {goal.min_gain_db} dB"
            break
        promoted = _flat((promoted, best_c))
        current, plan = best_ev, best_plan
        steps.append(curve_point(len(steps), promoted, best_ev, True))
        reached = meets_goal(goal, current, float_acc)
        reason = "goal met" if reached else reason
    return SearchResult(
        goal=goal,
        steps=tuple(steps),
        evaluated=tuple(evaluated),
        reached=reached,
        stop_reason=reason,
        requantizations=session.requantizations - start_requant,
        seconds=round(time.perf_counter() - t0, 3),
        float_accuracy=float_acc,
        plan=plan,
        chosen_step=len(steps) - 1,
    )
