"""What every search strategy shares: the session a search needs (:class:`SearchSession`), whether a measured
point meets the goal (:func:`meets_goal`), a point of the curve (:func:`curve_point`), the galloping prefix bisection
(:func:`smallest_passing_prefix`) and independent plans measured at once where the session can (:func:`evaluate_all`).

The strategies sit above it: :mod:`qdebug.mixed.search_ranked` (``prefix``, ``greedy``) and
:mod:`qdebug.mixed.search_measured` (``measured``, ``efficient``, ``stepwise``); :mod:`qdebug.mixed.search` chooses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from qdebug.errors import ConfigError
from qdebug.mixed.evaluation import Evaluation, sixteen_bit_cost
from qdebug.mixed.points import SearchGoal, SearchPoint
from qdebug.mixed.promote import PromotionPlan


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


def meets_goal(goal: SearchGoal, ev: Evaluation, float_acc: float | None) -> bool:
    """Whether the measured ``ev`` meets every bound of ``goal`` (``float_acc``: the float model's top-1, for an
    accuracy goal); a goal that cannot be checked raises :class:`~qdebug.errors.ConfigError`."""
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


def curve_point(step: int, promoted: tuple[str, ...], ev: Evaluation, chosen: bool, label: str = "") -> SearchPoint:
    """The curve's point for the measured ``ev`` (``promoted``: its promotion set)."""
    frac, n16 = sixteen_bit_cost(ev.report)
    converts = sum(1 for _, es in ev.config.tensor_overrides for e in es if e.convert is not None)
    task = None if ev.report.task is None else ev.report.task.value
    return SearchPoint(
        step, promoted, frac, n16, ev.output_sqnr_db, ev.accuracy, chosen, ev.seconds, label, converts, task_value=task
    )


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


def evaluate_all(session: SearchSession, plans: Sequence[PromotionPlan], names: Sequence[str]) -> list[Evaluation]:
    """The evaluations of independent plans, in their order: at once where the session can run them in parallel
    (``evaluate_many``: :class:`~qdebug.mixed.session.MixedPrecisionSession` on a Ray cluster), else one by one.
    Either way the same evaluations, so the search takes the same steps."""
    many = getattr(session, "evaluate_many", None)
    if many is not None:
        return list(many(plans, names))
    return [session.evaluate(p, name=n) for p, n in zip(plans, names, strict=True)]
