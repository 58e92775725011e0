"""Automatic mixed-precision search: a small promotion set that reaches a goal, with its curve.

Every point is *measured* (re-quantized from the cached calibration, re-debugged), never just estimated.
Five strategies:

* ``prefix`` (default) — rank all promotable tensors once by estimated output gain
  (:mod:`qdebug.mixed.suggest`), then measure growing prefixes of that ranking (1, 2, 4, 8, …) until one
  meets the goal, and bisect between the last miss and the first hit. ~2·log2(T) evaluations for T
  tensors, and it still works when the error is spread thinly over many tensors (each one alone gains
  little, which stalls a greedy search).
* ``greedy`` — at each step measure the best ``candidates_per_step`` candidates of the *current* report
  and keep the best; stops when no candidate gains ``min_gain_db``. Finer, but needs many evaluations.
* ``measured`` — the top candidates (:mod:`qdebug.mixed.candidates`: decomposed LayerNorms and attention cores as
  one candidate each) measured one at a time, then prefixes of the *measured* ranking measured together
  (:func:`~qdebug.mixed.search_measured.measured_search`): interactions measured, not assumed additive.
* ``efficient`` — a demotion sweep from the all-16-bit model ranks candidates by noise per 16-bit element, then
  prefixes of that ranking are measured (:func:`~qdebug.mixed.search_measured.efficient_search`).
* ``stepwise`` — the same sweep, then a step-by-step measured greedy over its ranking: each of the next few
  candidates added alone and measured, the best measured gain per added element kept
  (:mod:`qdebug.mixed.stepwise`, :func:`~qdebug.mixed.search_measured.stepwise_search`); within
  ``max_cost_fraction`` if given.

All stop as soon as the goal is met. ``near_all16_db`` makes the goal relative to the all-16-bit-activations model
(measured first).

This module is the search's face: the goal a user asks for (:func:`user_goal`), the budgets each strategy reads, and
:func:`search`, which measures the ceiling when needed and hands over to a strategy's room —
:mod:`qdebug.mixed.search_ranked` (``prefix``, ``greedy``) or :mod:`qdebug.mixed.search_measured` (``measured``,
``efficient``, ``stepwise``), both over :mod:`qdebug.mixed.search_base`.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from qdebug.errors import ConfigError
from qdebug.mixed.evaluation import Evaluation
from qdebug.mixed.holdout import check_holdout
from qdebug.mixed.points import SCHEMA_VERSION, STRATEGIES, SearchGoal, SearchPoint, SearchResult
from qdebug.mixed.search_base import TASK_GOAL_NEEDS, SearchSession, curve_point
from qdebug.mixed.search_measured import efficient_search, evaluation_bound, measured_search, stepwise_search
from qdebug.mixed.search_ranked import greedy_search, prefix_search

#: The search's records live in :mod:`qdebug.mixed.points`, the session it needs in :mod:`qdebug.mixed.search_base`,
#: the bound of stepwise's budget in :mod:`qdebug.mixed.search_measured`; they are named here too, where callers
#: (and docs/mixed_precision.md) have found them.
__all__ = [
    "BUDGET_STRATEGIES",
    "SCHEMA_VERSION",
    "STRATEGIES",
    "SearchGoal",
    "SearchPoint",
    "SearchResult",
    "SearchSession",
    "evaluation_bound",
    "search",
    "user_goal",
]


#: ``max_steps`` when a user leaves it out (``qdebug search`` and the UI's search tab; ``SearchGoal``'s own default,
#: 8, predates the CLI)
USER_MAX_STEPS = 12


#: The strategies that read each budget of :class:`SearchGoal` (elsewhere it is ignored): the UI's search tab shows
#: a budget's input only for these.
BUDGET_STRATEGIES: dict[str, tuple[str, ...]] = {
    "max_steps": STRATEGIES,
    "measure_top": ("measured", "efficient", "stepwise"),
    "candidates_per_step": ("greedy", "stepwise"),
    "max_evaluations": ("stepwise",),
    "max_cost_fraction": ("stepwise",),
}


def user_goal(
    strategy: str = "prefix",
    *,
    output_sqnr_db: float | None = None,
    max_accuracy_drop_points: float | None = None,
    near_all16_db: float | None = None,
    max_steps: int | None = None,
    candidates_per_step: int | None = None,
    measure_top: int | None = None,
    max_evaluations: int | None = None,
    max_cost_fraction: float | None = None,
    rank: str = "gain",
    to: str = "uint16",
    task_value: float | None = None,
) -> SearchGoal:
    """The goal a user asked for, from ``qdebug search``'s options or the UI search tab's inputs: one mapping for
    both faces, so that the same settings search the same. The accuracy drop is in percentage points (the goal keeps
    a fraction); a budget left out (``None``) takes its default (``max_steps``: :data:`USER_MAX_STEPS`; the others:
    :class:`SearchGoal`'s). Invalid values raise :class:`~qdebug.errors.ConfigError` naming the field."""
    return SearchGoal(
        output_sqnr_db=output_sqnr_db,
        max_accuracy_drop=None if max_accuracy_drop_points is None else max_accuracy_drop_points / 100.0,
        near_all16_db=near_all16_db,
        strategy=strategy,
        max_steps=USER_MAX_STEPS if max_steps is None else max_steps,
        candidates_per_step=SearchGoal.candidates_per_step if candidates_per_step is None else candidates_per_step,
        measure_top=measure_top,
        max_evaluations=max_evaluations,
        max_cost_fraction=max_cost_fraction,
        rank=rank,
        to=to,
        task_value=task_value,
    )


def search(session: SearchSession, goal: SearchGoal) -> SearchResult:
    """Find a small promotion set that meets ``goal``; see the module docstring."""
    if goal.max_accuracy_drop is not None and session.eval_data is None:
        # Say so before the base quantization and debug pass, which can take minutes on a large model.
        raise ConfigError("an accuracy goal needs a labelled evaluation set (eval_data)")
    options = getattr(session, "debug_options", None)
    if goal.task_value is not None and options is not None and options.task_metric is None:
        raise ConfigError(TASK_GOAL_NEEDS)
    t0 = time.perf_counter()
    start = session.requantizations
    ceiling_ev = None
    if goal.near_all16_db is not None or goal.strategy in ("efficient", "stepwise"):
        session.base  # noqa: B018 - the base first (its calibration is what every variant reuses)
        ceiling_ev = _ceiling(session, goal.to)
    ceiling = None if ceiling_ev is None else curve_point(-1, (), ceiling_ev, False, "all16")
    resolved = _resolve_goal(session, goal, ceiling_ev)
    if goal.strategy == "prefix":
        result = prefix_search(session, resolved)
    elif goal.strategy == "greedy":
        result = greedy_search(session, resolved)
    elif goal.strategy == "measured":
        result = measured_search(session, resolved)
    elif goal.strategy == "efficient":
        assert ceiling_ev is not None
        result = efficient_search(session, resolved, ceiling_ev)
    else:
        assert ceiling_ev is not None
        result = stepwise_search(session, resolved, ceiling_ev)
    result = replace(
        result,
        goal=goal,
        evaluated=(*result.evaluated, *([ceiling] if ceiling is not None else [])),
        ceiling_db=None if ceiling is None else ceiling.output_sqnr_db,
        requantizations=session.requantizations - start,
        seconds=round(time.perf_counter() - t0, 3),
    )
    checkable = resolved.output_sqnr_db is not None or goal.task_value is not None
    if getattr(session, "holdout_data", None) is not None and checkable:
        # the choice checked on samples the search never saw (an accuracy goal is measured on eval_data already)
        result = check_holdout(session, goal, resolved.output_sqnr_db, result, ceiling_ev)
    return result


def _ceiling(session: SearchSession, to: str) -> Evaluation:
    """The base recipe with every activation in ``to``: its own tensor overrides go (a scale or type set for 8 bits
    would not fit 16-bit activations), so the ceiling is the plain 16-bit recipe."""
    return session.evaluate(session.base.config.replace(activation_type=to, tensor_overrides=()), name="all16")


def _resolve_goal(session: SearchSession, goal: SearchGoal, ev: Evaluation | None) -> SearchGoal:
    """A goal relative to the all-16-bit model (``ev``, measured) made absolute."""
    if goal.near_all16_db is None or ev is None:
        return goal
    if ev.output_sqnr_db is None:
        return replace(goal, near_all16_db=None, output_sqnr_db=goal.output_sqnr_db or math.inf)
    target = ev.output_sqnr_db - goal.near_all16_db
    if goal.output_sqnr_db is not None:
        target = min(target, goal.output_sqnr_db)  # either bound met is enough: the ceiling may be below the number
    return replace(goal, near_all16_db=None, output_sqnr_db=target)
