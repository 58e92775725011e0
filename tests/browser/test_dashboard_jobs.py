"""The dashboard's long jobs in Debian's chromium (issue 38): a promotion shows its progress (the step, the time so
far and an estimate of the time left) and a Cancel right under the Promote button while Run and every other control
that starts work are disabled; Cancel stops it within seconds, re-enables the controls, keeps the model shown and
leaves no file and no process behind; closing the page then releases its kernel and folder at once. The model is
built here, big enough (six 32-channel convolutions on 64×64) that a promotion takes several seconds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from browser.conftest import assert_no_page_errors, checkout_env, free_port, notebook_copy, serve, start_voila
from browser.test_dashboard_voila import CLOSED_KERNEL_S, _kernels, _until

pytestmark = pytest.mark.slow
#: Seconds a Cancel may take to stop a promotion (the engine checks between two samples).
CANCEL_S = 10.0


def _slow_model(path: Path, channels: int = 32, side: int = 160, depth: int = 8) -> Path:
    """A CNN whose debug pass takes seconds per promotion (64 samples), so a counted step outlasts the one second
    before the page shows its estimate of the time left, on an idle machine too (patching a promotion is fast)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(depth):
        w = rng.standard_normal((channels, channels, 3, 3)) * (1.5 / (3 * channels**0.5))
        weights.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        nodes += [
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    shape = [1, channels, side, side]
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], weights,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if "error.log" not in p.name}


def test_promote_shows_progress_by_its_button_and_cancel_stops_it(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    nbdir = notebook_copy(tmp_path, "dashboard.ipynb")
    work = tmp_path / "work"
    model = _slow_model(tmp_path / "slow.onnx")
    port = free_port()
    env = {**checkout_env(tmp_path), "QDEBUG_DASHBOARD_WORKDIR": str(work), "QDEBUG_DASHBOARD_ROOT": str(tmp_path)}
    with serve(start_voila(nbdir / "dashboard.ipynb", port), port, cwd=nbdir, env=env) as server:
        page.goto(f"http://127.0.0.1:{port}/")
        run = page.locator(".qd-dash-run")
        expect(run).to_be_visible()
        page.locator(".qd-dash-source button", has_text="file on the server").click()
        path_box = page.locator(".qd-dash-model-path input")
        path_box.fill(str(model))
        path_box.press("Enter")
        page.locator(".qd-dash-data-choice select").select_option(label="synthetic (random inputs)")
        run.click()
        expect(page.locator(".qd-dash-ok")).to_contain_text("worst output SQNR")
        app = page.locator(".qd-app")
        promote = app.locator(".qd-promote")
        expect(promote).to_be_enabled()  # the compile Run starts has ended
        expect(run).to_be_enabled()
        app.locator(".qd-row .qd-row-name").first.click()
        (folder,) = [p for p in work.iterdir() if p.name.startswith("qdebug-dashboard-")]
        before = _files(folder)

        promote.click()
        job = app.locator(".qd-promote-job")
        expect(job).to_be_visible()
        expect(job.locator(".qd-job-text")).to_contain_text("left")  # the step, its time and the time left
        for control in (promote, app.locator(".qd-undo"), app.locator(".qd-search"), run):
            expect(control).to_be_disabled()  # nothing can start a second job
        page.screenshot(path=str(screenshot_dir / "dashboard_promote_progress.png"), full_page=True)
        t0 = time.monotonic()
        job.locator(".qd-cancel").click()
        expect(app.locator(".qd-fix-message")).to_contain_text("cancelled: nothing changed", timeout=CANCEL_S * 1000)
        assert time.monotonic() - t0 < CANCEL_S
        expect(job).to_be_hidden()
        expect(promote).to_be_enabled()
        expect(run).to_be_enabled()
        page.screenshot(path=str(screenshot_dir / "dashboard_promote_cancelled.png"), full_page=True)
        assert _files(folder) == before  # nothing the cancelled promotion wrote is left
        (kernel,) = _kernels(server)
        assert not kernel.children(recursive=True)  # no worker left running
        assert_no_page_errors(page_errors)

        page.close(run_before_unload=True)
        _until(lambda: not _kernels(server), "the page's kernel shut down", timeout_s=CLOSED_KERNEL_S)
        _until(lambda: not folder.exists(), "the page's folder removed", timeout_s=CLOSED_KERNEL_S)
