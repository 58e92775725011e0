""":func:`live_figure`: a plotly ``FigureWidget`` whose front-end code is sent to the browser once per kernel, not once
per figure.

Why: plotly's ``FigureWidget`` is an anywidget whose ``_esm`` trait is plotly's whole widget bundle (plotly.js
included, ~5 MB of JavaScript). Every new ``FigureWidget`` sends those 5 MB over the kernel's websocket in its
state, and the browser turns them into a new blob module and evaluates all of plotly.js again. The debugger draws
a new figure for every view change (expand all, a promotion redraws the heatmaps, the graph, the comparison and
the inspector's figures), and the browser handles the kernel's messages one after the other, so each new figure
held everything behind it, and a promote round trip spent most of its time in the browser after the kernel had
finished (``benchmarks/ui_views.py``, docs/benchmarks.md).

Here the bundle travels once, in a hidden :class:`PlotlyBundle` widget (one per kernel) whose front end imports
it and keeps the module on ``globalThis``; each :class:`SharedFigureWidget` carries a few hundred bytes of
JavaScript that waits for that module and hands anywidget plotly's own ``initialize``/``render``. Python-side the
figure is plotly's ``FigureWidget`` (same traits, messages and callbacks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import plotly
import traitlets as tr
from plotly.graph_objs import FigureWidget

#: plotly's widget bundle (what ``FigureWidget._esm`` names).
BUNDLE = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"

_LOADER_ESM = """
export default {
  initialize({ model }) {
    if (!globalThis.__qdebugPlotly) {  // once per page: later bundles (another app in the notebook) are the same
      const url = URL.createObjectURL(new Blob([model.get("bundle")], { type: "text/javascript" }));
      globalThis.__qdebugPlotly = import(url).finally(() => URL.revokeObjectURL(url));
    }
  },
  render({ el }) { el.style.display = "none"; },
};
"""

# The loader's model may be created after a figure's (the page restores widgets in any order): wait for it.
_SHIM_ESM = """
const loaded = await new Promise((resolve, reject) => {
  const t0 = Date.now();
  const poll = () => {
    if (globalThis.__qdebugPlotly) return resolve(globalThis.__qdebugPlotly);
    if (Date.now() - t0 > 300000) return reject(new Error("qdebug: plotly's widget bundle never arrived"));
    setTimeout(poll, 25);
  };
  poll();
});
export default loaded.default;
"""


class PlotlyBundle(anywidget.AnyWidget):
    """Hidden; carries plotly's widget bundle to the browser once (see the module docstring)."""

    _esm = _LOADER_ESM
    bundle = tr.Unicode("").tag(sync=True)


class SharedFigureWidget(FigureWidget):  # type: ignore[misc]
    """plotly's ``FigureWidget`` whose front end comes from the page's :class:`PlotlyBundle`."""

    _esm = _SHIM_ESM


#: The kernel's bundle widget, under "bundle" once made.
_open: dict[str, PlotlyBundle] = {}


def _ensure_bundle() -> PlotlyBundle:
    b = _open.get("bundle")
    if b is None or getattr(b, "comm", None) is None:  # first use, or closed (a test, a reset)
        b = _open["bundle"] = PlotlyBundle(bundle=BUNDLE.read_text(encoding="utf-8"))
    return b


def live_figure(fig: Any) -> SharedFigureWidget:
    """``fig`` (a plotly ``Figure`` or its dict) as a live figure widget; the first call in a kernel also opens the
    hidden bundle widget (its comm keeps it alive in the front end; it need not be displayed)."""
    _ensure_bundle()
    return SharedFigureWidget(fig)


__all__ = ["BUNDLE", "PlotlyBundle", "SharedFigureWidget", "live_figure"]
