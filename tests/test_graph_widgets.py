"""The graph, heatmap and inspector widgets on a 301-tensor model (``builders.scoped_residual_mlp``), driven from
Python without a browser: real ONNX Runtime, handlers called with the points a click would send."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd
import pytest
from builders import scoped_residual_mlp

import qdebug
from qdebug.render import graph_view as gv
from widgets.app import DebuggerApp
from widgets.session import QuantDebugger


class _Points:
    def __init__(self, inds: list[int]) -> None:
        self.point_inds, self.xs = inds, [0] * len(inds)


@pytest.fixture(scope="module")
def big_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("scoped")
    f = d / "scoped.onnx"
    onnx.save(scoped_residual_mlp(blocks=60, sigmoid_every=3), f)
    data = d / "calib.npz"
    np.savez(data, x=np.random.default_rng(0).uniform(-1, 1, (4, 1, 8)).astype(np.float32))
    q = d / "scoped.qdq.onnx"
    qdebug.quantize(f, data, None, q)
    return f, q, data


@pytest.fixture(scope="module")
def app(big_pair: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> DebuggerApp:
    f, q, data = big_pair
    dbg = QuantDebugger(f, q, data, workdir=tmp_path_factory.mktemp("work"))
    return DebuggerApp(dbg)


def _nodes(app: DebuggerApp) -> Any:
    return next(t for t in app.graph_box.children[0].data if t.name == "nodes")


def test_graph_opens_grouped_and_a_click_expands_or_selects(app: DebuggerApp) -> None:
    panel = app.graph_panel
    panel.on_collapse_all()
    assert len(app.debugger.report.activations) == 301
    ids = [tuple(c) for c in _nodes(app).customdata]
    assert len(ids) == len(panel.grouping.groups) <= gv.MAX_GROUPS
    assert panel.grouping.method == "name scope"
    assert gv.ranks_respect_edges(panel.view) == []  # type: ignore[arg-type]
    # A click on a group expands it (its tensors are drawn), and selects nothing.
    k = next(i for i, (kind, _) in enumerate(ids) if kind == gv.GROUP)
    key = ids[k][1]
    before = app.selected
    panel.on_node_click(_nodes(app), _Points([k]))
    assert key in panel.expanded and app.selected == before
    ids = [tuple(c) for c in _nodes(app).customdata]
    members = panel.grouping.group(key).members
    assert all((gv.TENSOR, m) in ids for m in members)
    # A click on each of two neighbouring tensors selects exactly that tensor (the clicked point's own data).
    for m in members[1:3]:
        i = ids.index((gv.TENSOR, m))
        panel.on_node_click(_nodes(app), _Points([i]))
        assert app.selected == m
        assert m in app.inspector.value
        ring = next(t for t in app.graph_box.children[0].data if t.name == "selected")
        assert (ring.x[0], ring.y[0]) == (_nodes(app).x[i], _nodes(app).y[i])


def test_search_selects_and_expands(app: DebuggerApp) -> None:
    app.graph_panel.on_collapse_all()
    hits = app.graph_panel.find("model.37/act")
    assert hits == ["/model.37/act/Tanh_output_0"]
    assert app.selected == hits[0]
    assert app.graph_panel.grouping.of[hits[0]] in app.graph_panel.expanded
    assert app.graph_panel.find("no such tensor") == []
    assert "no tensor name contains" in app.graph_panel.note.value


def test_worst_path_is_drawn(app: DebuggerApp) -> None:
    """The orange path starts at the colouring's worst tensor — by local SQNR where the error is born (the default;
    +inf, exact, left out), by cumulative SQNR for the accumulated error — and walks back to the input."""
    acts = app.debugger.report.activations
    assert app.metric == "local_sqnr_db"
    app.graph_panel.redraw()  # the note may still hold an earlier test's search
    path = app.graph_panel.path
    assert path[0] == "x"
    born = min((a for a in acts if a.local_sqnr_db is not None and a.local_sqnr_db < math.inf),
               key=lambda a: a.local_sqnr_db or 0.0)  # fmt: skip
    assert path[-1] == born.tensor_name and "where the most error is born" in app.graph_panel.note.value
    trace = next(t for t in app.graph_box.children[0].data if t.name == "path")
    assert trace.x and len(trace.x) >= 1
    worst = min((a for a in acts if a.cumulative_sqnr_db is not None), key=lambda a: a.cumulative_sqnr_db or 0.0)
    assert worst.tensor_name != born.tensor_name  # the two colourings start from different tensors here
    app.metric = "cumulative_sqnr_db"
    try:
        path = app.graph_panel.path
        assert path[0] == "x" and path[-1] == worst.tensor_name
        assert "where the most error is born" not in app.graph_panel.note.value
    finally:
        app.metric = "local_sqnr_db"


def test_local_colouring_path_skips_exact_tensors() -> None:
    """Where the error is born, a tensor with +inf local SQNR (exact: a Reshape) is never the path's start, and
    the walk back goes by cumulative SQNR."""
    from widgets.graph_view import GraphPanel

    rows = [
        {"tensor_name": "x", "producer_op": "", "inputs": (), "local_sqnr_db": 50.0, "cumulative_sqnr_db": 50.0},
        {"tensor_name": "a", "producer_op": "Conv", "inputs": ("x",), "local_sqnr_db": 20.0,
         "cumulative_sqnr_db": 20.0},
        {"tensor_name": "r", "producer_op": "Reshape", "inputs": ("a",), "local_sqnr_db": math.inf,
         "cumulative_sqnr_db": 19.0},
        {"tensor_name": "b", "producer_op": "Relu", "inputs": ("r",), "local_sqnr_db": 30.0,
         "cumulative_sqnr_db": 15.0},
    ]  # fmt: skip
    panel = GraphPanel(lambda t: None)
    panel.show(rows, "local_sqnr_db")
    assert panel.path == ["x", "a"]
    panel.colour("cumulative_sqnr_db")
    assert panel.path == ["x", "a", "r", "b"]
    rows[1]["local_sqnr_db"] = math.inf  # every tensor exact but x: the path starts at x
    rows[3]["local_sqnr_db"] = math.inf
    panel.show(rows, "local_sqnr_db")
    assert panel.path == ["x"]


def test_colouring_toggle_local_or_cumulative(app: DebuggerApp) -> None:
    """The graph opens coloured by where the error is born (local SQNR); the toggle switches to the accumulated
    error and back, the title and colour bar say which, and the app's metric follows the toggle."""
    from qdebug.render.bands import sqnr_color

    panel = app.graph_panel
    assert app.metric == "local_sqnr_db" and panel.colour_picker.value == "local_sqnr_db"
    assert app.metric_picker is panel.colour_picker

    def shown() -> tuple[list[str], str, str]:
        fig = app.graph_box.children[0]
        nodes = next(t for t in fig.data if t.name == "nodes")
        scale = next(t for t in fig.data if t.name == "scale")
        return list(nodes.marker.color), fig.layout.title.text, scale.marker.colorbar.title.text

    def worst(metric: str) -> list[str]:
        rows = panel.rows
        vals = [min((float(v) for m in panel.view.members[n] if not pd.isna(v := rows[m].get(metric))),
                    default=None) for n in panel.view.nodes]  # fmt: skip
        return [sqnr_color(v) for v in vals]

    local, title, bar = shown()
    assert "where the error is born" in title and "local SQNR" in bar and local == worst("local_sqnr_db")
    panel.colour_picker.value = "cumulative_sqnr_db"
    cum, title, bar = shown()
    assert app.metric == "cumulative_sqnr_db" and "accumulated" in title and "cumulative SQNR" in bar
    assert cum == worst("cumulative_sqnr_db") and cum != local
    app.metric = "local_sqnr_db"  # the view state drives the toggle too
    assert panel.colour_picker.value == "local_sqnr_db" and shown()[0] == local


def test_colour_by_mse_is_mse(app: DebuggerApp) -> None:
    app.metric = "cumulative_sqnr_db"
    cum = list(_nodes(app).marker.color)
    app.metric = "mse"
    mse = list(_nodes(app).marker.color)
    assert mse != cum and all(isinstance(c, float) for c in mse)
    assert "mse" in app.graph_box.children[0].layout.title.text
    app.metric = "local_sqnr_db"


def test_heatmap_groups_and_inspector(app: DebuggerApp) -> None:
    heat = app.heatmap_box.children[0]
    # 301 names would overlap: plotly writes as many as fit, and zooming in writes the others (labelalias)
    assert heat.layout.xaxis.tickmode == "auto" and heat.layout.xaxis.labelalias["1"].endswith("fc1/MatMul")
    app.heatmap_groups.value = True
    grouped = app.heatmap_box.children[0]
    # one labelled tick per group of the graph, as many as the graph shows collapsed (issue 38: 127 against 41)
    assert len(grouped.layout.xaxis.ticktext) == len(app.graph_panel.grouping.groups) <= gv.MAX_GROUPS
    assert all(grouped.layout.xaxis.ticktext) and grouped.layout.xaxis2.labelalias["1"]
    app.heatmap_groups.value = False
    # The inspector of a MatMul output: grid statistics, histogram, scatter and the weight per channel.
    app.on_select("/model.5/fc1/MatMul_output_0")
    panel = app.inspector_panel
    assert "levels used" in panel.stats.value and "of 256" in panel.stats.value
    assert "qd-histogram" in panel.histogram_box.children[0]._dom_classes
    assert "qd-scatter" in panel.scatter_box.children[0]._dom_classes
    figs = [c for c in panel.weights_box.children if "qd-channels" in getattr(c, "_dom_classes", ())]
    assert len(figs) == 1 and len(figs[0].data[0].x) == 8  # fc1's weight [8, 8]: 8 channels
    app.on_select("/model.4/act/Tanh_output_0")
    assert "no quantized weight" in panel.weights_box.children[0].value


def test_repeated_blocks_expand_and_find_in_the_panel() -> None:
    """The panel on 30 identical residual blocks (rows as the report gives them; no debug needed): the blocks open
    as one ×N group; find expands the group and the block that holds the tensor; expand all draws every tensor."""
    from test_graphview import onnx_tensors

    from widgets.graph_view import GraphPanel

    names, edges, ops = onnx_tensors(scoped_residual_mlp(blocks=30))
    rows = [{"tensor_name": n, "producer_op": ops[n], "inputs": tuple(a for a, b in edges if b == n), "elements": 8,
             "cumulative_sqnr_db": 30.0 + i % 7} for i, n in enumerate(names)]  # fmt: skip
    picked: list[str] = []
    panel = GraphPanel(picked.append)
    panel.show(rows, "cumulative_sqnr_db")
    rep = next(g for g in panel.grouping.groups if g.parts)
    assert (
        len(rep.parts) >= 20 and rep.label.endswith(f"×{len(rep.parts)}") and "repeated blocks ×N" in panel.note.value
    )

    def ids() -> set[tuple[str, str]]:
        return {tuple(c) for c in next(t for t in panel.figure.data if t.name == "nodes").customdata}

    assert (gv.GROUP, rep.key) in ids()
    assert panel.find("model.27/act") == ["/model.27/act/Tanh_output_0"] and picked == ["/model.27/act/Tanh_output_0"]
    assert {rep.key, panel.grouping.part_of[picked[0]]} <= panel.expanded
    assert (gv.TENSOR, picked[0]) in ids() and (gv.GROUP, rep.parts[0].key) in ids()
    panel.on_expand_all()
    assert {n for _, n in ids()} == set(names)
