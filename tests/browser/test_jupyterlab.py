"""The quickstart notebook in a real JupyterLab in Debian's chromium: open it, run every cell, and check that the
``DebuggerApp`` renders — its table, and its plotly ``FigureWidget``s (no "Loading widget..." left)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from browser.conftest import (
    assert_no_page_errors,
    checkout_env,
    free_port,
    notebook_copy,
    serve,
    start_jupyterlab,
)

pytestmark = pytest.mark.slow

#: True once the current widget is ``quickstart.ipynb`` with its context loaded, a session with a kernel, that
#: kernel's info received, and the kernel idle. Running "run all" before that silently runs nothing (measured).
#: ``kernel.info`` is a promise: it is chained here (never awaited inside ``evaluate``, which has no timeout).
NOTEBOOK_READY_JS = """
(path) => {
  const app = window.jupyterapp;
  const w = app && app.shell && app.shell.currentWidget;
  if (!w || !w.context || w.context.path !== path || !w.context.isReady || !w.sessionContext) return false;
  const sc = w.sessionContext;
  const kernel = sc.session && sc.session.kernel;
  if (!kernel) return false;
  if (window.__qdKernel !== kernel.id) {
    window.__qdKernel = kernel.id;
    window.__qdKernelInfo = false;
    kernel.info.then(() => { if (window.__qdKernel === kernel.id) window.__qdKernelInfo = true; },
                     () => { window.__qdKernel = null; });
  }
  return window.__qdKernelInfo === true && kernel.status === "idle" && kernel.connectionStatus === "connected";
}
"""

#: Start "run all cells" without waiting for it (the page is then polled for the results).
RUN_ALL_JS = "() => { void window.jupyterapp.commands.execute('notebook:run-all-cells'); }"

#: True once no cell is queued or running ("[*]" prompt) and every code cell has an execution count.
ALL_EXECUTED_JS = """
() => {
  const w = window.jupyterapp.shell.currentWidget;
  const cells = w.content.widgets.filter((c) => c.model.type === "code");
  return cells.length > 0 && cells.every((c) => typeof c.model.executionCount === "number")
    && w.sessionContext.session.kernel.status === "idle";
}
"""


def test_quickstart_runs_and_renders_in_jupyterlab(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    nbdir = notebook_copy(tmp_path, "quickstart.ipynb")
    port = free_port()
    cmd = start_jupyterlab(nbdir, port, tmp_path / "lab-settings")
    with serve(cmd, port, cwd=nbdir, env=checkout_env(tmp_path)):
        page.goto(f"http://127.0.0.1:{port}/lab/tree/quickstart.ipynb")
        page.wait_for_function(NOTEBOOK_READY_JS, arg="quickstart.ipynb", polling=200)
        page.evaluate(RUN_ALL_JS)
        page.wait_for_function(ALL_EXECUTED_JS, polling=250)

        # No cell failed (stderr may carry native libraries' notices, e.g. onnxruntime-qnn's, but no traceback).
        assert page.locator("[data-mime-type='application/vnd.jupyter.error']").count() == 0
        stderr = page.locator("[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        assert not any("Traceback" in t or "Error" in t for t in stderr), stderr

        app = page.locator(".qd-app")
        expect(app).to_have_count(1)
        app.scroll_into_view_if_needed()
        expect(app).to_be_visible()
        expect(app.locator(".qd-table")).to_be_visible()
        expect(app.locator(".qd-table")).to_contain_text("/stem/stem.0/Conv_output_0")  # a tensor of digits_cnn
        expect(page.get_by_text("Loading widget...")).to_have_count(0)

        # The heatmap tab holds a plotly FigureWidget: it renders (an SVG with the heatmap's bitmap) when shown.
        app.get_by_role("tab", name="Heatmap").click()
        plot = app.locator(".js-plotly-plot").first
        expect(plot).to_be_visible()
        expect(plot.locator(".main-svg").first).to_be_visible()
        expect(plot.locator("g.hm image, .heatmaplayer image").first).to_be_attached()
        expect(page.get_by_text("Loading widget...")).to_have_count(0)

        app.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshot_dir / "jupyterlab_quickstart.png"))
        app.screenshot(path=str(screenshot_dir / "jupyterlab_quickstart_app.png"))
    assert_no_page_errors(page_errors)
