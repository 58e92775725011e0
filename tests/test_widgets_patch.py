"""The promotion panel on a QDQ model the user gave (issue 38), from Python without a browser: "before" is the
user's model and names it, a promotion is a patch of it and the panel says which Q/DQ pairs changed and what the
estimate predicted beside what was measured; **Download fixed model** writes the model and a recipe the CLI
rebuilds the same model from (a patch recipe for a given model; the calibration ranges for one qdebug quantized)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import SAMPLE_MODELS

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions
from qdebug.mixed.suggest import suggest
from qdebug.model_io import file_sha256
from qdebug.quantizer import quantize
from widgets.app import DebuggerApp
from widgets.app_base import db_text
from widgets.session import QuantDebugger

FLOAT = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
OPTIONS = DebugOptions(num_samples=8)


def _outputs(path: Path) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [sess.run(None, {"input": x})[0] for x in np.load(CALIB)["input"][:6]]


@pytest.fixture(scope="module")
def given_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DebuggerApp, Path]]:
    work = tmp_path_factory.mktemp("given-panel")
    cfg = QuantConfig(weight_type="int8", per_channel=True, num_samples=32)
    user = Path(quantize(FLOAT, CALIB, cfg, work / "user.qdq.onnx", check=False).model_path)
    dbg = QuantDebugger(FLOAT, user, data=CALIB, debug_options=OPTIONS, workdir=work / "session")
    yield DebuggerApp(dbg, export_path=work / "run" / "overrides.json"), user
    dbg.close()


def test_promotion_of_your_model_is_like_for_like_and_says_what_changed(
    given_app: tuple[DebuggerApp, Path], tmp_path: Path, run_cli
) -> None:
    app, user = given_app
    dbg = app.debugger
    theirs = dbg.report.min_output_sqnr_db
    first = dbg.suggestions(top=1)[0]
    texts = [c.children[1].value for c in app.suggestions_box.children]
    assert texts and all("est. +" in t and "dB at output" in t for t in texts)
    assert not any("+48.2" in t for t in texts)  # calibrated, not the saturated 8-bit × 6 dB
    # the same numbers as qdebug suggest on the same report (one function)
    cli = {s.tensor_name: s.estimated_output_gain_db for s in suggest(dbg.report, None)}
    for t in texts:
        name, est = re.search(r">(\S+) \(.*est\. ([+-]\d+\.\d) dB at output", html_unescape(t)).groups()  # type: ignore[union-attr]
        assert est == f"{cli[name]:+.1f}"
    app.promotion = [first.tensor_name]  # ticked, then Promote
    app.on_promote_clicked()
    assert len(dbg.history) == 1, app.fix_message.value
    shown = app.before_after.value
    assert f"before: your model ({user.name})" in shown
    before_cell = re.search(r"<td class='qd-before'>(.*?)</td>", shown)
    assert before_cell is not None and before_cell.group(1) == db_text(theirs)  # the user's model itself
    assert "re-gridded in your model; every other Q/DQ is unchanged" in shown
    assert html_unescape(shown).count(f"{first.tensor_name}: uint8 (scale") == 1
    gain = dbg.last_gain
    assert gain is not None and gain.before_db == theirs and gain.tensors == (first.tensor_name,)
    assert f"this step: predicted {gain.predicted_db:+.1f} dB, measured" in shown
    # the download: the model as measured and a recipe the CLI applies to the user's model
    saved = app.on_export_fix_clicked()
    assert set(saved) == {"model", "recipe"}
    assert saved["model"].read_bytes() == dbg.quant_model_path.read_bytes()
    links = app.download.value
    assert "download fixed model" in links and "download recipe JSON" in links and "--quant-model" in links
    doc = json.loads(saved["recipe"].read_text())
    assert doc["quant_model_sha256"] == file_sha256(user)
    assert doc["tensor_quant_overrides"][first.tensor_name][0]["scale"] > 0  # the exact grid used
    out = tmp_path / "rebuilt.qdq.onnx"
    r = run_cli("quantize", "-f", FLOAT, "--quant-model", user, "--overrides", saved["recipe"], "-o", out)
    assert r.code == 0, r.stderr
    for a, b in zip(_outputs(out), _outputs(saved["model"]), strict=True):
        np.testing.assert_array_equal(a, b)
    # undone, the suggestion is listed again with what it measured beside what was predicted
    app.on_undo_clicked()
    again = next(c.children[1].value for c in app.suggestions_box.children if first.tensor_name in c.children[1].value)
    assert f"measured {gain.measured_db:+.1f} dB (predicted {gain.predicted_db:+.1f} dB)" in html_unescape(again)


def html_unescape(text: str) -> str:
    import html

    return html.unescape(text)


def test_download_of_a_model_qdebug_quantized_carries_its_ranges(tmp_path: Path, run_cli) -> None:
    dbg = QuantDebugger(FLOAT, data=CALIB, debug_options=OPTIONS, workdir=tmp_path / "session")
    try:
        app = DebuggerApp(dbg, export_path=tmp_path / "run" / "overrides.json")
        top = dbg.suggestions(top=1)[0].tensor_name
        app.promotion = [top]
        app.on_promote_clicked()
        assert len(dbg.history) == 1, app.fix_message.value
        assert "re-quantized from the same calibration ranges" in app.before_after.value
        saved = app.on_export_fix_clicked()
        doc = json.loads(saved["recipe"].read_text())
        assert "quant_model_sha256" not in doc
        entries = doc["tensor_quant_overrides"]
        assert entries[top][0]["quant_type"] == "QUInt16" and "rmin" in entries[top][0]
        assert sum("rmin" in es[0] for es in entries.values()) > 10  # every calibrated tensor's range
        out = tmp_path / "rebuilt.qdq.onnx"
        # synthetic calibration data: the ranges come from the recipe, so the model is the same
        r = run_cli("quantize", "-f", FLOAT, "--overrides", saved["recipe"], "-o", out, "--no-output-check")
        assert r.code == 0, r.stderr
        for a, b in zip(_outputs(out), _outputs(saved["model"]), strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        dbg.close()


def test_a_fix_applied_from_the_ui_is_measured_before_after_and_downloadable(tmp_path: Path) -> None:
    from qdebug.fix import FixOptions

    cfg = QuantConfig(weight_type="int8", per_channel=False, num_samples=32)  # per-tensor: the fix has work to do
    user = Path(quantize(FLOAT, CALIB, cfg, tmp_path / "user.qdq.onnx", check=False).model_path)
    dbg = QuantDebugger(FLOAT, user, data=CALIB, debug_options=OPTIONS, workdir=tmp_path / "session")
    try:
        app = DebuggerApp(dbg, export_path=tmp_path / "run" / "overrides.json")
        panel = app.fix_panel
        assert panel.apply_button.disabled  # nothing to apply before a fix
        panel.base_options = FixOptions(libraries=(), max_trials=8)
        result = panel.on_fix_clicked()
        assert result is not None and result.model_path is not None, panel.message.value
        assert not panel.apply_button.disabled
        theirs = dbg.report.min_output_sqnr_db
        assert panel.on_apply_clicked(), panel.message.value
        assert dbg.applied_fix and len(dbg.history) == 1
        gain = dbg.last_gain
        assert gain is not None and gain.before_db == theirs and gain.predicted_db is None
        shown = html_unescape(app.before_after.value)
        assert f"before: your model ({user.name})" in shown and "the Fix tab's fixed model" in shown
        assert f"this step: measured {gain.measured_db:+.1f} dB" in shown
        assert "fix applied to the debugger" in panel.message.value
        with pytest.raises(Exception, match=r"a fix is applied: .* undo it to promote"):
            dbg.promote([dbg.report.activations[0].tensor_name])
        saved = app.on_export_fix_clicked()
        assert saved["model"].read_bytes() == Path(result.model_path).read_bytes()
        assert json.loads(saved["recipe"].read_text())  # the fix's own recipe JSON
        app.on_undo_clicked()
        assert not dbg.applied_fix and dbg.report.min_output_sqnr_db == theirs
    finally:
        dbg.close()


def test_a_diagnostics_remedy_applied_from_the_ui_patches_your_model(tmp_path: Path, run_cli) -> None:
    import onnx
    from diag_models import per_channel_weight

    f, q = per_channel_weight()  # one int8 scale for a weight whose channel 0 is 1000× the others
    fp, qp = tmp_path / "mm.onnx", tmp_path / "mm.qdq.onnx"
    onnx.save(f, str(fp))
    onnx.save(q, str(qp))
    dbg = QuantDebugger(fp, qp, debug_options=OPTIONS, workdir=tmp_path / "session")
    try:
        app = DebuggerApp(dbg, export_path=tmp_path / "run" / "overrides.json")
        panel = app.report_panel
        panel.on_diagnose_clicked()
        offered = [d.remedy.kind.value for d in panel.remedies]
        assert "per_channel" in offered and not panel.apply_button.disabled
        panel.remedy_picker.value = offered.index("per_channel")
        theirs = dbg.report.min_output_sqnr_db
        assert panel.on_apply_remedy_clicked(), panel.remedy_message.value
        gain = dbg.last_gain
        assert gain is not None and gain.before_db == theirs and gain.measured_db is not None
        assert gain.after_db != gain.before_db  # measured (the worst output is channel 0's: not a gain to expect here)
        shown = html_unescape(app.before_after.value)
        assert "before: your model (mm.qdq.onnx)" in shown and "W: per-tensor" in shown and "per channel" in shown
        assert "applied: quantize W per channel" in html_unescape(panel.remedy_message.value)
        with pytest.raises(Exception, match="undo it to promote"):
            dbg.promote(["x"])
        saved = app.on_export_fix_clicked()
        doc = json.loads(saved["recipe"].read_text())
        assert doc["tensor_quant_overrides"]["W"] == [{"axis": 1}]
        out = tmp_path / "rebuilt.qdq.onnx"
        r = run_cli("quantize", "-f", fp, "--quant-model", qp, "--overrides", saved["recipe"], "-o", out)
        assert r.code == 0, r.stderr
        x = np.random.default_rng(1).uniform(0, 1, (4, 1, 8)).astype(np.float32)
        run = lambda p: [ort.InferenceSession(str(p)).run(None, {"x": xi})[0] for xi in x]  # noqa: E731
        for a, b in zip(run(out), run(saved["model"]), strict=True):
            np.testing.assert_array_equal(a, b)
        app.on_undo_clicked()
        assert dbg.report.min_output_sqnr_db == theirs
    finally:
        dbg.close()


def test_download_carries_the_qnn_compile_of_the_patched_model(tmp_path: Path) -> None:
    """A promotion of your model (16-bit pairs as ORT's com.microsoft Q/DQ) compiles for the HTP, and Download fixed
    model zips the EPContext model with the QDQ model and its recipe."""
    import os
    import zipfile

    from qdebug.targets.qnn_options import qnn_available

    ok, why = qnn_available()
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"onnxruntime-qnn unusable: {why} (CI=true: the QNN tests must run, not skip)")
        pytest.skip(f"onnxruntime-qnn unusable: {why}")
    cfg = QuantConfig(weight_type="int8", per_channel=True, num_samples=32)
    user = Path(quantize(FLOAT, CALIB, cfg, tmp_path / "user.qdq.onnx", check=False).model_path)
    dbg = QuantDebugger(FLOAT, user, data=CALIB, config=QuantConfig(target="qnn"), debug_options=OPTIONS,
                        workdir=tmp_path / "session")  # fmt: skip
    try:
        dbg.apply(dbg.promote([dbg.suggestions(1)[0].tensor_name]))
        assert dbg.changes is not None and dbg.changes.patches
        assert dbg.recompile("qnn").ok
        saved = dbg.export_fix(tmp_path / "out", "qnn")
        assert set(saved) == {"model", "recipe", "compiled"}
        names = zipfile.ZipFile(saved["compiled"]).namelist()
        assert any(n.endswith("_ctx.onnx") for n in names), names
    finally:
        dbg.close()
