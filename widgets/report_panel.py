"""The debugger's report panel: **Diagnose** (why tensors lose precision, and the fix to try: a short table) and
**Download HTML report** (the one-file report of :mod:`qdebug.render.html`, offered as a download link). Used by
:class:`~widgets.app.DebuggerApp`, so the dashboard and the notebooks both have it."""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from qdebug.render.fmt import fmt_db_text

if TYPE_CHECKING:
    from qdebug.findings import Diagnostic

    from .session import QuantDebugger

#: Diagnostics listed in the panel (the HTML report has all of them).
SHOWN = 8


class ReportPanel(w.VBox):  # type: ignore[misc]
    """Two buttons and what they produce; handlers are plain methods (tested in Python, clicked in the browser)."""

    def __init__(
        self,
        debugger: QuantDebugger,
        *,
        path: str | Path | None = None,
        applied: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        self.debugger = debugger
        self.applied = applied  # the app shows a remedy applied here (views, before/after)
        self.remedies: list[Diagnostic] = []  # the listed diagnostics whose remedy the debugger applies
        self.remedy_picker = w.Dropdown(options=[], description="remedy", layout=w.Layout(width="420px"))
        self.apply_button = w.Button(description="Apply remedy", icon="wrench", disabled=True,
                                     layout=w.Layout(width="auto"))  # fmt: skip
        self.remedy_message = w.HTML("")
        self.remedy_box = w.HBox([self.remedy_picker, self.apply_button], layout=w.Layout(display="none"))
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
            (self.remedy_picker, "qd-remedy-picker"),
            (self.apply_button, "qd-remedy-apply"),
            (self.remedy_message, "qd-remedy-msg"),
        ):
            widget.add_class(cls)
        self.diagnose_button.on_click(self.on_diagnose_clicked)
        self.html_button.on_click(self.on_html_clicked)
        self.apply_button.on_click(self.on_apply_remedy_clicked)
        super().__init__(
            [w.HBox([self.diagnose_button, self.html_button]), self.diagnostics_view, self.remedy_box,
             self.remedy_message, self.link],
            **kwargs,
        )  # fmt: skip

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
        self._offer_remedies(list(diags.items[:SHOWN]))
        self.diagnostics_view.value = f"<b>{len(diags)} diagnostic(s)</b>" + (
            "<table><tr><th>severity</th><th>problem</th><th>tensor</th><th>evidence</th><th>fix</th></tr>"
            f"{rows}</table>{more}"
            if rows
            else " — nothing found"
        )

    def _offer_remedies(self, shown: list[Diagnostic]) -> None:
        """The listed diagnostics whose remedy applies as a patch of the current model or a promotion (per-channel
        weights, float fallback, 16 bits), in the picker; the others are measured by the Fix tab."""
        from qdebug.findings import RemedyKind

        kinds = (RemedyKind.PROMOTE_16BIT, RemedyKind.PER_CHANNEL, RemedyKind.FLOAT_FALLBACK)
        self.remedies = [d for d in shown if d.remedy.kind in kinds]
        self.remedy_picker.options = [(d.remedy.text[:90], i) for i, d in enumerate(self.remedies)]
        self.apply_button.disabled = not self.remedies
        self.remedy_box.layout.display = "flex" if self.remedies else "none"

    def on_apply_remedy_clicked(self, b: Any = None) -> bool:
        """Apply the picked diagnostic's remedy to the current model (:meth:`~widgets.session.QuantDebugger.
        apply_remedy`: measured like a promotion) and let the app show the before/after."""
        i = self.remedy_picker.value
        if i is None or not 0 <= i < len(self.remedies):
            return False
        remedy = self.remedies[i].remedy
        self.apply_button.disabled = True
        try:
            ev = self.debugger.apply_remedy(remedy)
        except Exception as exc:  # said in the panel; the current variant stays
            why = " ".join(str(exc).split()) or type(exc).__name__
            self.remedy_message.value = f"<span style='color:#c92a2a'>remedy not applied: {html.escape(why)}</span>"
            return False
        finally:
            self.apply_button.disabled = False
        gain = self.debugger.last_gain
        self.remedy_message.value = (
            f"<span class='qd-remedy-done'>applied: {html.escape(remedy.text)} — "
            f"{html.escape(gain.text() if gain else '')} "
            f"(worst output {fmt_db_text(ev.output_sqnr_db)}; Undo goes back)"
            "</span>"
        )
        self.remedies, self.remedy_picker.options = [], []  # the diagnostics were of the model before it
        self.remedy_box.layout.display = "none"
        if self.applied is not None:
            self.applied()
        return True

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
