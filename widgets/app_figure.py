"""A figure of :mod:`qdebug.render.figures` as a live plotly ``FigureWidget`` in the debugger, or a placeholder saying
why there is none: a figure bug, or a missing front end, must not take the dashboard down."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import ipywidgets as w

__all__ = ["figure", "json_safe", "on_click", "placeholder"]


def placeholder(what: str, why: str) -> w.HTML:
    """A grey line in place of a view: ``what`` is unavailable, and why."""
    return w.HTML(f"<div class='qd-placeholder'><i>{html.escape(what)} unavailable: {html.escape(why)}</i></div>")


def figure(name: str, *args: Any, css: str | None = None) -> w.Widget:
    """The figure ``qdebug.render.figures.<name>(*args)`` as a live ``FigureWidget``, or a placeholder saying why
    there is none (a figure bug must not take the dashboard down; plotly's FigureWidget needs anywidget)."""
    try:
        from qdebug.render import figures
    except Exception as exc:
        return placeholder(name, f"qdebug.render.figures does not import ({type(exc).__name__}: {exc})")
    fn: Callable[..., Any] | None = getattr(figures, name, None)
    if fn is None:
        return placeholder(name, f"qdebug.render.figures has no {name}()")
    try:
        fig = fn(*args)
    except Exception as exc:
        return placeholder(name, f"{type(exc).__name__}: {exc}")
    try:
        from .live_figure import live_figure

        widget = live_figure(json_safe(fig))  # plotly's FigureWidget, its 5 MB front end sent once per kernel
        # plotly.js then follows window resizes itself (the FigureWidget's own listener is never installed under
        # anywidget), which is how a figure drawn in a hidden tab gets its width (widgets/resize.py)
        widget._config = {**widget._config, "responsive": True}
    except Exception as exc:  # no anywidget: say so rather than show a static image nobody can click
        return placeholder(name, f"plotly FigureWidget unavailable ({exc}); pip install 'qdebug[ui]'")
    if css:
        widget._dom_classes = (*widget._dom_classes, css)  # a stable selector for the browser tests
    return widget


def on_click(fig: Any, handler: Callable[..., None]) -> None:
    """Call ``handler`` on a click on any trace of ``fig`` (a placeholder has none)."""
    for trace in getattr(fig, "data", ()):
        if hasattr(trace, "on_click"):
            trace.on_click(handler)


def _finite(v: Any) -> Any:
    """``v`` with every NaN/±inf float replaced by None (plotly draws None as a gap, as it draws NaN)."""
    import numpy as np

    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            return [_finite(x) for x in v.tolist()]
        if v.dtype.kind == "O":
            return [_finite(x) for x in v.tolist()]
        return v
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def json_safe(fig: Any) -> Any:
    """The figure without non-finite numbers: the widget's state travels as JSON, and a NaN or inf there makes
    jupyter_client print "Out of range float values are not JSON compliant" above the app (every hover and colour
    already says "n/a" / "identical (inf)" in text)."""
    try:
        d = fig.to_dict()
    except AttributeError:
        return fig
    return {"data": _finite(d.get("data", [])), "layout": _finite(d.get("layout", {}))}
