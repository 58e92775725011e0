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
  (:func:`measured_search`): interactions measured, not assumed additive.
* ``efficient`` — a demotion sweep from the all-16-bit model ranks candidates by noise per 16-bit element, then
  prefixes of that ranking are measured (:func:`efficient_search`).
* ``stepwise`` — the same sweep, then a step-by-step measured greedy over its ranking: each of the next few
  candidates added alone and measured, the best measured gain per added element kept
  (:mod:`qdebug.mixed.stepwise`, :func:`stepwise_search`); within ``max_cost_fraction`` if given.

All stop as soon as the goal is met. ``near_all16_db`` makes the goal relative to the all-16-bit-activations model
(measured first).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from qdebug.errors import ConfigError
from qdebug.mixed.candidates import (
    Candidate,
    Ranking,
    Sensitivity,
    candidates,
    measure_demotions,
    measure_sensitivity,
    noise_power,
)
from qdebug.mixed.evaluation import Evaluation, sixteen_bit_cost
from qdebug.mixed.holdout import check_holdout
from qdebug.mixed.points import SCHEMA_VERSION, STRATEGIES, SearchGoal, SearchPoint, SearchResult
from qdebug.mixed.promote import PromotionPlan
from qdebug.mixed.stepwise import Measurements, stepwise_greedy
from qdebug.mixed.suggest import Role, analyse

if TYPE_CHECKING:
    pass

#: The search's records live in :mod:`qdebug.mixed.points`; they are named here too, where callers have found them.
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


class SearchSession(Protocol):
    """What a search needs of a session (:class:`~qdebug.mixed.session.MixedPrecisionSession` is one): the
    measured base, promotion plans, measured variants, and the counts it reports."""

    @property
    def base(self) -> Evaluation:
        """The base variant, measured."""

    @property
    def float_accuracy(self) -> float | None:
        """Top-1 of the float model (``None`` without evaluation data)."""

    @property
    def eval_data(self) -> Any:
        """The labelled evaluation data, if any."""

    @property
    def requantizations(self) -> int:
        """Re-quantizations so far."""

    @property
    def float_proto(self) -> Any:
        """The float model (its graph gives the candidate groups)."""

    def promote(self, tensors: Iterable[str], to: str = "uint16") -> PromotionPlan:
        """A promotion plan from the base config."""
        ...

    def evaluate(self, config_or_plan: Any, name: str | None = None) -> Evaluation:
        """Quantize (calibration reused) and measure a variant."""
        ...


#: Why a task goal cannot be checked.
TASK_GOAL_NEEDS = "a task goal (task_value) needs a task metric: the session's debug_options.task_metric (--metric)"
#: ``measured``: candidates measured alone when ``measure_top`` is not given
DEFAULT_MEASURE_TOP = 8
#: ``stepwise``: the search's evaluations at most when ``max_evaluations`` is not given, in words (the number is
#: :func:`evaluation_bound` of the model's candidates)
DEFAULT_MAX_EVALUATIONS = "N + 2·log2(N) for N candidates"
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


def _met(goal: SearchGoal, ev: Evaluation, float_acc: float | None) -> bool:
    ok = True
    if goal.output_sqnr_db is not None:
        ok &= ev.output_sqnr_db is not None and ev.output_sqnr_db >= goal.output_sqnr_db
    if goal.max_accuracy_drop is not None:
        if ev.accuracy is None or float_acc is None:
            raise ConfigError("an accuracy goal needs a labelled evaluation set (eval_data)")
        ok &= float_acc - ev.accuracy <= goal.max_accuracy_drop + 1e-12
    if goal.task_value is not None:
        if ev.report.task is None:
            raise ConfigError(TASK_GOAL_NEEDS)
        ok &= ev.report.task.meets(goal.task_value)
    return ok


def _point(step: int, promoted: tuple[str, ...], ev: Evaluation, chosen: bool, label: str = "") -> SearchPoint:
    frac, n16 = sixteen_bit_cost(ev.report)
    converts = sum(1 for _, es in ev.config.tensor_overrides for e in es if e.convert is not None)
    task = None if ev.report.task is None else ev.report.task.value
    return SearchPoint(
        step, promoted, frac, n16, ev.output_sqnr_db, ev.accuracy, chosen, ev.seconds, label, converts, task_value=task
    )


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
    ceiling = None if ceiling_ev is None else _point(-1, (), ceiling_ev, False, "all16")
    resolved = _resolve_goal(session, goal, ceiling_ev)
    if goal.strategy == "prefix":
        result = _prefix_search(session, resolved)
    elif goal.strategy == "greedy":
        result = _greedy_search(session, resolved)
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


def _prefix_search(session: SearchSession, goal: SearchGoal) -> SearchResult:
    t0 = time.perf_counter()
    start_requant = session.requantizations
    base = session.base
    float_acc = session.float_accuracy
    results: dict[int, tuple[SearchPoint, Evaluation, PromotionPlan | None]] = {
        0: (_point(0, (), base, True), base, None)
    }
    if _met(goal, base, float_acc):
        return _result(goal, results, 0, True, "goal met by the base quantization", session, start_requant, t0)
    order = _grouped(_candidates(base, (), 1 << 30), _group_map(session, base))
    if not order:
        return _result(goal, results, 0, False, "no promotable tensors", session, start_requant, t0)

    def measure(n: int) -> bool:
        tensors = _flat(order[:n])
        plan = session.promote(tensors, goal.to)
        ev = session.evaluate(plan, name=f"prefix{n}")
        results[n] = (_point(len(results), tensors, ev, False), ev, plan)
        return _met(goal, ev, float_acc)

    lo, hi = smallest_passing_prefix(len(order), measure, goal.max_steps)
    if hi is None:
        why = "even promoting every candidate misses the goal" if lo == len(order) else f"max_steps ({goal.max_steps})"
        return _result(goal, results, lo, False, why, session, start_requant, t0)
    reason = "goal met"
    if hi - lo > 1:  # max_steps cut the bisection short: a smaller set may also meet the goal
        reason = f"goal met; max_steps ({goal.max_steps}) ended the bisection with {lo + 1}–{hi - 1} candidates untried"
    return _result(goal, results, hi, True, reason, session, start_requant, t0)


def smallest_passing_prefix(
    n_max: int, meets: Callable[[int], bool], budget: int | None = None, start: int = 1
) -> tuple[int, int | None]:
    """The smallest prefix size that ``meets``: probe ``start``, then gallop (steps doubling) up while it fails or
    down while it passes, then bisect. From ``start=1`` that is sizes 1, 2, 4, … (capped at ``n_max``); from a good
    guess of the answer, a few probes around it. Either way at most ~2·log2(``n_max``) probes.

    Returns ``(largest size seen failing, smallest size seen passing or None)``; at most ``budget`` probes.
    Assumes the goal is roughly monotone in the prefix size, which is what ranking by (estimated or measured) gain
    buys.
    """
    probes = 0

    def left() -> bool:
        return budget is None or probes < budget

    def probe(n: int) -> bool:
        nonlocal probes
        probes += 1
        return meets(n)

    n = min(max(start, 1), n_max)
    step = 1 if n == 1 else max(1, n // 8)
    lo, hi = 0, None
    if not left():
        return lo, hi
    if probe(n):
        hi = n
        while hi - lo > 1 and left():  # gallop down
            m = max(lo + 1, hi - step)
            if probe(m):
                hi = m
            else:
                lo = m
                break
            step *= 2
    else:
        lo = n
        while lo < n_max and left():  # gallop up
            m = min(lo + step, n_max)
            if probe(m):
                hi = m
                break
            lo = m
            step *= 2
    if hi is None:
        return lo, None
    while hi - lo > 1 and left():
        mid = (lo + hi) // 2
        if probe(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi


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


def evaluate_all(session: SearchSession, plans: Sequence[PromotionPlan], names: Sequence[str]) -> list[Evaluation]:
    """The evaluations of independent plans, in their order: at once where the session can run them in parallel
    (``evaluate_many``: :class:`~qdebug.mixed.session.MixedPrecisionSession` on a Ray cluster), else one by one.
    Either way the same evaluations, so the search takes the same steps."""
    many = getattr(session, "evaluate_many", None)
    if many is not None:
        return list(many(plans, names))
    return [session.evaluate(p, name=n) for p, n in zip(plans, names, strict=True)]


def _greedy_search(session: SearchSession, goal: SearchGoal) -> SearchResult:
    t0 = time.perf_counter()
    start_requant = session.requantizations
    base = session.base
    float_acc = session.float_accuracy
    current = base
    promoted: tuple[str, ...] = ()
    steps = [_point(0, (), base, True)]
    evaluated: list[SearchPoint] = []
    plan: PromotionPlan | None = None
    reason = "goal met by the base quantization"
    reached = _met(goal, base, float_acc)
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
            evaluated.append(_point(len(steps), _flat((promoted, c)), ev, False))
            score = ev.output_sqnr_db if ev.output_sqnr_db is not None else -math.inf
            trials.append((score, c, p, ev))
        best_score, best_c, best_plan, best_ev = max(trials, key=lambda t: t[0])
        cur_score = current.output_sqnr_db if current.output_sqnr_db is not None else -math.inf
        if best_score - cur_score < goal.min_gain_db and not _met(goal, best_ev, float_acc):
            reason = f"stalled: no candidate gains ≥ {goal.min_gain_db} dB"
            break
        promoted = _flat((promoted, best_c))
        current, plan = best_ev, best_plan
        steps.append(_point(len(steps), promoted, best_ev, True))
        reached = _met(goal, current, float_acc)
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


def _in_cost_order(r: SearchResult) -> SearchResult:
    """The curve in cost order (then SQNR), renumbered, so that drawn as a line it does not zigzag in the order the
    points were measured."""
    order = sorted(
        range(len(r.steps)), key=lambda i: (r.steps[i].cost_fraction_16bit, r.steps[i].output_sqnr_db or -math.inf)
    )
    steps = tuple(replace(r.steps[i], step=k, chosen=(i == r.chosen_step)) for k, i in enumerate(order))
    return replace(r, steps=steps, chosen_step=order.index(r.chosen_step))


def _tensors(order: tuple[Candidate, ...], n: int) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for c in order[:n] for t in c.tensors))


class _Run:
    """One run of a measured strategy (``measured``, ``efficient``): the points measured so far, each with its plan
    when it has one, the base first; how the run ends (:meth:`done`); and its prefix search (:meth:`prefixes`)."""

    def __init__(self, session: SearchSession, goal: SearchGoal) -> None:
        self.session, self.goal = session, goal
        self.t0, self.start = time.perf_counter(), session.requantizations
        self.points: list[tuple[SearchPoint, PromotionPlan | None]] = [
            (_point(0, (), session.base, True, "base"), None)
        ]

    def begin(self) -> tuple[tuple[Candidate, ...], SearchResult | None]:
        """The candidates of the base report, and the result already when there is nothing to search (the base meets
        the goal, or nothing is promotable)."""
        base = self.session.base
        if _met(self.goal, base, self.session.float_accuracy):
            return (), self.done(0, True, "goal met by the base quantization")
        cands = candidates(self.session.float_proto, base.report)
        return cands, None if cands else self.done(0, False, "no promotable tensors")

    def done(self, chosen: int, reached: bool, reason: str, sens: object = None) -> SearchResult:
        """The result, ``chosen`` (an index into :attr:`points`) being the point the run recommends."""
        s, points = self.session, self.points
        return _in_cost_order(
            SearchResult(
                goal=self.goal, steps=tuple(p for p, _ in points), evaluated=(), reached=reached, stop_reason=reason,
                requantizations=s.requantizations - self.start, seconds=round(time.perf_counter() - self.t0, 3),
                float_accuracy=s.float_accuracy, plan=points[chosen][1], chosen_step=chosen, sensitivity=sens,
            )
        )  # fmt: skip

    def prefixes(
        self,
        order: tuple[Candidate, ...],
        tag: str,
        sens: object,
        start: int = 1,
        met: str = "goal met",
        budget: int | None = None,
    ) -> SearchResult:
        """Prefixes of ``order`` promoted and measured together (:func:`smallest_passing_prefix` from ``start``, at
        most ``budget`` evaluations, default ``goal.max_steps``); the smallest that meets the goal, else the best
        point measured."""
        session, goal, points = self.session, self.goal, self.points
        by_n: dict[int, int] = {}

        def meets(n: int) -> bool:
            tensors = _tensors(order, n)
            plan = session.promote(tensors, goal.to)
            ev: Evaluation = session.evaluate(plan, name=f"{tag}{n}")
            points.append((_point(0, tensors, ev, False, f"prefix {n} of {len(order)}"), plan))
            by_n[n] = len(points) - 1
            return _met(goal, ev, session.float_accuracy)

        limit = max(1, goal.max_steps if budget is None else budget)
        lo, hi = smallest_passing_prefix(len(order), meets, limit, start=start)
        if hi is None:
            best = max(range(len(points)), key=lambda i: points[i][0].output_sqnr_db or -math.inf)
            if points[best][1] is None and best != 0:  # a single measured without its plan kept
                points[best] = (points[best][0], session.promote(points[best][0].promoted, goal.to))
            why = "even every candidate misses the goal" if lo == len(order) else f"max_steps ({limit})"
            return self.done(best, False, why, sens)
        reason = met
        if hi - lo > 1:
            reason += f"; max_steps ({limit}) ended the bisection with {lo + 1}–{hi - 1} candidates untried"
        return self.done(by_n[hi], True, reason, sens)


def measured_search(session: SearchSession, goal: SearchGoal) -> SearchResult:
    """The ``measured`` strategy.

    1. The candidates (:func:`qdebug.mixed.candidates.candidates`: tensors, and decomposed LayerNorms / attention
       cores as one candidate each) are ranked by estimate; the top ``goal.measure_top`` are promoted one at a time
       and measured (:func:`~qdebug.mixed.candidates.measure_sensitivity`). Early stop: the cheapest single
       candidate that meets the goal ends the search.
    2. The ranking by *measured* gain (unmeasured candidates after, by estimate) is searched like ``prefix``: growing
       prefixes 1, 2, 4, … then bisection, each prefix promoted and measured *together* — interactions between
       candidates (a promotion that only helps next to another, or two that fix the same noise) are measured, never
       assumed additive. At most ``measure_top + max_steps`` evaluations.

    Every point (singles, prefixes, base) is in the result, so :meth:`SearchResult.pareto` is a front of measured
    points only.
    """
    run = _Run(session, goal)
    cands, trivial = run.begin()
    if trivial is not None:
        return trivial
    float_acc, points, done = session.float_accuracy, run.points, run.done
    sens, singles = measure_sensitivity(session, cands, goal.measure_top or DEFAULT_MEASURE_TOP, goal.to)
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
    return run.prefixes(sens.ranking(goal.rank), "mprefix", sens)


def predicted_prefix(
    sens: Sensitivity, order: Sequence[Candidate], base_db: float | None, goal_db: float | None
) -> int:
    """The smallest prefix of ``order`` that the measured noise of its candidates predicts meets ``goal_db``.

    Additive model: promoting a candidate removes the output noise power its demotion added to the all-16-bit model,
    scaled so that removing every measured candidate's noise takes the base to the ceiling (the scale absorbs how far
    the noises are from additive). ``len(order)`` when even that misses the goal."""
    n_base, n_goal = noise_power(base_db), noise_power(goal_db)
    moved = {m.candidate.name: sens.noise_moved(m) for m in sens.measured}
    n_ceil = noise_power(sens.base_output_sqnr_db) if sens.mode == "demote" else None
    total = sum(moved.values())
    if n_base is None or n_goal is None or total <= 0:
        return len(order)
    scale = (n_base - n_ceil) / total if n_ceil is not None and n_base > n_ceil else 1.0
    left = n_base
    for i, c in enumerate(order, 1):
        left -= scale * moved.get(c.name, 0.0)
        if left <= n_goal:
            return i
    return len(order)


def efficient_search(session: SearchSession, goal: SearchGoal, ceiling: Evaluation) -> SearchResult:
    """The ``efficient`` strategy (cost-effectiveness).

    1. Where the noise sits: blocks of candidates (groups merged) are left in 8 bits with everything else in 16 bits
       and measured, the noisiest block split in halves first (:func:`~qdebug.mixed.candidates.measure_demotions`,
       at most ``goal.measure_top`` evaluations, default N): the output noise a block adds is its own rounding noise,
       not masked by every other tensor's as when a candidate is promoted alone.
    2. Blocks are ranked by that noise per 16-bit element: a small tensor carrying the gain before a big one
       carrying a little more (on real models most elements sit in wide tensors that matter little).
    3. Prefixes of that ranking are measured jointly (interactions measured), starting at the prefix the additive
       noise model predicts meets the goal, galloping and bisecting from there (:func:`smallest_passing_prefix`).

    At most N + ~2·log2(N) evaluations for N candidates, plus the ceiling. Only measured points are on the front.
    """
    run = _Run(session, goal)
    cands, trivial = run.begin()
    if trivial is not None:
        return trivial
    sens = _demotion_sweep(session, goal, ceiling, cands)
    order = sens.ranking(Ranking.EFFICIENCY)
    guess = predicted_prefix(sens, order, session.base.output_sqnr_db, goal.output_sqnr_db)
    return run.prefixes(order, "eprefix", sens, start=guess, met=f"goal met (predicted prefix {guess})")


def _demotion_sweep(
    session: SearchSession, goal: SearchGoal, ceiling: Evaluation, cands: Sequence[Candidate]
) -> Sensitivity:
    """Where the noise sits (:func:`~qdebug.mixed.candidates.measure_demotions`, at most ``goal.measure_top``
    evaluations, default one per candidate): step 1 of ``efficient`` and ``stepwise``."""
    # Blocks adding less than an eighth of the noise the goal allows over the ceiling are not worth splitting.
    n_goal, n_ceil = noise_power(goal.output_sqnr_db), noise_power(ceiling.output_sqnr_db)
    resolve = (n_goal - n_ceil) / 8.0 if n_goal is not None and n_ceil is not None and n_goal > n_ceil else 0.0
    sens, _ = measure_demotions(session, cands, goal.measure_top or len(cands), ceiling, goal.to, resolve=resolve)
    return sens


def evaluation_bound(n: int) -> int:
    """The issue's bound on a search's measured evaluations for ``n`` candidates: N + 2·⌈log2 N⌉ (a measurement
    of each, then a bisection's worth twice). ``stepwise``'s default budget, the ceiling included."""
    return n + 2 * math.ceil(math.log2(max(n, 2)))


def stepwise_search(session: SearchSession, goal: SearchGoal, ceiling: Evaluation) -> SearchResult:
    """The ``stepwise`` strategy, within ``goal.max_evaluations`` evaluations in all (the ceiling's included; default
    :func:`evaluation_bound` of the number of candidates).

    1. The demotion sweep of ``efficient`` (:func:`_demotion_sweep`: at most ``goal.measure_top`` evaluations, and
       never so many that fewer than 2·⌈log2 N⌉ are left).
    2. The step-by-step measured greedy over its ranking by noise per 16-bit element
       (:func:`~qdebug.mixed.stepwise.stepwise_greedy`): windows of ``goal.candidates_per_step`` candidates, each
       added alone to the current set and measured, the best measured gain per added element kept (else the window
       as a group); points above ``goal.max_cost_fraction`` are never kept; at most ``goal.max_steps`` kept
       additions; ⌈log2 N⌉ + 1 evaluations are kept back for step 3.
    3. When the greedy stalls short of the goal: ``efficient``'s prefixes of the same ranking (measured jointly,
       from the prefix the additive model predicts) with the evaluations left, so that the goal is reached, at a
       higher cost, wherever a prefix reaches it.

    Stops as soon as a point meets the goal (the greedy's first, else the smallest passing prefix, is chosen);
    otherwise the best point measured is chosen. Every measured point is on the curve and the front.
    """
    run = _Run(session, goal)
    cands, trivial = run.begin()
    if trivial is not None:
        return trivial
    log_n = math.ceil(math.log2(max(len(cands), 2)))
    total = goal.max_evaluations or evaluation_bound(len(cands))
    left = total - (session.requantizations - run.start) - 1  # the ceiling, measured before this
    sweep_cap = max(1, min(goal.measure_top or len(cands), left - 2 * log_n))
    sens = _demotion_sweep(session, replace(goal, measure_top=sweep_cap), ceiling, cands)
    left -= sens.evaluations
    walk = stepwise_greedy(
        Measurements(session, goal.to),
        sens,
        lambda ev: _met(goal, ev, session.float_accuracy),
        width=goal.candidates_per_step,
        budget=1.0 if goal.max_cost_fraction is None else goal.max_cost_fraction,
        max_evaluations=max(1, left - (log_n + 1)),
        max_steps=goal.max_steps,
    )
    left -= walk.new
    index: dict[frozenset[str], int] = {}
    for t in walk.trials:
        run.points.append((_point(0, t.tensors, t.evaluation, False, t.label), t.plan))
        index[frozenset(t.tensors)] = len(run.points) - 1
    chosen = index[frozenset(walk.path[-1].tensors)] if walk.path else 0
    steps = f"{len(walk.path)} steps, {walk.asked} greedy evaluations"
    if walk.reason.startswith("max evaluations"):  # the greedy's share of the search's budget: say the user's
        walk = replace(walk, reason=f"max evaluations: the greedy's share of the {total} spent")
    if walk.reached or left < 1 or goal.max_cost_fraction is not None:
        # a cost budget is the user's limit: prefixes of the whole ranking would break it
        return run.done(chosen, walk.reached, f"{walk.reason} ({steps}; {_of(session, run, total)})", sens)
    order = sens.ranking(Ranking.EFFICIENCY)
    guess = predicted_prefix(sens, order, session.base.output_sqnr_db, goal.output_sqnr_db)
    done = run.prefixes(order, "sprefix", sens, start=guess, met="goal met by a prefix", budget=left)
    why = f"the greedy: {walk.reason} ({steps}); then prefixes of its ranking: {done.stop_reason}"
    return replace(done, stop_reason=f"{why} ({_of(session, run, total)})")


def _of(session: SearchSession, run: _Run, total: int) -> str:
    """ "K of M evaluations" (the ceiling's included)."""
    return f"{session.requantizations - run.start + 1} of {total} evaluations"
