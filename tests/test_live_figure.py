"""``widgets.live_figure``: every live figure of the debugger is plotly's ``FigureWidget`` whose 5 MB front end is
sent once per kernel (in one hidden bundle widget), not in every figure's state (docs/ui.md, Performance)."""

from __future__ import annotations

import plotly.graph_objects as go

from widgets import live_figure as lf
from widgets.app_figure import figure as _figure


def test_figures_carry_a_shim_and_share_one_bundle() -> None:
    a = lf.live_figure(go.Figure(go.Scatter(x=[0, 1], y=[1, 2])))
    b = _figure("pareto_figure", [])  # what the debugger's views draw
    bundle = lf._open["bundle"]
    assert bundle is not None and bundle.bundle == lf.BUNDLE.read_text(encoding="utf-8")
    assert len(bundle.bundle) > 1_000_000  # plotly's widget bundle (plotly.js inside)
    for fig in (a, b):
        assert isinstance(fig, go.FigureWidget)  # Python-side: plotly's widget (traits, callbacks)
        state = fig.get_state()
        assert len(state["_esm"]) < 2_000 and "__qdebugPlotly" in state["_esm"]  # not the 5 MB bundle
    assert len(a.data) == 1 and list(a.data[0].y) == [1, 2]
    lf.live_figure(go.Figure())
    assert lf._open["bundle"] is bundle  # one per kernel
    bundle.close()
    lf.live_figure(go.Figure())
    assert lf._open["bundle"] is not bundle and lf._open["bundle"].comm is not None  # a closed one is replaced
