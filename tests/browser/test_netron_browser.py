"""Netron opened by qdebug (widgets.netron_view) in Debian's chromium: offline, local only, and it works.

Netron on its own looks up the visitor's country (ipinfo.io), stops at a consent dialog when that fails, and after
consent sends ~9 Google Analytics requests per load. qdebug serves it behind a proxy that forbids the page any host
but its own (Content-Security-Policy) and gives the consent cookie with the page. The ``page`` fixture
(tests/browser/conftest.py) fails the test on any request that is not to 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from builders import tiny_convnet

pytest.importorskip("netron")

from widgets.netron_view import LOCAL_ONLY_CSP, netron_expired, open_in_netron


@pytest.fixture
def netron_url(tmp_path: Path) -> Iterator[str]:
    if netron_expired():
        pytest.skip("the installed netron is past its 180-day expiry (its page refuses to run)")
    onnx.save(tiny_convnet(), tmp_path / "tiny.onnx")
    with open_in_netron(tmp_path / "tiny.onnx") as h:
        yield h.url


def test_graph_renders_offline_with_no_request_off_the_machine(
    page: Any, page_errors: list[str], offsite_requests: list[str], netron_url: str
) -> None:
    from playwright.sync_api import expect

    response = page.goto(netron_url)
    assert response is not None and response.headers.get("content-security-policy") == LOCAL_ONLY_CSP
    nodes = page.locator("#canvas .node")
    expect(nodes.first).to_be_visible()
    assert nodes.count() >= 7  # tiny_convnet: 7 operators (plus inputs/outputs)
    expect(page.get_by_text("This app uses cookies")).to_be_hidden()  # no consent dialog offline
    page.reload()  # analytics would go out on a (re)load after consent: none does
    expect(nodes.first).to_be_visible()
    assert offsite_requests == []
