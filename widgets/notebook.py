"""A one-cell notebook that shows the debugger (:class:`~widgets.app.DebuggerApp`) on a given model pair, for
serving with Voila: what the browser tests and the UI benchmarks open (``tests/browser/test_graph_browser.py``,
``benchmarks/ui_views.py``), and a way to open the debugger on your own pair without the dashboard's form."""

from __future__ import annotations

import json
from pathlib import Path

from qdebug.io import atomic_write_text


def debugger_notebook(
    path: str | Path,
    float_model: str | Path,
    quant_model: str | Path | None,
    data: str | Path | None,
    workdir: str | Path,
    *,
    tab: str | None = None,
    import_root: str | Path | None = None,
) -> Path:
    """Write (atomically) a one-cell notebook to ``path`` that debugs ``float_model`` against ``quant_model`` on
    ``data`` (session files in ``workdir``) and shows ``DebuggerApp``, with the tab titled ``tab`` open (e.g.
    ``"Graph"``). ``import_root``: a source checkout put first on ``sys.path`` (so that checkout's ``widgets`` and
    ``qdebug`` are the ones imported); ``None`` uses the installed packages. Returns ``path``."""
    lines = []
    if import_root is not None:
        lines.append(f"import sys; sys.path.insert(0, {str(import_root)!r})")
        lines.append("from widgets.app import DebuggerApp\nfrom widgets.session import QuantDebugger")
    else:
        lines.append("from qdebug_widgets import DebuggerApp, QuantDebugger")
    q = None if quant_model is None else str(quant_model)
    d = None if data is None else str(data)
    lines.append(f"dbg = QuantDebugger({str(float_model)!r}, {q!r}, {d!r}, workdir={str(workdir)!r})")
    lines.append("app = DebuggerApp(dbg)")
    if tab is not None:
        lines.append(f"app.show_tab({tab!r})")
    lines.append("app")
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": "\n".join(lines)}
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    out = Path(path)
    atomic_write_text(out, json.dumps(nb, indent=1))
    return out


__all__ = ["debugger_notebook"]
