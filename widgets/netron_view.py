"""The explicit opt-in "Open in Netron" backend: serve ONE model with Netron on 127.0.0.1 and stop it again.

qdebug's own graph view (:func:`qdebug.render.figures.graph_figure`) is the primary one. Netron is offered only as an
action the user chooses, because of the limits measured with netron 9.3.3 (see ``docs/netron.md``):

* **Consent dialog offline.** Netron looks up the visitor's country (``https://ipinfo.io``); when that fails it
  assumes an EU user and blocks on a cookie-consent dialog. A ``consent`` cookie for the serving host set before
  the page loads skips it: :func:`consent_cookie` returns one in Playwright's ``context.add_cookies`` format.
* **Analytics.** Once consent is given (by the dialog or by that cookie), every page load sends ~9 requests to
  Google Analytics. For a tool that handles users' models that is not acceptable.

So qdebug never hands Netron's own server to the browser: :func:`open_in_netron` puts a small proxy on 127.0.0.1 in
front of it that adds a ``Content-Security-Policy`` allowing the page to load from and connect to its own origin
only (the browser then sends neither the location lookup nor the analytics) and a ``consent`` cookie with the
page (no dialog; the analytics it would allow cannot leave). The handle's URL is the proxy's.
* **Expiry.** Netron's page refuses to work 180 days after the build date stamped in its ``index.html``
  (``<meta name="date">``): it shows "Please update to the newest version." forever. :func:`netron_build_info`
  reads that date from the installed package; :func:`netron_expired` says whether it is past.
* **No metric colouring.** Netron has no API to colour nodes by a metric (only by op category), so SQNR cannot
  be shown in it.

How qdebug serves the model: the file is **copied** into a private temporary directory (mode 0700) and Netron
serves that copy. Netron's server answers any path under the model's directory, so serving the user's file in
place would expose its neighbours; serving a copy also guarantees the user's file is never touched. The server
binds ``127.0.0.1`` unless the caller passes another address explicitly, on a free port (port 0 — Netron's own
default would grab 8080). :meth:`NetronHandle.stop` stops the server (Netron's ``stop`` is asynchronous, so it
waits until the port is closed, with a deadline) and deletes the copy.
"""

from __future__ import annotations

import datetime as _dt
import html
import http.client
import importlib
import logging
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

from qdebug.errors import MissingExtraError

#: Netron refuses to run this many days after its build date (``browser.js``: ``if (days > 180)``).
EXPIRY_DAYS = 180
#: Google Analytics requests measured per page load after consent (netron 9.3.3, chromium 156).
ANALYTICS_REQUESTS_PER_LOAD = 9
#: The documented limits, one line each (shown by the app next to the "Open in Netron" button).
LIMITS: tuple[str, ...] = (
    "Offline, Netron stops at a cookie-consent dialog unless a 'consent' cookie is set for its host "
    "(qdebug's proxy sets one).",
    f"After consent it tries ~{ANALYTICS_REQUESTS_PER_LOAD} Google Analytics requests per page load "
    "(qdebug's proxy forbids the page any host but its own, so none leaves the machine).",
    f"It refuses to run {EXPIRY_DAYS} days after its build date ('Please update to the newest version.').",
    "It cannot colour nodes by a metric (SQNR): use qdebug's own graph view for that.",
)
DEFAULT_ADDRESS = "127.0.0.1"
#: The policy the proxy adds to every response: Netron's page may load from and connect to its own origin only.
LOCAL_ONLY_CSP = (
    "default-src 'self' 'unsafe-inline' 'unsafe-eval' data: blob:; connect-src 'self' data: blob:; "
    "img-src 'self' data: blob:; font-src 'self' data:; frame-ancestors http://127.0.0.1:* http://localhost:*"
)
#: Response headers not passed on by the proxy (it sends the body whole, with its own length and policy).
_HOP_HEADERS = {"connection", "transfer-encoding", "content-length", "content-security-policy", "keep-alive"}


class _LocalOnly(BaseHTTPRequestHandler):
    """Forward a request to Netron's server; answer with its response plus :data:`LOCAL_ONLY_CSP` and, with the
    page, a ``consent`` cookie."""

    server: _LocalOnlyProxy

    def _forward(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "connection", "keep-alive"}}
        upstream = http.client.HTTPConnection(self.server.upstream[0], self.server.upstream[1], timeout=60)
        try:
            upstream.request(method, self.path, body, headers)
            resp = upstream.getresponse()
            data = resp.read()
        finally:
            upstream.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP_HEADERS:
                self.send_header(k, v)
        self.send_header("Content-Security-Policy", LOCAL_ONLY_CSP)
        if (resp.getheader("Content-Type") or "").startswith("text/html"):
            self.send_header("Set-Cookie", f"consent={int(time.time() * 1000)}; Path=/; SameSite=Lax")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._forward("GET")

    def do_HEAD(self) -> None:
        self._forward("HEAD")

    def do_POST(self) -> None:
        self._forward("POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a notebook has no use for an access log


class _LocalOnlyProxy(ThreadingHTTPServer):
    """The proxy of :class:`_LocalOnly` on ``address`` (port 0: a free one), served by a daemon thread."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        super().__init__(address, _LocalOnly)
        self.thread = threading.Thread(target=self.serve_forever, name="qdebug-netron-proxy", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)


def _import_netron() -> ModuleType:
    try:
        return importlib.import_module("netron")  # untyped package: imported by name, used as a ModuleType
    except ImportError as exc:
        raise MissingExtraError("netron", "ui", "Opening a model in Netron") from exc


@dataclass(frozen=True)
class NetronBuildInfo:
    """Version and build date of the installed netron package, and the day its page stops working."""

    version: str
    build_date: _dt.datetime | None
    expires: _dt.datetime | None

    def days_left(self, now: _dt.datetime | None = None) -> float | None:
        """Days until the page refuses to run (negative: already expired); None if the date is unknown."""
        if self.expires is None:
            return None
        now = now or _dt.datetime.now(_dt.UTC)
        return (self.expires - now).total_seconds() / 86400


def netron_build_info() -> NetronBuildInfo:
    """Read ``<meta name="version">`` and ``<meta name="date">`` from the installed netron's ``index.html``.

    The page compares ``new Date()`` with that date (parsed by the browser as local time; taken as UTC here —
    the difference is at most a day); after :data:`EXPIRY_DAYS` days it refuses to run.
    """
    netron = _import_netron()
    version = str(getattr(netron, "__version__", "unknown"))
    try:
        text = resources.files("netron").joinpath("index.html").read_text(encoding="utf-8")
    except (OSError, ModuleNotFoundError):
        return NetronBuildInfo(version, None, None)
    m = re.search(r'<meta name="version" content="([^"]*)"', text)
    if m:
        version = m.group(1)
    d = re.search(r'<meta name="date" content="([^"]*)"', text)
    if not d:
        return NetronBuildInfo(version, None, None)
    try:
        built = _dt.datetime.fromisoformat(d.group(1)).replace(tzinfo=_dt.UTC)
    except ValueError:
        return NetronBuildInfo(version, None, None)
    return NetronBuildInfo(version, built, built + _dt.timedelta(days=EXPIRY_DAYS))


def netron_expired(now: _dt.datetime | None = None) -> bool:
    """True when the installed netron's page would refuse to run (False if its build date is unknown)."""
    left = netron_build_info().days_left(now)
    return left is not None and left < 0


def consent_cookie(host: str = DEFAULT_ADDRESS, port: int | None = None) -> dict[str, Any]:
    """A ``consent`` cookie for Netron's page, in Playwright's ``BrowserContext.add_cookies`` format.

    Netron skips its consent dialog when a ``consent`` (or ``_ga``) cookie exists. Setting it is giving consent:
    Netron then sends its analytics requests, so pair it with blocking non-local requests. With ``port`` the
    cookie is given as a ``url`` (Playwright derives domain and path), else as ``domain`` + ``path``. For other
    clients, ``{"consent": value}`` for that host is all that is needed.
    """
    value = str(int(time.time() * 1000))  # what Netron itself stores: Date.now()
    if port is not None:
        return {"name": "consent", "value": value, "url": f"http://{host}:{port}/"}
    return {"name": "consent", "value": value, "domain": host, "path": "/"}


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class NetronHandle:
    """A running Netron server for one model copy, behind its local-only proxy (``url``/``port`` are the
    proxy's). Use :meth:`stop` (or ``with``) to shut both down."""

    url: str
    host: str
    port: int
    model_copy: Path
    _tmpdir: Path = field(repr=False)
    _stopped: bool = field(default=False, repr=False)
    _netron_port: int = field(default=0, repr=False)
    _proxy: _LocalOnlyProxy | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return not self._stopped and _port_open(self.host, self.port)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server, wait until its port is closed (``TimeoutError`` after ``timeout`` s), delete the copy."""
        if self._stopped:
            return
        netron = _import_netron()
        netron.stop((self.host, self._netron_port or self.port))
        if self._proxy is not None:
            self._proxy.stop()
        deadline = time.monotonic() + timeout
        while _port_open(self.host, self.port) or (self._netron_port and _port_open(self.host, self._netron_port)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Netron at {self.url} still listening {timeout} s after stop()")
            time.sleep(0.02)
        self._stopped = True
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    def iframe(self, width: str | int = "100%", height: int = 800) -> tuple[str, str | int, int]:
        """``(url, width, height)``: the arguments of ``IPython.display.IFrame``."""
        return (self.url, width, height)

    def __enter__(self) -> NetronHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def open_in_netron(
    model_path: str | Path, *, address: str = DEFAULT_ADDRESS, port: int = 0, timeout: float = 10.0
) -> NetronHandle:
    """Serve a copy of ``model_path`` with Netron on ``address`` (default 127.0.0.1) and return its handle.

    ``port=0`` picks a free port. Raises :class:`~qdebug.errors.MissingExtraError` without netron
    (``pip install 'qdebug[ui]'``), ``FileNotFoundError`` for a missing model and ``TimeoutError`` when the
    server does not listen within ``timeout`` s. Netron's limits are listed in :data:`LIMITS`.
    """
    netron = _import_netron()
    src = Path(model_path)
    if not src.is_file():
        raise FileNotFoundError(f"open_in_netron: no model file at {src}")
    tmpdir = Path(tempfile.mkdtemp(prefix="qdebug-netron-"))  # mode 0700: private to this user
    try:
        copy = tmpdir / src.name
        shutil.copyfile(src, copy)
        # netron.serve calls logging.basicConfig() when the root logger has no handler; keep the app's logging as is.
        root = logging.getLogger()
        guard = logging.NullHandler()
        root.addHandler(guard)
        try:
            host, bound = netron.start(str(copy), address=(address, int(port)), browse=False)
        finally:
            root.removeHandler(guard)
        deadline = time.monotonic() + timeout
        while not _port_open(host, bound):
            if time.monotonic() > deadline:
                netron.stop((host, bound))
                raise TimeoutError(f"Netron did not listen on {host}:{bound} within {timeout} s")
            time.sleep(0.02)
        proxy = _LocalOnlyProxy((host, 0), (host, int(bound)))
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    port_out = int(proxy.server_address[1])
    url_host = f"[{host}]" if ":" in host else host
    return NetronHandle(
        url=f"http://{url_host}:{port_out}/",
        host=host,
        port=port_out,
        model_copy=copy,
        _tmpdir=tmpdir,
        _netron_port=int(bound),
        _proxy=proxy,
    )


def netron_iframe_html(url: str, width: str = "100%", height: int = 800) -> str:
    """An ``<iframe>`` for ``url`` (e.g. in an ``ipywidgets.HTML``); works when the browser runs on the same host."""
    return (
        f'<iframe src="{html.escape(url, quote=True)}" width="{html.escape(str(width), quote=True)}" '
        f'height="{int(height)}" style="border: 0" class="qd-netron-frame"></iframe>'
    )


__all__ = [
    "ANALYTICS_REQUESTS_PER_LOAD",
    "EXPIRY_DAYS",
    "LIMITS",
    "NetronBuildInfo",
    "NetronHandle",
    "consent_cookie",
    "netron_build_info",
    "netron_expired",
    "netron_iframe_html",
    "open_in_netron",
]
