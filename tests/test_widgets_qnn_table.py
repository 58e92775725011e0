"""The QNN compile on the dashboard's page (issue 38, 4): the HTP simulator's accuracy vs float and vs CPU-QDQ,
partitions and CPU nodes, for before and after a promotion on the same SoC, the before's figures being the compile
made before the step (no second compile or simulator run of it), and a before compiled again when after needed
another SoC. Needs onnxruntime-qnn (fails under CI=true without it)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLE_MODELS
from test_qnn_fixes import require_qnn

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions
from qdebug.quantizer import quantize
from qdebug.render.target_table import worst_db
from qdebug.targets.recompile import RecompileResult
from widgets.app import DebuggerApp
from widgets.session import QuantDebugger

FLOAT = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"


@pytest.fixture
def qnn_app(tmp_path: Path) -> Iterator[tuple[DebuggerApp, list[Any]]]:
    """The dashboard's debugger on your 8-bit QDQ model with target qnn; the list records each compile asked for."""
    require_qnn()
    cfg = QuantConfig(weight_type="int8", per_channel=True, num_samples=32)
    user = Path(quantize(FLOAT, CALIB, cfg, tmp_path / "user.qdq.onnx", check=False).model_path)
    dbg = QuantDebugger(FLOAT, user, data=CALIB, config=QuantConfig(target="qnn"),
                        debug_options=DebugOptions(num_samples=4), workdir=tmp_path / "session")  # fmt: skip
    calls: list[Any] = []
    real = dbg.recompile

    def counted(target: str, options: Any = None, step: int | None = None) -> RecompileResult:
        calls.append((target, None if options is None else options.soc, step))
        return real(target, options, step)

    dbg.recompile = counted  # type: ignore[method-assign]
    app = DebuggerApp(dbg, export_path=tmp_path / "run" / "overrides.json", target="qnn")
    try:
        yield app, calls
    finally:
        dbg.close()


def _cells(page: str, cls: str) -> list[str]:
    row = re.search(rf"<tr class='{cls}'>(.*?)</tr>", page)
    assert row is not None, f"no {cls} row in {page[:400]}"
    return [html.unescape(c) for c in re.findall(r"<td class='qd-col\d'>(.*?)</td>", row.group(1))]


def _db(v: float | None) -> str:
    assert v is not None
    return f"{v:.2f} dB"


def _promote(app: DebuggerApp) -> None:
    app.promotion = [app.debugger.suggestions(1)[0].tensor_name]
    app.on_promote_clicked()
    assert len(app.debugger.history) == 1, app.fix_message.value


def test_before_and_after_on_the_page_with_the_htp_accuracy(qnn_app: tuple[DebuggerApp, list[Any]]) -> None:
    app, calls = qnn_app
    app.compile_current()  # what Run does after debugging
    first = app.last_recompile
    assert first is not None and first.ok and first.target_accuracy is not None
    shown = app.compile_view.value
    assert _cells(shown, "qd-t-vs-float") == [_db(worst_db(first.target_accuracy, lambda o: o.target_vs_float_db))]
    _promote(app)
    after = app.last_recompile
    assert after is not None and after.ok and after.target_accuracy is not None
    page = app.before_after.value
    for res, col in ((first, 0), (after, 1)):
        acc = res.target_accuracy
        assert _cells(page, "qd-t-vs-float")[col] == _db(worst_db(acc, lambda o: o.target_vs_float_db))
        assert _cells(page, "qd-t-vs-cpu")[col] == _db(worst_db(acc, lambda o: o.target_vs_cpu_db))
        assert _cells(page, "qd-t-cpu-vs-float")[col] == _db(worst_db(acc, lambda o: o.cpu_vs_float_db))
        assert _cells(page, "qd-t-partitions")[col] == str(res.compile.accelerator_partitions)
        assert _cells(page, "qd-t-cpu")[col].split(" ")[0] == str(res.compile.cpu_nodes)
        assert _cells(page, "qd-t-samples")[col].startswith("4 (")  # before and after on the same samples
        assert _cells(page, "qd-t-diverge")[col].startswith(f"{len(acc.flagged)} of {len(acc.tensors)}")
    devices = _cells(page, "qd-t-device")
    assert devices[0] == devices[1] and "HTP v" in devices[0]
    assert "before and after were compiled for the same device" in page
    assert "compiled for qnn — the target here: onnxruntime-qnn" in page and "HTP" in page
    assert "<th>before: your model (user.qdq.onnx)</th><th>after</th>" in html.unescape(page)
    # the before column is the compile Run made: your model was compiled (and simulated) once
    assert [c[2] for c in calls] == [None, None] and app.compiled_by_step[("qnn", 0)] is first
    app.on_undo_clicked()
    assert app.last_recompile is first and "qd-t-vs-float" in app.compile_view.value


def test_before_is_compiled_again_when_after_needs_another_soc(qnn_app: tuple[DebuggerApp, list[Any]]) -> None:
    app, calls = qnn_app
    app.compile_current()
    first = app.last_recompile
    assert first is not None and first.soc is None  # the provider's default SoC
    app.compile_soc["qnn"] = "SM8650"  # as when a step's 16-bit weights move the compile to a newer SoC
    _promote(app)
    page = app.before_after.value
    devices = _cells(page, "qd-t-device")
    assert devices == ["qnn SM8650 (HTP v75)"] * 2, devices
    assert "same device: SM8650 (HTP v75)" in page
    assert "compiled again for SM8650 (HTP v75) (first compiled for default SoC (HTP v68))" in html.unescape(page)
    assert calls == [("qnn", None, None), ("qnn", "SM8650", None), ("qnn", "SM8650", 0)]
