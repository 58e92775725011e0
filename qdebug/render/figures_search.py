"""The mixed-precision search's figures: the cost-vs-SQNR curve and its Pareto front (:func:`pareto_figure`, from a
:class:`~qdebug.mixed.points.SearchResult` or its JSON points) and a promotion's per-tensor before/after
(:func:`comparison_figure`). The colours follow :mod:`qdebug.render.figures`' anchoring."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from qdebug._lazy import LazyModule
from qdebug.mixed.compare import Comparison
from qdebug.mixed.search import SearchPoint, SearchResult
from qdebug.mixed.target_cost import TargetCost
from qdebug.render.bands import HIGHLIGHT, SQNR_HIGH, SQNR_LOW, Z_MAX
from qdebug.render.figures_base import MAX_TICK_LABELS, as_number, db_text, make_subplots, short_name

if TYPE_CHECKING:
    import plotly.graph_objects as go
else:  # plotly is the ``ui`` extra: imported on the first figure, a missing one names the extra then
    go = LazyModule("plotly.graph_objects")


def _points(
    result: SearchResult | Mapping[str, Any] | Sequence[Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(steps, evaluated, chosen index into steps) from a SearchResult, its dict, or a list of points."""

    def as_dict(p: Any) -> dict[str, Any]:
        return _point_dict(p) if isinstance(p, SearchPoint) else dict(p)

    if isinstance(result, SearchResult):
        steps = [as_dict(p) for p in result.steps]
        evaluated = [as_dict(p) for p in result.evaluated]
        chosen = result.chosen_step
    elif isinstance(result, Mapping):
        steps = [as_dict(p) for p in result.get("steps", [])]
        evaluated = [as_dict(p) for p in result.get("evaluated", [])]
        chosen = int(result.get("chosen_step", -1))
    else:
        steps, evaluated = [as_dict(p) for p in result], []
        flagged = [i for i, p in enumerate(steps) if p.get("chosen")]
        chosen = flagged[-1] if flagged else -1
    if steps and chosen < 0:
        chosen += len(steps)
    return steps, evaluated, chosen


def _front(result: SearchResult | Mapping[str, Any] | Sequence[Any]) -> list[dict[str, Any]]:
    """The Pareto front of a SearchResult (or the ``pareto`` list of its dict); empty for a bare list of points."""
    if isinstance(result, SearchResult):
        return [_point_dict(p) for p in result.pareto()]
    if isinstance(result, Mapping):
        return [dict(p) for p in result.get("pareto", [])]
    return []


def _point_dict(p: SearchPoint) -> dict[str, Any]:
    """What the figure reads of a point, as in ``SearchResult.to_dict()`` (``target_cost`` with ``splits``)."""
    return {
        "step": p.step, "cost_fraction_16bit": p.cost_fraction_16bit, "output_sqnr_db": p.output_sqnr_db,
        "accuracy": p.accuracy, "chosen": p.chosen, "num_16bit_tensors": p.num_16bit_tensors,
        "target_cost": None if p.target_cost is None else p.target_cost.to_dict(),
    }  # fmt: skip


def _target_text(p: Mapping[str, Any]) -> str:
    """The hover lines of a compiled point: its target graph (SPLIT marked) and its SQNR on the target."""
    tc = p.get("target_cost")
    if not tc:
        return ""
    c = TargetCost.from_dict(tc)  # the dict's one reading, not a second copy of it
    out = f"<br>{c.target.upper()}: {c.describe()}"
    if c.target_sqnr_db is not None or c.accuracy_error is not None:
        out += f"<br>on {c.target.upper()} vs float: {c.describe_accuracy()}"
    return out


def _splits(p: Mapping[str, Any]) -> bool:
    tc = p.get("target_cost")
    return TargetCost.from_dict(tc).splits if tc else False


def pareto_figure(result: SearchResult | Mapping[str, Any] | Sequence[Any]) -> go.Figure:
    """Cost (fraction of 16-bit elements) vs output SQNR of a mixed-precision search.

    ``result`` is a :class:`SearchResult`, its ``to_dict()``, or a list of :class:`SearchPoint` (or their dicts).
    Traces: ``steps`` (the accepted curve), ``evaluated`` (other measured points, if any), ``Pareto front`` (the
    non-dominated measured points, :meth:`SearchResult.pareto`, dashed), ``SPLIT on <TARGET>`` (compiled points that
    split the target graph, a red cross; only when there are some) and ``chosen`` (the chosen point, a star). A
    compiled point's hover adds its target graph and its SQNR on the target.
    Every point's ``customdata`` is its ``step`` so a click handler can apply that step;
    the hover shows accuracy and the number of 16-bit tensors. ``+inf`` SQNR is drawn at :data:`Z_MAX`.
    """
    steps, evaluated, chosen = _points(result)

    def xy(pts: list[dict[str, Any]]) -> tuple[list[float], list[float | None], list[int], list[str]]:
        xs, ys, cd, tx = [], [], [], []
        for p in pts:
            v = as_number(p.get("output_sqnr_db"))
            acc = as_number(p.get("accuracy"))
            xs.append(float(p["cost_fraction_16bit"]))
            ys.append(None if v is None else (Z_MAX if math.isinf(v) else v))
            cd.append(int(p["step"]))
            tx.append(
                f"step {p['step']}<br>16-bit elements: {100 * float(p['cost_fraction_16bit']):.1f}%"
                f" ({p.get('num_16bit_tensors', '?')} tensors)<br>output SQNR: {db_text(v)}"
                f"<br>accuracy: {'n/a' if acc is None else f'{100 * acc:.2f}%'}" + _target_text(p)
            )
        return xs, ys, cd, tx

    traces: list[go.Scatter] = []
    x, y, cd, tx = xy(steps)
    traces.append(
        go.Scatter(x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="lines+markers", name="steps")
    )
    seen = {int(p["step"]) for p in steps}
    others = [p for p in evaluated if int(p["step"]) not in seen]
    if others:
        x, y, cd, tx = xy(others)
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="markers", name="evaluated",
                marker={"color": "#adb5bd"},
            )
        )  # fmt: skip
    front = _front(result)
    if len(front) > 1:  # the measured Pareto front, the same points `qdebug search` lists
        x, y, cd, tx = xy(front)
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="lines", name="Pareto front",
                line={"dash": "dash", "color": "#495057"},
            )
        )  # fmt: skip
    split = list({int(p["step"]): p for p in (*steps, *evaluated) if _splits(p)}.values())
    if split:  # compiled points that do not run as one accelerator partition (qdebug search's SPLIT)
        x, y, cd, tx = xy(split)
        target = str(split[0]["target_cost"].get("target", "target")).upper()
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="markers", name=f"SPLIT on {target}",
                marker={"symbol": "x", "size": 14, "color": "#d62728", "line": {"width": 1, "color": "black"}},
            )
        )  # fmt: skip
    if steps and 0 <= chosen < len(steps):
        x, y, cd, tx = xy([steps[chosen]])
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="markers", name="chosen",
                marker={"symbol": "star", "size": 18, "color": HIGHLIGHT, "line": {"width": 1, "color": "black"}},
            )
        )  # fmt: skip
    fig = go.Figure(traces)
    fig.update_layout(
        title="Mixed precision: cost vs output SQNR",
        xaxis={"title": "fraction of 16-bit elements", "tickformat": ".0%"},
        yaxis={"title": "output SQNR (dB)"},
        hovermode="closest",
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig


def comparison_figure(comparison: Comparison, max_label_chars: int = 40) -> go.Figure:
    """Per-tensor cumulative SQNR before and after (top) and the change after − before (bottom bars).

    Tensors are in the comparison's (topological) order. Non-finite values leave gaps in the lines and are
    named in the hover ("identical (inf)" or "n/a"); a delta that is not comparable has no bar. Bars are
    green where the change helped and red where it hurt. Traces: ``before``, ``after``, ``delta``. Above
    :data:`~qdebug.render.figures_base.MAX_TICK_LABELS` tensors the axis carries no names (the hover has them).
    """
    names = [d.name for d in comparison.cumulative]
    idx = list(range(len(names)))

    def fin(v: float | None) -> float | None:
        return None if v is None or math.isinf(v) else v

    hover = [
        f"<b>{d.name}</b><br>before: {db_text(d.before_db)} ({d.before_type or 'float'})"
        f"<br>after: {db_text(d.after_db)} ({d.after_type or 'float'})"
        f"<br>delta: {'n/a' if d.delta_db is None else f'{d.delta_db:+.2f} dB'}"
        for d in comparison.cumulative
    ]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35], vertical_spacing=0.05)
    for label, vals in (
        ("before", [fin(d.before_db) for d in comparison.cumulative]),
        ("after", [fin(d.after_db) for d in comparison.cumulative]),
    ):
        fig.add_trace(
            go.Scatter(x=idx, y=vals, name=label, mode="lines+markers", customdata=names, hovertext=hover,
                       hoverinfo="text"),
            row=1, col=1,
        )  # fmt: skip
    deltas = [d.delta_db for d in comparison.cumulative]
    fig.add_trace(
        go.Bar(
            x=idx, y=deltas, name="delta", customdata=names, hovertext=hover, hoverinfo="text",
            marker={"color": ["#2b8a3e" if (v or 0) >= 0 else "#e03131" for v in deltas]},
        ),
        row=2, col=1,
    )  # fmt: skip
    for y in (SQNR_LOW, SQNR_HIGH):
        fig.add_hline(y=y, line={"dash": "dot", "color": "#adb5bd"}, row=1, col=1)
    if len(names) <= MAX_TICK_LABELS:
        ticks = [short_name(n, max_label_chars) for n in names]
        fig.update_xaxes(tickmode="array", tickvals=idx, ticktext=ticks, row=2, col=1)
    else:  # as the heatmap: more names than fit overlap into a band, and plotly measures each one (seconds)
        title = "tensor (topological order; the hover names it)"
        fig.update_xaxes(showticklabels=False, title_text=title, row=2, col=1)
    fig.update_yaxes(title_text="cumulative dB", row=1, col=1)
    fig.update_yaxes(title_text="Δ dB", row=2, col=1)
    fig.update_layout(
        title="Cumulative SQNR before / after", hovermode="closest", margin={"l": 10, "r": 10, "t": 40, "b": 10}
    )
    return fig
