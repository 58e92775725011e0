"""The graph view in Debian's chromium on a 301-tensor model (``builders.scoped_residual_mlp``, built here — no
corpus): the debugger served by Voila opens the graph as a few dozen groups; a click on a group expands it; a
click on a tensor selects exactly the tensor the hover named (the clicked-node bug of issue 15), for several
neighbouring tensors; the name search selects and expands."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from builders import scoped_residual_mlp

import qdebug
from browser.conftest import REPO, assert_no_page_errors, checkout_env, free_port, serve, start_voila
from widgets.notebook import debugger_notebook

pytestmark = pytest.mark.slow

#: The graph figure's traces, in order: edges, path, nodes, scale, selected (qdebug.render.graphview).
NODES = ".qd-graph .scatterlayer .trace:nth-of-type(3) .points path"


def _hover_name(page: Any, point: Any) -> str:
    point.hover(force=True)
    line = page.locator(".qd-graph .hoverlayer .hovertext tspan.line").first  # SVG: the first line is the name
    line.wait_for()
    return str(line.text_content()).strip()


def test_graph_click_selects_the_clicked_tensor(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    f, q, data = tmp_path / "scoped.onnx", tmp_path / "scoped.qdq.onnx", tmp_path / "calib.npz"
    onnx.save(scoped_residual_mlp(blocks=60, sigmoid_every=3), f)
    np.savez(data, x=np.random.default_rng(0).uniform(-1, 1, (4, 1, 8)).astype(np.float32))
    qdebug.quantize(f, data, None, q)
    nb = debugger_notebook(tmp_path / "graph.ipynb", f, q, data, tmp_path / "work", tab="Graph", import_root=REPO)
    port = free_port()
    env = checkout_env(tmp_path)  # qdebug's Voila template (as `qdebug dashboard` serves it) and this checkout
    with serve(start_voila(nb, port), port, cwd=tmp_path, env=env):
        # Voila answers once the notebook ran (quantize-free debug of 301 tensors): a loaded CI machine is slow.
        page.goto(f"http://127.0.0.1:{port}/", wait_until="commit")
        points = page.locator(NODES)
        expect(points.first).to_be_visible(timeout=240_000)
        groups = points.count()
        assert 10 <= groups <= 40  # 301 tensors open as a few dozen groups
        page.screenshot(path=str(screenshot_dir / "graph_groups_scoped.png"), full_page=True)

        # Expand the second group (the first node is the input x): more nodes are drawn.
        points.nth(1).click(force=True)
        expect(points.nth(groups)).to_be_attached()  # the new figure has more nodes than there were groups
        expanded = points.count()

        # Click neighbouring tensors: the inspector shows the tensor the hover named, each time.
        tensors = 0
        for i in range(expanded):
            name = _hover_name(page, points.nth(i))
            if not name.startswith("/model."):
                continue  # a group
            points.nth(i).click(force=True)
            expect(page.locator(".qd-inspector")).to_contain_text(name)
            tensors += 1
            if tensors == 3:
                break
        assert tensors == 3

        # Search by name: selects the tensor and expands its group.
        box = page.locator(".qd-graph-search input")
        box.fill("model.37/act")
        box.press("Enter")
        expect(page.locator(".qd-inspector")).to_contain_text("/model.37/act/Tanh_output_0")
        expect(page.locator(".qd-graph-note")).to_contain_text(re.compile(r"301 tensors in \d+ groups"))
        page.screenshot(path=str(screenshot_dir / "graph_expanded_scoped.png"), full_page=True)
    # A FigureWidget replaced (a redraw after a click) before its front end finished initialising logs this from
    # anywidget; the replacement renders and answers clicks (asserted above). Known, not yet fixed: see docs/ui.md.
    assert_no_page_errors(page_errors, allowed=[r"\[anywidget\] Failed to initialize model"])
