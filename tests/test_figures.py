"""Figure builders (qdebug/render/figures.py) and the graph layout, on real reports — no browser."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import builders
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from conftest import SAMPLE_MODELS

import qdebug
from qdebug.mixed.compare import compare
from qdebug.mixed.search import SearchGoal, SearchPoint, SearchResult
from qdebug.mixed.suggest import analyse
from qdebug.render import bands, figures
from qdebug.render.layout import chain_with_skips, layered_layout
from qdebug.report import DebugReport

RED_END, GREEN_END = bands.SQNR_COLORSCALE[0][1], bands.SQNR_COLORSCALE[-1][1]


@pytest.fixture(scope="module")
def tiny_report(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> DebugReport:
    return qdebug.debug(tiny_float, tiny_quant("u8"))


@pytest.fixture(scope="module")
def transformer_report(tmp_path_factory: pytest.TempPathFactory) -> DebugReport:
    f = SAMPLE_MODELS / "digits_transformer.onnx"
    calib = SAMPLE_MODELS / "digits_calib.npz"
    q = tmp_path_factory.mktemp("tr") / "digits_transformer.qdq.onnx"
    qdebug.quantize(f, calib, None, q)
    return qdebug.debug(f, q, calib)


def _scale_band(z: float) -> str:
    """Which band of the colour scale a z value falls in (using zmin/zmax, as plotly does)."""
    frac = (min(max(z, bands.Z_MIN), bands.Z_MAX) - bands.Z_MIN) / (bands.Z_MAX - bands.Z_MIN)
    return "red" if frac < 1 / 3 else ("yellow" if frac <= 2 / 3 else "green")


def _degenerate(report: DebugReport) -> DebugReport:
    """The report with the first non-input tensor made identical (+inf) and the next one undefined."""
    acts = list(report.activations)
    acts[1] = replace(acts[1], cumulative_sqnr_db=math.inf, cumulative_status="identical")
    acts[2] = replace(acts[2], cumulative_sqnr_db=None, cumulative_status="undefined")
    return replace(report, activations=tuple(acts))


def test_colour_anchoring() -> None:
    assert bands.sqnr_color(10.0).startswith("#") and _scale_band(10.0) == "red"
    assert _scale_band(50.0) == "green" and _scale_band(30.0) == "yellow"
    # Breakpoints sit at 20 and 40 dB exactly, and the explicit colours agree with the scale's ends.
    positions = [p for p, _ in bands.SQNR_COLORSCALE]
    assert (bands.SQNR_LOW - bands.Z_MIN) / (bands.Z_MAX - bands.Z_MIN) in [pytest.approx(p) for p in positions]
    assert (bands.SQNR_HIGH - bands.Z_MIN) / (bands.Z_MAX - bands.Z_MIN) in [pytest.approx(p) for p in positions]
    assert bands.sqnr_color(-5.0) == RED_END and bands.sqnr_color(math.inf) == GREEN_END == bands.sqnr_color(80.0)
    assert bands.sqnr_color(None) == bands.sqnr_color(math.nan) == bands.GREY
    red, green = bands.sqnr_color(10.0), bands.sqnr_color(50.0)
    assert int(red[1:3], 16) > int(red[3:5], 16)  # red dominates
    assert int(green[3:5], 16) > int(green[1:3], 16)  # green dominates


@pytest.mark.parametrize("orientation", ["h", "v"])
def test_layer_heatmap(tiny_report: DebugReport, orientation: str) -> None:
    rep = _degenerate(tiny_report)
    df = rep.to_dataframe()
    fig = figures.layer_heatmap(df, rep.weights_dataframe(), orientation=orientation)
    assert isinstance(fig, go.Figure)
    assert '"zmax":60.0' in fig.to_json()  # serialisable as sent to the browser (NaN cells included)
    main, grey = fig.data
    assert isinstance(main, go.Heatmap) and isinstance(grey, go.Heatmap)
    assert (main.zmin, main.zmax) == (bands.Z_MIN, bands.Z_MAX)
    z = np.array(main.z, dtype=float)
    zg = np.array(grey.z, dtype=float)
    text = np.array(main.text, dtype=object)
    if orientation == "v":
        z, zg, text = z.T, zg.T, text.T
    assert z.shape == (3, len(df))  # local, cumulative, weight × tensors
    assert list(main.y if orientation == "h" else main.x) == ["local", "cumulative", "weight"]
    for j, name in enumerate(df["tensor_name"]):
        assert name in text[0, j]
    # +inf: top of the scale, hover "identical (inf)"; undefined: grey cell with its status.
    assert z[1, 1] == bands.Z_MAX and "identical (inf)" in text[1, 1]
    assert np.isnan(z[1, 2]) and zg[1, 2] == 1.0 and "undefined" in text[1, 2]
    # The input has no weights: blank, not grey.
    assert np.isnan(z[2, 0]) and np.isnan(zg[2, 0])
    w = rep.weights_dataframe()
    for node, tensor in (("conv2", "c2"), ("gemm", "y")):
        j = list(df["tensor_name"]).index(tensor)
        assert z[2, j] == pytest.approx(w[w.consumer_node == node].weight_sqnr_db.min())
        assert "weight:" in text[2, j]
    # Anchoring: every finite value's colour band is the one its dB value calls for.
    finite = z[np.isfinite(z)]
    assert all(_scale_band(v) == ("red" if v < 20 else "yellow" if v <= 40 else "green") for v in finite)


def test_fused_weights_map_to_the_captured_output(tiny_report: DebugReport) -> None:
    # conv1 is fused with relu1: only r1 is captured, so conv1's weights belong to r1 through weight_owners.
    df, w = tiny_report.to_dataframe(), tiny_report.weights_dataframe()
    owners = figures.weight_owners(builders.tiny_convnet(), df)
    assert owners == {"conv1": "r1"}
    worst = w[w.consumer_node == "conv1"].weight_sqnr_db.min()
    fig = figures.layer_heatmap(df, w, owners=owners)
    assert fig.data[0].z[2][1] == pytest.approx(worst) and "w1" in fig.data[0].text[2][1]
    assert math.isnan(figures.layer_heatmap(df, w).data[0].z[2][1])  # without owners: blank, not wrong
    t = figures.tensor_table(df, weights=w, owners=owners)
    assert t.set_index("tensor_name").weight_sqnr_db["r1"] == pytest.approx(worst)


def test_layer_heatmap_anchoring_on_synthetic_values(tiny_report: DebugReport) -> None:
    df = tiny_report.to_dataframe()
    df.loc[1, "cumulative_sqnr_db"] = 10.0
    df.loc[2, "cumulative_sqnr_db"] = 50.0
    df.loc[3, ["cumulative_sqnr_db", "cumulative_status"]] = [None, "nonfinite"]
    fig = figures.layer_heatmap(df)
    z = np.array(fig.data[0].z, dtype=float)
    assert _scale_band(z[1, 1]) == "red" and _scale_band(z[1, 2]) == "green"
    assert fig.data[1].z[1][3] == 1.0 and "nonfinite" in fig.data[0].text[1][3]


def test_layer_heatmap_transformer(transformer_report: DebugReport) -> None:
    df = transformer_report.to_dataframe()
    fig = figures.layer_heatmap(df, transformer_report.weights_dataframe())
    assert np.array(fig.data[0].z, dtype=float).shape == (3, len(df))
    # Identical (reshape/transpose) local values are drawn at the top colour with the right hover.
    ident = [j for j, s in enumerate(df["local_status"]) if s == "identical"]
    assert ident
    for j in ident:
        assert fig.data[0].z[0][j] == bands.Z_MAX and "identical (inf)" in fig.data[0].text[0][j]
    weighted = np.isfinite(np.array(fig.data[0].z, dtype=float)[2]).sum()
    assert weighted > 0


def test_samples_heatmap(transformer_report: DebugReport) -> None:
    ps = transformer_report.per_sample.to_dataframe()
    ps.iloc[0, 3] = np.nan
    ps.iloc[1, 4] = np.inf
    ps.iloc[2, 5] = 10.0
    fig = figures.samples_heatmap(ps)
    main, grey = fig.data
    assert isinstance(main, go.Heatmap) and (main.zmin, main.zmax) == (bands.Z_MIN, bands.Z_MAX)
    z = np.array(main.z, dtype=float)
    assert z.shape == ps.shape
    assert np.isnan(z[0, 3]) and grey.z[0][3] == 1.0 and "undefined" in main.text[0][3]
    assert z[1, 4] == bands.Z_MAX and "identical (inf)" in main.text[1][4]
    assert _scale_band(z[2, 5]) == "red"
    assert ps.columns[7] in main.text[0][7] and "sample 0" in main.text[0][7]


def test_tensor_table(transformer_report: DebugReport) -> None:
    sugg = analyse(transformer_report)
    df = transformer_report.to_dataframe()
    t = figures.tensor_table(df, sugg, transformer_report.weights_dataframe())
    assert isinstance(t, pd.DataFrame) and len(t) == len(df)
    assert {"op", "type", "local_sqnr_db", "cumulative_sqnr_db", "weight_sqnr_db", "role", "reason"} <= set(t.columns)
    s0 = sugg[0]
    row = t[t.tensor_name == s0.tensor_name].iloc[0]
    assert row.role == s0.role and row.reason == s0.reason
    assert t.sort_values("cumulative_sqnr_db").cumulative_sqnr_db.is_monotonic_increasing
    assert (t.weight_sqnr_db.notna()).any()
    # Same from the suggestions' DataFrame.
    from qdebug.mixed.suggest import suggestions_dataframe

    t2 = figures.tensor_table(df, suggestions_dataframe(sugg))
    assert t2[t2.tensor_name == s0.tensor_name].iloc[0].role == s0.role


@pytest.mark.parametrize("which", ["tiny", "transformer"])
def test_graph_figure(which: str, request: pytest.FixtureRequest) -> None:
    rep: DebugReport = request.getfixturevalue(f"{which}_report")
    rep = _degenerate(rep)
    df = rep.to_dataframe()
    names = list(df["tensor_name"])
    sel = names[3]
    fig = figures.graph_figure(df, metric="cumulative", selected=sel)
    edges, nodes, _scale, ring = fig.data
    assert all(isinstance(t, go.Scatter) for t in fig.data)
    assert list(nodes.customdata) == names
    assert all(x is not None for x in nodes.x) and len(nodes.x) == len(names)
    expected_edges = sum(1 for ins in df["inputs"] for i in ins if i in set(names))
    assert len(edges.x) == 3 * expected_edges and list(edges.x[2::3]) == [None] * expected_edges
    assert expected_edges >= len(names) - 1
    # Colours: the anchoring, +inf → top colour, undefined → grey with its status in the hover.
    assert nodes.marker.color[1] == GREEN_END and nodes.marker.color[2] == bands.GREY
    assert "undefined" in nodes.hovertext[2]
    for j, v in enumerate(df["cumulative_sqnr_db"]):
        if v is not None and math.isfinite(v):
            assert nodes.marker.color[j] == bands.sqnr_color(v)
        assert names[j] in nodes.hovertext[j]
    assert ring.customdata[0] == sel and (ring.x[0], ring.y[0]) == (nodes.x[3], nodes.y[3])
    local = figures.graph_figure(df, metric="local")
    assert len(local.data) == 3
    with pytest.raises(ValueError, match="metric"):
        figures.graph_figure(df, metric="weight")


def test_graph_positions_for_every_tensor(transformer_report: DebugReport) -> None:
    df = transformer_report.to_dataframe()
    names = list(df["tensor_name"])
    edges = figures.graph_edges(df)
    pos = layered_layout(names, edges)
    assert set(pos) == set(names)
    # Layered: every edge goes down (the graph is a DAG).
    assert all(pos[a][1] < pos[b][1] for a, b in edges)
    fig = figures.graph_figure(df, layout=pos)
    assert (fig.data[1].x[0], fig.data[1].y[0]) == pos[names[0]]
    fallback = layered_layout(names, edges, method="longest_path")
    assert set(fallback) == set(names) and all(fallback[a][1] < fallback[b][1] for a, b in edges)


def test_layout_900_nodes() -> None:
    nodes, edges = chain_with_skips(900)
    t0 = time.perf_counter()
    pos = layered_layout(nodes, edges)
    took = time.perf_counter() - t0
    print(f"\nlayered_layout (grandalf Sugiyama) on 900 nodes / {len(edges)} edges: {took:.2f} s")
    assert set(pos) == set(nodes)
    assert all(pos[a][1] < pos[b][1] for a, b in edges)
    df = pd.DataFrame(
        {
            "tensor_name": nodes, "producer_op": "Add", "producer_node": nodes, "topo_index": range(900),
            "quant_type": "uint8", "local_sqnr_db": 30.0, "local_status": "ok",
            "cumulative_sqnr_db": np.linspace(10, 50, 900), "cumulative_status": "ok",
            "inputs": [tuple(a for a, b in edges if b == n) for n in nodes],
        }
    )  # fmt: skip
    fig = figures.graph_figure(df, layout=pos)
    assert len(fig.data[0].x) == 3 * len(edges)
    assert fig.data[1].marker.color[0] == bands.sqnr_color(10.0) and fig.data[1].mode == "markers"


def test_layout_edge_cases() -> None:
    assert layered_layout([], []) == {}
    pos = layered_layout(["a", "b", "c"], [("a", "b"), ("b", "a"), ("x", "c"), ("c", "c")])
    assert set(pos) == {"a", "b", "c"}  # cycle, unknown node and self-loop tolerated
    with pytest.raises(ValueError, match="unique"):
        layered_layout(["a", "a"], [])
    with pytest.raises(ValueError, match="method"):
        layered_layout(["a"], [], method="nope")  # type: ignore[arg-type]


def test_histogram_figure() -> None:
    rng = np.random.default_rng(0)
    f = rng.normal(size=5000).astype(np.float32)
    scale = 0.05
    q = np.round(f / scale) * scale
    fig = figures.histogram_figure(f, q, scale=scale, zero_point=128)
    assert len(fig.data) == 3 and [t.name for t in fig.data] == ["float", "quantized", "error"]
    assert all(isinstance(t, go.Bar) for t in fig.data)
    assert sum(fig.data[0].y) == 5000 and sum(fig.data[2].y) == 5000
    err_x = np.array(fig.data[2].x)
    assert err_x.min() >= -scale and err_x.max() <= scale
    lines = [s.x0 for s in fig.layout.shapes]
    assert sorted(lines) == pytest.approx([-scale / 2, scale / 2])
    assert "0.05" in fig.layout.title.text and "128" in fig.layout.title.text
    assert len(figures.histogram_figure(f, q).layout.shapes) == 0
    with pytest.raises(ValueError, match="sizes"):
        figures.histogram_figure(f, q[:10])


def _search_result() -> SearchResult:
    pts = tuple(
        SearchPoint(step=i, promoted=tuple(f"t{k}" for k in range(i)), cost_fraction_16bit=0.1 * i,
                    num_16bit_tensors=i, output_sqnr_db=20.0 + 3 * i, accuracy=0.9 + 0.01 * i,
                    chosen=(i == 2), seconds=0.1)
        for i in range(4)
    )  # fmt: skip
    extra = SearchPoint(7, ("a",), 0.05, 1, math.inf, None, False, 0.1)
    return SearchResult(
        goal=SearchGoal(output_sqnr_db=25.0), steps=pts, evaluated=(*pts, extra), reached=True,
        stop_reason="goal", requantizations=5, seconds=1.0, float_accuracy=0.95, chosen_step=2,
    )  # fmt: skip


@pytest.mark.parametrize("form", ["result", "dict", "steps"])
def test_pareto_figure(form: str) -> None:
    res = _search_result()
    arg = {"result": res, "dict": res.to_dict(), "steps": res.steps}[form]
    fig = figures.pareto_figure(arg)
    by = {t.name: t for t in fig.data}
    assert list(by["steps"].customdata) == [0, 1, 2, 3]
    assert list(by["steps"].x) == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert "accuracy: 92.00%" in by["steps"].hovertext[2]
    assert list(by["chosen"].customdata) == [2] and by["chosen"].marker.symbol == "star"
    if form != "steps":
        assert list(by["evaluated"].customdata) == [7] and by["evaluated"].y[0] == bands.Z_MAX
        assert "accuracy: n/a" in by["evaluated"].hovertext[0]
        assert list(by["Pareto front"].customdata) == [0, 7]  # the same front SearchResult.pareto() and the CLI give
    else:
        assert "Pareto front" not in by


def test_comparison_figure(tiny_report: DebugReport) -> None:
    after = _degenerate(tiny_report)
    acts = list(after.activations)
    acts[4] = replace(acts[4], cumulative_sqnr_db=(acts[4].cumulative_sqnr_db or 0) + 6.0)
    after = replace(after, activations=tuple(acts))
    cmp = compare(tiny_report, after)
    fig = figures.comparison_figure(cmp)
    before_t, after_t, delta_t = fig.data
    assert [t.name for t in fig.data] == ["before", "after", "delta"]
    assert isinstance(delta_t, go.Bar) and delta_t.y[4] == pytest.approx(6.0)
    assert delta_t.marker.color[4] == "#2b8a3e"
    assert after_t.y[1] is None and "identical (inf)" in after_t.hovertext[1]  # +inf: gap, named in hover
    assert delta_t.y[2] is None
    assert all(d.name in h for d, h in zip(cmp.cumulative, before_t.hovertext, strict=True))


def test_comparison_figure_names_tensors_only_while_they_fit(tiny_report: DebugReport) -> None:
    # 300 tensors: no tick labels (they would overlap, and plotly measures each one), every name still in the hover
    many = tuple(replace(a, tensor_name=f"t{i}") for i in range(300) for a in tiny_report.activations[:1])
    big = replace(tiny_report, activations=many)
    fig = figures.comparison_figure(compare(big, big))
    assert fig.layout.xaxis2.showticklabels is False and fig.layout.xaxis2.ticktext is None
    assert len(fig.data[0].hovertext) == 300 and "t299" in fig.data[0].hovertext[-1]
    small = figures.comparison_figure(compare(tiny_report, tiny_report))
    assert list(small.layout.xaxis2.ticktext) == [a.tensor_name for a in tiny_report.activations]


def test_figures_import_and_core_stays_plotly_free() -> None:
    # The rendering layer is core: importing it loads no plotly; building the first figure does.
    code = (
        "import sys, qdebug.render.figures as f; a = 'plotly' in sys.modules; f.pareto_figure([]); "
        "print(a, 'plotly' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False True"
    code = "import sys, qdebug, qdebug.mixed.search, qdebug.mixed.compare; print('plotly' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_a_figure_without_plotly_names_the_ui_extra() -> None:
    """plotly hidden (a meta-path finder refuses it): text rendering works, a figure raises MissingExtraError."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("plotly", "grandalf"):
            raise ImportError(f"no module named {name!r}")
        return None
sys.meta_path.insert(0, Block())
from qdebug.errors import MissingExtraError
from qdebug.render import figures, fmt, layout, text
assert fmt.fmt_db(25.0) == "  25.00"
try:
    figures.pareto_figure([])
except MissingExtraError as exc:
    print(exc)
try:
    layout.layered_layout(["a", "b"], [("a", "b")])
except MissingExtraError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all("pip install 'qdebug[ui]'" in line for line in lines), out.stdout


def test_a_signed_db_change_that_rounds_to_zero_has_no_minus_sign() -> None:
    """fmt_db_delta: a change rounding to zero prints '+0.0 dB' (a '-0.0 dB' read as a loss), others keep their sign."""
    from qdebug.render.fmt import fmt_db_delta

    assert fmt_db_delta(-0.04) == "+0.0 dB" and fmt_db_delta(-0.0) == "+0.0 dB" and fmt_db_delta(0.0) == "+0.0 dB"
    assert fmt_db_delta(-0.004, 2) == "+0.00 dB"
    assert fmt_db_delta(-0.06) == "-0.1 dB" and fmt_db_delta(1.44) == "+1.4 dB"
    assert fmt_db_delta(None) == "n/a" and fmt_db_delta(None, missing="-") == "-"
