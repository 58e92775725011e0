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
            help="where the dashboard's server-side file browser starts (default: the current folder); see "
            "docs/ui.md for who can reach which files",
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
        return [
            sys.executable,
            "-m",
            "voila",
            str(notebook),
            "--no-browser",
            f"--port={args.port}",
            f"--Voila.ip={args.ip}",
            "--Voila.port_retries=0",
        ]

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Start Voila, print the URL, wait; Ctrl-C stops it (and its kernels)."""
        root = Path(args.root) if args.root else Path.cwd()
        if not root.is_dir():
            raise ConfigError(f"--root {root}: not a folder")
        cmd = self.command(args)
        env = {**os.environ, "QDEBUG_DASHBOARD_ROOT": str(root.resolve())}
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


__all__ = ["DEFAULT_PORT", "Dashboard"]
