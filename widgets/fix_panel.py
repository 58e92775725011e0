"""The debugger's **Fix** tab: ``qdebug fix`` on the debugger's own models and data (a 16-bit budget, an optional
goal), its progress next to the button, then the before / best 8-bit / fixed table, the ceilings, what each remedy
bought and what caps it (:mod:`qdebug.render.fix`), and **Save fixed model** (the model, its recipe JSON, the
measurements and the HTML report, written at once and offered as download links, as *Export overrides JSON* does).

The panel holds view state only: :meth:`~widgets.session.QuantDebugger.fix` computes, and
:meth:`~widgets.session.QuantDebugger.save_fix` writes. Handlers are plain methods (tested in Python, clicked in the
browser by their ``qd-fix-*`` classes)."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from qdebug.errors import ConfigError, QDebugError
from qdebug.render.fmt import fmt_db_text

from .status import StepClock, hide_paths, verdict

if TYPE_CHECKING:
    from qdebug.fix import FixOptions, FixResult

    from .session import ProgressCallback, QuantDebugger

#: Files above this size are saved but not offered as a link: a data: link travels through the kernel's websocket
#: inside the page (the fixed model of a large network would stall it); the path is shown instead.
LINK_MAX_BYTES = 50_000_000

#: What the saved files are, in the order the links are listed.
_FILES = (
    ("model", "fixed model"),
    ("recipe", "recipe JSON"),
    ("compiled", "compiled model (zip)"),
    ("html", "HTML report"),
    ("result", "measurements"),
)
_MIME = {"model": "application/octet-stream", "html": "text/html", "compiled": "application/zip"}


def one_sentence(exc: BaseException) -> str:
    """An error as one line: its message with line breaks folded (an overrides error lists its problems on lines)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def goal_from_text(text: str) -> float | None:
    """The goal typed in dB ("30", "30 dB"); empty: the fix's own goal (80 % of the way to the W16A16 ceiling)."""
    text = text.strip().removesuffix("dB").strip()
    if not text:
        return None
    try:
        goal = float(text)
    except ValueError:
        raise ConfigError(f"goal dB: {text!r} is not a number; type one like 30 (or leave it empty)") from None
    if not math.isfinite(goal):
        raise ConfigError(f"goal dB: must be a finite number of dB, got {text!r}")
    return goal


class FixPanel(w.VBox):  # type: ignore[misc]
    """The Fix tab for one :class:`~widgets.session.QuantDebugger`.

    ``folder`` is where **Save fixed model** writes (the dashboard: the run's own folder, never its ``--root``).
    ``set_busy(bool)`` disables the app's long actions while the fix runs (it calls :meth:`set_busy` back);
    ``status(text)`` sets the app's status line. ``base_options`` holds the settings the tab does not show (PTQ
    libraries, candidates, held-out samples): ``None`` is the fix's defaults for the debugger's target and types;
    a notebook or a test sets e.g. ``FixOptions(libraries=(), max_trials=12)`` to keep it short.
    """

    def __init__(
        self,
        debugger: QuantDebugger,
        *,
        folder: str | Path,
        set_busy: Callable[[bool], None],
        status: Callable[[str], None],
        applied: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        self.debugger = debugger
        self.applied = applied
        self.folder = Path(folder)
        self.app_busy = set_busy
        self.status = status
        self.base_options: FixOptions | None = None
        self.last_fix: FixResult | None = None
        self.saved: dict[str, Path] = {}
        self._make_widgets()
        super().__init__(self._children(), **kwargs)
        self.add_class("qd-fix")

    def _make_widgets(self) -> None:
        style = {"description_width": "initial"}
        self.budget = w.BoundedFloatText(
            description="16-bit budget %", value=10.0, min=0.0, max=100.0, step=1.0, style=style,
            layout=w.Layout(width="190px"),
            tooltip="The largest share of the model's weight and activation elements the fix may keep in 16 bits "
            "(0: 8 bits only).",
        )  # fmt: skip
        self.goal = w.Text(
            description="goal dB", placeholder="automatic", style=style, layout=w.Layout(width="190px"),
            tooltip="The worst output SQNR to reach. Empty: 80 % of the way from the best 8-bit recipe to what every "
            "weight and activation in 16 bits measures.",
        )  # fmt: skip
        self.fix_button = w.Button(description="Fix", button_style="primary", icon="magic",
                                   layout=w.Layout(width="auto", flex="0 0 auto"))  # fmt: skip
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="240px"))
        self.progress_line = w.HTML("")
        self.message = w.HTML("")
        self.result_view = w.HTML("")
        self.save_button = w.Button(description="Save fixed model", icon="download", disabled=True,
                                    layout=w.Layout(width="auto", flex="0 0 auto"))  # fmt: skip
        self.links = w.HTML("")
        self.apply_button = w.Button(description="Apply to the debugger", icon="check", disabled=True,
                                     layout=w.Layout(width="auto", flex="0 0 auto"),
                                     tooltip="Make the fixed model the debugger's current model: the views, the "
                                     "before/after and Download fixed model then show it; Undo goes back.")  # fmt: skip
        for widget, cls in (
            (self.budget, "qd-fix-budget"),
            (self.goal, "qd-fix-goal"),
            (self.fix_button, "qd-fix-run"),
            (self.progress, "qd-fix-progress"),
            (self.progress_line, "qd-fix-progress-text"),
            (self.message, "qd-fix-msg"),
            (self.result_view, "qd-fix-result"),
            (self.save_button, "qd-fix-save"),
            (self.links, "qd-fix-links"),
            (self.apply_button, "qd-fix-apply"),
        ):
            widget.add_class(cls)
        self.fix_button.on_click(self.on_fix_clicked)
        self.save_button.on_click(self.on_save_clicked)
        self.apply_button.on_click(self.on_apply_clicked)

    def _children(self) -> list[w.Widget]:
        intro = w.HTML(
            "<b>Fix</b>: measure remedies — a better 8-bit recipe, the PTQ libraries installed here, then a few "
            "blocks in 16 bits within the budget — and keep the best model, checked on samples no choice saw "
            "(<code>qdebug fix</code>, docs/fix.md). The data's last samples are held out."
        )
        return [
            intro,
            w.HBox([self.budget, self.goal, self.fix_button], layout=w.Layout(flex_flow="row wrap")),
            w.HBox([self.progress, self.progress_line]),
            self.message,
            self.result_view,
            w.HBox([self.save_button, self.apply_button]),
            self.links,
        ]

    # ------------------------------------------------------------------ state
    def set_busy(self, busy: bool) -> None:
        """Disable (or enable again) the tab's buttons; Save only once there is a fix to save."""
        self.fix_button.disabled = busy
        self.save_button.disabled = busy or self.last_fix is None
        self.apply_button.disabled = busy or self.last_fix is None or self.last_fix.model_path is None

    #: the page's private folders on the server (the dashboard's): a path inside one is said by its file name only
    hidden_folders: tuple[Path, ...] = ()

    def _say(self, text: str, kind: str = "info", colour: str | None = None) -> None:
        """A message under the button and the same words in the app's status line."""
        text = hide_paths(text, self.hidden_folders)
        colour = colour or {"error": "#c92a2a", "ok": "#2b8a3e"}.get(kind, "#495057")
        self.message.value = f"<div class='qd-msg qd-msg-{kind}' style='color:{colour}'>{html.escape(text)}</div>"
        self.status(text)

    def fix_options(self) -> FixOptions:
        """The fix's options: the tab's budget and goal over :attr:`base_options` (default: the fix's defaults for
        the target and the activation / weight types the debugger quantizes with). A value it cannot use raises
        :class:`~qdebug.errors.ConfigError` naming the input."""
        from qdebug.fix import FixOptions

        cfg = self.debugger.config
        base = self.base_options or FixOptions(
            target=cfg.target, activation_type=cfg.activation_type, weight_type=cfg.weight_type
        )
        budget = float(self.budget.value)
        if not 0.0 <= budget <= 100.0:  # the box bounds it; a value set from code is checked all the same
            raise ConfigError(f"16-bit budget %: must be between 0 and 100, got {budget:g}")
        return replace(base, budget_16bit=budget / 100.0, goal_db=goal_from_text(self.goal.value))

    # ------------------------------------------------------------------ handlers
    def on_fix_clicked(self, b: Any = None) -> FixResult | None:
        """Run the fix with the app's long actions disabled and its progress next to the button; show the outcome
        (or one sentence saying why there is none). The previous fix's outcome stays until a new one arrives."""
        try:
            opts = self.fix_options()
        except ConfigError as exc:
            self._say(f"fix not started: {one_sentence(exc)}", "error")
            return None
        app_progress = self.debugger.progress
        self.debugger.progress = self._progress_to(app_progress)
        self.app_busy(True)
        try:
            self.debugger.progress(0, 1, "fix: measuring the starting point")
            result = self.debugger.fix(opts)
        except QDebugError as exc:  # bad input, a goal above the ceiling: the user changes a field and tries again
            self._say(f"fix failed: {one_sentence(exc)}", "error")
            return None
        except Exception as exc:  # a bug: its type and message; the debugger stays usable
            self._say(f"fix failed: {type(exc).__name__}: {one_sentence(exc)}", "error")
            return None
        finally:
            self.debugger.progress = app_progress
            self.app_busy(False)
        self.last_fix, self.saved, self.links.value = result, {}, ""
        self.save_button.disabled = False
        self.apply_button.disabled = result.model_path is None
        self.result_view.value = result_html(result)
        fixed = result.trial(result.chosen)
        v = verdict(fixed.db)
        goal = (
            ""
            if result.goal_db is None
            else f"; goal {result.goal_db:.1f} dB "
            + ("reached" if result.reached else "not reached (what caps it is below)")
        )
        self._say(f"fix done: worst output SQNR {fmt_db_text(result.trial(result.base).db)} → "
                  f"{fmt_db_text(fixed.db)} ({v.kind}), {100 * fixed.share_16bit:.1f} % in 16 bits{goal}",
                  colour=v.colour)  # fmt: skip
        return result

    def _progress_to(self, app_progress: ProgressCallback | None) -> ProgressCallback:
        """A progress callback feeding both the app's bar and line and the tab's own, next to the Fix button."""
        clock = StepClock()

        def progress(done: int, total: int, message: str) -> None:
            if app_progress is not None:
                app_progress(done, total, message)
            self.progress.max = max(total, 1)
            self.progress.value = min(done, self.progress.max)
            self.progress_line.value = f"<span>{html.escape(clock.text(done, total, message))}</span>"

        return progress

    def on_save_clicked(self, b: Any = None) -> dict[str, Path]:
        """Write the last fix's model, recipe, measurements and HTML report (all or none) into :attr:`folder` and
        offer them as download links."""
        if self.last_fix is None:
            self._say("press Fix first: there is no fixed model to save yet")
            return {}
        try:
            self.saved = self.debugger.save_fix(self.last_fix, self.folder)
        except Exception as exc:  # a full disk, an unwritable folder: said, nothing half-written (all or none)
            self._say(f"saving the fix failed: {one_sentence(exc)}", "error")
            return {}
        self.links.value = links_html(self.saved, self.hidden_folders)
        self._say(f"fixed model, recipe and report written to {self.folder}", "ok")
        return self.saved

    def on_apply_clicked(self, b: Any = None) -> bool:
        """Make the last fix's model the debugger's current variant (:meth:`~widgets.session.QuantDebugger.adopt_fix`:
        its remedies measured on the debug samples, before/after like a promotion) and let the app show it."""
        if self.last_fix is None:
            self._say("press Fix first: there is no fixed model to apply yet")
            return False
        self.app_busy(True)
        try:
            ev = self.debugger.adopt_fix(self.last_fix)
        except Exception as exc:  # the fix kept your model, a debug pass failed: said; the current variant stays
            self._say(f"applying the fix failed: {one_sentence(exc)}", "error")
            return False
        finally:
            self.app_busy(False)
        gain = self.debugger.last_gain
        v = verdict(ev.output_sqnr_db)
        said = f"fix applied to the debugger: {gain.text() if gain else ''} — worst output SQNR "
        self._say(
            f"{said}{fmt_db_text(ev.output_sqnr_db)} ({v.kind}); see Before/after, Undo to go back", colour=v.colour
        )
        if self.applied is not None:
            self.applied()
        return True


def result_html(result: FixResult) -> str:
    """The outcome of a fix: the before / best 8-bit / fixed table (:func:`~qdebug.render.fix.summary_rows`), then
    the ceilings, what each remedy bought, the goal and what caps it (:func:`~qdebug.render.fix.detail_lines`)."""
    from qdebug.render.fix import detail_lines, summary_rows

    held = next(iter(result.holdout.values())).samples if result.holdout else 0
    base = result.trial(result.base).measure
    debug = "debug samples" if base is None else f"debug samples ({base.samples})"
    head = ("", "what", f"{debug} dB", f"held-out ({held}) dB", "16-bit share")
    rows = "".join(
        f"<tr class='qd-fix-row'>{''.join(f'<td>{html.escape(c)}</td>' for c in row)}</tr>"
        for row in summary_rows(result)
    )
    table = (
        "<style>.qd-fix-table td,.qd-fix-table th{padding:1px 8px;text-align:left;border-bottom:1px solid #dee2e6}"
        "</style><table class='qd-fix-table'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
        f"{rows}</table><p style='color:#495057;font-size:90%'>worst output SQNR against the float model; held-out: "
        "samples no stage of the fix saw</p>"
    )
    details = "".join(f"<div class='qd-fix-line'>{html.escape(line)}</div>" for line in detail_lines(result))
    return f"{table}<div class='qd-fix-details' style='white-space:pre-wrap'>{details}</div>"


def links_html(saved: dict[str, Path], hidden: tuple[Path, ...] = ()) -> str:
    """A download link per saved file (a data: link: Voila serves no files of the kernel's) and its path; a file
    above :data:`LINK_MAX_BYTES` only its path. A path inside one of ``hidden`` (the dashboard's private folders) is
    written by its file name (:func:`~widgets.status.hide_paths`)."""
    items = []
    for key, label in _FILES:
        path = saved.get(key)
        if path is None:
            continue
        size = path.stat().st_size
        where = f"<span class='qd-fix-path'>{html.escape(hide_paths(str(path), hidden))}</span>"
        if size > LINK_MAX_BYTES:
            items.append(f"<li>{html.escape(label)}: {where} ({size / 1e6:.0f} MB: too large for a download link; "
                         "copy it from the server)</li>")  # fmt: skip
            continue
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        mime = _MIME.get(key, "application/json")
        items.append(f"<li><a class='qd-fix-download qd-fix-download-{key}' download='{html.escape(path.name)}' "
                     f"href='data:{mime};base64,{data}'>download {html.escape(label)}</a> {where}</li>")  # fmt: skip
    return f"<ul>{''.join(items)}</ul>"


__all__ = ["LINK_MAX_BYTES", "FixPanel", "goal_from_text", "links_html", "one_sentence", "result_html"]
