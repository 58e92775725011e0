"""The ``qdebug`` console script: a Ctrl-C at any point, start-up included, ends with one line and exit 130."""

from __future__ import annotations

import signal
import sys
from typing import Any

from qdebug._signals import deferring, signals_held


def _interrupt() -> None:
    raise KeyboardInterrupt


def _import_main() -> Any:
    """``qdebug.cli.main``, imported with Ctrl-C put off until the imports are done: raised inside a C extension's
    import (numpy's import of ``datetime``), it became that extension's ImportError and a traceback."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # an embedding program's: leave it
        from qdebug.cli import main

        return main
    try:
        signal.signal(signal.SIGINT, deferring(_interrupt))
        with signals_held():  # a Ctrl-C meanwhile is raised on leaving the block, once the imports are whole
            from qdebug.cli import main
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # main() installs its own handlers over Python's
    return main


def console_main() -> None:
    """Import the CLI (numpy, onnx and onnxruntime load here) and run it."""
    try:
        code = _import_main()()
    except KeyboardInterrupt:
        print("qdebug: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
