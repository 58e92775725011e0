"""The QNN compile on the dashboard's page (issue 38, 4), in Debian's chromium: your 8-bit QDQ model and its float
model typed as files on the server, target qnn, Run; the compile table under the target picker has the HTP
simulator's accuracy vs float and vs CPU-QDQ, partitions and CPU nodes; a promotion's before/after puts the compile
before the step beside the one after, on the same SoC. Needs onnxruntime-qnn (fails under CI=true without it).
Screenshot: ``test-output/screenshots/dashboard_qnn.png``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from browser.conftest import (
    assert_no_page_errors,
    dashboard_on_your_model,
)

pytestmark = pytest.mark.slow
DB = re.compile(r"^-?\d+\.\d\d dB$")


def test_qnn_table_before_and_after_on_one_soc(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect
    from test_qnn_fixes import require_qnn

    require_qnn()
    with dashboard_on_your_model(page, tmp_path):
        page.locator(".qd-dash-target select").select_option(label="qnn")
        page.locator(".qd-dash-run").click()
        expect(page.locator(".qd-dash-ok")).to_contain_text("worst output SQNR")
        app = page.locator(".qd-app")
        run_table = app.locator(".qd-compile-box .qd-target-table")
        expect(run_table).to_be_visible()  # Run's compile, under the target picker
        expect(run_table.locator(".qd-t-device td")).to_contain_text("HTP v")
        for cls in ("qd-t-vs-float", "qd-t-vs-cpu", "qd-t-cpu-vs-float"):
            assert DB.match(run_table.locator(f".{cls} td").inner_text()), cls
        app.locator(".qd-suggestion input").first.check()
        app.locator(".qd-promote").click()
        table = app.locator(".qd-before-after-box .qd-target-table")
        expect(table).to_be_visible()
        expect(table.locator("th").nth(1)).to_contain_text("before: your model (mine.qdq.onnx)")
        for cls in ("qd-t-vs-float", "qd-t-vs-cpu", "qd-t-cpu-vs-float"):
            cells = table.locator(f".{cls} td").all_inner_texts()
            assert len(cells) == 2 and all(DB.match(c) for c in cells), (cls, cells)
        partitions = table.locator(".qd-t-partitions td").all_inner_texts()
        assert len(partitions) == 2 and all(p.isdigit() for p in partitions), partitions
        cpu = table.locator(".qd-t-cpu td").all_inner_texts()
        assert len(cpu) == 2 and all(c.split(" ")[0].isdigit() for c in cpu), cpu
        devices = table.locator(".qd-t-device td").all_inner_texts()
        assert len(devices) == 2 and devices[0] == devices[1], devices
        expect(app.locator(".qd-target-device")).to_contain_text("before and after were compiled for the same device")
        table.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshot_dir / "dashboard_qnn.png"), full_page=True)
    assert_no_page_errors(page_errors)
