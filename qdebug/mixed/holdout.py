"""Does the point a search chose hold on samples it never saw? (issue 14)

A search picks the cheapest point whose worst output SQNR meets the goal *on the debug samples*. With few debug
samples that choice can fit the samples rather than the model, and on unseen samples gain nothing over the base
(docs/mixed_precision.md, "On real models"). So when the session has
held-out samples (``MixedPrecisionSession(holdout_data=…)``, ``qdebug search --holdout-samples K``), the search
measures base, all-16 and its chosen point again on them (same models, calibration reused), with the goal made
relative to the held-out all-16 model. When the chosen point misses it there, the next points of the Pareto front that
met the goal on the debug samples are checked in order of cost (``SearchGoal.holdout_checks`` at most) and the first
that holds becomes the choice; when none does, the choice stays and the result says it does not hold.

Held-out passes are not search evaluations: they are counted apart (:attr:`HoldoutCheck.evaluations`).

Held-out samples given as another data set are checked before any work to be what their name says
(:func:`seen_holdout`): by content, not path — a hard link or a copy of the calibration or debug data, or samples equal
to some of theirs, are samples the search sees.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.io import same_file
from qdebug.mixed.points import HeldOutPoint, HoldoutCheck, SearchGoal, SearchPoint, SearchResult

if TYPE_CHECKING:
    from qdebug.data import Sample
    from qdebug.mixed.evaluation import Evaluation
    from qdebug.model_io import InputSpec

__all__ = ["HeldOutPoint", "HoldoutCheck", "SeenHoldout", "check_holdout", "seen_holdout"]


def _goal_db(goal: SearchGoal, ceiling_db: float | None) -> float | None:
    """The SQNR goal on the held-out samples: relative to their all-16 model when the goal is (either bound met is
    enough, as on the debug samples), else the absolute number."""
    if goal.near_all16_db is not None and ceiling_db is not None:
        rel = ceiling_db - goal.near_all16_db
        return rel if goal.output_sqnr_db is None else min(rel, goal.output_sqnr_db)
    return goal.output_sqnr_db


def _to_check(result: SearchResult, search_goal_db: float | None, limit: int) -> list[SearchPoint]:
    """The choice, then the costlier front points that met the goal on the debug samples, by cost."""
    chosen = result.final
    if not result.reached or search_goal_db is None:
        return [chosen]
    more = [
        p
        for p in result.pareto()
        if p is not chosen
        and p.label != "all16"  # another recipe, not a promotion set the overrides can hold
        and p.cost_fraction_16bit >= chosen.cost_fraction_16bit
        and p.output_sqnr_db is not None
        and p.output_sqnr_db >= search_goal_db
    ]
    return [chosen, *more][:limit]


def check_holdout(
    session: Any, goal: SearchGoal, search_goal_db: float | None, result: SearchResult, ceiling: Evaluation | None
) -> SearchResult:
    """``result`` with its :class:`HoldoutCheck` (and its choice moved when the module docstring says so).
    ``goal`` is the goal as the user gave it, ``search_goal_db`` the SQNR it meant on the debug samples."""
    t0, runs0 = time.perf_counter(), session.holdout_evaluations
    base = session.base
    base_report = session.evaluate_holdout(base.config, "holdout-base")
    base_db = base_report.min_output_sqnr_db
    ceiling_db = None
    if ceiling is not None and goal.near_all16_db is not None:
        ceiling_db = session.evaluate_holdout(ceiling.config, "holdout-all16").min_output_sqnr_db
    goal_db = _goal_db(goal, ceiling_db)
    checked: list[HeldOutPoint] = []
    picked: SearchPoint | None = None
    for p in _to_check(result, search_goal_db, goal.holdout_checks):
        config = base.config if not p.promoted else session.promote(p.promoted, goal.to).config
        report = base_report if not p.promoted else session.evaluate_holdout(config, "holdout-point")
        db, task = report.min_output_sqnr_db, report.task
        holds = (goal_db is None or (db is not None and db >= goal_db)) and (
            goal.task_value is None or (task is not None and task.meets(goal.task_value))
        )
        task_value = None if task is None else task.value
        checked.append(HeldOutPoint(p.label, p.cost_fraction_16bit, p.output_sqnr_db, db, holds, p.task_value,
                                    task_value))  # fmt: skip
        if holds:
            picked = p
            break
    check = HoldoutCheck(
        samples=_len_of(session.holdout_data), base_db=base_db, ceiling_db=ceiling_db, goal_db=goal_db,
        points=tuple(checked), holds=picked is not None, moved=picked is not None and picked is not result.final,
        note=_note(checked, goal_db, picked is not None, result.reached, goal.task_value),
        evaluations=session.holdout_evaluations - runs0, seconds=round(time.perf_counter() - t0, 3),
    )  # fmt: skip
    out = replace(result, holdout=check)
    return _move_choice(session, goal, out, picked) if check.moved and picked is not None else out


def _len_of(data: Any) -> int:
    """How many held-out samples (0 when the session cannot tell)."""
    try:
        return len(data)
    except TypeError:
        return 0


def _fmt(db: float | None) -> str:
    return "n/a" if db is None or not math.isfinite(db) else f"{db:.2f} dB"


def _task_text(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def _note(
    checked: list[HeldOutPoint], goal_db: float | None, holds: bool, reached: bool, task_goal: float | None = None
) -> str:
    """One line for the user."""
    first = checked[0]
    seen = f"{first.label} ({first.cost_fraction_16bit:.1%}): {_fmt(first.search_db)} on the debug samples"
    there = f"{_fmt(first.holdout_db)} on the held-out samples (goal {_fmt(goal_db)})"
    if first.search_task is not None or first.holdout_task is not None:
        goal = "" if task_goal is None else f", goal {task_goal:g}"
        seen += f", task {_task_text(first.search_task)}"
        there += f", task {_task_text(first.holdout_task)} held out{goal}"
    if goal_db is None and task_goal is None:
        return f"{seen}, {_fmt(first.holdout_db)} on the held-out samples (no SQNR goal to check)"
    if first.holds:
        return f"the choice holds: {seen}, {there}"
    if holds:
        last = checked[-1]
        return (
            f"the choice did not hold ({seen}, {there}); chosen instead: {last.label} ({last.cost_fraction_16bit:.1%}),"
            f" {_fmt(last.holdout_db)} held out"
        )
    more = "" if len(checked) == 1 else f"; nor did the next {len(checked) - 1} front point(s)"
    why = "More debug samples (--debug-samples) make the choice fit the model, not the samples"
    return f"the choice does NOT hold: {seen}, {there}{more}. {why}" if reached else f"{seen}, {there}"


def _move_choice(session: Any, goal: SearchGoal, result: SearchResult, picked: SearchPoint) -> SearchResult:
    """``result`` with ``picked`` (a point of its curve) as the choice, its plan made again (deterministic)."""
    steps = list(result.steps)
    index = next((i for i, p in enumerate(steps) if p is picked), None)
    if index is None:  # a point of ``evaluated`` (not on the curve): it joins it
        steps.append(picked)
        index = len(steps) - 1
    steps = [replace(p, chosen=i == index) for i, p in enumerate(steps)]
    evaluated = tuple(p for p in result.evaluated if p is not picked)
    plan = session.promote(picked.promoted, goal.to)
    return replace(result, steps=tuple(steps), evaluated=evaluated, chosen_step=index, plan=plan)


# ------------------------------------------------------------------------------------------ held-out data checked
@dataclass(frozen=True)
class SeenHoldout:
    """How many of the held-out samples the search sees too (:func:`seen_holdout`), and where."""

    #: held-out samples compared (the first ``holdout_samples`` of the set, or all of it)
    samples: int
    #: of them, seen in any data set the search reads
    seen: int
    #: the option of each data set the search reads → how many held-out samples it holds too
    where: Mapping[str, int]
    #: the data set (option → path) whose file holds the same bytes as the held-out one (a hard link, a copy)
    same_file: tuple[str, str] | None = None

    @property
    def all_seen(self) -> bool:
        """Every held-out sample is one the search sees: the check would measure nothing new."""
        return self.same_file is not None or (self.samples > 0 and self.seen >= self.samples)

    def describe(self, holdout: str) -> str | None:
        """One line for the user, ``None`` when no held-out sample is seen."""
        if self.same_file is not None:
            flag, path = self.same_file
            what = _ROLES.get(flag, "data the search reads")
            return f"--holdout {holdout} is {what} {flag} {path} (the same file, a hard link or a copy)"
        if not self.seen:
            return None
        where = ", ".join(f"{n} in {flag}" for flag, n in self.where.items() if n)
        held = f"{self.seen} of the {self.samples} held-out samples of --holdout {holdout}"
        return f"{held} are ones the search sees ({where})"


#: What each data option of a search is, in words.
_ROLES = {"--calib": "the calibration data", "--data": "the debug data"}


def _files(path: Path) -> list[Path]:
    """A folder's regular files by name, or the file itself."""
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def _layout(path: Path) -> list[tuple[str, int]]:
    """The name (in a folder) and size of each file: what two copies must share before their bytes are read."""
    return [(p.name if path.is_dir() else "", p.stat().st_size) for p in _files(path)]


def _same_bytes(a: Path, b: Path) -> bool:
    """The same file or folder (by path or inode), or the same bytes (a copy; folders: the same names and bytes)."""
    try:
        if same_file(a, b):
            return True
        if a.is_dir() != b.is_dir() or _layout(a) != _layout(b):
            return False
        return all(_sha256(x) == _sha256(y) for x, y in zip(_files(a), _files(b), strict=True))
    except (OSError, ValueError):  # unreadable: the data check says why
        return False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sample_digest(sample: Sample) -> bytes:
    """A sample's identity: the names, types, shapes and bytes of its arrays (how it is stored does not matter)."""
    h = hashlib.sha256()
    for name in sorted(sample):
        arr = sample[name]
        h.update(f"{name}\0{arr.dtype.str}\0{arr.shape}\0".encode())
        h.update(arr.tobytes())
    return h.digest()


def seen_holdout(
    holdout: str | Path,
    seen: Mapping[str, tuple[str | Path | None, int | None]],
    specs: Sequence[InputSpec],
    *,
    samples: int | None = None,
    ignore: Sequence[str] = (),
) -> SeenHoldout:
    """Which of the held-out samples (the first ``samples`` of ``holdout``, or every one) the search sees too, by
    content: ``seen`` maps each data option the search reads to its path and how many of its samples it reads
    (``None``: all). A file with the same bytes as one of them (a hard link, a copy) is seen whole; otherwise every
    sample is compared by :func:`sample_digest`. Bad data raise their usual error."""
    from qdebug.data import open_data

    given = {flag: (Path(p), n) for flag, (p, n) in seen.items() if p is not None}
    for flag, (path, _) in given.items():
        if _same_bytes(Path(holdout), path):
            return SeenHoldout(samples or 0, samples or 0, {flag: samples or 0}, same_file=(flag, str(path)))
    held = [sample_digest(s) for s in open_data(holdout, specs, num_samples=samples, ignore=ignore)]
    wanted = set(held)
    found: dict[str, set[bytes]] = {}
    for flag, (path, n) in given.items():
        found[flag] = {
            d for s in open_data(path, specs, num_samples=n, ignore=ignore) if (d := sample_digest(s)) in wanted
        }
    every = set().union(*found.values()) if found else set()
    where = {flag: sum(1 for d in held if d in f) for flag, f in found.items()}
    return SeenHoldout(len(held), sum(1 for d in held if d in every), where)
