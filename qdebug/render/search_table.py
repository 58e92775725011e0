"""The tables of a mixed-precision search's points (the measured curve, the Pareto front), defined once so that
``qdebug search`` and the notebook's search tab show the same columns and cells: the 16-bit cost, the output SQNR
and, for the points compiled for a target (:mod:`qdebug.mixed.target_cost`), the target graph — partitions, CPU
nodes, ``SPLIT: …`` — and the output SQNR measured on the target next to the CPU's.

Points are duck-typed (:class:`~qdebug.mixed.search.SearchPoint`): rendering sits above the operations and does not
import them.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

from qdebug.render.fmt import fmt_db

__all__ = [
    "CURVE_COLUMNS",
    "FRONT_COLUMNS",
    "HOLDOUT_COLUMNS",
    "POINT_CELLS",
    "front_columns",
    "holdout_rows",
    "outcome_line",
    "point_rows",
    "points_html",
    "split_note",
]

#: Columns of the point tables: header → the cell of one point.
POINT_CELLS: dict[str, Callable[[Any], str]] = {
    "point": lambda p: p.label or str(p.step),
    "promoted": lambda p: str(len(p.promoted)),
    "16-bit elements": lambda p: f"{p.cost_fraction_16bit:.1%}",
    "16-bit tensors": lambda p: str(p.num_16bit_tensors),
    "8/16-bit converts": lambda p: str(p.num_converts),
    "output SQNR": lambda p: fmt_db(p.output_sqnr_db),
    "top-1": lambda p: "-" if p.accuracy is None else f"{p.accuracy:.2%}",
    "chosen": lambda p: "<-" if p.chosen else "",
    "target graph": lambda p: "-" if p.target_cost is None else p.target_cost.describe(),
    "on target vs float": lambda p: "-" if p.target_cost is None else p.target_cost.describe_accuracy(),
}

CURVE_COLUMNS = ("point", "promoted", "16-bit elements", "16-bit tensors", "output SQNR", "top-1", "chosen")
FRONT_COLUMNS = ("point", "16-bit elements", "16-bit tensors", "8/16-bit converts", "output SQNR", "chosen")


def front_columns(front: Sequence[Any]) -> list[str]:
    """The Pareto front's columns: the target's, too, once a point of it was compiled (and ran on the target)."""
    cols = list(FRONT_COLUMNS)
    compiled = [p.target_cost for p in front if p.target_cost is not None]
    if compiled:
        cols.append("target graph")
    if any(c.target_sqnr_db is not None or c.accuracy_error is not None for c in compiled):
        cols.append("on target vs float")
    return cols


def point_rows(points: Sequence[Any], columns: Sequence[str], index: bool = False) -> list[list[str]]:
    """The cells of ``points`` (``index``: a first ``#`` column, what ``--compile-points`` refers to)."""
    return [[*([str(i)] if index else []), *(POINT_CELLS[c](p) for c in columns)] for i, p in enumerate(points)]


def outcome_line(result: Any) -> str:
    """How a search ended, as ``qdebug search`` says it last and the UI's search tab first: reached or not and why
    (the stop reason; ``stepwise`` adds its kept steps and greedy evaluations), the evaluations (each a
    re-quantization from the cached calibration and a debug pass), the wall time, and the float top-1 and the
    all-16-bit ceiling when they were measured."""
    n = result.evaluations
    text = (
        f"goal {'reached' if result.reached else 'NOT reached'}: {result.stop_reason}; "
        f"{n} evaluation{'' if n == 1 else 's'} (re-quantizations, calibration reused) in {result.seconds:.1f} s"
    )
    if result.float_accuracy is not None:
        text += f", float top-1 {result.float_accuracy:.2%}"
    if result.ceiling_db is not None:
        text += f", all-16-bit {result.ceiling_db:.2f} dB"
    return text


def split_note(front: Sequence[Any]) -> str | None:
    """ "N compiled point(s) split the QNN graph (SPLIT)", or ``None`` when none does."""
    split = [p for p in front if p.target_cost is not None and p.target_cost.splits]
    if not split:
        return None
    return f"{len(split)} compiled point(s) split the {split[0].target_cost.target.upper()} graph (SPLIT)"


def points_html(points: Sequence[Any], columns: Sequence[str], index: bool = True) -> str:
    """The same table as HTML (``<table class="qd-front">``); a compiled point that splits the target graph is a
    ``qd-split`` row, the chosen one a ``qd-chosen`` row."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in [*(["#"] if index else []), *columns])
    body = []
    for p, row in zip(points, point_rows(points, columns, index), strict=True):
        cls = [c for c, on in (("qd-split", p.target_cost is not None and p.target_cost.splits),
                               ("qd-chosen", p.chosen)) if on]  # fmt: skip
        attr = f" class='{' '.join(cls)}'" if cls else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    return f"<table class='qd-front'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


#: Columns of the held-out check (:class:`~qdebug.mixed.holdout.HoldoutCheck`): each point checked, its worst output
#: SQNR on the debug samples (what the search saw) and on the held-out ones.
HOLDOUT_COLUMNS = ("point", "16-bit elements", "debug samples", "held-out samples", "holds")


def holdout_rows(check: Any) -> list[list[str]]:
    """The held-out check's rows: base and all-16 first (the held-out goal's reference), then each point checked."""
    rows = [["base", "0.0%", "-", fmt_db(check.base_db), ""]]
    if check.ceiling_db is not None:
        rows.append(["all16", "100.0%", "-", fmt_db(check.ceiling_db), ""])
    for p in check.points:
        holds = "yes" if p.holds else "NO"
        rows.append([p.label, f"{p.cost_fraction_16bit:.1%}", fmt_db(p.search_db), fmt_db(p.holdout_db), holds])
    return rows
