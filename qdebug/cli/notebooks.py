"""``qdebug notebooks DIR``: copy the walkthrough notebooks (bundled in the wheel), to open in JupyterLab."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar, TextIO

from qdebug.cli._base import Tool
from qdebug.cli._preflight import Checks, Output
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

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The folder (the guard checks it can be written in before anything is copied)."""
        return {"directory": Output(args.directory, folder=True)}

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """A notebook already there (perhaps edited) is never replaced without ``--force``."""
        from qdebug.samples import WALKTHROUGHS

        target = Path(args.directory)
        existing = [name for name in WALKTHROUGHS if _exists(target / name)]
        if existing and not args.force:
            checks.add(f"{target / existing[0]} exists (perhaps with your edits); use --force to replace it")

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Copy every walkthrough; what cannot be written is one line naming the folder."""
        from qdebug.io import atomic_write_bytes
        from qdebug.samples import NOTEBOOK_DIR, WALKTHROUGHS

        target = Path(args.directory)
        try:
            target.mkdir(parents=True, exist_ok=True)
            for name in WALKTHROUGHS:
                atomic_write_bytes(target / name, (NOTEBOOK_DIR / name).read_bytes())
        except OSError as exc:  # the folder changed since the guard looked (or a file system refusing late)
            raise ConfigError(f"{target}: cannot copy the notebooks there ({exc.strerror or exc})") from exc
        print(f"copied {', '.join(WALKTHROUGHS)} to {target.resolve()}", file=out)
        print(f"open them with: jupyter lab {target}  (needs pip install 'qdebug[ui]')", file=out)
        return EXIT_OK


def _exists(path: Path) -> bool:
    """``path`` exists; a path that cannot be looked up (a link loop, an overlong name) does not — the guard names
    what is wrong with the folder."""
    try:
        return path.exists()
    except OSError:
        return False


__all__ = ["Notebooks"]
