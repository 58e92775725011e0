"""The graph's colouring and the grouped heatmap in Debian's chromium (issue 38) on a small ResNet named as torch
exports it (``graph_shapes.tiny_resnet``: Conv outputs ``input.N`` under scoped node names), built here: the graph
opens coloured by where the error is born (local SQNR) and says so, the toggle switches to the accumulated error;
the grouped heatmap writes one label per group of the graph (its stages' blocks), as many as the graph has, and
the tensor names above it follow the zoom."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from graph_shapes import tiny_resnet

import qdebug
from browser.conftest import REPO, assert_no_page_errors, checkout_env, free_port, serve, start_voila
from widgets.notebook import debugger_notebook

pytestmark = pytest.mark.slow

NODES = ".qd-graph .scatterlayer .trace:nth-of-type(3) .points path"
HEAT = ".qd-heatmap:not([data-old])"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The debugger on the small ResNet, Graph tab open, served by Voila; yields the port."""
    tmp_path = tmp_path_factory.mktemp("resnet")
    f, q, data = tmp_path / "resnet.onnx", tmp_path / "resnet.qdq.onnx", tmp_path / "calib.npz"
    onnx.save(tiny_resnet(), f)  # type: ignore[arg-type]
    np.savez(data, input=np.random.default_rng(0).uniform(0, 1, (4, 1, 3, 32, 32)).astype(np.float32))
    qdebug.quantize(f, data, None, q)
    nb = debugger_notebook(tmp_path / "resnet.ipynb", f, q, data, tmp_path / "work", tab="Graph", import_root=REPO)
    port = free_port()
    with serve(start_voila(nb, port), port, cwd=tmp_path, env=checkout_env(tmp_path)):
        yield port


def _fills_width(page: Any) -> None:
    """Wait until the heatmap is drawn as wide as its column (a hidden tab's figure is resized when shown)."""
    page.wait_for_function(
        f"() => {{ const el = document.querySelector('{HEAT}'); const svg = el && el.querySelector('.main-svg');"
        " return svg && Math.abs(+svg.getAttribute('width') - el.parentElement.clientWidth) <= 2; }"
    )


def _texts(page: Any, sel: str) -> list[str]:
    return [str(t).strip() for t in page.locator(sel).all_text_contents()]


def test_local_colouring_and_labelled_grouped_heatmap(
    served: int, page: Any, page_errors: list[str], screenshot_dir: Path
) -> None:
    from playwright.sync_api import expect

    page.goto(f"http://127.0.0.1:{served}/", wait_until="commit")
    expect(page.locator(NODES).first).to_be_visible(timeout=240_000)
    # Opens coloured by where the error is born; the toggle, the title and the colour bar say so.
    toggle = page.locator(".qd-graph-colour")
    expect(toggle.locator("button.mod-active")).to_have_text(re.compile("where the error is born"))
    expect(page.locator(".qd-graph .gtitle")).to_contain_text("where the error is born")
    expect(page.locator(".qd-graph .cbtitle")).to_contain_text("local SQNR")
    note = page.locator(".qd-graph-note")
    expect(note).to_contain_text(re.compile(r"\d+ tensors in \d+ groups \(name scope"))
    groups = int(re.search(r"tensors in (\d+) groups", note.inner_text()).group(1))  # type: ignore[union-attr]
    assert page.locator(NODES).count() == groups
    page.screenshot(path=str(screenshot_dir / "graph_colour_local.png"), full_page=True)
    local = [p.get_attribute("style") for p in page.locator(NODES).all()]

    toggle.locator("button", has_text="accumulated").click()
    expect(page.locator(".qd-graph .gtitle")).to_contain_text("accumulated", timeout=60_000)
    expect(page.locator(".qd-graph .cbtitle")).to_contain_text("cumulative SQNR")
    assert [p.get_attribute("style") for p in page.locator(NODES).all()] != local  # other colours
    toggle.locator("button", has_text="where the error is born").click()
    expect(page.locator(".qd-graph .gtitle")).to_contain_text("where the error is born", timeout=60_000)

    # The grouped heatmap: one label per group of the graph (the stages' blocks), tensor names above.
    page.locator(".lm-TabBar-tab", has_text="Heatmap").first.click()
    page.locator(f"{HEAT} .main-svg").first.wait_for()
    page.evaluate("() => document.querySelectorAll('.qd-heatmap').forEach(e => e.dataset.old = 1)")
    page.locator(".qd-heatmap-groups input").click()
    page.locator(f"{HEAT} .xtick text").first.wait_for()
    labels = _texts(page, f"{HEAT} .xtick text")
    assert len(labels) == groups and {"layer1/layer1.0", "layer4/layer4.0"} <= set(labels)
    assert any("×2" in t for t in labels)  # layer3's identical blocks, one box in the graph too
    names = _texts(page, f"{HEAT} .x2tick text")
    assert names and all(n and not re.fullmatch(r"[\d.]+", n) for n in names)  # names, not positions
    _fills_width(page)
    page.screenshot(path=str(screenshot_dir / "heatmap_grouped_resnet.png"), full_page=True)

    # Zoom into a few columns (a drag on the cells): every tensor there is named.
    box = page.locator(f"{HEAT} .nsewdrag").first.bounding_box()
    y = box["y"] + box["height"] * 0.8
    page.mouse.move(box["x"] + 0.30 * box["width"], y)
    page.mouse.down()
    page.mouse.move(box["x"] + 0.36 * box["width"], y, steps=8)
    page.mouse.up()
    try:
        page.wait_for_function(
            f"() => {{ const t = [...document.querySelectorAll('{HEAT} .x2tick text')].map(e => e.textContent);"
            f" return t.length >= 2 && t.join() !== {','.join(names)!r} && t.every(s => !/^[0-9.]+$/.test(s)); }}",
            timeout=30_000,
        )
    except Exception:
        page.screenshot(path=str(screenshot_dir / "heatmap_grouped_resnet_zoomed.png"), full_page=True)
        pytest.fail(f"after the zoom, the names axis shows {_texts(page, f'{HEAT} .x2tick text')}")
    zoomed = [t for t in _texts(page, f"{HEAT} .x2tick text") if t]  # between two tensors: no label
    assert len(zoomed) >= 2 and set(zoomed) != set(names)
    assert all(t.startswith(("input.", "/")) for t in zoomed)  # tensor names, each once
    assert len(zoomed) == len(set(zoomed))
    page.screenshot(path=str(screenshot_dir / "heatmap_grouped_resnet_zoomed.png"), full_page=True)
    assert_no_page_errors(page_errors, allowed=[r"\[anywidget\] Failed to initialize model"])
