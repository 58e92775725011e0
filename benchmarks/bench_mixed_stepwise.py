"""The step-by-step measured greedy within a budget of 16-bit activation elements (issue 14: is there a point within
0.5 dB of all-16 at 10–15 % that the prefix searches miss?), on an ``efficient`` search result's demotion sweep.

The greedy is the product's (:func:`qdebug.mixed.stepwise.stepwise_greedy`, the ``stepwise`` search strategy's
second half; its module docstring says how a step works); here it runs at each budget of
``bench_mixed_corpus.py --greedy-budgets`` on the sweep the efficient search already measured, its evaluations cached
per tensor set across budgets (budgets that share a trajectory share its evaluations; ``evaluations`` counts what the
greedy asked for, ``new_evaluations`` what it ran).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from qdebug.mixed.stepwise import Measurements, stepwise_greedy


def stepwise_row(
    memo: Measurements, r: Any, budget: float, goal_db: float | None, width: int = 3, max_evaluations: int = 60
) -> dict[str, Any] | None:
    """The product's greedy at ``budget`` on the search result ``r``'s demotion sweep; a JSON-ready row, or ``None``
    without a sweep."""
    sens = r.sensitivity
    if sens is None or str(sens.mode) != "demote" or not sens.measured:
        return None

    def meets(ev: Any) -> bool:
        return goal_db is not None and ev.output_sqnr_db is not None and ev.output_sqnr_db >= goal_db

    t0 = time.perf_counter()
    walk = stepwise_greedy(memo, sens, meets, width=width, budget=budget, max_evaluations=max_evaluations)
    base_db = memo.session.base.output_sqnr_db
    last = walk.path[-1] if walk.path else None
    return {
        "budget": budget, "width": width, "candidates": 0 if last is None else len(last.units),
        "db": base_db if last is None else last.db, "cost": 0.0 if last is None else last.cost,
        "evaluations": walk.asked, "new_evaluations": walk.new, "seconds": time.perf_counter() - t0,
        "reached": walk.reached, "trail": [(0, 0.0, base_db)] + [(len(t.units), t.cost, t.db) for t in walk.path],
        "picked": [] if last is None else [c.name for c in last.units],
        "tensors": [] if last is None else list(last.tensors),
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
