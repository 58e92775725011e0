"""Browser-test infrastructure: Debian's chromium driven by Playwright, servers (JupyterLab, Voila) on a free
127.0.0.1 port, screenshots under ``test-output/screenshots/``.

The rules behind every choice here (measured on this kind of machine): never let Playwright download a browser;
abort every non-local request; wait for ports and selectors, never sleep; stop servers with SIGTERM.

Helpers are plain functions so other browser tests import them (``from browser.conftest import serve, ...``):
:func:`free_port`, :func:`serve`, :func:`start_voila`, :func:`start_jupyterlab`, :func:`assert_no_page_errors`.
A missing chromium or ``playwright`` package skips the tests locally and fails them in CI (``CI=true``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
SAMPLE_MODELS = REPO / "sample_models"
CHROMIUM = Path("/usr/bin/chromium")
#: Chromium flags that work here (headless, no sandbox as root, nothing phoning home).
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
#: Default Playwright timeout for waits and expectations (ms): generous for a loaded 2-core CI machine.
TIMEOUT_MS = 60_000
#: How long a server may take to accept connections (JupyterLab: 4–6 s, Voila: 3.6–4.8 s measured).
SERVER_START_S = 90.0
#: SIGTERM → SIGKILL grace period; kernels shut down on SIGTERM.
STOP_GRACE_S = 15.0
#: Requests the page may make: the local server only. Any other is aborted *and fails the test* (the product makes
#: no request outside 127.0.0.1: docs/ui.md); a test that expects one (Netron's, documented) says so explicitly.
LOCAL_URL = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost)(:\d+)?(/|$)")
BIN = Path(sys.executable).parent
IN_CI = os.environ.get("CI") == "true"


def _missing(what: str) -> None:
    """Skip locally, fail in CI: a browser test that cannot run in CI is a broken CI, not a skipped test."""
    if IN_CI:
        pytest.fail(f"{what} (CI=true: the browser tests must run)")
    pytest.skip(what)


# ---------------------------------------------------------------------------------------------- servers
def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (bind port 0 and read what the kernel chose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-n:]
    except OSError:
        return "<no log>"


@contextlib.contextmanager
def serve(
    cmd: Sequence[str],
    port: int,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    start_timeout_s: float = SERVER_START_S,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run the server ``cmd`` (in its own process group) until it accepts TCP connections on 127.0.0.1:``port``;
    yield the process; then SIGTERM the group (SIGKILL after :data:`STOP_GRACE_S`).

    The server's output goes to a log file whose tail is in the failure message when it exits or does not
    listen before ``start_timeout_s``.
    """
    log_fd, log_name = tempfile.mkstemp(prefix="qdebug-server-", suffix=".log")
    log = Path(log_name)
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        list(cmd),
        cwd=None if cwd is None else str(cwd),
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the kernels it starts are stopped with it
    )
    os.close(log_fd)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _port_open(port):
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode} before listening: {' '.join(cmd)}\n{_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"server not listening on {port} after {start_timeout_s:.0f} s: {' '.join(cmd)}\n{_tail(log)}"
                )
            time.sleep(0.1)  # polling a port, not waiting for a guessed duration
        yield proc
    finally:
        _stop(proc)
        if proc.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM, None):
            print(f"server exited with {proc.returncode}; log tail:\n{_tail(log)}")
        log.unlink(missing_ok=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it after the grace period."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_GRACE_S)


def start_voila(notebook: Path, port: int, *, cull_idle_s: int | None = None) -> list[str]:
    """The command line serving ``notebook`` with Voila on 127.0.0.1:``port`` exactly as ``qdebug dashboard`` does
    (:func:`qdebug.cli.dashboard.voila_command`: qdebug's template without CDN links, the websocket size for
    uploads, kernel culling). Run it with ``cwd=notebook.parent`` and :func:`checkout_env`."""
    from qdebug.cli.dashboard import CULL_IDLE_S, voila_command

    return voila_command(notebook, port, cull_idle_s=CULL_IDLE_S if cull_idle_s is None else cull_idle_s)


def lab_settings_dir(path: Path) -> Path:
    """Write JupyterLab user settings for tests into ``path``: no news toast (it would cover the page), no
    autosave (the server must never write outputs into a notebook), and every cell rendered (no windowing: a
    cell scrolled out of view would otherwise not be laid out, and its widgets would not count as visible)."""
    settings = {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }
    for rel, value in settings.items():
        f = path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value), encoding="utf-8")
    return path


def start_jupyterlab(root: Path, port: int, settings_dir: Path) -> list[str]:
    """The command line of a JupyterLab serving ``root`` on 127.0.0.1:``port``, no token or password, the test
    settings of :func:`lab_settings_dir` in ``settings_dir``, and the app exposed as ``window.jupyterapp`` (so a
    test can wait for the notebook's session and kernel instead of guessing)."""
    cmd = [
        str(BIN / "jupyter"),
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.token=",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={lab_settings_dir(settings_dir)}",
        f"--LabApp.workspaces_dir={settings_dir / 'workspaces'}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def notebook_copy(dest: Path, *names: str) -> Path:
    """Copy ``notebooks/<names>`` into ``dest/notebooks/`` next to a ``sample_models`` link, so a browser run can
    never write into the committed notebooks; returns ``dest/notebooks``."""
    nbdir = dest / "notebooks"
    nbdir.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(NOTEBOOKS / name, nbdir / name)
    link = dest / "sample_models"
    if not link.exists():
        link.symlink_to(SAMPLE_MODELS, target_is_directory=True)
    # The notebooks import ``qdebug_widgets`` (the installed name): next to them, it is this checkout's widgets/.
    ui = nbdir / "qdebug_widgets"
    if not ui.exists():
        ui.symlink_to(REPO / "widgets", target_is_directory=True)
    return nbdir


def server_env(tmp: Path) -> dict[str, str]:
    """Environment for a test server: its own Jupyter runtime/config dirs (no user state leaks in) and its own TMPDIR
    (Voila makes its connection folder there and leaves it when the server is killed)."""
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        "TMPDIR": str(tmp / "tmp"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def checkout_env(tmp: Path) -> dict[str, str]:
    """:func:`server_env` for a server running this checkout's code: qdebug's Voila template on ``JUPYTER_PATH``
    (as ``qdebug dashboard`` sets it) and the checkout first on ``PYTHONPATH``."""
    from qdebug.samples import VOILA_DATA_DIR

    return {
        **server_env(tmp),
        "JUPYTER_PATH": str(VOILA_DATA_DIR),
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


@contextlib.contextmanager
def dashboard_on_your_model(page: Any, tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """The dashboard served (Voila, this checkout) with the sample CNN typed as a file on the server, *your* QDQ
    model beside it (qdebug's int8 per-channel recipe, as a user's own) and the calibration data: the form filled,
    not yet Run. Yields ``(float model, your QDQ model, data)``."""
    from playwright.sync_api import expect

    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    models = tmp_path / "models"
    models.mkdir()
    float_model = Path(shutil.copy(SAMPLE_MODELS / "digits_cnn.onnx", models / "digits_cnn.onnx"))
    calib = Path(shutil.copy(SAMPLE_MODELS / "digits_calib.npz", models / "digits_calib.npz"))
    user = models / "mine.qdq.onnx"
    quantize(float_model, calib, QuantConfig(weight_type="int8", per_channel=True, num_samples=32), user, check=False)
    nbdir = notebook_copy(tmp_path, "dashboard.ipynb")
    port = free_port()
    (tmp_path / "work").mkdir()
    env = {
        **checkout_env(tmp_path),
        "QDEBUG_DASHBOARD_WORKDIR": str(tmp_path / "work"),
        "QDEBUG_DASHBOARD_ROOT": str(tmp_path),
    }
    with serve(start_voila(nbdir / "dashboard.ipynb", port), port, cwd=nbdir, env=env):
        page.goto(f"http://127.0.0.1:{port}/")
        expect(page.locator(".qd-dash-run")).to_be_visible()
        page.locator(".qd-dash-source button", has_text="file on the server").click()
        path_box = page.locator(".qd-dash-model-path input")
        path_box.fill(str(float_model))
        path_box.press("Enter")
        page.locator(".qd-dash-quant input").fill(str(user))
        page.locator(".qd-dash-data-choice select").select_option(label="file on the server (.npz)")
        data_box = page.locator(".qd-dash-data input").first
        data_box.fill(str(calib))
        data_box.press("Enter")
        yield float_model, user, calib


# ---------------------------------------------------------------------------------------------- page errors
#: Known harmless page errors, to pass explicitly to :func:`assert_no_page_errors` where they apply: a static
#: ``fig.show()`` inside Voila makes plotly's renderer raise this (FigureWidgets do not).
STATIC_PLOTLY_IN_VOILA = r"r\.setData is not a function"


def assert_no_page_errors(errors: Sequence[str], allowed: Sequence[str] = ()) -> None:
    """No uncaught page error except those matching one of the ``allowed`` regexes (each documented where
    allowed, e.g. "r.setData is not a function" from a static ``fig.show()`` in Voila)."""
    unexpected = [e for e in errors if not any(re.search(a, e) for a in allowed)]
    assert not unexpected, "uncaught errors in the page:\n" + "\n".join(unexpected)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """Debian's chromium (``make browser`` installs it); skipped locally / failed in CI when missing."""
    if not CHROMIUM.exists():
        _missing("chromium not installed: run `make browser` (apt-get install -y chromium)")
    return str(CHROMIUM)


@pytest.fixture(scope="session")
def playwright_api() -> Iterator[Any]:
    """A started Playwright (sync API) for the whole session; skipped / failed when the package is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed: pip install -e '.[dev]'")
    pw = sync_playwright().start()
    try:
        yield pw
    finally:
        pw.stop()


@pytest.fixture(scope="session")
def browser(playwright_api: Any, chromium_executable: str) -> Iterator[Any]:
    """Debian's chromium launched once per session (headless, the flags of :data:`CHROMIUM_ARGS`)."""
    b = playwright_api.chromium.launch(executable_path=chromium_executable, args=list(CHROMIUM_ARGS), headless=True)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def page_errors() -> list[str]:
    """Uncaught errors of the test's page (``pageerror`` events), for :func:`assert_no_page_errors`."""
    return []


@pytest.fixture
def offsite_requests() -> list[str]:
    """Every request of the test's page to a host other than 127.0.0.1/localhost (aborted, and a failure unless
    the test empties the list because it expects them)."""
    return []


@pytest.fixture
def page(browser: Any, page_errors: list[str], offsite_requests: list[str]) -> Iterator[Any]:
    """A fresh page (own context) that can reach 127.0.0.1/localhost only, with generous default timeouts and
    its uncaught errors collected in ``page_errors``. A request to any other host is aborted and recorded in
    ``offsite_requests``; the test fails at teardown if any is left there."""
    context = browser.new_context(viewport={"width": 1600, "height": 1200})
    context.set_default_timeout(TIMEOUT_MS)
    context.set_default_navigation_timeout(TIMEOUT_MS)

    def route(r: Any) -> None:
        if LOCAL_URL.match(r.request.url) or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            offsite_requests.append(r.request.url)
            r.abort()

    context.route(re.compile(r".*"), route)
    p = context.new_page()
    p.on("pageerror", lambda exc: page_errors.append(f"{getattr(exc, 'name', '')}: {getattr(exc, 'message', exc)}"))
    try:
        from playwright.sync_api import expect

        expect.set_options(timeout=TIMEOUT_MS)
    except ImportError:  # pragma: no cover - playwright_api already skipped
        pass
    try:
        yield p
    finally:
        context.close()
    assert_local_only(offsite_requests)


def assert_local_only(offsite: Sequence[str]) -> None:
    """No request left 127.0.0.1 (the product promises it: docs/ui.md, "Offline and local only")."""
    if offsite:
        pytest.fail("requests to hosts other than 127.0.0.1:\n" + "\n".join(sorted(set(offsite))))


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    """``test-output/screenshots/`` under the repo (gitignored); screenshots there have stable names."""
    d = REPO / "test-output" / "screenshots"
    d.mkdir(parents=True, exist_ok=True)
    return d
