"""The dashboard's session (``QuantDebugger``) and widget (``DebuggerApp``), driven from Python without a browser:
real tiny models through real ONNX Runtime; traits are set and handlers called, then the outputs are read."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import REPO, SAMPLE_MODELS, TINY_CONFIGS

from qdebug.config import QuantConfig
from qdebug.metrics import sqnr_db
from qdebug.mixed.overrides import OverridesFile
from widgets.app import DebuggerApp
from widgets.session import QuantDebugger


@pytest.fixture
def dbg(tiny_float: Path, tmp_path: Path) -> QuantDebugger:
    return QuantDebugger(tiny_float, config=TINY_CONFIGS["u8"], workdir=tmp_path / "work")


def _types(d: QuantDebugger) -> dict[str, str | None]:
    return {a.tensor_name: a.quant_type for a in d.report.activations}


def test_import_widgets_is_light() -> None:
    code = (
        "import sys, widgets; "
        "heavy = [m for m in ('ipywidgets', 'plotly', 'widgets.app', 'widgets.session') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    import widgets

    assert widgets.QuantDebugger is QuantDebugger
    assert widgets.DebuggerApp is DebuggerApp


def test_quantizes_debugs_suggests_and_reports_progress(tiny_float: Path, tmp_path: Path) -> None:
    calls: list[tuple[int, int, str]] = []
    d = QuantDebugger(tiny_float, config=TINY_CONFIGS["u8"], workdir=tmp_path, progress=lambda *a: calls.append(a))
    assert calls and calls[-1][0] == calls[-1][1]  # ended at done == total
    assert {a.tensor_name for a in d.report.activations} >= {"r1", "c2", "a1"}
    assert all(a.quant_type == "uint8" for a in d.report.activations if a.quantized)
    sugg = d.suggestions(top=3)
    assert 1 <= len(sugg) <= 3
    assert [s.rank for s in sugg] == sorted(s.rank for s in sugg)
    assert Path(d.quant_model_path).is_file()


def test_promote_apply_undo(dbg: QuantDebugger) -> None:
    base = dbg.report
    target = dbg.suggestions()[0].tensor_name
    plan = dbg.promote([target])
    assert target in plan.requested and target in dict(plan.overrides)
    assert "uint16" in plan.describe()
    assert dbg.report is base and dbg.history == ()  # a plan quantizes nothing

    ev = dbg.apply(plan)
    assert len(dbg.history) == 1 and dbg.report is ev.report
    assert _types(dbg)[target] == "uint16"
    assert ev.comparison is not None
    assert dbg.promoted == tuple(sorted(dict(plan.overrides)))
    assert target not in {s.tensor_name for s in dbg.suggestions(top=None)}  # already 16-bit

    assert dbg.undo() is ev
    assert dbg.report is base and dbg.history == ()
    assert _types(dbg)[target] == "uint8"
    assert dbg.undo() is None


def test_export_overrides_round_trips(dbg: QuantDebugger, tmp_path: Path) -> None:
    target = dbg.suggestions()[0].tensor_name
    dbg.apply(dbg.promote([target]))
    path = dbg.export_overrides(tmp_path / "ov.json")
    loaded = OverridesFile.load(path)
    assert target in loaded.tensors
    assert loaded.requested == (target,)
    assert loaded.model_sha256 == dbg.session.float_sha256
    assert loaded.apply_to(TINY_CONFIGS["u8"]).tensor_overrides == dbg.config.tensor_overrides


def test_tensor_values_one_tensor_on_demand(dbg: QuantDebugger) -> None:
    a = dbg.report.activation("c2")
    f, q, scale, zp = dbg.tensor_values("c2")
    assert f.shape == q.shape == (1, 4, 6, 6)
    assert scale == a.scale and zp == a.zero_point
    assert scale is not None
    # The quantized side is dequantized: every value sits on the scale's grid, and close to the float one.
    steps = q / scale
    assert np.allclose(steps, np.round(steps), atol=1e-3)
    # Both sides are the ones the debug pass compared on this sample: their SQNR is the report's sample-0 value.
    assert a.measured_through is None  # (else the report compares them clipped through the activation)
    j = dbg.report.per_sample.tensor_names.index("c2")
    assert sqnr_db(f, q) == pytest.approx(dbg.report.per_sample.values[0, j], abs=1e-3)
    with pytest.raises(KeyError):
        dbg.tensor_values("no-such-tensor")


def test_targets_and_cpu_recompile(dbg: QuantDebugger) -> None:
    t = dbg.targets()
    assert t["cpu"][0] is True
    assert "qnn" in t and isinstance(t["qnn"][1], str) and t["qnn"][1]
    for ok, reason in t.values():
        assert isinstance(ok, bool) and reason  # unavailable ones say why
    res = dbg.recompile("cpu")
    assert res.ok, res.problems


def test_given_pair_is_debugged_as_is(tiny_float: Path, tiny_quant, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    q = tiny_quant("u16_qnn")
    d = QuantDebugger(tiny_float, q, workdir=tmp_path)
    assert d.quant_model_path == q
    assert d.report.meta.quant_sha256 == d.model_sha256
    assert {a.quant_type for a in d.report.activations if a.quantized} == {"uint16"}
    assert d.current is None and d.history == ()


# ---------------------------------------------------------------------------------------------- the widget
def test_app_select_updates_inspector(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    assert app.show() is app
    assert app.selected == "" and app.tensor_picker.value is None  # nothing selected until the user does
    app.selected = "c2"
    assert "c2" in app.inspector.value and "c2" in app.status_line.value
    assert app.tensor_picker.value == "c2"
    assert app.histogram_box.children  # a figure or a placeholder saying why not
    import plotly.graph_objects as go

    for box in (app.heatmap_box, app.samples_box, app.graph_box, app.histogram_box):
        (child,) = box.children
        assert isinstance(child, go.FigureWidget), getattr(child, "value", child)  # live, never a placeholder
    app.on_select("a1")
    assert app.selected == "a1" and "a1" in app.inspector.value
    app.tensor_picker.value = "r1"  # the dropdown writes the trait
    assert app.selected == "r1"
    app.sort_key = "cumulative_sqnr_db"
    assert "r1" in app.table_names()


def test_app_promote_undo_export(dbg: QuantDebugger, tmp_path: Path) -> None:
    app = DebuggerApp(dbg, export_path=tmp_path / "out" / "overrides.json")
    assert "cpu" in [v for _, v in app.target_picker.options]
    assert app.target == "cpu"
    base_db = dbg.report.min_output_sqnr_db
    app.on_promote_clicked()  # nothing ticked, nothing selected
    assert "at least one" in app.status and dbg.history == ()

    first = next(iter(app.suggestion_boxes))
    app.suggestion_boxes[first].value = True
    app.on_promote_clicked()
    after_db = dbg.report.min_output_sqnr_db
    assert len(dbg.history) == 1
    assert _types(dbg)[first] == "uint16"
    assert after_db is not None and f"{after_db:.2f} dB" in app.status
    assert "cpu: ok" in app.status
    # the compile table beside the step (the CPU target runs every node: no accelerator partitions to count)
    assert "before" in app.before_after.value and "<th>nodes (all on the CPU)</th>" in app.before_after.value
    assert first in app.plan_view.value
    assert app.progress.value == app.progress.max
    assert base_db != after_db

    app.on_export_clicked()
    written = tmp_path / "out" / "overrides.json"
    assert first in OverridesFile.load(written).tensors
    assert "data:application/json;base64," in app.download.value
    assert str(written) in app.download.value  # outside the dashboard the whole path is useful
    app.hidden_folders = (tmp_path,)  # the dashboard's page: its files by name, never the server's folders
    app.on_export_clicked()
    assert "<span class='qd-export-path'>overrides.json</span>" in app.download.value
    assert str(tmp_path) not in app.download.value and str(tmp_path) not in app.status
    app.hidden_folders = ()

    app.on_undo_clicked()
    assert dbg.history == () and dbg.report.min_output_sqnr_db == base_db
    assert app.status.startswith("undone step 1: "), app.status  # the step's name as prose, not 'step1'
    app.on_undo_clicked()
    assert app.status == "nothing to undo"


def test_app_unavailable_target_is_explained(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    app.targets_info = {**app.targets_info, "qnn": (False, "no onnxruntime-qnn here")}
    app.target = "qnn"
    assert app.target_picker.value == "qnn"
    app.suggestion_boxes[next(iter(app.suggestion_boxes))].value = True
    app.on_promote_clicked()
    assert len(dbg.history) == 1  # the promotion still happens; the compile is skipped with the reason
    assert "not compiled: qnn unavailable (no onnxruntime-qnn here)" in app.status
    assert app.last_recompile is None


@pytest.mark.skipif(not (SAMPLE_MODELS / "digits_cnn.onnx").is_file(), reason="sample model missing")
def test_digits_cnn_accuracy_in_before_after(tmp_path: Path) -> None:
    model = onnx.load(str(SAMPLE_MODELS / "digits_cnn.onnx"))
    assert model.graph.input
    d = QuantDebugger(
        SAMPLE_MODELS / "digits_cnn.onnx",
        data=SAMPLE_MODELS / "digits_calib.npz",
        config=QuantConfig(activation_type="uint8", weight_type="uint8"),
        debug_data=SAMPLE_MODELS / "digits_eval.npz",
        eval_data=SAMPLE_MODELS / "digits_eval.npz",
        workdir=tmp_path,
    )
    app = DebuggerApp(d)
    app.suggestion_boxes[next(iter(app.suggestion_boxes))].value = True
    app.on_promote_clicked()
    assert "accuracy" in app.status and "top-1 accuracy" in app.before_after.value


# ---------------------------------------------------------------------------------------------- table, clicks, search
def _row_names(app: DebuggerApp) -> list[str]:
    return [row.children[1].tooltip for row in app.table.children[1:] if hasattr(row, "children")]


def test_table_filters_sorts_pages_and_ticks(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    df = dbg.report.to_dataframe()
    assert _row_names(app) == app.table_names() == list(df.sort_values("topo_index")["tensor_name"])[:20]
    app.sort_key = "cumulative_sqnr_db"
    cum = app.table_frame()["cumulative_sqnr_db"].dropna().tolist()
    assert cum == sorted(cum)
    assert "qd-sort-cumulative_sqnr_db" in app.table._dom_classes
    app.descending = True
    cum = app.table_frame()["cumulative_sqnr_db"].dropna().tolist()
    assert cum == sorted(cum, reverse=True)
    app.filter_text = "conv"  # matches the op column, case-insensitively
    assert set(app.table_frame()["op"]) == {"Conv"}
    app.filter_text = "no-such-tensor"
    assert app.table_names() == [] and "no tensor matches" in app.table.children[-1].value
    app.filter_text = ""
    app.threshold = 1000.0
    app.only_low = True  # every finite SQNR is below 1000 dB
    assert len(app.table_frame()) > 0
    app.only_low = False
    # ticking a row's checkbox adds the tensor to the promotion set, mirrored in the suggestions
    name = app.table_names()[0]
    app.row_boxes[name].value = True
    assert app.promotion == [name] and name in app.promotion_view.value
    if name in app.suggestion_boxes:
        assert app.suggestion_boxes[name].value
    app.row_boxes[name].value = False
    assert app.promotion == []
    # the name button selects
    app.table.children[1].children[1].click()
    assert app.selected == app.table_names()[0]


def test_table_pages(tmp_path: Path) -> None:
    d = QuantDebugger(
        SAMPLE_MODELS / "digits_transformer.onnx",
        data=SAMPLE_MODELS / "digits_calib.npz",
        config=QuantConfig(num_samples=8),
        workdir=tmp_path,
    )
    app = DebuggerApp(d)
    total = len(d.report.activations)
    assert total > 2 * 20
    first = app.table_names()
    app.next_button.click()
    assert app.page == 1 and app.table_names() != first and "21–40 of" in app.page_label.value
    for _ in range(total):
        app.next_button.click()
    assert app.page == (total - 1) // 20  # clamps at the last page
    app.prev_button.click()
    assert app.page == (total - 1) // 20 - 1
    app.sort_key = "local_sqnr_db"  # a new order starts at page 0
    assert app.page == 0


class _Points:
    def __init__(self, inds: list[int], xs: list[object]) -> None:
        self.point_inds, self.xs = inds, xs


def test_figure_clicks_select(dbg: QuantDebugger) -> None:
    import plotly.graph_objects as go

    app = DebuggerApp(dbg)
    heat = app.heatmap_box.children[0]
    assert isinstance(heat, go.FigureWidget) and "qd-heatmap" in heat._dom_classes
    c2 = dbg.report.activation("c2")
    order = sorted(dbg.report.activations, key=lambda a: a.topo_index)
    app.on_heatmap_click(heat.data[0], _Points([0], [[a.tensor_name for a in order].index(c2.tensor_name)]))
    assert app.selected == "c2"
    samples = app.samples_box.children[0]
    assert isinstance(samples, go.FigureWidget)
    names = dbg.report.per_sample.tensor_names
    app.on_samples_click(samples.data[0], _Points([0], [names.index("r1")]))
    assert app.selected == "r1"
    # The graph: a click selects the tensor whose node was clicked (its own customdata), the ring follows it.
    graph = app.graph_box.children[0]
    nodes = next(t for t in graph.data if t.name == "nodes")
    ids = [tuple(c) for c in nodes.customdata]
    i = ids.index(("tensor", "a1"))
    app.graph_panel.on_node_click(nodes, _Points([i], [nodes.x[i]]))
    assert app.selected == "a1"
    ring = next(t for t in app.graph_box.children[0].data if t.name == "selected")
    assert (ring.x[0], ring.y[0]) == (nodes.x[i], nodes.y[i])
    app.on_select("c2")  # the ring moves in place
    j = ids.index(("tensor", "c2"))
    ring = next(t for t in app.graph_box.children[0].data if t.name == "selected")
    assert (ring.x[0], ring.y[0]) == (nodes.x[j], nodes.y[j])


def test_search_pareto_click_applies_point(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    base_db = dbg.report.min_output_sqnr_db
    assert base_db is not None
    app.goal_db.value = base_db + 60  # unreachable: every step of the curve gets measured
    app.on_search_clicked()
    res = app.last_search
    assert res is not None and res.steps
    plotted = {p.step for p in (*res.steps, *res.evaluated)}  # the curve's points
    assert f"{len(plotted)} points measured" in app.search_summary.value
    assert dbg.history == ()  # searching does not change the current variant
    fig = app.pareto_box.children[0]
    steps = next(t for t in fig.data if t.name == "steps")
    last = len(steps.customdata) - 1
    app._on_pareto_click(steps, _Points([last], [steps.x[last]]))
    point = app.search_point(int(steps.customdata[last]))
    assert point is not None and point.promoted
    assert set(dbg.promoted) >= set(point.promoted) and len(dbg.history) == 1
    assert abs((dbg.report.min_output_sqnr_db or 0) - (point.output_sqnr_db or 0)) < 1e-6
    assert "before" in app.before_after.value
    # a second point replaces (does not add to) the first one's promotion
    first = next(p for p in res.steps if p.promoted)
    app.on_pareto_point(first.step)
    assert set(dbg.config.tensor_overrides and dbg._requested()) == set(first.promoted)
    base = next((p for p in res.steps if not p.promoted), None)
    if base is not None:
        app.on_pareto_point(base.step)
        assert dbg.history == () and "base" in app.status
    app.on_pareto_point(10_000)
    assert "no search point" in app.status


def test_bad_search_goal_is_a_message(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    app.goal_db.value = 0.0
    app.goal_drop.value = 0.0
    app.on_search_clicked()
    assert app.status.startswith("search not started: set a goal first") and app.last_search is None


def test_comparison_after_promotion(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    app.promotion = [dbg.suggestions()[0].tensor_name]
    assert all(b.value for n, b in app.suggestion_boxes.items() if n in app.promotion)
    app.on_select("r1")
    app.on_promote_clicked()
    assert app.selected == "r1" and app.tensor_picker.value == "r1"  # a redraw keeps the selection
    (fig,) = app.comparison_box.children
    assert [t.name for t in fig.data] == ["before", "after", "delta"]
    assert app.promotion == []
    app.on_undo_clicked()
    assert app.comparison_box.children == ()


def test_netron_is_an_explicit_opt_in(dbg: QuantDebugger) -> None:
    pytest.importorskip("netron", reason="netron is part of the ui extra: pip install -e '.[ui]'")
    app = DebuggerApp(dbg)
    assert app.netron is None and app.netron_view.value == ""  # nothing served until asked
    app.on_netron_clicked()
    try:
        assert app.netron is not None, app.status
        assert app.netron.url.startswith("http://127.0.0.1:") and app.netron.url in app.netron_view.value
        assert "Google Analytics" in app.netron_view.value and "<iframe" in app.netron_view.value
        assert app.netron_button.description == "Stop Netron"
    finally:
        handle = app.netron
        app.on_netron_clicked()
    assert app.netron is None and app.netron_view.value == "" and handle is not None and not handle.running


def test_expired_netron_is_refused_with_the_reason(dbg: QuantDebugger, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("netron", reason="netron is part of the ui extra: pip install -e '.[ui]'")
    import datetime as dt

    from widgets import netron_view

    info = netron_view.netron_build_info()
    if info.expires is None:
        pytest.skip("the installed netron has no build date")
    later = info.expires + dt.timedelta(days=1)
    monkeypatch.setattr(
        netron_view, "netron_expired", lambda now=None: netron_view.netron_build_info().days_left(later) < 0
    )
    app = DebuggerApp(dbg)
    app.on_netron_clicked()
    assert app.netron is None and "refuses to run since" in app.status and "pip install -U netron" in app.status


def test_per_report_views_are_derived_once(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    first = app.views()
    app.sort_key = "cumulative_sqnr_db"
    app.on_select("c2")
    app.filter_text = "r"
    assert app.views() is first  # view-state changes reuse the report's table, suggestions and owners
    app.promotion = [dbg.suggestions()[0].tensor_name]
    app.on_promote_clicked()
    promoted = app.views()
    assert promoted is not first and promoted.report is dbg.report
    app.on_undo_clicked()
    assert app.views().report is first.report


def test_the_app_says_how_the_tensors_were_captured(dbg: QuantDebugger) -> None:
    from widgets.app import DebuggerApp

    app = DebuggerApp(dbg)
    info = dbg.report.meta.capture
    assert info is not None
    assert f"capture: {info.backend} backend" in app.capture_note.value


# ---------------------------------------------------------------------------------------------- honest state
def test_step_clock_says_the_step_and_the_time_left() -> None:
    from widgets.status import StepClock

    now = [100.0]
    c = StepClock(clock=lambda: now[0])
    assert c.text(0, 64, "base model: debugging sample 0/64") == "base model: debugging sample 0/64"
    now[0] += 10
    assert c.text(16, 64, "base model: debugging sample 16/64").endswith("— 10 s, about 30 s left")
    now[0] += 100
    assert "about" not in c.text(0, 1, "compiling for qnn")  # a new step restarts the clock; no count, no ETA
    now[0] += 75
    assert c.text(0, 1, "compiling for qnn") == "compiling for qnn — 1 min 15 s"


@pytest.mark.parametrize(
    ("db", "kind"), [(9.6, "poor"), (-20.6, "poor"), (30.0, "fair"), (45.0, "good"), (None, "unknown")]
)
def test_verdict_instead_of_success_at_any_value(db: float | None, kind: str) -> None:
    from widgets.status import verdict

    v = verdict(db)
    assert v.kind == kind and (db is None or kind in v.text)


def test_buttons_are_disabled_while_working_and_a_failure_is_said_where_the_user_looks(
    dbg: QuantDebugger, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = DebuggerApp(dbg)
    seen: list[bool] = []
    real_apply = dbg.apply

    def failing(plan):  # type: ignore[no-untyped-def]
        seen.append(app.promote_button.disabled and app.search_button.disabled and app.undo_button.disabled)
        raise RuntimeError("Only an existing tensor can be modified, 'x_intermediate' is not.")

    monkeypatch.setattr(dbg, "apply", failing)
    before = dbg.report.min_output_sqnr_db
    name = next(iter(app.suggestion_boxes))
    app.suggestion_boxes[name].value = True
    app.on_promote_clicked()
    assert seen == [True]  # busy while working …
    assert not app.promote_button.disabled and not app.search_button.disabled  # … and usable after
    failed = app.comparison_box.children[0].value  # the Before/after tab says it, and why
    assert "failed" in failed and "Only an existing tensor" in failed
    assert "qd-msg-error" in app.fix_message.value and "Only an existing tensor" in app.fix_message.value
    assert dbg.history == () and dbg.report.min_output_sqnr_db == before
    monkeypatch.setattr(dbg, "apply", real_apply)
    app.suggestion_boxes[name].value = True
    app.on_promote_clicked()  # the session stays usable
    assert len(dbg.history) == 1 and "promoted 1 tensor(s)" in app.fix_message.value


def test_table_wording(dbg: QuantDebugger) -> None:
    """Human column names, n/a last in both directions, no `nan` type, suggestion text whole."""
    app = DebuggerApp(dbg)
    assert ("local SQNR", "local_sqnr_db") in app.sort_picker.options
    assert all(not label.endswith("_db") for label, _ in app.sort_picker.options + app.metric_picker.options)
    for desc in (False, True):
        app.descending = desc
        app.sort_key = "weight_sqnr_db"  # n/a for every tensor without weights
        values = list(app.table_frame()["weight_sqnr_db"])
        missing = [math.isnan(v) for v in values]
        assert missing == sorted(missing), values  # every n/a after every value
    cells = [c.value for r in app.table.children[1:] for c in r.children if isinstance(getattr(c, "value", None), str)]
    assert cells and not any(c.strip().endswith(">nan</span>") or ">nan<" in c for c in cells)
    labels = [
        h.value
        for row in app.suggestions_box.children
        for h in getattr(row, "children", ())
        if "qd-suggestion-text" in str(getattr(h, "value", ""))
    ]
    assert labels and all("dB at output</span>" in t for t in labels)  # the whole label, not cut


def test_figures_carry_no_nan_to_the_front_end() -> None:
    """A NaN or inf in widget state makes jupyter_client warn "Out of range float values are not JSON compliant"."""
    import json

    import plotly.graph_objects as go

    from widgets.app_figure import json_safe as _json_safe

    fig = go.Figure(go.Heatmap(z=[[1.0, float("nan")], [float("inf"), 2.0]], customdata=[[float("-inf")]]))
    json.dumps(_json_safe(fig), allow_nan=False, default=lambda o: o.tolist())


def test_report_panel_diagnoses_and_offers_the_html_report(dbg: QuantDebugger, tmp_path: Path) -> None:
    app = DebuggerApp(dbg, export_path=tmp_path / "overrides.json")
    panel = app.report_panel
    first = next(iter(app.suggestion_boxes))
    app.suggestion_boxes[first].value = True
    app.on_promote_clicked()
    gains = dbg.measured_gains()  # every tensor the (fixed) promotion overrides, one measured gain
    assert first in gains and set(gains) == set(dbg.promoted)
    gained = dbg.report.min_output_sqnr_db - dbg.session.base.report.min_output_sqnr_db
    assert list(gains.values()) == pytest.approx([gained] * len(gains))
    panel.on_diagnose_clicked()
    assert "diagnostic(s)" in panel.diagnostics_view.value
    assert dbg.diagnostics() is dbg.diagnostics()  # kept per variant
    panel.on_html_clicked()
    assert "data:text/html;base64," in panel.link.value and "download report.html" in panel.link.value
    page = (dbg.workdir / "report.html").read_text(encoding="utf-8")
    assert "Promotions applied and measured" in page and first in page


def test_a_step_that_changed_nothing_says_plus_zero() -> None:
    """A step whose measured change rounds to zero says '+0.0 dB', not '-0.0 dB' (read as a loss)."""
    from widgets.session_steps import StepGain

    assert StepGain(("t",), 20.0, 19.97, -0.01).text() == "predicted +0.0 dB, measured +0.0 dB"
