"""The single place where optional backends are imported.

Core modules never import an optional package at module level; they call :func:`require`, which
raises :class:`~qdebug.errors.MissingExtraError` naming the pip extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from qdebug.errors import MissingExtraError

# module name -> (pip extra, what it is for)
OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "onnxruntime_qnn": ("qnn", "Compiling for Qualcomm QNN HTP"),
    "plotly": ("ui", "Plotting"),
    "grandalf": ("ui", "Laying out the model graph"),
    "ipywidgets": ("ui", "The interactive views"),
    "voila": ("ui", "The dashboard"),
    "ray": ("ray", "Running on a Ray cluster"),
    "psutil": ("bench", "Measuring memory"),
    "numba": ("fast", "The compiled reduction (--capture compiled)"),
}


def require(module: str) -> ModuleType:
    """Import an optional module (or a submodule of one) or raise an error that names the extra providing it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".", maxsplit=1)[0]
        extra, purpose = OPTIONAL_MODULES.get(module, OPTIONAL_MODULES.get(top, ("dev", f"This feature ({module})")))
        raise MissingExtraError(top, extra, purpose) from exc


class LazyModule(ModuleType):
    """A stand-in for an optional module, imported through :func:`require` on first attribute access.

    Lets a core module write ``go.Figure(...)`` with ``go = LazyModule("plotly.graph_objects")`` and still import
    without plotly: the missing extra is reported only when a figure is actually built.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._target = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(require(self._target), attr)
