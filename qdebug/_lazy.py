"""The single place where optional backends are imported.

Core modules never import an optional package at module level; they call :func:`require`, which
raises :class:`~qdebug.errors.MissingExtraError` naming the pip extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from qdebug.errors import MissingExtraError

# module name -> (pip extra, what it is for)
OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "onnxruntime_qnn": ("qnn", "Compiling for Qualcomm QNN HTP"),
    "plotly": ("ui", "Plotting"),
    "ipywidgets": ("ui", "The interactive views"),
    "psutil": ("bench", "Measuring memory"),
}


def require(module: str) -> ModuleType:
    """Import an optional module or raise an error that names the extra providing it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra, purpose = OPTIONAL_MODULES.get(module, ("dev", f"This feature ({module})"))
        raise MissingExtraError(module, extra, purpose) from exc
