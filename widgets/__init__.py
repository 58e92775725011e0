"""qdebug's UI layer (ipywidgets + plotly). It imports :mod:`qdebug`; :mod:`qdebug` never imports it.

``QuantDebugger`` (the session: data, computation, history), ``DebuggerApp`` (the debugger: view state only)
and ``Dashboard`` (the Voila entry: model/data/target form + the debugger) load lazily, so ``import widgets``
stays light and needs neither ipywidgets nor plotly.

Installed, this package is ``qdebug_widgets`` (``from qdebug_widgets import QuantDebugger``): a top-level
``widgets`` could collide with another distribution's. In a source checkout the folder is ``widgets/`` and both names
work (the editable install maps ``qdebug_widgets`` to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import qdebug

if TYPE_CHECKING:
    from .app import DebuggerApp
    from .dashboard import Dashboard
    from .notebook import debugger_notebook
    from .report_panel import ReportPanel
    from .session import QuantDebugger

#: Relative module names: the package is ``qdebug_widgets`` when installed and ``widgets`` in a source checkout.
_LAZY = {"QuantDebugger": ".session", "DebuggerApp": ".app", "Dashboard": ".dashboard", "ReportPanel": ".report_panel",
         "debugger_notebook": ".notebook"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Dashboard", "DebuggerApp", "QuantDebugger", "ReportPanel", "debugger_notebook", "qdebug"]
