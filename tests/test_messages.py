"""What the user reads when something is wrong (issue 38): a float/quant pair given the other way round is said to
look swapped by the engine, so the CLI, the fix and the dashboard all say it; the dashboard names uploaded files by
their names (never the server's temporary folders) and no library's raw words (protobuf's DecodeError); its progress
line does not keep the last step's words beside an empty bar after an error; the target menu never cuts a reason."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from conftest import SAMPLE_MODELS

from qdebug.errors import InputFileError, ModelError
from qdebug.model_io import load_model
from qdebug.pairing import SWAPPED_PAIR, check_not_swapped
from widgets.dashboard import Dashboard
from widgets.status import hide_paths, user_text


def _upload(name: str, content: bytes) -> tuple[dict[str, object], ...]:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return ({"name": name, "type": "", "size": len(content), "content": memoryview(content), "last_modified": when},)


def test_a_swapped_pair_is_said_by_the_engine(tiny_float: Path, tiny_quant, tmp_path: Path) -> None:
    from qdebug.fix.engine import fix
    from qdebug.mixed.session import MixedPrecisionSession

    q = tiny_quant("u8")
    check_not_swapped(load_model(tiny_float), q)  # the right way round: nothing to say
    with pytest.raises(ModelError, match="look swapped"):
        check_not_swapped(load_model(q), tiny_float)
    with pytest.raises(ModelError, match="look swapped"):  # the dashboard's session (a given quantized model)
        MixedPrecisionSession(q, None, quant_model=tiny_float, workdir=tmp_path / "s")
    with pytest.raises(ModelError, match="look swapped"):  # qdebug fix -q: before quantizing a QDQ model
        fix(q, None, quant_model=tiny_float, workdir=tmp_path / "f")
    assert not (tmp_path / "f").exists() or not any((tmp_path / "f").iterdir())


def test_a_corrupt_model_is_said_without_protobufs_words(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\xff\xff\xff garbage \x00" * 10)
    with pytest.raises(InputFileError) as info:
        load_model(bad, "float model")
    text = str(info.value)
    assert str(bad) in text and "not a valid ONNX file" in text
    assert "DecodeError" not in text and "Wire format" not in text and "ModelProto" not in text


def test_paths_in_the_pages_folders_are_file_names(tmp_path: Path) -> None:
    work = tmp_path / "qdebug-dashboard-x"
    text = f"quantized model {work}/run1/uploads/m.onnx: bad; also {work} and {tmp_path}/mine.onnx"
    assert hide_paths(text, [work]) == f"quantized model m.onnx: bad; also this page's folder and {tmp_path}/mine.onnx"
    said = user_text(ValueError(f"x in {work}/run2/a.npz"), [work])
    assert said.startswith("Unexpected error (ValueError: x in a.npz)") and str(work) not in said


def test_the_dashboard_says_errors_plainly_and_clears_its_progress(tmp_path: Path) -> None:
    dash = Dashboard(root=SAMPLE_MODELS, workdir=tmp_path / "work", debug_samples=4)
    dash.source.value = "upload"
    dash.data_choice.value = "synthetic"
    # the quantized model uploaded as the float one and the other way round
    qdq = dash.workdir / "given.qdq.onnx"
    from qdebug.quantizer import quantize

    quantize(SAMPLE_MODELS / "digits_cnn.onnx", None, None, qdq)
    dash.model_upload.value = _upload("mine.qdq.onnx", qdq.read_bytes())
    dash.quant_upload.value = _upload("mine.onnx", (SAMPLE_MODELS / "digits_cnn.onnx").read_bytes())
    dash.run_button.click()
    assert SWAPPED_PAIR.split(":")[0] in dash.message.value and dash.app is None
    assert dash.progress_text.value == "" and dash.progress.value == 0  # no stale step beside an empty bar
    # a corrupt upload: its name, not the server's folder; not protobuf's words
    dash.quant_upload.value = _upload("broken.onnx", b"\x08\xff\xff\xff garbage")
    dash.model_upload.value = _upload("mine.onnx", (SAMPLE_MODELS / "digits_cnn.onnx").read_bytes())
    dash.run_button.click()
    message = dash.message.value
    assert "quantized model broken.onnx: not a valid ONNX file" in message, message
    assert str(dash.workdir) not in message and "DecodeError" not in message
    assert dash.progress_text.value == ""


def test_the_target_menu_never_cuts_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from widgets.session import QuantDebugger

    reason = "needs the optional package 'onnxruntime-qnn' (pip install 'qdebug[qnn]'), which is not installed here"
    real = QuantDebugger.available_targets

    def targets() -> dict[str, tuple[bool, str]]:
        return {**real(), "qnn": (False, reason)}

    monkeypatch.setattr(QuantDebugger, "available_targets", staticmethod(targets))
    dash = Dashboard(root=SAMPLE_MODELS, workdir=tmp_path / "work")
    assert ("qnn (unavailable)", "qnn") in dash.target_picker.options
    assert dash.target_note.value == ""
    dash.target_picker.value = "qnn"
    import html

    assert html.escape(reason) in dash.target_note.value


def test_the_debuggers_messages_in_the_dashboard_hide_the_pages_folder(tmp_path: Path) -> None:
    dash = Dashboard(root=SAMPLE_MODELS, workdir=tmp_path / "work", debug_samples=4)
    dash.sample_picker.value = "digits_cnn"
    dash.run_button.click()
    app = dash.app
    assert app is not None and app.hidden_folders == (dash.workdir,)
    app.export_button.click()  # "overrides written to <path in the page's folder>"
    assert "overrides written to overrides.json" in app.fix_message.value
    assert str(dash.workdir) not in app.fix_message.value and str(dash.workdir) not in app.status_line.value


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"PK\x03\x04" + bytes(range(200)), "not a zip archive, or a damaged one"),  # a damaged zip
        (bytes(range(256)) * 2, "not an .npz file"),  # neither zip nor .npy
    ],
)
def test_an_unreadable_npz_is_said_in_words_not_zipfile_s(tmp_path: Path, content: bytes, says: str) -> None:
    """numpy's and zipfile's own words ('File is not a zip file', 'Bad CRC-32') never reach the user."""
    from qdebug.data import NpzData
    from qdebug.model_io import input_specs

    bad = tmp_path / "data.npz"
    bad.write_bytes(content)
    with pytest.raises(InputFileError) as info:
        NpzData(bad, input_specs(load_model(SAMPLE_MODELS / "digits_cnn.onnx")))
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and says in message, message
    assert "File is not a zip file" not in message and "CRC" not in message, message
