"""The one-file HTML report in Debian's chromium, opened from disk with every network request blocked: it must
draw all its figures without asking the network for anything (plotly.js is inlined, docs/diagnostics.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

#: What an offline report may load: itself (file://) and what its own scripts create (data:/blob:).
OFFLINE_URL = re.compile(r"^(file|data|blob):")


@pytest.fixture(scope="module")
def html_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diag_models import scale_mismatch

    from qdebug.debugger import DebugOptions, debug
    from qdebug.diagnose import diagnose_models
    from qdebug.mixed.suggest import suggest
    from qdebug.render.html import write_report_html

    f, q = scale_mismatch()
    report = debug(f, q, None, DebugOptions(num_samples=4))
    diags = diagnose_models(report, f, q, max_samples=4)
    path = tmp_path_factory.mktemp("html") / "report.html"
    return write_report_html(path, report, diagnostics=diags, suggestions=suggest(report))


def test_report_renders_offline(browser: Any, html_report: Path, screenshot_dir: Path) -> None:
    from playwright.sync_api import expect

    # A short window: the graph, the third figure, starts well below it (plus the 400 px look-ahead).
    context = browser.new_context(viewport={"width": 1400, "height": 600})
    requests: list[str] = []
    errors: list[str] = []

    def route(r: Any) -> None:
        if OFFLINE_URL.match(r.request.url):
            r.continue_()
        else:
            r.abort()

    context.route(re.compile(r".*"), route)
    page = context.new_page()
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(html_report.as_uri())
        expect(page.locator("#verdict h2")).to_contain_text("Verdict")
        expect(page.locator("#diagnostics")).to_contain_text("scale mismatch")
        expect(page.locator("body")).to_have_attribute("data-qd-ready", "3", timeout=60_000)
        # Drawn only when reached: the graph, out of view, is not drawn yet.
        assert page.locator("#fig-graph[data-qd-drawn]").count() == 0
        assert page.locator("#fig-graph .main-svg").count() == 0
        for fig in ("fig-layers", "fig-samples", "fig-graph"):  # as a reader scrolls down: each one draws
            page.locator(f"#{fig}").scroll_into_view_if_needed()
            expect(page.locator(f"#{fig}[data-qd-drawn]")).to_have_count(1, timeout=60_000)
            assert page.locator(f"#{fig} .main-svg").count() >= 1, fig
            assert page.locator(f"#{fig} .wait").count() == 0, fig  # the placeholder is gone
        assert page.locator("#fig-layers .heatmaplayer image, #fig-layers .hm image").count() >= 1
        assert page.locator("#fig-graph .scatterlayer .point").count() >= 4  # x, a, b, cat (and y)
        expect(page.locator("body")).to_have_attribute("data-qd-rendered", "3")
        page.screenshot(path=str(screenshot_dir / "html_report.png"), full_page=False)
    finally:
        context.close()
    assert not errors, errors
    remote = [u for u in requests if not OFFLINE_URL.match(u)]
    assert not remote, f"the report asked the network for: {remote}"
