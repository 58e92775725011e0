"""qdebug's UI layer (ipywidgets + plotly). It imports :mod:`qdebug`; :mod:`qdebug` never imports it.

The interactive views arrive with the "interactive debugger" issue; this package exists now so the layering
rule (and its test) hold from the start.
"""

from __future__ import annotations

import qdebug

__all__ = ["qdebug"]
