"""The Voila dashboard (``notebooks/dashboard.ipynb``) in Debian's chromium, the way a non-programmer uses it:
a bad file first (a message in the page, the session stays usable), then the bundled sample: Run, wait for the
heatmap and the table, select the worst tensor in the table, "Promote to 16-bit", read the before/after output
SQNR, export the overrides and load the exported file. Screenshots go to ``test-output/screenshots/`` (the user
guide, docs/ui.md, shows them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from browser.conftest import assert_no_page_errors, free_port, notebook_copy, serve, server_env, start_voila
from qdebug.mixed.overrides import OverridesFile

pytestmark = pytest.mark.slow


def _db(text: str) -> float:
    m = re.search(r"(-?\d+\.\d+) dB", text)
    assert m, f"no dB figure in {text!r}"
    return float(m.group(1))


def test_dashboard_debug_promote_export(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    nbdir = notebook_copy(tmp_path, "dashboard.ipynb")
    work = tmp_path / "work"
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model")
    port = free_port()
    env = {**server_env(tmp_path), "QDEBUG_DASHBOARD_WORKDIR": str(work), "QDEBUG_DASHBOARD_ROOT": str(tmp_path)}
    with serve(start_voila(nbdir / "dashboard.ipynb", port), port, cwd=nbdir, env=env):
        page.goto(f"http://127.0.0.1:{port}/")
        run = page.locator(".qd-dash-run")
        expect(run).to_be_visible()
        expect(page.get_by_text("from qdebug_widgets import Dashboard")).to_have_count(0)  # no code shown
        page.screenshot(path=str(screenshot_dir / "dashboard_form.png"))

        # A file that is not ONNX: a sentence in the page, no traceback, the form stays usable.
        page.locator(".qd-dash-source button", has_text="file on the server").click()
        path_box = page.locator(".qd-dash-model-path input")
        path_box.fill(str(bad))
        path_box.press("Enter")
        page.locator(".qd-dash-data-choice select").select_option(label="synthetic (random inputs)")
        run.click()
        error = page.locator(".qd-dash-error")
        expect(error).to_contain_text("not a valid ONNX file")
        expect(page.get_by_text("Traceback")).to_have_count(0)

        # The bundled sample, its calibration data, the CPU target.
        page.locator(".qd-dash-source button", has_text="bundled sample").click()
        expect(page.locator(".qd-dash-sample select")).to_have_value(re.compile(".+"))
        page.locator(".qd-dash-data-choice select").select_option(label="the sample's calibration data")
        run.click()
        expect(page.locator(".qd-dash-ok")).to_contain_text("worst output SQNR")
        app = page.locator(".qd-app")
        expect(app.locator(".qd-table .qd-row").first).to_be_visible()
        app.get_by_role("tab", name="Heatmap").click()
        heat = app.locator(".qd-heatmap .js-plotly-plot, .qd-heatmap.js-plotly-plot").first
        expect(heat).to_be_visible()
        expect(heat.locator(".hm image, .heatmaplayer image").first).to_be_attached()
        page.screenshot(path=str(screenshot_dir / "dashboard_heatmap.png"), full_page=True)
        app.get_by_role("tab", name="Graph").click()
        expect(app.locator(".qd-graph .js-plotly-plot, .qd-graph.js-plotly-plot").first).to_be_visible()
        page.screenshot(path=str(screenshot_dir / "dashboard_graph.png"), full_page=True)

        # Select the tensor with the worst own rounding in the table, promote it.
        app.get_by_role("tab", name="Tensors").click()
        app.locator(".qd-sort select").select_option(label="local_sqnr_db")
        expect(app.locator(".qd-table.qd-sort-local_sqnr_db")).to_be_visible()  # the re-sorted rows are shown
        first = app.locator(".qd-row .qd-row-name").first
        name = first.get_attribute("title")
        assert name
        first.click()
        expect(app.locator(".qd-inspector")).to_contain_text(name)
        page.screenshot(path=str(screenshot_dir / "dashboard_table.png"), full_page=True)
        app.locator(".qd-promote").click()
        before = app.locator(".qd-before-after .qd-before").first
        after = app.locator(".qd-before-after .qd-after").first
        expect(after).to_contain_text("dB")
        assert _db(before.inner_text()) != _db(after.inner_text())
        expect(app.locator(".qd-status")).to_contain_text("cpu: ok")
        page.screenshot(path=str(screenshot_dir / "dashboard_after_promote.png"), full_page=True)

        # Export: the file the CLI consumes exists and loads; the page offers it for download.
        app.locator(".qd-export").click()
        exported = app.locator(".qd-export-path")
        expect(exported).to_be_visible()
        expect(app.locator("a.qd-download")).to_have_attribute("href", re.compile("^data:application/json;base64,"))
        path = Path(exported.inner_text().strip())
        assert path.is_file() and work in path.parents
        assert name in OverridesFile.load(path).tensors
    assert_no_page_errors(page_errors)
