"""Netron opened by qdebug (widgets.netron_view) in Debian's chromium: the documented limits, checked for real.

The ``page`` fixture (tests/browser/conftest.py) aborts every request that is not to 127.0.0.1/localhost, so
Netron's location lookup and its analytics never leave the machine; the tests record what was attempted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from builders import tiny_convnet

pytest.importorskip("netron")

from widgets.netron_view import consent_cookie, netron_expired, open_in_netron

ANALYTICS = re.compile(r"^https://[^/]*google-analytics\.com/|^https://analytics\.google\.com/")


@pytest.fixture
def netron_url(tmp_path: Path) -> Iterator[tuple[str, int]]:
    if netron_expired():
        pytest.skip("the installed netron is past its 180-day expiry (its page refuses to run)")
    onnx.save(tiny_convnet(), tmp_path / "tiny.onnx")
    with open_in_netron(tmp_path / "tiny.onnx") as h:
        yield h.url, h.port


def test_graph_renders_with_consent_cookie(page: Any, page_errors: list[str], netron_url: tuple[str, int]) -> None:
    from playwright.sync_api import expect

    url, port = netron_url
    page.context.add_cookies([consent_cookie(port=port)])
    # After consent Netron reports usage to Google Analytics (aborted by the fixture): why it is an opt-in only.
    with page.expect_request(lambda r: bool(ANALYTICS.match(r.url))):
        page.goto(url)
    nodes = page.locator("#canvas .node")
    expect(nodes.first).to_be_visible()
    assert nodes.count() >= 7  # tiny_convnet: 7 operators (plus inputs/outputs)
    expect(page.get_by_text("This app uses cookies")).to_be_hidden()
    assert not page_errors, page_errors


def test_consent_dialog_without_cookie(page: Any, netron_url: tuple[str, int]) -> None:
    from playwright.sync_api import expect

    url, _ = netron_url
    # Its location lookup fails offline (aborted), so it assumes an EU visitor and asks for consent.
    with page.expect_request(lambda r: r.url.startswith("https://ipinfo.io/")):
        page.goto(url)
    expect(page.get_by_text("This app uses cookies")).to_be_visible()
    assert page.locator("#canvas .node").count() == 0
