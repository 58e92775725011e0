"""The graph view (qdebug/render/graph_view*.py), the scaled heatmap and the inspector figures — no browser.

The layout is checked against the ONNX graph itself: every edge between two activations of the model must go
strictly down a rank, in the collapsed view (groups) and in the fully expanded one.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pandas as pd
import pytest
from builders import scoped_residual_mlp

from qdebug.render import figures
from qdebug.render import graph_view as gv
from qdebug.render import inspector as ri
from qdebug.render.bands import sqnr_color


def onnx_tensors(model: onnx.ModelProto) -> tuple[list[str], list[tuple[str, str]], dict[str, str]]:
    """(activations in topological order, (input, output) edges between them, producer op) read from the graph."""
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    ops = dict.fromkeys(names, "input")
    edges = []
    for n in model.graph.node:
        for o in n.output:
            names.append(o)
            ops[o] = n.op_type
            edges += [(i, o) for i in n.input if i in ops]
    return names, edges, ops


def unscoped(names: list[str], edges: list[tuple[str, str]], ops: dict[str, str]) -> tuple[list, list, dict]:
    """The same graph with PaddleOCR-like names that carry no scope (``p2o.Add.7``)."""
    ren = {n: f"p2o.{ops[n]}.{i}" for i, n in enumerate(names)}
    return [ren[n] for n in names], [(ren[a], ren[b]) for a, b in edges], {ren[n]: ops[n] for n in names}


@pytest.fixture(scope="module")
def model_graph() -> tuple[list[str], list[tuple[str, str]], dict[str, str]]:
    return onnx_tensors(scoped_residual_mlp(blocks=60, sigmoid_every=3))


def test_scope_path() -> None:
    assert gv.scope_path("/model.22/cv2.0/conv/Conv_output_0") == ("model.22", "cv2.0", "conv")
    assert gv.scope_path("encoder.layer.3.attention.output.dense") == ("encoder", "layer.3", "attention", "output")
    for flat in ("p2o.Add.12", "swish_14.tmp_0", "images", "output0"):
        assert gv.scope_path(flat) == ()


@pytest.mark.parametrize("naming", ["scoped", "unscoped"])
def test_layout_respects_every_onnx_edge(model_graph: tuple, naming: str) -> None:
    names, edges, ops = model_graph if naming == "scoped" else unscoped(*model_graph)
    assert len(names) >= 300 and len(edges) >= 360
    g = gv.group_tensors(names, edges, ops)
    assert g.method == ("name scope" if naming == "scoped" else "graph structure")
    assert 10 <= len(g.groups) <= gv.MAX_GROUPS
    assert sorted(m for grp in g.groups for m in grp.members) == sorted(names)  # a partition
    collapsed = gv.graph_view(names, edges, g, set())
    assert len(collapsed.nodes) == len(g.groups)
    assert gv.ranks_respect_edges(collapsed) == []
    # Every ONNX edge crossing two groups is drawn (as an edge between the groups); none is invented.
    crossing = {(g.of[a], g.of[b]) for a, b in edges if g.of[a] != g.of[b]}
    assert set(collapsed.edges) == crossing
    full = gv.graph_view(names, edges, g, {grp.key for grp in g.groups})
    assert set(full.nodes) == set(names) and set(full.edges) == set(edges)
    assert gv.ranks_respect_edges(full) == []
    r = full.drawing.ranks
    assert all(r[a] < r[b] for a, b in edges)
    # Long edges (the residuals skip 4 tensors) are routed through one point per layer they cross.
    a, b = next((a, b) for a, b in edges if r[b] - r[a] > 1)
    assert len(full.drawing.routes[(a, b)]) == r[b] - r[a] + 1


def test_scoped_groups_are_runs_of_blocks(model_graph: tuple) -> None:
    names, edges, ops = model_graph
    g = gv.group_tensors(names, edges, ops)
    labels = [grp.label for grp in g.groups]
    assert labels[0] == "x" and labels[1] == "model.0 … model.1"
    assert all(set(m.split("/")[1] for m in grp.members) <= {"model.0", "model.1"} for grp in g.groups[1:2])


def test_structure_blocks_are_contiguous(model_graph: tuple) -> None:
    names, edges, ops = unscoped(*model_graph)
    g = gv.group_tensors(names, edges, ops)
    pos = {n: i for i, n in enumerate(names)}
    for grp in g.groups:
        idx = sorted(pos[m] for m in grp.members)
        assert idx == list(range(idx[0], idx[-1] + 1))
    # Cuts fall on block boundaries: only the residual stream crosses (one edge from each block's output).
    assert all(grp.label.startswith("block ") for grp in g.groups)


def test_groups_on_a_cycle_are_merged() -> None:
    # a/x feeds b/y which feeds a/z: the groups "a" and "b" would form a cycle a → b → a.
    names = [f"/a/{i}" for i in range(30)] + [f"/b/{i}" for i in range(30)] + ["/a/z", *[f"/c/{i}" for i in range(30)]]
    edges = [(names[i], names[i + 1]) for i in range(len(names) - 1)]
    g = gv.group_tensors(names, edges, max_groups=10)
    view = gv.graph_view(names, edges, g, set())
    assert gv.ranks_respect_edges(view) == []
    # Not merged into one box (issue 38: a ResNet became "(top level) (+38 merged)"): "a" is cut into its runs.
    assert g.group(g.of["/a/z"]).label == "a (2/2)" and g.group(g.of["/a/0"]).label == "a (1/2)"
    assert g.group(g.of["/b/0"]).members == tuple(f"/b/{i}" for i in range(30))


def test_repeated_blocks_become_one_expandable_group() -> None:
    # 12 residual blocks, every 6th with Sigmoid instead of Tanh: blocks 1–4 and 6–10 are runs of the same block.
    names, edges, ops = onnx_tensors(scoped_residual_mlp(blocks=12, sigmoid_every=6))
    g = gv.group_tensors(names, edges, ops, max_groups=16)
    reps = {x.label: x for x in g.groups if x.parts}
    # model.0 is the same block as model.1–4 (its input is the graph's, theirs the previous block's)
    assert set(reps) == {"model.0 … model.4 ×5", "model.6 … model.10 ×5"}
    four = reps["model.0 … model.4 ×5"]
    assert [p.label for p in four.parts] == ["model.0", "model.1", "model.2", "model.3", "model.4"]
    assert all(len(p.members) == 5 for p in four.parts)
    assert {"model.5", "model.11"} <= {x.label for x in g.groups}  # the Sigmoid blocks differ: not merged
    assert sorted(m for grp in g.groups for m in grp.members) == sorted(names)  # still a partition
    # Collapsed: one node; expanded: its blocks; a block expanded: its tensors. Every drawing respects the edges.
    third = four.parts[2]
    v0 = gv.graph_view(names, edges, g, set())
    v1 = gv.graph_view(names, edges, g, {four.key})
    v2 = gv.graph_view(names, edges, g, {four.key, third.key})
    assert four.key in v0.kind and v0.node_of(third.members[0]) == four.key
    assert four.key not in v1.kind and all(v1.kind[p.key] == gv.GROUP for p in four.parts)
    assert v1.node_of(third.members[0]) == third.key
    assert all(v2.kind[m] == gv.TENSOR for m in third.members) and v2.node_of(third.members[0]) == third.members[0]
    for v in (v0, v1, v2):
        assert gv.ranks_respect_edges(v) == []
    fig = gv.graph_view_figure(v0, _rows(names, ops))
    i = [c[1] for c in fig.data[2].customdata].index(four.key)
    assert "in 5 identical blocks" in fig.data[2].hovertext[i]
    assert g.finest()[third.members[0]] == third.key and g.of[third.members[0]] == four.key
    # Same ops but another size is another block (two Conv+SiLU stages of different widths are not repeats).
    sizes = {n: 16 if n.startswith("/model.3/") else 8 for n in names}
    labels = {x.label for x in gv.group_tensors(names, edges, ops, max_groups=16, sizes=sizes).groups}
    assert {"model.0 … model.2 ×3", "model.3", "model.4"} <= labels


def test_small_graphs_are_not_grouped() -> None:
    g = gv.group_tensors(["a", "b"], [("a", "b")])
    assert g.method == "none" and [x.members for x in g.groups] == [("a",), ("b",)]


def test_worst_path_and_search() -> None:
    names = ["in", "a", "b", "c", "out"]
    edges = [("in", "a"), ("in", "b"), ("a", "c"), ("b", "c"), ("c", "out")]
    vals = {"in": math.inf, "a": 30.0, "b": 12.0, "c": 9.0, "out": 5.0}
    assert gv.worst_path(names, edges, vals) == ["in", "b", "c", "out"]
    assert gv.worst_path(names, edges, vals, start="a") == ["in", "a"]
    assert gv.find_tensors(["x/conv", "conv", "y/Conv_1"], "conv") == ["conv", "x/conv", "y/Conv_1"]
    assert gv.find_tensors(["a"], "  ") == []


def _rows(names: list[str], ops: dict[str, str]) -> dict[str, dict]:
    return {
        n: {"tensor_name": n, "producer_op": ops[n], "producer_node": n, "quant_type": "uint8",
            "local_sqnr_db": 40.0 + i % 7, "cumulative_sqnr_db": 50.0 - i / 10, "mse": 1e-4 * (i + 1),
            "max_abs_error": 0.01}
        for i, n in enumerate(names)
    }  # fmt: skip


def test_graph_view_figure(model_graph: tuple) -> None:
    names, edges, ops = model_graph
    rows = _rows(names, ops)
    g = gv.group_tensors(names, edges, ops)
    view = gv.graph_view(names, edges, g, {g.groups[3].key})
    path = gv.worst_path(names, edges, {n: r["cumulative_sqnr_db"] for n, r in rows.items()})
    assert path[0] == "x" and path[-1] == names[-1]
    fig = gv.graph_view_figure(view, rows, "cumulative_sqnr_db", selected=names[20], path=path)
    assert [t.name for t in fig.data] == ["edges", "path", "nodes", "scale", "selected"]
    nodes = fig.data[2]
    kinds = [tuple(c) for c in nodes.customdata]
    assert {k for k, _ in kinds} == {gv.GROUP, gv.TENSOR}
    assert sum(k == gv.TENSOR for k, _ in kinds) == len(g.groups[3].members) + 1  # + the input x
    # A group is coloured by its worst member (lowest cumulative SQNR).
    i = kinds.index((gv.GROUP, g.groups[5].key))
    worst = min(rows[m]["cumulative_sqnr_db"] for m in g.groups[5].members)
    assert nodes.marker.color[i] == sqnr_color(worst)
    # Tensors are labelled with their op type, groups with their name and size.
    assert nodes.text[kinds.index((gv.TENSOR, g.groups[3].members[0]))] in {"MatMul", "Add", "Tanh"}
    assert nodes.text[i].endswith(f"({len(g.groups[5].members)})")
    # The ring is on the group that holds the selected (collapsed) tensor.
    ring = fig.data[4]
    gx, gy = view.drawing.pos[g.of[names[20]]]
    assert (ring.x[0], ring.y[0]) == (gx, gy)
    assert gv.ring_at(fig, view, g.groups[3].members[1]) == g.groups[3].members[1]
    assert len(fig.data[1].x) > 1  # the worst path is drawn


def test_colour_by_error_metric_is_not_sqnr(model_graph: tuple) -> None:
    names, edges, ops = model_graph
    rows = _rows(names, ops)
    g = gv.group_tensors(names, edges, ops)
    view = gv.graph_view(names, edges, g, set())
    cum = gv.graph_view_figure(view, rows, "cumulative_sqnr_db").data[2].marker.color
    mse = gv.graph_view_figure(view, rows, "mse")
    colours = mse.data[2].marker.color
    assert colours != cum and all(isinstance(c, float) for c in colours)
    # the worst (largest) mse of each group, on a log scale
    k = [c[1] for c in mse.data[2].customdata].index(g.groups[-1].key)
    assert colours[k] == pytest.approx(math.log10(max(rows[m]["mse"] for m in g.groups[-1].members)))
    assert "mse" in mse.data[3].marker.colorbar.title.text
    with pytest.raises(ValueError, match="metric"):
        gv.graph_view_figure(view, rows, "weight")


def _df(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "tensor_name": [f"/model.{i // 5}/t{i}" for i in range(n)], "topo_index": list(range(n)),
            "producer_op": ["Add"] * n, "producer_node": [f"n{i}" for i in range(n)], "quant_type": ["uint8"] * n,
            "local_sqnr_db": [30.0] * n, "local_status": ["ok"] * n, "cumulative_sqnr_db": [25.0] * n,
            "cumulative_status": ["ok"] * n,
        }
    )  # fmt: skip


def test_heatmap_scales_to_hundreds_of_tensors() -> None:
    small = figures.layer_heatmap(_df(20))
    assert small.layout.xaxis.ticktext[0] == "/model.0/t0"
    big = figures.layer_heatmap(_df(300))
    # Names follow the zoom (issue 38: past 60 tensors there were none, and zooming did not bring them back):
    # plotly writes as many ticks as fit and each tick's number is replaced by that tensor's name.
    axis = big.layout.xaxis
    assert axis.showticklabels is not False and axis.tickmode == "auto" and "zoom" in axis.title.text
    assert axis.labelalias["299"] == "/model.59/t299" and len(axis.labelalias) >= 300
    assert big.data[0].xgap == 0 and big.layout.width is None and big.layout.autosize  # the container's width
    assert "/model.59/t299" in big.data[0].text[1][299]  # the name is in the hover
    groups = {f"/model.{i // 5}/t{i}": f"model.{i // 50}" for i in range(300)}
    grouped = figures.layer_heatmap(_df(300), groups=groups)
    assert list(grouped.layout.xaxis.ticktext) == [f"model.{k}" for k in range(6)]
    assert len(grouped.layout.shapes) == 5  # a boundary between consecutive groups
    assert list(grouped.data[0].x) == list(range(300))  # a click still addresses one tensor


def test_inspector_saturation_and_levels() -> None:
    # uint8, scale 0.01, zero point 0: the grid is [0, 2.55]; 30 % of the data lies above it.
    rng = np.random.default_rng(0)
    f = np.concatenate([rng.uniform(0.0, 2.0, 700), rng.uniform(3.0, 4.0, 300)])
    q = np.clip(np.rint(f / 0.01), 0, 255) * 0.01
    s = ri.grid_stats(f, q, 0.01, 0, "uint8")
    assert (s.grid_min, s.grid_max) == (0.0, pytest.approx(2.55))
    assert s.clipped_high == pytest.approx(0.3) and s.clipped_low == 0
    assert s.saturated_high == pytest.approx(0.3)
    assert s.levels_total == 256 and 150 < s.levels_used <= 256
    assert "clipped 30.00%" in s.describe() and "of 256" in s.describe()
    fig = ri.value_histogram(f, q, 0.01, 0, "uint8")
    assert [t.name for t in fig.data] == ["float", "quantized", "error"]
    assert fig.layout.yaxis.type == "log"
    assert "saturated" in fig.layout.title.text
    assert sum(fig.data[0].y) == 1000
    assert ri.grid_stats(f, q, None, None, None).levels_total is None


def test_bins_follow_the_data() -> None:
    # A Sigmoid output in [1.8e-6, 0.03] with a grid step of 0.03/255: one bin per level, none at 0 only.
    f = np.linspace(1.8e-6, 0.03, 5000)
    scale = 0.03 / 255
    q = np.rint(f / scale) * scale
    edges = ri.bin_edges(f, q, scale, 0)
    assert len(edges) - 1 > ri.MAX_BINS / 2 or len(edges) - 1 == ri.MAX_BINS
    assert edges[0] < 1e-3 and edges[-1] >= 0.03
    few = ri.bin_edges(np.array([0.0, 0.02, 0.05]), np.array([0.0, 0.02, 0.05]), 0.01, 0)
    assert np.allclose(np.diff(few), 0.01) and len(few) - 1 == 6  # one bar per grid level


def test_scatter_and_channels() -> None:
    f = np.linspace(-1, 1, 10_000)
    sc = ri.value_scatter(f, np.round(f * 10) / 10, 0.1, 128, "uint8", max_points=500)
    assert len(sc.data[0].x) == 500 and sc.data[1].name == "identity"
    w = np.random.default_rng(1).normal(size=(4, 3, 3, 3))
    wq = w.copy()
    wq[2] = np.round(w[2] * 4) / 4  # one coarse channel
    per = ri.channel_sqnr(w, wq, 0)
    assert per[0] == math.inf and per[2] is not None and per[2] < 40
    fig = ri.channel_figure("conv.weight", w, wq, 0)
    assert [t.name for t in fig.data] == ["sqnr", "range"] and len(fig.data[0].x) == 4
    assert fig.data[0].y[0] == 60.0 and "worst" in fig.layout.title.text


def test_markers_never_overlap_the_next_layer(model_graph: tuple) -> None:
    # The clicked-neighbour bug: hundreds of layers squeezed into a few hundred pixels made markers overlap.
    names, edges, ops = model_graph
    g = gv.group_tensors(names, edges, ops)
    for expanded in (set(), {grp.key for grp in g.groups}):
        view = gv.graph_view(names, edges, g, expanded)
        fig = gv.graph_view_figure(view, _rows(names, ops))
        layers = max(view.drawing.ranks.values()) + 1
        px_per_layer = (fig.layout.height - 40) / layers
        assert px_per_layer >= 10
        assert max(fig.data[2].marker.size) <= 0.8 * px_per_layer + 1e-9
