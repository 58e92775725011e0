"""``qdebug dashboard``: the no-code dashboard (Voila on the bundled ``dashboard.ipynb``) on 127.0.0.1."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import ClassVar, TextIO

from qdebug.cli._base import Tool, positive_int
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


def upload_limit_mb() -> float:
    """The upload limit the dashboard's kernel enforces (``QDEBUG_MAX_UPLOAD_MB``, default 25)."""
    return float(os.environ.get("QDEBUG_MAX_UPLOAD_MB", DEFAULT_MAX_UPLOAD_MB))


def voila_command(notebook: Path, port: int, ip: str = "127.0.0.1", *, max_upload_mb: float | None = None,
                  cull_idle_s: int = CULL_IDLE_S) -> list[str]:  # fmt: skip
    """The Voila command line serving ``notebook`` with qdebug's template (no CDN request), a websocket that
    carries uploads up to the limit, and idle kernels of closed pages culled (run it with :func:`voila_env`)."""
    from qdebug.samples import VOILA_TEMPLATE

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
    ]


def voila_env(root: Path, max_upload_mb: float | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the dashboard's Voila: the file-browser root, the upload limit, and qdebug's Voila
    template on ``JUPYTER_PATH``."""
    from qdebug.samples import VOILA_DATA_DIR

    env = dict(os.environ if base is None else base)
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
        parser.add_argument("--port", type=positive_int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
        parser.add_argument(
            "--root",
            help="the only folder the dashboard's file browser and typed paths can reach (default: the current "
            "folder); see docs/ui.md for who can reach which files",
        )
        parser.add_argument(
            "--max-upload-mb",
            type=float,
            default=None,
            help=f"largest model or data upload in MB (default {DEFAULT_MAX_UPLOAD_MB:g}, or $QDEBUG_MAX_UPLOAD_MB)",
        )
        parser.add_argument(
            "--ip",
            default="127.0.0.1",
            help="the address to listen on (default 127.0.0.1: this machine only; anything else lets other "
            "machines use the dashboard and read files through it)",
        )

    def command(self, args: argparse.Namespace) -> list[str]:
        """The Voila command line (its own process: Ctrl-C and its kernels end with it)."""
        from qdebug._lazy import require
        from qdebug.samples import DASHBOARD_NOTEBOOK, NOTEBOOK_DIR

        require("voila")
        require("ipywidgets")
        notebook = NOTEBOOK_DIR / DASHBOARD_NOTEBOOK
        return voila_command(notebook, args.port, args.ip, max_upload_mb=getattr(args, "max_upload_mb", None))

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Start Voila, print the URL, wait; Ctrl-C stops it (and its kernels)."""
        root = Path(args.root) if args.root else Path.cwd()
        if not root.is_dir():
            raise ConfigError(f"--root {root}: not a folder")
        cmd = self.command(args)
        if args.max_upload_mb is not None and args.max_upload_mb <= 0:
            raise ConfigError(f"--max-upload-mb {args.max_upload_mb:g}: must be positive")
        env = voila_env(root, args.max_upload_mb)
        host = f"[{args.ip}]" if ":" in args.ip else args.ip
        print(f"qdebug dashboard: http://{host}:{args.port}/  (files from {root.resolve()}; Ctrl-C stops it)", file=out)
        out.flush()
        proc = subprocess.Popen(cmd, env=env)
        # A SIGTERM (a service manager, `kill`) stops Voila and its kernels too, as Ctrl-C does: never an orphan.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()  # Voila shuts its kernels down on SIGTERM
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        if code != 0:
            raise ConfigError(f"Voila exited with code {code} (is port {args.port} in use? try --port)")
        return EXIT_OK


__all__ = ["DEFAULT_PORT", "Dashboard", "upload_limit_mb", "voila_command", "voila_env"]
