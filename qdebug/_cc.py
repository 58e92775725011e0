"""The machine's C compiler, for the two things qdebug compiles: the capture's reduction kernels
(:mod:`qdebug.capture.kernels.c_kernel`) and Deeploy's generated code run on the host
(:mod:`qdebug.targets.deeploy_host`)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence

__all__ = ["c_compiler"]


def c_compiler(defaults: Sequence[str] = ("cc", "gcc", "clang")) -> list[str] | None:
    """The compiler command: ``$CC`` if set (its first word found on the PATH, the rest kept as arguments, e.g.
    ``ccache gcc``), else the first of ``defaults`` on the PATH; ``None`` if there is none (and on Windows, whose
    compilers take other flags)."""
    if sys.platform == "win32":
        return None
    words = shlex.split(os.environ.get("CC", ""))
    for name, rest in [(words[0], words[1:])] if words else [(n, []) for n in defaults]:
        found = shutil.which(name)
        if found:
            return [found, *rest]
    return None
