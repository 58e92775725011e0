"""The dashboard's session (``QuantDebugger``) and widget (``DebuggerApp``), driven from Python without a browser:
real tiny models through real ONNX Runtime; traits are set and handlers called, then the outputs are read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import REPO, SAMPLE_MODELS, TINY_CONFIGS

from qdebug.config import QuantConfig
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
    assert np.max(np.abs(f - q)) <= 0.5 * scale + 1e-6 or a.local_sqnr_db is not None
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
    app.selected = "c2"
    assert "c2" in app.inspector.value and "c2" in app.status_line.value
    assert app.tensor_picker.value == "c2"
    assert app.histogram_box.children  # a figure or a placeholder saying why not
    for box in (app.heatmap_box, app.graph_box, app.histogram_box):
        (child,) = box.children
        assert hasattr(child, "figure") or hasattr(child, "data") or "unavailable" in child.value
    app.on_select("a1")
    assert app.selected == "a1" and "a1" in app.inspector.value
    app.tensor_picker.value = "r1"  # the dropdown writes the trait
    assert app.selected == "r1"
    app.sort_key = "cumulative_sqnr_db"
    assert "r1" in app.table.value


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
    assert "before" in app.before_after.value and "partition" in app.before_after.value
    assert first in app.plan_view.value
    assert app.progress.value == app.progress.max
    assert base_db != after_db

    app.on_export_clicked()
    written = tmp_path / "out" / "overrides.json"
    assert first in OverridesFile.load(written).tensors
    assert "data:application/json;base64," in app.download.value

    app.on_undo_clicked()
    assert dbg.history == () and dbg.report.min_output_sqnr_db == base_db
    assert "undone" in app.status
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
