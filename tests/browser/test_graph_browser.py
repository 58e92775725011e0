"""The graph view and the heatmap in Debian's chromium on a 301-tensor model (``builders.scoped_residual_mlp``, built
here — no corpus): the debugger served by Voila opens the graph as a few dozen groups; a click on a group expands
it; a click on a tensor selects exactly the tensor the hover named (the clicked-node bug of issue 15), for several
neighbouring tensors; the name search selects and expands. The heatmap fills its container's width when its tab
opens and after every redraw in the shown tab (it used to stay at plotly's default 700 px: widgets/resize.py)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
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

#: The graph figure's traces, in order: edges, path, nodes, scale, selected (qdebug.render.graph_view).
NODES = ".qd-graph .scatterlayer .trace:nth-of-type(3) .points path"


def _hover_name(page: Any, point: Any) -> str:
    line = page.locator(".qd-graph .hoverlayer .hovertext tspan.line").first  # SVG: the first line is the name
    page.mouse.move(0, 0)  # the last point's label goes first: a label read at once could still be that one's
    with contextlib.suppress(Exception):  # no label shown (the first hover), or plotly keeps it: hover anyway
        line.wait_for(state="detached", timeout=5_000)
    for _ in range(3):  # a re-layout under the pointer (a resize after the draw) drops the hover: point again
        point.hover(force=True)
        try:
            line.wait_for(timeout=10_000)
            break
        except Exception:
            page.mouse.move(0, 0)
    return str(line.text_content()).strip()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The debugger on the 301-tensor model, Graph tab open, served by Voila; yields the port."""
    tmp_path = tmp_path_factory.mktemp("graph")
    f, q, data = tmp_path / "scoped.onnx", tmp_path / "scoped.qdq.onnx", tmp_path / "calib.npz"
    onnx.save(scoped_residual_mlp(blocks=60, sigmoid_every=3), f)
    np.savez(data, x=np.random.default_rng(0).uniform(-1, 1, (4, 1, 8)).astype(np.float32))
    qdebug.quantize(f, data, None, q)
    nb = debugger_notebook(tmp_path / "graph.ipynb", f, q, data, tmp_path / "work", tab="Graph", import_root=REPO)
    port = free_port()
    env = checkout_env(tmp_path)  # qdebug's Voila template (as `qdebug dashboard` serves it) and this checkout
    with serve(start_voila(nb, port), port, cwd=tmp_path, env=env):
        yield port


def test_graph_click_selects_the_clicked_tensor(
    served: int, page: Any, page_errors: list[str], screenshot_dir: Path
) -> None:
    from playwright.sync_api import expect

    page.goto(f"http://127.0.0.1:{served}/", wait_until="commit")
    points = page.locator(NODES)
    expect(points.first).to_be_visible(timeout=240_000)
    groups = points.count()
    assert 10 <= groups <= 40  # 301 tensors open as a few dozen groups
    page.screenshot(path=str(screenshot_dir / "graph_groups_scoped.png"), full_page=True)

    # Expand the second group (the first node is the input x): more nodes are drawn.
    points.nth(1).click(force=True)
    expect(points.nth(groups)).to_be_attached()  # the new figure has more nodes than there were groups
    _fills_width(page, ".qd-graph")  # drawn and resized to the page's width: nodes stay where they are
    expanded = points.count()

    # Click neighbouring tensors: the inspector shows the tensor the hover named, each time.
    tensors = 0
    for i in range(expanded):
        if not _click_shows(page, points.nth(i)):
            continue  # a group
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


#: The width plotly drew the newest figure under ``sel`` at, and its container's (the 100 %-wide column around it).
def _click_shows(page: Any, point: Any) -> bool:
    """Hover ``point``; if it names a tensor, click it and expect the inspector to show that name (``False``: a group,
    not clicked). Under load (a CI run beside benchmarks) a click once went to the neighbour hovered just before,
    its hover event not yet handled: the point is hovered and clicked once more. A click that selects another
    tensor every time — the bug this test is for — still fails."""
    from playwright.sync_api import expect

    inspector = page.locator(".qd-inspector")
    for attempt in range(2):
        name = _hover_name(page, point)
        if not name.startswith("/model."):
            return False
        point.click(force=True)
        try:
            expect(inspector).to_contain_text(name, timeout=15_000 if attempt == 0 else 60_000)
            return True
        except AssertionError:
            if attempt:
                raise
    return True


#: A figure replaced by a redraw is marked ``data-old`` first, so the new one is told apart.
_WIDTHS = """(sel) => { const el = document.querySelector(sel + ':not([data-old])');
    const svg = el && el.querySelector('.main-svg');
    return svg ? [+svg.getAttribute('width'), el.parentElement.clientWidth] : null; }"""
_NEW = "{sel}:not([data-old]) .main-svg"


def _fills_width(page: Any, sel: str) -> None:
    """Wait until the newest figure under ``sel`` is drawn as wide as its container; fail with both widths."""
    page.locator(_NEW.format(sel=sel)).first.wait_for()
    try:
        page.wait_for_function(
            f"(() => {{ const w = ({_WIDTHS})({sel!r}); return w && w[1] > 0 && Math.abs(w[0] - w[1]) <= 2; }})()",
            timeout=20_000,
        )
    except Exception:
        pytest.fail(f"{sel}: figure width vs container width = {page.evaluate(_WIDTHS, sel)}")


def test_heatmap_fills_its_container_after_every_redraw(served: int, page: Any, page_errors: list[str]) -> None:
    """The heatmap drawn in a hidden tab fills the width when the tab opens; redrawn in the shown tab ("group by
    scope" on and off, three times), every new figure fills it too, not only after the next tab switch."""
    page.goto(f"http://127.0.0.1:{served}/", wait_until="commit")
    page.locator(NODES).first.wait_for(timeout=240_000)  # the notebook ran (Graph tab shown)
    page.locator(".lm-TabBar-tab", has_text="Heatmap").first.click()
    _fills_width(page, ".qd-heatmap")
    groups = page.locator(".qd-heatmap-groups input")
    for i in range(3):
        page.evaluate("() => document.querySelectorAll('.qd-heatmap').forEach(e => e.dataset.old = 1)")
        groups.click()
        if i % 2 == 0:  # grouped: the axis names the groups (ungrouped, 301 tensors carry no names)
            page.locator(".qd-heatmap:not([data-old]) .xtick").first.wait_for()
        _fills_width(page, ".qd-heatmap")
    page.locator(".lm-TabBar-tab", has_text="Samples").first.click()
    _fills_width(page, ".qd-samples-heatmap")
    assert_no_page_errors(page_errors, allowed=[r"\[anywidget\] Failed to initialize model"])
