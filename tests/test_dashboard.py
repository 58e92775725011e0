"""The Voila dashboard's form (``widgets.dashboard.Dashboard``) driven from Python without a browser: every way
of choosing a model and data, the target list, and bad input becoming a message in the page (never a traceback)
while the form stays usable. Real models through real ONNX Runtime."""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_MODELS, sha256

from qdebug.mixed.overrides import OverridesFile
from widgets.app import DebuggerApp
from widgets.dashboard import MAX_UPLOAD_MB, Dashboard


def _upload(name: str, content: bytes) -> tuple[dict[str, object], ...]:
    """What ipywidgets' FileUpload holds after the browser sent one file."""
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return ({"name": name, "type": "", "size": len(content), "content": memoryview(content), "last_modified": when},)


@pytest.fixture
def dash(tmp_path: Path) -> Dashboard:
    return Dashboard(root=SAMPLE_MODELS, workdir=tmp_path / "work", debug_samples=16)


def test_sample_run_promote_export(dash: Dashboard) -> None:
    assert dash.source.value == "sample" and "digits_cnn" in dash.sample_picker.options
    assert [v for _, v in dash.target_picker.options][:1] == ["cpu"]
    assert dash.precision_picker.options == ("uint8", "int8", "uint16")
    dash.sample_picker.value = "digits_cnn"
    dash.run_button.click()
    assert "qd-dash-ok" in dash.message.value and "worst output SQNR" in dash.message.value
    app = dash.app
    assert isinstance(app, DebuggerApp) and dash.app_box.children == (app,)
    before = dash.debugger.report.min_output_sqnr_db
    app.sort_key = "local_sqnr_db"  # worst own rounding first: what a user promotes
    app.table.children[1].children[1].click()  # select the first row
    assert app.selected == app.table_names()[0]
    app.promote_button.click()
    assert dash.debugger.report.min_output_sqnr_db != before
    assert "top-1 accuracy" in app.before_after.value  # the sample has labels
    app.export_button.click()
    exported = dash.workdir / "run1" / "overrides.json"
    assert OverridesFile.load(exported).tensors


def test_target_changes_precisions(dash: Dashboard) -> None:
    dash.target_picker.value = "deeploy"
    assert dash.precision_picker.options == ("int8",)
    dash.target_picker.value = "qnn"
    assert "uint16" in dash.precision_picker.options


def test_server_file_browser_and_synthetic_data(dash: Dashboard, tmp_path: Path) -> None:
    dash.source.value = "server"
    assert dash.model_browser in dash.model_panel.children
    assert [v for _, v in dash.data_choice.options] == ["synthetic", "server", "upload"]  # no sample data here
    listing = dict(dash.model_browser.listing.options)
    assert "digits_cnn.onnx" in listing and not any(k.endswith(".npz") for k in listing)
    dash.model_browser.listing.value = listing["digits_transformer.onnx"]
    assert dash.model_browser.path.endswith("digits_transformer.onnx")
    assert not any(k.startswith("⬆") for k, _ in dash.model_browser.listing.options)  # never above the root
    dash.model_browser.show_dir(SAMPLE_MODELS.parent)  # asked to list above it: lists the root
    assert dash.model_browser.cwd == SAMPLE_MODELS.resolve()
    dash.data_choice.value = "synthetic"
    dash.run_button.click()
    assert "qd-dash-ok" in dash.message.value, dash.message.value
    assert dash.debugger.report.min_output_sqnr_db is not None


def test_bad_inputs_are_messages_and_the_form_stays_usable(tmp_path: Path) -> None:
    (tmp_path / "digits_cnn.onnx").write_bytes((SAMPLE_MODELS / "digits_cnn.onnx").read_bytes())
    dash = Dashboard(root=tmp_path, workdir=tmp_path / "work", debug_samples=16)
    dash.source.value = "server"
    dash.run_button.click()
    assert "choose a float model" in dash.message.value and dash.app is None
    notes = tmp_path / "notes.onnx"
    notes.write_text("not a model")
    before = sha256(notes)
    dash.model_browser.path = str(notes)
    dash.data_choice.value = "synthetic"
    dash.run_button.click()
    assert "qd-dash-error" in dash.message.value and "not a valid ONNX file" in dash.message.value
    assert "Traceback" not in dash.message.value and sha256(notes) == before
    # data that does not fit the model: the engine's DataError, as a sentence
    bad = tmp_path / "bad.npz"
    np.savez(bad, wrong_name=np.zeros((1, 1, 8, 8), np.float32))
    dash.model_browser.path = str(tmp_path / "digits_cnn.onnx")
    dash.data_choice.value = "server"
    dash.data_path.value = str(bad)
    dash.run_button.click()
    assert "qd-dash-error" in dash.message.value and "wrong_name" in dash.message.value
    # uploads: a non-ONNX file, an oversized one, then a good one — same form, no restart
    dash.source.value = "upload"
    dash.data_choice.value = "synthetic"
    dash.run_button.click()
    assert "upload a float model" in dash.message.value
    dash.model_upload.value = _upload("model.onnx", b"\x00garbage")
    dash.run_button.click()
    assert "not a valid ONNX file" in dash.message.value
    dash.model_upload.value = _upload("notes.txt", b"hello")
    dash.run_button.click()
    assert "is not a .onnx file" in dash.message.value
    big = b"\0" * int(MAX_UPLOAD_MB * 1e6 + 1)
    dash.model_upload.value = _upload("big.onnx", big)
    assert "qd-dash-error" in dash.message.value and "upload limit" in dash.message.value  # said on arrival
    dash.run_button.click()
    assert "upload limit" in dash.message.value
    assert not any(p.name == "big.onnx" for p in dash.workdir.rglob("*"))  # nothing written for a refused upload
    dash.model_upload.value = _upload("cnn.onnx", (SAMPLE_MODELS / "digits_cnn.onnx").read_bytes())
    dash.run_button.click()
    assert "qd-dash-ok" in dash.message.value, dash.message.value
    stored = [p for p in dash.workdir.rglob("cnn.onnx")]
    assert len(stored) == 1 and not list(dash.workdir.rglob("*.tmp*"))


def test_unexpected_error_is_logged_not_shown(dash: Dashboard, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr("widgets.session.QuantDebugger.__init__", boom)
    dash.run_button.click()
    assert "Unexpected error (RuntimeError: kaboom)" in dash.message.value
    (log,) = dash.workdir.rglob("error.log")
    assert "Traceback" in log.read_text() and "Traceback" not in dash.message.value
    assert not dash.run_button.disabled


def test_deeploy_target_folds_batchnorm_into_a_copy(dash: Dashboard) -> None:
    original = sha256(SAMPLE_MODELS / "digits_cnn.onnx")
    dash.sample_picker.value = "digits_cnn"
    dash.target_picker.value = "deeploy"
    dash.run_button.click()
    assert "qd-dash-ok" in dash.message.value, dash.message.value
    assert dash.debugger.float_model.name == "digits_cnn.deeploy.onnx"  # the target's fixes, in a copy
    import onnx

    assert not [n for n in onnx.load(str(dash.debugger.float_model)).graph.node if n.op_type == "BatchNormalization"]
    assert dash.app.target == "deeploy"
    assert all(a.quant_type in (None, "int8") for a in dash.debugger.report.activations)
    assert sha256(SAMPLE_MODELS / "digits_cnn.onnx") == original


def test_a_model_the_engine_rejects_is_a_message(dash: Dashboard) -> None:
    """A quantized model that is not the float model's counterpart: the engine's ModelError, in the page."""
    dash.source.value = "server"
    dash.model_browser.path = str(SAMPLE_MODELS / "digits_cnn.onnx")
    dash.quant_path.value = str(SAMPLE_MODELS / "digits_transformer.onnx")
    dash.data_choice.value = "synthetic"
    dash.run_button.click()
    assert "qd-dash-error" in dash.message.value and "Could not debug this model" in dash.message.value
    assert dash.app is None


def test_the_root_confines_typed_paths(tmp_path: Path) -> None:
    """``QDEBUG_DASHBOARD_ROOT`` is a boundary, not a starting point: ``..``, absolute paths elsewhere and symbolic
    links out of it are refused with a sentence naming the folder."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "cnn.onnx").write_bytes((SAMPLE_MODELS / "digits_cnn.onnx").read_bytes())
    (root / "escape.onnx").symlink_to(SAMPLE_MODELS / "digits_cnn.onnx")
    d = Dashboard(root=root, workdir=tmp_path / "work", debug_samples=8)
    d.source.value = "server"
    d.data_choice.value = "synthetic"
    for typed in ("../elsewhere.onnx", str(SAMPLE_MODELS / "digits_cnn.onnx"), "escape.onnx"):
        d.model_browser.path = typed
        d.run_button.click()
        assert "qd-dash-error" in d.message.value and "outside the dashboard" in d.message.value, typed
        assert str(root) in d.message.value and d.app is None
    d.model_browser.path = "cnn.onnx"  # relative to the root
    d.quant_path.value = "../x.qdq.onnx"
    d.run_button.click()
    assert "the quantized model" in d.message.value and "outside the dashboard" in d.message.value
    d.quant_path.value = ""
    d.data_choice.value = "server"
    d.data_path.value = str(SAMPLE_MODELS / "digits_calib.npz")
    d.run_button.click()
    assert "the data file" in d.message.value and "outside the dashboard" in d.message.value


def test_a_page_folder_is_removed_when_its_kernel_exits(tmp_path: Path) -> None:
    """Each page gets its own folder under ``QDEBUG_DASHBOARD_WORKDIR``; the kernel's exit (Voila shuts it down
    when the page closes, or culls it) removes it: nothing accumulates."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    code = (
        "from widgets.dashboard import Dashboard; d = Dashboard(debug_samples=4); "
        "(d.workdir / 'run1').mkdir(); (d.workdir / 'run1' / 'x.onnx').write_bytes(b'x'); print(d.workdir)"
    )
    env = {**os.environ, "QDEBUG_DASHBOARD_WORKDIR": str(tmp_path / "work"), "QDEBUG_DASHBOARD_ROOT": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    page = Path(out.stdout.strip().splitlines()[-1])
    assert page.parent == tmp_path / "work" and page.name.startswith("qdebug-dashboard-")
    assert not page.exists() and (tmp_path / "work").is_dir()


def test_run_gives_a_verdict_and_compiles_for_the_target(dash: Dashboard) -> None:
    dash.sample_picker.value = "digits_cnn"
    dash.run_button.click()
    out = dash.debugger.report.min_output_sqnr_db
    kind = "poor" if out < 20 else ("fair" if out <= 40 else "good")
    assert f"qd-verdict-{kind}" in dash.message.value and f"{kind} —" in dash.message.value
    assert "qd-compile" in dash.app.compile_view.value and "cpu" in dash.app.compile_view.value
    assert dash.app.last_recompile is not None and dash.app.last_recompile.ok


def test_qnn_run_searches_the_fixed_model_and_says_so(dash: Dashboard) -> None:
    """The dashboard applies the target's fixes before debugging (as `qdebug build` and `qdebug search --target` do):
    its search tab searches that model, the summary names the fixes, and the exported overrides record them so that
    `qdebug build --target qnn --overrides` on the user's file checks them after its own fixes."""
    from test_qnn_fixes import require_qnn

    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    dash.sample_picker.value = "digits_cnn"
    dash.target_picker.value = "qnn"
    dash.run_button.click()
    assert "qd-dash-ok" in dash.message.value, dash.message.value
    fixes = dash.debugger.session.target_fixes
    assert fixes is not None and fixes.target == "qnn" and "batchnorm_folding" in fixes.changed
    assert fixes.given_sha256 == sha256(SAMPLE_MODELS / "digits_cnn.onnx")
    app = dash.app
    assert app is not None
    app.compile_front_box.value = False
    app.goal_db.value = (dash.debugger.report.min_output_sqnr_db or 0.0) + 0.3
    app.on_search_clicked()
    assert app.last_search is not None and app.last_search.target_fixes == fixes
    summary = html.unescape(app.search_summary.value)
    assert "searched the model after qnn's compatibility fixes (" in summary and "batchnorm_folding" in summary
    app.on_pareto_point(app.last_search.pareto()[-1].step)  # a promotion to export
    app.export_button.click()
    exported = OverridesFile.load(dash.workdir / "run1" / "overrides.json")
    assert exported.target_fixes == ("qnn", fixes.changed) and exported.model_sha256 == fixes.given_sha256


def test_sigterm_stops_qdebug_dashboard_with_143_and_nothing_left(tmp_path: Path) -> None:
    """``kill`` (SIGTERM) on ``qdebug dashboard``: Voila and its kernels stop, the exit code is 143 with one line
    (not Ctrl-C's 130), and nothing is left in TMPDIR (Voila's connection folder, qdebug's runtime folder)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "qdebug", "dashboard", "--port", str(port), "--root", str(tmp_path)]
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _refused(port):
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the dashboard did not listen within 120 s"
            time.sleep(0.1)  # polling a port, not waiting for a guessed duration
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = [line for line in err.decode().splitlines() if line.startswith("qdebug:")]
    assert (proc.returncode, lines) == (143, ["qdebug: terminated"]), err.decode()[-2000:]
    assert sorted(p.name for p in tmp.iterdir()) == []


def _refused(port: int) -> bool:
    """Nothing accepts a connection on 127.0.0.1:``port`` (yet)."""
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_your_own_qdq_model_disables_the_precision_picker(dash: Dashboard) -> None:
    """A quantized model of the user's brings its own grids: the precision picker is disabled and says so."""
    dash.source.value = "server"
    assert not dash.precision_picker.disabled and dash.precision_note.value == ""
    dash.quant_path.value = "digits_cnn.qdq.onnx"
    assert dash.precision_picker.disabled and "your model's own grids" in dash.precision_note.value
    dash.source.value = "sample"  # the quantized path is the server's field: not given with a sample
    assert not dash.precision_picker.disabled and dash.precision_note.value == ""
    dash.source.value = "server"
    dash.quant_path.value = " "
    assert not dash.precision_picker.disabled
