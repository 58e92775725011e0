"""``InspectorPanel``: the selected tensor's numbers and figures. It holds no data of its own: values come from
the session on demand (one tensor, one sample), figures from :mod:`qdebug.render.inspector`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from qdebug.render.fmt import fmt_db_text

if TYPE_CHECKING:
    from .session import QuantDebugger


def _placeholder(what: str, why: str) -> w.HTML:
    return w.HTML(f"<div class='qd-placeholder'><i>{html.escape(what)} unavailable: {html.escape(why)}</i></div>")


def _live(fig: Any, css: str) -> w.Widget:
    from .live_figure import live_figure

    widget = live_figure(fig)
    widget._dom_classes = (*widget._dom_classes, css)
    return widget


class InspectorPanel(w.VBox):  # type: ignore[misc]
    """Table of the tensor's parameters, the grid statistics line, and tabs: values (histogram), float vs
    quantized (scatter), weights per channel."""

    def __init__(self, **kwargs: Any) -> None:
        self.table = w.HTML("<i>select a tensor</i>")
        self.stats = w.HTML("")
        self.histogram_box = w.Box()
        self.scatter_box = w.Box()
        self.weights_box = w.VBox()
        self.tabs = w.Tab(children=[self.histogram_box, self.scatter_box, self.weights_box])
        for i, t in enumerate(("values", "float vs quantized", "weights per channel")):
            self.tabs.set_title(i, t)
        self.table.add_class("qd-inspector")
        self.stats.add_class("qd-inspector-stats")
        super().__init__([self.table, self.stats, self.tabs], **kwargs)
        self.add_class("qd-inspector-panel")

    def clear(self) -> None:
        """Nothing selected."""
        self.table.value = "<i>select a tensor (table, heatmap, graph or this list)</i>"
        self.stats.value = ""
        for box in (self.histogram_box, self.scatter_box, self.weights_box):
            box.children = []

    def show(self, debugger: QuantDebugger, name: str, owners: Mapping[str, str] | None = None) -> None:
        """Inspect ``name`` of ``debugger``'s current report (values fetched now, for that tensor only)."""
        from qdebug.render import inspector as ri

        a = debugger.report.activation(name)
        rows = [
            ("tensor", a.tensor_name),
            ("producer", f"{a.producer_op} ({a.producer_node})"),
            ("quant type", a.quant_type or "not quantized"),
            ("scale / zero point", f"{a.scale} / {a.zero_point}"),
            ("local SQNR", fmt_db_text(a.local_sqnr_db)),
            ("cumulative SQNR", fmt_db_text(a.cumulative_sqnr_db)),
            ("float range (all samples)", f"[{a.float_min}, {a.float_max}]"),
        ]
        body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
        self.table.value = f"<table class='qd-inspector-table'>{body}</table>"
        try:
            tv = debugger.tensor_values(name)
            args = (tv.float_values, tv.quant_values, tv.scale, tv.zero_point, a.quant_type)
            stats = ri.grid_stats(*args)
            self.stats.value = f"<span class='qd-grid-stats'>sample 0: {html.escape(stats.describe())}</span>"
            self.histogram_box.children = [_live(ri.value_histogram(*args), "qd-histogram")]
            self.scatter_box.children = [_live(ri.value_scatter(*args), "qd-scatter")]
        except Exception as exc:  # the inspector must not take the page down
            self.stats.value = ""
            self.histogram_box.children = [_placeholder("histogram", f"{type(exc).__name__}: {exc}")]
            self.scatter_box.children = []
        self._show_weights(debugger, a.producer_node, name, owners or {})

    def _show_weights(self, debugger: QuantDebugger, node: str, name: str, owners: Mapping[str, str]) -> None:
        from qdebug.model_io import load_model
        from qdebug.render import inspector as ri
        from qdebug.tensor_values import weight_values

        nodes = {node, *(n for n, t in owners.items() if t == name)}
        try:
            found = weight_values(debugger.session.float_proto, load_model(debugger.quant_model_path), nodes)
        except Exception as exc:
            self.weights_box.children = [_placeholder("weights", f"{type(exc).__name__}: {exc}")]
            return
        weights = [v for v in found if v.kind == "weight"]
        if not weights:
            self.weights_box.children = [w.HTML("<i>no quantized weight feeds this tensor's producer</i>")]
            return
        figs: list[w.Widget] = []
        for v in weights:
            axis = v.axis if v.axis is not None else 0
            how = "per channel" if v.axis is not None else "per tensor (one scale; channels shown along axis 0)"
            figs.append(w.HTML(f"<span>{html.escape(v.name)} {tuple(v.float_values.shape)}, {how}</span>"))
            figs.append(_live(ri.channel_figure(v.name, v.float_values, v.quant_values, axis), "qd-channels"))
        self.weights_box.children = figs


__all__ = ["InspectorPanel"]
