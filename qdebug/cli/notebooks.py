"""``qdebug notebooks DIR``: copy the walkthrough notebooks (bundled in the wheel), to open in JupyterLab."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar, TextIO

from qdebug.cli._base import Tool
from qdebug.errors import EXIT_OK, ConfigError


class Notebooks(Tool):
    """Copy the walkthroughs into a folder."""

    name = "notebooks"
    help = "copy the walkthrough notebooks into a folder (open them with: jupyter lab DIR)"
    required: ClassVar[dict[str, str]] = {}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug notebooks``."""
        parser.add_argument("directory", help="where to copy them (created if missing)")
        parser.add_argument("--force", action="store_true", help="replace notebooks of the same name already there")

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Copy every walkthrough; an existing one (perhaps edited) is never replaced without ``--force``."""
        from qdebug.io import atomic_write_bytes
        from qdebug.samples import NOTEBOOK_DIR, WALKTHROUGHS

        target = Path(args.directory)
        if target.exists() and not target.is_dir():
            raise ConfigError(f"{target}: exists and is not a folder")
        existing = [name for name in WALKTHROUGHS if (target / name).exists()]
        if existing and not args.force:
            raise ConfigError(f"{target / existing[0]} exists (perhaps with your edits); use --force to replace it")
        target.mkdir(parents=True, exist_ok=True)
        for name in WALKTHROUGHS:
            atomic_write_bytes(target / name, (NOTEBOOK_DIR / name).read_bytes())
        print(f"copied {', '.join(WALKTHROUGHS)} to {target.resolve()}", file=out)
        print(f"open them with: jupyter lab {target}  (needs pip install 'qdebug[ui]')", file=out)
        return EXIT_OK


__all__ = ["Notebooks"]
