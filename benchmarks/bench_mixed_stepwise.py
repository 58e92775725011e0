"""A step-by-step measured greedy within a budget of 16-bit activation elements (issue 14: is there a point within
0.5 dB of all-16 at 10–15 % that the prefix searches miss?).

``bench_mixed_corpus.greedy_at_budget`` fills a budget in one shot (the demotion sweep's candidates by noise per
element, promoted together, measured once). This one measures after *each* addition. A step looks at a window of the
next ``width`` candidates of that ranking (not yet taken, whose region still fits the budget): each is added alone
to the current set and measured, and the one with the best measured gain per added 16-bit element is kept (its
measured cost, not the sweep's, counts against the budget). When none of them gains, the window is added as a
*group* (one more evaluation): promotions that only help together (an 8↔16-bit boundary moved past a neighbour)
show up there. When the group gains nothing either, the window slides to the next ``width`` candidates; those
tried stay in the pool (they may gain once others are in). The greedy stops at the goal, when a window slides past
the end of the pool without a gain, or after ``max_evaluations``. Every evaluation is a real re-quantization and
debug pass, cached per tensor set (budgets that share a trajectory share its evaluations; ``evaluations`` counts what
the greedy asked for, ``new_evaluations`` what it ran).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

#: a measured cost increase below this counts as this (a promotion inside an already 16-bit region costs ~nothing)
_MIN_COST_STEP = 1e-4


class Memo:
    """Evaluations of one session by promoted tensor set (a set measured once, whatever budget asks for it)."""

    def __init__(self, session: Any) -> None:
        self.session, self.seen, self.evaluations, self.asked = session, {}, 0, 0

    def measure(self, tensors: tuple[str, ...]) -> tuple[float, float]:
        """(worst output SQNR dB, share of activation elements in 16 bits) of ``tensors`` promoted."""
        from qdebug.mixed.evaluation import sixteen_bit_cost

        self.asked += 1
        key = frozenset(tensors)
        if key not in self.seen:
            ev = self.session.evaluate(self.session.promote(tensors), name=f"stepwise{len(self.seen)}")
            self.seen[key] = (ev.output_sqnr_db, sixteen_bit_cost(ev.report)[0])
            self.evaluations += 1
        return self.seen[key]


def _tensors(units: Sequence[Any]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for c in units for t in c.tensors))


def _best_addition(
    memo: Memo, chosen: list[Any], window: list[Any], cur: tuple[float, float], budget: float
) -> tuple[list[Any], float, float] | None:
    """The window's best single addition by measured gain per added element, else the window as a group; ``None``
    when neither gains within the budget."""
    best: tuple[float, list[Any], float, float] | None = None
    for c in window:
        db, cost = memo.measure(_tensors([*chosen, c]))
        if cost <= budget and db > cur[0]:
            score = (db - cur[0]) / max(cost - cur[1], _MIN_COST_STEP)
            if best is None or score > best[0]:
                best = (score, [c], db, cost)
    if best is None and len(window) > 1:
        db, cost = memo.measure(_tensors([*chosen, *window]))
        if cost <= budget and db > cur[0]:
            best = (0.0, list(window), db, cost)
    return None if best is None else (best[1], best[2], best[3])


def stepwise_greedy(
    memo: Memo, r: Any, budget: float, goal_db: float | None, width: int = 3, max_evaluations: int = 60
) -> dict[str, Any] | None:
    """The measured greedy at ``budget`` (see the module docstring) on the search result ``r``'s demotion sweep;
    a JSON-ready row, or ``None`` without a sweep."""
    sens = r.sensitivity
    if sens is None or str(sens.mode) != "demote" or not sens.measured:
        return None
    share = {m.candidate.name: m.cost_fraction_16bit for m in sens.measured}
    moved = {m.candidate.name: sens.noise_moved(m) for m in sens.measured}
    pool = [c for c in sens.ranking("efficiency") if c.name in share and moved[c.name] > 0]
    t0, start, asked = time.perf_counter(), memo.evaluations, memo.asked
    chosen: list[Any] = []
    cur = (memo.session.base.output_sqnr_db, 0.0)
    trail, offset = [(0, 0.0, cur[0])], 0
    while memo.asked - asked < max_evaluations and not (goal_db is not None and cur[0] >= goal_db):
        fits = [c for c in pool if cur[1] + share[c.name] <= budget]
        window = fits[offset : offset + width]
        if not window:
            break
        picked = _best_addition(memo, chosen, window, cur, budget)
        if picked is None:
            offset += width  # nothing here gains now: the next window (these stay for later steps)
            continue
        added, db, cost = picked
        chosen += added
        pool = [c for c in pool if c not in added]
        cur, offset = (db, cost), 0
        trail.append((len(chosen), cost, db))
    return {
        "budget": budget, "width": width, "candidates": len(chosen), "db": cur[0], "cost": cur[1],
        "evaluations": memo.asked - asked, "new_evaluations": memo.evaluations - start,
        "seconds": time.perf_counter() - t0, "reached": goal_db is not None and cur[0] >= goal_db, "trail": trail,
        "picked": [c.name for c in chosen], "tensors": list(_tensors(chosen)),
    }  # fmt: skip


def held_out(session: Any, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Base, all-16 and each greedy point (its tensors promoted) measured again by ``session``: the same model and
    calibration, debugged on samples the greedy did not see (did it fit the debug set or the model?)."""
    from qdebug.mixed.evaluation import sixteen_bit_cost

    base = session.base
    all16 = session.evaluate(base.config.replace(activation_type="uint16", tensor_overrides=()), name="heldout16")
    points = []
    for r in rows:
        ev = session.evaluate(session.promote(r["tensors"]), name=f"heldout{round(r['budget'] * 1000)}")
        points.append({"budget": r["budget"], "db": ev.output_sqnr_db, "cost": sixteen_bit_cost(ev.report)[0]})
    return {"base_db": base.output_sqnr_db, "all16_db": all16.output_sqnr_db, "points": points}
