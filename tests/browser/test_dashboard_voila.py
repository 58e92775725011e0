"""The Voila dashboard (``notebooks/dashboard.ipynb``) in Debian's chromium, the way a non-programmer uses it:
a 12 MB upload (above Tornado's default websocket message size) and one over the limit (a sentence), a bad file
(a message in the page, the session stays usable), then the bundled sample: Run, wait for the
heatmap and the table, select the worst tensor in the table, "Promote to 16-bit", read the before/after output
SQNR, export the overrides and load the exported file; closing the page releases its kernel and its folder. No
request leaves 127.0.0.1 (the ``page`` fixture fails the test otherwise). Screenshots go to
``test-output/screenshots/`` (the user guide, docs/ui.md, shows them)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from browser.conftest import assert_no_page_errors, checkout_env, free_port, notebook_copy, serve, start_voila
from qdebug.mixed.overrides import OverridesFile

pytestmark = pytest.mark.slow
#: Seconds a closed page's kernel may take to exit (and remove its folder): its shutdown request is immediate.
CLOSED_KERNEL_S = 5.0


_COMPARISON_FILLS = """() => {
  const fig = document.querySelector('.qd-app .qd-comparison .main-svg');
  const box = document.querySelector('.qd-app .qd-comparison')?.parentElement;
  return !!fig && !!box && box.clientWidth > 0 && +fig.getAttribute('width') >= 0.9 * box.clientWidth;
}"""


def _db(text: str) -> float:
    m = re.search(r"(-?\d+\.\d+) dB", text)
    assert m, f"no dB figure in {text!r}"
    return float(m.group(1))


def _big_model(path: Path) -> Path:
    """A valid 12.3 MB float model (one 1750×1750 MatMul): larger than Tornado's default websocket message."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1750, 1750)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1750])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1750])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    assert path.stat().st_size > 10.5 * 2**20
    return path


def _upload(page: Any, css: str, path: Path) -> None:
    """Choose ``path`` in a FileUpload (its file input is not in the page: the button opens the chooser)."""
    with page.expect_file_chooser() as chooser:
        page.locator(css).click()
    chooser.value.set_files(str(path))


def _kernels(server: Any) -> list[Any]:
    """The kernel processes the Voila server started (its children running ipykernel)."""
    import psutil

    try:
        kids = psutil.Process(server.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if "ipykernel" in " ".join(k.cmdline()):
                out.append(k)
        except psutil.Error:
            continue
    return out


def _until(done: Any, what: str, timeout_s: float = 60.0) -> None:
    """Poll a state (not a guessed duration) until it holds; fail naming it after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout_s:.0f} s: {what}")
        time.sleep(0.2)


def test_dashboard_debug_promote_export(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    nbdir = notebook_copy(tmp_path, "dashboard.ipynb")
    work = tmp_path / "work"
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model")
    port = free_port()
    env = {**checkout_env(tmp_path), "QDEBUG_DASHBOARD_WORKDIR": str(work), "QDEBUG_DASHBOARD_ROOT": str(tmp_path)}
    with serve(start_voila(nbdir / "dashboard.ipynb", port), port, cwd=nbdir, env=env):
        page.goto(f"http://127.0.0.1:{port}/")
        run = page.locator(".qd-dash-run")
        expect(run).to_be_visible()
        expect(page.get_by_text("from qdebug_widgets import Dashboard")).to_have_count(0)  # no code shown
        page.screenshot(path=str(screenshot_dir / "dashboard_form.png"))

        # Uploads above Tornado's default websocket message size (10 MiB) arrive; above the limit, a sentence.
        page.locator(".qd-dash-source button", has_text="upload").click()
        expect(page.locator(".qd-dash-upload")).to_be_visible()  # the form re-laid out for uploads
        data_choice = page.locator(".qd-dash-data-choice select")
        data_choice.select_option(label="synthetic (random inputs)")
        expect(data_choice).to_have_value("synthetic (random inputs)")
        _upload(page, ".qd-dash-upload", _big_model(tmp_path / "wide.onnx"))
        expect(page.locator(".qd-dash-info")).to_contain_text("'wide.onnx' received (12.")
        run.click()
        expect(page.locator(".qd-dash-ok")).to_contain_text("wide.onnx")
        junk = tmp_path / "huge.onnx"
        junk.write_bytes(b"\0" * 26_000_000)  # over the 25 MB limit
        _upload(page, ".qd-dash-upload", junk)
        expect(page.locator(".qd-dash-error")).to_contain_text("above the 25 MB upload limit")  # said at once
        run.click()
        expect(page.locator(".qd-dash-error")).to_contain_text("above the 25 MB upload limit")

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
        app.locator(".qd-sort select").select_option(label="local SQNR")
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
        app.get_by_role("tab", name="Before/after").click()  # its figure fills the tab, as the heatmap does
        page.wait_for_function(_COMPARISON_FILLS, timeout=30_000, polling=100)

        # Export: the file the CLI consumes exists and loads; the page offers it for download.
        app.locator(".qd-export").click()
        exported = app.locator(".qd-export-path")
        expect(exported).to_be_visible()
        expect(app.locator("a.qd-download")).to_have_attribute("href", re.compile("^data:application/json;base64,"))
        shown = exported.inner_text().strip()
        assert shown == "overrides.json" and str(work) not in app.inner_text()  # by name, not the server's folder
        # the file the link offers is the one written in the page's folder, byte for byte
        href = app.locator("a.qd-download").get_attribute("href") or ""
        found = list(work.rglob(shown))
        assert len(found) == 1, found
        path = found[0]
        assert path.is_file() and work in path.parents
        assert base64.b64decode(href.split(",", 1)[1]) == path.read_bytes()
        assert name in OverridesFile.load(path).tensors
    assert_no_page_errors(page_errors)


def test_closing_the_page_releases_its_kernel_and_folder(page: Any, tmp_path: Path) -> None:
    """Each page runs a kernel (hundreds of MB with a real model) and owns a folder; closing the page shuts its kernel
    down at once and the kernel's exit removes the folder: Voila's "beforeunload" shutdown carries the page's
    ``_xsrf`` cookie, which qdebug's voila.py makes the server set (without it every shutdown was refused with 403
    and the kernel stayed until the idle cull). The server here culls as the product does (after 10 min), so only
    the page's own shutdown can pass this test."""
    from playwright.sync_api import expect

    from qdebug.cli.dashboard import CULL_IDLE_S

    nbdir = notebook_copy(tmp_path, "dashboard.ipynb")
    work = tmp_path / "work"
    port = free_port()
    env = {**checkout_env(tmp_path), "QDEBUG_DASHBOARD_WORKDIR": str(work), "QDEBUG_DASHBOARD_ROOT": str(tmp_path)}
    cmd = start_voila(nbdir / "dashboard.ipynb", port, cull_idle_s=CULL_IDLE_S)
    with serve(cmd, port, cwd=nbdir, env=env) as server:
        page.goto(f"http://127.0.0.1:{port}/")
        expect(page.locator(".qd-dash-run")).to_be_visible()
        assert any(c["name"] == "_xsrf" for c in page.context.cookies()), "the page has no _xsrf cookie"
        folders = [p for p in work.iterdir() if p.name.startswith("qdebug-dashboard-")]
        assert len(folders) == 1 and len(_kernels(server)) == 1
        page.close(run_before_unload=True)
        _until(lambda: not _kernels(server), "the page's kernel shut down", timeout_s=CLOSED_KERNEL_S)
        _until(lambda: not folders[0].exists(), "the page's folder removed", timeout_s=CLOSED_KERNEL_S)
