"""The measured search strategies: ``measured`` (the top candidates measured alone, then prefixes of the measured
ranking measured together), ``efficient`` (a demotion sweep from the all-16-bit model ranks candidates by noise per
16-bit element, then prefixes of that ranking) and ``stepwise`` (the same sweep, then a step-by-step measured greedy
over its ranking, within an evaluation budget).

Each run keeps every point it measured (:class:`_Run`), so that the curve and the front hold measured points only.
:mod:`qdebug.mixed.search` describes every strategy and chooses between them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from qdebug.mixed.candidates import (
    Candidate,
    Ranking,
    Sensitivity,
    candidates,
    measure_demotions,
    measure_sensitivity,
    noise_power,
)
from qdebug.mixed.evaluation import Evaluation
from qdebug.mixed.points import SearchGoal, SearchPoint, SearchResult
from qdebug.mixed.promote import PromotionPlan
from qdebug.mixed.search_base import SearchSession, curve_point, meets_goal, smallest_passing_prefix
from qdebug.mixed.stepwise import Measurements, stepwise_greedy

#: ``measured``: candidates measured alone when ``measure_top`` is not given
DEFAULT_MEASURE_TOP = 8


#: ``stepwise``: the search's evaluations at most when ``max_evaluations`` is not given, in words (the number is
#: :func:`evaluation_bound` of the model's candidates)
DEFAULT_MAX_EVALUATIONS = "N + 2·log2(N) for N candidates"


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
            (curve_point(0, (), session.base, True, "base"), None)
        ]

    def begin(self) -> tuple[tuple[Candidate, ...], SearchResult | None]:
        """The candidates of the base report, and the result already when there is nothing to search (the base meets
        the goal, or nothing is promotable)."""
        base = self.session.base
        if meets_goal(self.goal, base, self.session.float_accuracy):
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
            points.append((curve_point(0, tensors, ev, False, f"prefix {n} of {len(order)}"), plan))
            by_n[n] = len(points) - 1
            return meets_goal(goal, ev, session.float_accuracy)

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
        points.append((curve_point(0, m.candidate.tensors, ev, False, f"single {m.candidate.name}"), None))
        if meets_goal(goal, ev, float_acc):
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
        lambda ev: meets_goal(goal, ev, session.float_accuracy),
        width=goal.candidates_per_step,
        budget=1.0 if goal.max_cost_fraction is None else goal.max_cost_fraction,
        max_evaluations=max(1, left - (log_n + 1)),
        max_steps=goal.max_steps,
    )
    left -= walk.new
    index: dict[frozenset[str], int] = {}
    for t in walk.trials:
        run.points.append((curve_point(0, t.tensors, t.evaluation, False, t.label), t.plan))
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
