"""The ``qdebug`` console script: a Ctrl-C at any point, start-up included, ends with one line and exit 130."""

from __future__ import annotations

import sys


def console_main() -> None:
    """Import the CLI (numpy, onnx and onnxruntime load here) and run it."""
    try:
        from qdebug.cli import main

        code = main()
    except KeyboardInterrupt:
        print("qdebug: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
