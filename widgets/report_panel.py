"""The debugger's report panel: **Diagnose** (why tensors lose precision, and the fix to try: a short table) and
**Download HTML report** (the one-file report of :mod:`qdebug.render.html`, offered as a download link). Used by
:class:`~widgets.app.DebuggerApp`, so the dashboard and the notebooks both have it."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

if TYPE_CHECKING:
    from .session import QuantDebugger

#: Diagnostics listed in the panel (the HTML report has all of them).
SHOWN = 8


class ReportPanel(w.VBox):  # type: ignore[misc]
    """Two buttons and what they produce; handlers are plain methods (tested in Python, clicked in the browser)."""

    def __init__(self, debugger: QuantDebugger, *, path: str | Path | None = None, **kwargs: Any) -> None:
        self.debugger = debugger
        self.path = Path(path) if path is not None else debugger.workdir / "report.html"
        self.diagnose_button = w.Button(description="Diagnose", icon="stethoscope", layout=w.Layout(width="auto"))
        self.html_button = w.Button(
            description="Download HTML report", icon="file-code-o", layout=w.Layout(width="auto")
        )
        self.diagnostics_view = w.HTML("")
        self.link = w.HTML("")
        for widget, cls in (
            (self.diagnose_button, "qd-diagnose"),
            (self.html_button, "qd-html-report"),
            (self.diagnostics_view, "qd-diagnostics"),
            (self.link, "qd-html-link"),
        ):
            widget.add_class(cls)
        self.diagnose_button.on_click(self.on_diagnose_clicked)
        self.html_button.on_click(self.on_html_clicked)
        super().__init__([w.HBox([self.diagnose_button, self.html_button]), self.diagnostics_view, self.link], **kwargs)

    def on_diagnose_clicked(self, b: Any = None) -> None:
        """Diagnose the current variant and list the first :data:`SHOWN` findings."""
        try:
            diags = self.debugger.diagnostics()
        except Exception as exc:  # the panel says why; the rest of the app keeps working
            self.diagnostics_view.value = f"<i>diagnostics failed: {html.escape(f'{type(exc).__name__}: {exc}')}</i>"
            return
        rows = "".join(
            f"<tr><td>{html.escape(d.severity.value)}</td><td>{html.escape(d.kind.value.replace('_', ' '))}</td>"
            f"<td><code>{html.escape(d.tensor)}</code></td><td>{html.escape(d.evidence)}</td>"
            f"<td>{html.escape(d.remedy.text)}</td></tr>"
            for d in diags.items[:SHOWN]
        )
        more = f"<p>… and {len(diags) - SHOWN} more in the HTML report</p>" if len(diags) > SHOWN else ""
        self.diagnostics_view.value = f"<b>{len(diags)} diagnostic(s)</b>" + (
            "<table><tr><th>severity</th><th>problem</th><th>tensor</th><th>evidence</th><th>fix</th></tr>"
            f"{rows}</table>{more}"
            if rows
            else " — nothing found"
        )

    def on_html_clicked(self, b: Any = None) -> None:
        """Write the HTML report of the current variant and offer it as a download (a data: link: Voila serves no
        files of the kernel's)."""
        try:
            path = self.debugger.write_html_report(self.path)
        except Exception as exc:
            self.link.value = f"<i>HTML report failed: {html.escape(f'{type(exc).__name__}: {exc}')}</i>"
            return
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        self.link.value = (
            f"<a class='qd-html-download' download='{html.escape(path.name)}' "
            f"href='data:text/html;base64,{data}'>download {html.escape(path.name)}</a> "
            f"<span class='qd-html-path'>({path.stat().st_size / 1e6:.1f} MB, {html.escape(str(path))})</span>"
        )


__all__ = ["SHOWN", "ReportPanel"]
