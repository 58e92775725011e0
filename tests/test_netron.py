"""The opt-in Netron backend (widgets.netron_view): a real server on a tiny ONNX model, no browser."""

from __future__ import annotations

import datetime as dt
import hashlib
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import onnx
import pytest
from builders import tiny_convnet

from qdebug.errors import MissingExtraError

pytest.importorskip("netron")

from widgets import netron_view
from widgets.netron_view import (
    consent_cookie,
    netron_build_info,
    netron_iframe_html,
    open_in_netron,
)


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "user"
    d.mkdir()
    onnx.save(tiny_convnet(), d / "model.onnx")
    (d / "secret.txt").write_text("not for netron")
    return d


def test_serves_a_copy_on_localhost_and_stops(model_dir: Path) -> None:
    model = model_dir / "model.onnx"
    before = _sha256(model)
    h = open_in_netron(model)
    try:
        assert h.host == "127.0.0.1"
        assert h.port not in (0, 8080)
        assert h.url == f"http://127.0.0.1:{h.port}/"
        assert _listening("127.0.0.1", h.port)
        assert h.running
        # The copy lives in a private temp dir, not next to the user's file.
        assert h.model_copy.parent != model_dir
        assert h.model_copy.name == "model.onnx"
        assert h.model_copy.parent.stat().st_mode & 0o077 == 0
        status, body = _get(h.url)
        assert status == 200
        assert b"<html" in body.lower()
        assert b'name="identifier" content="model.onnx"' in body
        # The model bytes served are the copy's (identical to the user's file).
        status, data = _get(h.url + "data/model.onnx")
        assert status == 200
        assert hashlib.sha256(data).hexdigest() == before
        # Neighbours of the user's file are not reachable (only the copy's private directory is served).
        with pytest.raises(urllib.error.HTTPError):
            _get(h.url + "data/secret.txt")
    finally:
        h.stop()
    assert not _listening("127.0.0.1", h.port)
    assert not h.running
    assert not h.model_copy.exists()
    assert _sha256(model) == before
    h.stop()  # idempotent


def test_context_manager_and_two_servers(model_dir: Path) -> None:
    model = model_dir / "model.onnx"
    with open_in_netron(model) as a, open_in_netron(model) as b:
        assert a.port != b.port
        assert _listening("127.0.0.1", a.port) and _listening("127.0.0.1", b.port)
    assert not _listening("127.0.0.1", a.port)
    assert not _listening("127.0.0.1", b.port)


def test_missing_model(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_in_netron(tmp_path / "nope.onnx")
    assert not list(tmp_path.glob("qdebug-netron-*"))


def test_missing_netron_names_the_extra(monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
    monkeypatch.setitem(sys.modules, "netron", None)  # makes `import netron` raise ImportError
    with pytest.raises(MissingExtraError, match=r"qdebug\[ui\]"):
        open_in_netron(model_dir / "model.onnx")


def test_build_info_and_expiry() -> None:
    info = netron_build_info()
    assert info.version
    assert info.build_date is not None and info.expires is not None
    assert info.expires - info.build_date == dt.timedelta(days=netron_view.EXPIRY_DAYS)
    left = info.days_left(info.build_date + dt.timedelta(days=10))
    assert left == pytest.approx(netron_view.EXPIRY_DAYS - 10)
    assert info.days_left(info.expires + dt.timedelta(days=1)) == pytest.approx(-1)


def test_consent_cookie_and_iframe() -> None:
    c = consent_cookie()
    assert c["name"] == "consent" and c["domain"] == "127.0.0.1" and c["path"] == "/"
    assert c["value"].isdigit()
    c = consent_cookie(port=1234)
    assert c["url"] == "http://127.0.0.1:1234/" and "domain" not in c
    h = netron_iframe_html('http://127.0.0.1:1234/"><script>', height=600)
    assert h.startswith("<iframe ") and 'height="600"' in h and "<script>" not in h
    assert len(netron_view.LIMITS) == 4
