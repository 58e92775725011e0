"""``qdebug dashboard``: the no-code dashboard (Voila on the bundled ``dashboard.ipynb``) on 127.0.0.1."""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, ClassVar, TextIO

from qdebug.cli._base import Tool
from qdebug.cli._preflight import Checks
from qdebug.errors import EXIT_OK, ConfigError

DEFAULT_PORT = 8866
#: Largest upload the dashboard accepts (MB); ``--max-upload-mb`` / ``QDEBUG_MAX_UPLOAD_MB`` change it.
DEFAULT_MAX_UPLOAD_MB = 25.0
#: The kernel websocket takes messages up to this many times the upload limit (one upload is one message), so a
#: file a little over the limit still reaches the kernel and is refused with a sentence instead of dropping the
#: connection; Tornado's default (10 MiB) lost every model above ~9 MB.
WEBSOCKET_HEADROOM = 4
#: A kernel whose page is gone (no connection) is shut down after this many idle seconds: the page's own
#: "beforeunload" shutdown is the normal path; this catches a crashed tab or a closed laptop lid.
CULL_IDLE_S = 600
#: The folder (under the bundled notebooks' ``share``) of qdebug's ``voila.py``, the server configuration.
VOILA_CONFIG_DIR = "voila_config"


#: What Voila and its kernel print on stderr that a dashboard user can do nothing about, dropped from it (every other
#: line passes): the bundled notebook "not trusted" (trust is a per-user signature store; the notebook is qdebug's
#: own), and ipykernel's "TCP without encryption" (its ports listen on 127.0.0.1 only, in a private runtime folder).
NOISE = (
    re.compile(r"WARNING \| Notebook .* is not trusted\s*$"),
    re.compile(r"WARNING \| Kernel is running over TCP without encryption\."),
)
#: A library's DeprecationWarning (``path.py:LINE: DeprecationWarning: ...``, then its indented source line): meant
#: for its developers — Voila turns traitlets' on, which warns about the dict syntax of Voila's own command line.
DEPRECATION = re.compile(r"^\S.*\.py:\d+: DeprecationWarning: ")


#: The environment variable that sets the upload limit (MB).
UPLOAD_ENV = "QDEBUG_MAX_UPLOAD_MB"


def parse_upload_mb(text: str, where: str) -> float:
    """An upload limit in MB: a finite number above 0, else a :class:`~qdebug.errors.ConfigError` naming ``where``
    (the option or the variable it came from)."""
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and mb > 0):
        raise ConfigError(f"{where} {text!r}: the upload limit is a number of MB above 0 (e.g. 25)")
    return mb


def upload_limit_mb() -> float:
    """The upload limit the dashboard's kernel enforces (``QDEBUG_MAX_UPLOAD_MB``, default 25; a value that is not
    a number of MB above 0 is a :class:`~qdebug.errors.ConfigError` naming the variable)."""
    text = os.environ.get(UPLOAD_ENV)
    return DEFAULT_MAX_UPLOAD_MB if text is None else parse_upload_mb(text, UPLOAD_ENV)


def upload_mb_arg(text: str) -> float:
    """argparse type of ``--max-upload-mb``."""
    try:
        return parse_upload_mb(text, "")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"expected a number of MB above 0, got {text!r}") from exc


def port_arg(text: str) -> int:
    """argparse type of ``--port``: a TCP port, 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return port


def port_problem(ip: str, port: int) -> str | None:
    """Why Voila could not listen on ``ip:port`` — in use, or not an address of this machine — found by binding it
    here first (Voila would fail after starting, or wait); ``None`` when it can."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(ip, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return f"--ip {ip}: not an address of this machine ({exc})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado does: a closed port's TIME_WAIT is free
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"--port {port}: {ip}:{port} is in use by another program; choose another --port"
            return f"--ip {ip} --port {port}: cannot listen there ({exc.strerror or exc})"
    return None


def voila_command(notebook: Path, port: int, ip: str = "127.0.0.1", *, max_upload_mb: float | None = None,
                  cull_idle_s: int = CULL_IDLE_S) -> list[str]:  # fmt: skip
    """The Voila command line serving ``notebook`` with qdebug's template (no CDN request), a websocket that
    carries uploads up to the limit, qdebug's ``voila.py`` (a closed page's kernel shut down at once), and idle
    kernels of pages that vanished without closing culled (run it with :func:`voila_env`)."""
    from qdebug.samples import VOILA_DATA_DIR, VOILA_TEMPLATE

    limit = upload_limit_mb() if max_upload_mb is None else max_upload_mb
    ws_bytes = int((limit * WEBSOCKET_HEADROOM + 16) * 1e6)
    return [
        sys.executable,
        "-m",
        "voila",
        str(notebook),
        "--no-browser",
        f"--port={port}",
        f"--Voila.ip={ip}",
        "--Voila.port_retries=0",
        f"--template={VOILA_TEMPLATE}",
        f"--Voila.tornado_settings={{'websocket_max_message_size': {ws_bytes}}}",
        f"--MappingKernelManager.cull_idle_timeout={cull_idle_s}",
        f"--MappingKernelManager.cull_interval={max(1, min(60, cull_idle_s // 2))}",
        "--MappingKernelManager.cull_connected=False",
        # qdebug's voila.py: the page gets the _xsrf cookie its close-time kernel shutdown needs (else a 403)
        "--Voila.config_file_paths",
        str(VOILA_DATA_DIR / VOILA_CONFIG_DIR),
        "--Voila.config_file_paths",
        str(notebook.parent),  # where Voila looks by default (its working folder): a voila.py beside it still counts
    ]


def voila_env(
    root: Path, max_upload_mb: float | None = None, base: dict[str, str] | None = None, runtime_dir: Path | None = None
) -> dict[str, str]:
    """The environment of the dashboard's Voila: the file-browser root, the upload limit, qdebug's Voila template on
    ``JUPYTER_PATH``, and (``runtime_dir``) the folder of its connection files, one qdebug removes afterwards."""
    from qdebug.samples import VOILA_DATA_DIR

    env = dict(os.environ if base is None else base)
    if runtime_dir is not None:
        env["JUPYTER_RUNTIME_DIR"] = str(runtime_dir)
    paths = [str(VOILA_DATA_DIR), *filter(None, env.get("JUPYTER_PATH", "").split(os.pathsep))]
    env["JUPYTER_PATH"] = os.pathsep.join(paths)
    env["QDEBUG_DASHBOARD_ROOT"] = str(root.resolve())
    env["QDEBUG_MAX_UPLOAD_MB"] = f"{upload_limit_mb() if max_upload_mb is None else max_upload_mb:g}"
    return env


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Dashboard(Tool):
    """Serve the dashboard until Ctrl-C."""

    name = "dashboard"
    help = "serve the no-code dashboard (Voila) on 127.0.0.1 until Ctrl-C"
    required: ClassVar[dict[str, str]] = {}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug dashboard``."""
        parser.add_argument("--port", type=port_arg, default=DEFAULT_PORT, help=f"1-65535 (default {DEFAULT_PORT})")
        parser.add_argument(
            "--root",
            help="the only folder the dashboard's file browser and typed paths can reach (default: the current "
            "folder); see docs/ui.md for who can reach which files",
        )
        parser.add_argument(
            "--max-upload-mb",
            type=upload_mb_arg,
            default=None,
            help=f"largest model or data upload in MB (default {DEFAULT_MAX_UPLOAD_MB:g}, or ${UPLOAD_ENV})",
        )
        parser.add_argument(
            "--ip",
            default="127.0.0.1",
            help="the address to listen on (default 127.0.0.1: this machine only; anything else lets other "
            "machines use the dashboard and read files through it)",
        )

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """The root a folder, the upload limit (the option or the variable), the UI extra, the address and port
        free to listen on: all before Voila starts (it would fail after starting, or wait)."""
        from qdebug._lazy import require
        from qdebug.io import input_problem

        root = args.root if args.root is not None else "."
        problem = input_problem(root, folder=True)
        if problem is not None:
            checks.add(f"--root {root}: not a folder ({problem})")
        elif not Path(root).is_dir():
            checks.add(f"--root {root}: not a folder")
        if args.max_upload_mb is None:
            checks.run(upload_limit_mb)
        checks.run(require, "voila")
        checks.run(require, "ipywidgets")
        problem = port_problem(args.ip, args.port)
        if problem is not None:
            checks.add(problem)

    def command(self, args: argparse.Namespace) -> list[str]:
        """The Voila command line (its own process: Ctrl-C and its kernels end with it)."""
        from qdebug.samples import DASHBOARD_NOTEBOOK, NOTEBOOK_DIR

        notebook = NOTEBOOK_DIR / DASHBOARD_NOTEBOOK
        return voila_command(notebook, args.port, args.ip, max_upload_mb=getattr(args, "max_upload_mb", None))

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Start Voila, print the URL, wait; Ctrl-C stops it (and its kernels)."""
        from qdebug.io import temp_dir

        root = Path(args.root) if args.root else Path.cwd()
        host = f"[{args.ip}]" if ":" in args.ip else args.ip
        print(f"qdebug dashboard: http://{host}:{args.port}/  (files from {root.resolve()}; Ctrl-C stops it)", file=out)
        out.flush()
        with temp_dir(prefix="qdebug-voila-") as runtime:  # its connection files go with it, however Voila ends
            code = serve(self.command(args), voila_env(root, args.max_upload_mb, runtime_dir=Path(runtime)))
        if code != 0:
            raise ConfigError(f"Voila exited with code {code} (is port {args.port} in use? try --port)")
        return EXIT_OK


def serve(cmd: list[str], env: dict[str, str]) -> int:
    """Run Voila until it exits (its exit code); Ctrl-C or SIGTERM stop it and its kernels, never an orphan. Its
    stderr reaches ours without the lines of :data:`NOISE`."""
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    forward = threading.Thread(target=forward_lines, args=(proc.stderr, sys.stderr), daemon=True)
    forward.start()
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_DFL, None):  # under qdebug's main its own handler raises (exit 143): keep that one
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()  # Voila shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        forward.join(timeout=5)  # a kernel still holding the pipe must not keep qdebug waiting


def forward_lines(stream: IO[bytes], to: TextIO) -> None:
    """Copy ``stream`` to ``to`` line by line until it ends, except the lines :data:`NOISE` matches and the
    :data:`DEPRECATION` warnings (with their source lines)."""
    in_warning = False
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        in_warning = bool(DEPRECATION.match(line)) or (in_warning and line[:1] in (" ", "\t"))
        if not in_warning and not any(p.search(line) for p in NOISE):
            to.write(line)
            to.flush()
    stream.close()


__all__ = [
    "DEFAULT_PORT",
    "DEPRECATION",
    "NOISE",
    "UPLOAD_ENV",
    "Dashboard",
    "forward_lines",
    "parse_upload_mb",
    "port_problem",
    "serve",
    "upload_limit_mb",
    "voila_command",
    "voila_env",
]
