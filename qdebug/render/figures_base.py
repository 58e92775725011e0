"""What the figure builders share (:mod:`qdebug.render.figures`, :mod:`qdebug.render.figures_graph`,
:mod:`qdebug.render.figures_search`): plotly's subplots loaded on first use, a table cell as a number, SQNR as text
and as a heatmap value, the SQNR colour axis, a table in graph order and a name shortened for a tick."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from qdebug._lazy import LazyModule
from qdebug.render.bands import GREY, SQNR_COLORSCALE, SQNR_HIGH, SQNR_LOW, Z_MAX, Z_MIN
from qdebug.render.fmt import fmt_db_text
from qdebug.report import decode_number

if TYPE_CHECKING:
    import plotly.graph_objects as go
else:  # plotly is the ``ui`` extra: imported on the first figure, a missing one names the extra then
    go = LazyModule("plotly.graph_objects")


#: Most tensor names written under a heatmap; above that the names are in the hover only (they would overlap).
MAX_TICK_LABELS = 60


def make_subplots(*args: Any, **kwargs: Any) -> go.Figure:
    """plotly's ``make_subplots`` (imported on first use)."""
    return LazyModule("plotly.subplots").make_subplots(*args, **kwargs)


#: A single-colour scale: the trace that draws missing values in grey.
GREY_SCALE: list[list[float | str]] = [[0.0, GREY], [1.0, GREY]]
#: The statuses of a missing value drawn in grey (other missing values do not apply and are left blank).
MISSING_SHOWN = ("undefined", "nonfinite")


def as_number(v: Any) -> float | None:
    """A DataFrame cell as float or None (NaN, None and JSON's ``"inf"`` handled)."""
    if v is None:
        return None
    if isinstance(v, str):
        return decode_number(v)
    f = float(v)
    return None if math.isnan(f) else f


def db_text(v: float | None, status: str | None = None) -> str:
    """An SQNR as hover text (:func:`qdebug.render.fmt.fmt_db_text`)."""
    return fmt_db_text(v, status)


def heat_z(v: float | None) -> float | None:
    """Heatmap value: +inf at the top of the scale, missing as None (drawn by the grey trace or left blank)."""
    if v is None:
        return None
    if math.isinf(v):
        return Z_MAX if v > 0 else Z_MIN
    return v


def sqnr_coloraxis() -> dict[str, Any]:
    """The anchored SQNR colour scale and its colour bar, as a heatmap's keyword arguments."""
    return {
        "colorscale": SQNR_COLORSCALE,
        "zmin": Z_MIN,
        "zmax": Z_MAX,
        "colorbar": {"title": {"text": "SQNR dB"}, "tickvals": [0, SQNR_LOW, SQNR_HIGH, Z_MAX]},
    }


def in_graph_order(df: pd.DataFrame) -> pd.DataFrame:
    """The table sorted by ``topo_index`` when it has one, renumbered."""
    if "topo_index" in df.columns:
        return df.sort_values("topo_index", kind="stable").reset_index(drop=True)
    return df.reset_index(drop=True)


def short_name(name: str, n: int) -> str:
    """``name`` cut to its last ``n`` characters (``…`` first) when longer."""
    return name if len(name) <= n else "…" + name[-(n - 1) :]
