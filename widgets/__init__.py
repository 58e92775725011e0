"""qdebug's UI layer (ipywidgets + plotly). It imports :mod:`qdebug`; :mod:`qdebug` never imports it.

``QuantDebugger`` (the session: data, computation, history), ``DebuggerApp`` (the debugger: view state only)
and ``Dashboard`` (the Voila entry: model/data/target form + the debugger) load lazily, so ``import widgets``
stays light and needs neither ipywidgets nor plotly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import qdebug

if TYPE_CHECKING:
    from widgets.app import DebuggerApp
    from widgets.dashboard import Dashboard
    from widgets.session import QuantDebugger

_LAZY = {"QuantDebugger": "widgets.session", "DebuggerApp": "widgets.app", "Dashboard": "widgets.dashboard"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'widgets' has no attribute {name!r}")


__all__ = ["Dashboard", "DebuggerApp", "QuantDebugger", "qdebug"]
