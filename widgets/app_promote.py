"""The debugger's promotion flow and its target: promote the ticked tensors (plan → re-quantize → re-debug →
compile), undo, export the overrides JSON, compile the current variant for the chosen target, and the before/after
of each step."""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import traitlets as tr

from .app_base import AppBase, JobBar, button_layout, db_text, pct_text
from .app_figure import figure
from .session_steps import step_label
from .status import hide_paths, verdict

if TYPE_CHECKING:
    from qdebug.mixed.promote import PromotionPlan
    from qdebug.mixed.session import Evaluation
    from qdebug.targets.recompile import RecompileResult

__all__ = ["PromoteFlow"]


def _task(v: float | None) -> str:
    """A task metric's score in the before/after table."""
    return "n/a" if v is None else f"{v:.4f}"


class PromoteFlow(AppBase):
    """Promotion, undo, export and the compile for the chosen target (a room of :class:`~widgets.app.DebuggerApp`)."""

    def _make_promote_widgets(self) -> None:
        """The target picker, the promote/undo/export buttons and what they show."""
        self.last_plan_text = ""
        self.last_recompile: RecompileResult | None = None
        # each variant's last compile per target, by its step (0: the model the session started from): a step's
        # "before" column is the compile already made, so no variant is compiled or simulated twice
        self.compiled_by_step: dict[tuple[str, int], RecompileResult] = {}
        # per target, the SoC of its first compile: every later one uses it, so that before and after share a chip
        self.compile_soc: dict[str, str | None] = {}
        self.targets_info: dict[str, tuple[bool, str]] = {}
        self.target_picker = w.Dropdown(description="target")
        self.target_note = w.HTML("")
        # flex "0 0 auto": a narrow column wraps the row instead of cutting the labels ("Promote to…")
        self.promote_button = w.Button(
            description="Promote to 16-bit", button_style="primary", icon="arrow-up", layout=button_layout()
        )
        self.undo_button = w.Button(description="Undo", icon="undo", layout=button_layout())
        self.export_button = w.Button(description="Export overrides JSON", icon="download", layout=button_layout())
        self.export_fix_button = w.Button(
            description="Download fixed model", icon="download", button_style="success", layout=button_layout()
        )
        self.fix_message = w.HTML("")  # the outcome of Promote / Undo / Export, right under those buttons
        self.promote_job = JobBar("qd-promote-job")  # a promote's or compile's progress and Cancel, under the buttons
        self.compile_view = w.HTML("")  # the last compile for the chosen target (Run compiles too)
        self.plan_view = w.HTML("")
        self.before_after = w.HTML("")
        self.download = w.HTML("")
        self.comparison_box = w.VBox(layout=w.Layout(width="100%"))  # a plain Box shrank the figure to ~500 px

    def _wire_promote(self) -> None:
        """CSS classes for the browser tests and the buttons' handlers."""
        for widget, cls in (
            (self.promote_button, "qd-promote"),
            (self.undo_button, "qd-undo"),
            (self.export_button, "qd-export"),
            (self.export_fix_button, "qd-export-fix"),
            (self.target_picker, "qd-target"),
            (self.before_after, "qd-before-after-box"),
            (self.plan_view, "qd-plan-box"),
            (self.fix_message, "qd-fix-message"),
            (self.compile_view, "qd-compile-box"),
        ):
            widget.add_class(cls)
        self.promote_button.on_click(self.on_promote_clicked)
        self.undo_button.on_click(self.on_undo_clicked)
        self.export_button.on_click(self.on_export_clicked)
        self.export_fix_button.on_click(self.on_export_fix_clicked)
        self.target_picker.observe(self._on_target_picker, names="value")

    def _promote_column(self) -> w.VBox:
        """The mixed-precision panel: suggestions, the buttons, the compile, the plan and the before/after."""
        return w.VBox(
            [
                w.HTML("<b>Mixed precision</b> — tick suggestions or table rows, then promote"),
                self.suggestions_box,
                self.promotion_view,
                w.HBox(
                    [
                        self.target_picker,
                        self.promote_button,
                        self.undo_button,
                        self.export_button,
                        self.export_fix_button,
                    ],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.promote_job,
                self.fix_message,
                self.target_note,
                self.compile_view,
                self.plan_view,
                self.before_after,
                self.download,
                self.report_panel,
            ],
            layout=w.Layout(width="50%"),
        )

    # ------------------------------------------------------------------ the target
    def _refresh_targets(self) -> None:
        targets = self.debugger.targets()
        opts = []
        notes = []
        for name, (ok, reason) in targets.items():
            opts.append((name if ok else f"{name} (unavailable)", name))
            if not ok:
                notes.append(f"<li><b>{html.escape(name)}</b> unavailable: {html.escape(reason)}</li>")
        self.targets_info = targets
        self.target_picker.options = opts
        self.target_picker.value = self.target if self.target in targets else "cpu"
        self.target_note.value = f"<ul>{''.join(notes)}</ul>" if notes else ""

    @tr.observe("target")
    def _target_changed(self, change: dict[str, Any]) -> None:
        if self.target_picker.value != change["new"] and change["new"] in self.targets_info:
            self.target_picker.value = change["new"]

    def _on_target_picker(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.target = change["new"]

    # ------------------------------------------------------------------ promotion
    def on_promote_clicked(self, b: Any = None) -> None:
        """Promote the ticked tensors (or the selected one): plan → apply → recompile → before/after."""
        tensors = self.checked() or ([self.selected] if self.selected else [])
        if not tensors:
            self._say(self.fix_message, "tick at least one suggestion or table row (or select a tensor) to promote")
            return
        self._apply(lambda: self.debugger.promote(tensors), f"the promotion of {', '.join(tensors)}")

    def _apply(self, make_plan: Callable[[], PromotionPlan], what: str) -> None:
        """Plan, re-quantize, re-debug and compile as a job (:meth:`run_job`: the buttons disabled, progress and
        Cancel under them); a failure is said next to the button and in the Before/after tab (where the user looks
        for the result), and the current variant stays."""
        before = self.debugger.report
        before_ev = self.debugger.current
        shown_plan = self.plan_view.value  # the plan shown again if this one is cancelled

        def work() -> tuple[PromotionPlan, Evaluation, RecompileResult | None, str]:
            self._busy(f"planning {what}")
            plan = make_plan()
            self.last_plan_text = plan.describe()
            self.plan_view.value = f"<pre class='qd-plan'>{html.escape(self.last_plan_text)}</pre>"
            ev = self.debugger.apply(plan)
            return (plan, ev, *self._recompile())

        def done(result: tuple[PromotionPlan, Evaluation, RecompileResult | None, str]) -> None:
            self._promoted(before, before_ev, *result)

        self.run_job(
            self.promote_job, self.fix_message, what, work, done, lambda exc: self._failed(what, exc),
            cancelled=lambda: setattr(self.plan_view, "value", shown_plan),
        )  # fmt: skip

    def _promoted(
        self, before: Any, before_ev: Evaluation | None, plan: PromotionPlan, ev: Evaluation,
        compiled: RecompileResult | None, note: str,
    ) -> None:  # fmt: skip
        """Show a promotion that went through: the table, the before/after, the comparison, the message."""
        self.promotion = []
        self.refresh()
        self.download.value = ""  # links written before this step offer another variant's files
        self.before_after.value = self._before_after_html(before.min_output_sqnr_db, before_ev, ev, compiled)
        if compiled is not None:  # the compile table is in the before/after, beside the compile before the step
            state = "ok" if compiled.ok else "FAILED"
            self.compile_view.value = (
                f"<p class='qd-compile'>compiled for {html.escape(self.target)} {html.escape(compiled.compile.device)}:"
                f" {state} — the before/after below compares it with the compile before this step</p>"
            )
        if ev.comparison is not None:
            self.comparison_box.children = [figure("comparison_figure", ev.comparison, css="qd-comparison")]
        v = verdict(ev.output_sqnr_db)
        self._say(
            self.fix_message,
            f"promoted {len(plan.requested)} tensor(s) (with the tensors around them: {len(plan.promoted)} in 16 "
            f"bits): output SQNR {db_text(before.min_output_sqnr_db)} → {db_text(ev.output_sqnr_db)}, {v.kind}"
            + ("" if ev.accuracy is None else f", accuracy {pct_text(ev.accuracy)}")
            + (f"; {note}" if compiled is None else f"; {self.target}: {'ok' if compiled.ok else 'failed'}"),
            colour=v.colour,
        )

    def _failed(self, what: str, exc: BaseException) -> None:
        """Say that ``what`` failed, and why, where the user will look: next to the button, in the status line
        and in the Before/after tab; the model shown is still the previous one."""
        why = f"{type(exc).__name__}: {exc}"
        shown = db_text(self.debugger.report.min_output_sqnr_db)
        self._say(self.fix_message, f"{what} failed: {why}", "error")
        self.before_after.value = ""
        box = w.HTML(
            f"<div class='qd-failed' style='color:#c92a2a'><b>{html.escape(what)} failed</b>: {html.escape(why)}"
            f"<br>The model shown is unchanged (worst output SQNR {html.escape(shown)}); the session is usable: "
            "try other tensors or undo.</div>"
        )
        self.comparison_box.children = [box]

    def compile_current(self) -> None:
        """Compile the current variant for the chosen target (Run does it too, as ``qdebug build`` would) as a job
        with its progress and Cancel, and show the compile report under the target picker."""

        def done(result: tuple[RecompileResult | None, str]) -> None:
            compiled, note = result
            if compiled is None:
                self.compile_view.value = f"<p class='qd-compile-note'>{html.escape(note)}</p>"
            else:
                self.compile_view.value = self._compile_html(compiled)
                ok = "ok" if compiled.ok else "FAILED (see below the target)"
                self.status = f"compiled for {self.target}: {ok}"

        def failed(exc: BaseException) -> None:
            self._say(self.compile_view, f"compile for {self.target} failed: {type(exc).__name__}: {exc}", "error")

        shown, last = self.compile_view.value, self.last_recompile  # kept when this compile is cancelled

        def cancelled() -> None:
            self.compile_view.value, self.last_recompile = shown, last

        self.run_job(
            self.promote_job, self.fix_message, f"the compile for {self.target}", self._recompile, done, failed,
            cancelled=cancelled,
        )  # fmt: skip

    def _recompile(self) -> tuple[RecompileResult | None, str]:
        ok, reason = self.targets_info.get(self.target, (False, "unknown target"))
        self.last_recompile = None
        if not ok:
            return None, f"not compiled: {self.target} unavailable ({reason})"
        from qdebug.targets.recompile import build_options

        target, step = self.target, len(self.debugger.history)
        pinned = self.compile_soc.get(target)
        self._busy(f"compiling for {target}" + ("" if pinned is None else f" for {pinned}, as its first compile"))
        try:
            res = self.debugger.recompile(target, build_options(target, soc=pinned))
        except Exception as exc:
            return None, f"compile for {target} failed: {type(exc).__name__}: {exc}"
        if res.ok:  # a later compile on the same SoC; one the target had to move (16-bit weights) moves it
            self._same_device_before(target, step, res)
            self.compile_soc[target] = res.soc  # after the before's compile: a cancel there leaves the pin as it was
        self.compiled_by_step[(target, step)] = res
        self.last_recompile = res
        return res, ""

    def _same_device_before(self, target: str, step: int, after: RecompileResult) -> None:
        """When ``after`` had to be compiled for another SoC than the compile before its step (QNN: 16-bit weights
        need HTP v73), compile the variant before it again for that SoC, so that the before/after compares one chip;
        its compile for the old SoC stays if the new one fails (the table then says why they differ)."""
        from dataclasses import replace

        from qdebug.targets.recompile import build_options

        before = self.compiled_by_step.get((target, step - 1)) if step else None
        if before is None or before.soc == after.soc:
            return
        name = self._variant_name(step - 1)
        self._busy(f"compiling {name} again for {after.compile.device}, the device after the step needed")
        again = self.debugger.recompile(target, build_options(target, soc=after.soc), step=step - 1)
        if again.ok:
            note = (
                f"compiled again for {again.compile.device} (first compiled for {before.compile.device}) so that "
                "before and after run on one device"
            )
            self.compiled_by_step[(target, step - 1)] = replace(again, notes=(*again.notes, note))

    def _compile_html(self, compiled: RecompileResult) -> str:
        """The compile table (:mod:`qdebug.render.target_table`): the current variant's compile beside the one of
        the variant its step started from, when that was compiled for the same target."""
        from qdebug.render.target_table import target_table_html

        step = len(self.debugger.history)
        before = self.compiled_by_step.get((self.target, step - 1)) if step else None
        if before is None:
            results, names = [compiled], [self._variant_name(step)]
        else:
            results, names = [before, compiled], [f"before: {self._variant_name(step - 1)}", "after"]
        where = self.targets_info.get(self.target, (True, ""))[1]  # e.g. "onnxruntime-qnn 1.23 (HTP simulator)"
        caption = f"compiled for {self.target}" + (f" — the target here: {where}" if where else "")
        return f"<div class='qd-compile'>{target_table_html(results, names, caption)}</div>"

    def _forget_compiles(self, *, new_variant: bool) -> None:
        """Drop the compiles of steps no longer in the history (an undo) or of the step a variant another panel made
        current takes (``new_variant``: not compiled yet), and show the current variant's compile when there is one."""
        step = len(self.debugger.history)
        last = step - 1 if new_variant else step
        self.compiled_by_step = {k: r for k, r in self.compiled_by_step.items() if k[1] <= last}
        self.last_recompile = self.compiled_by_step.get((self.target, step))
        if self.last_recompile is not None:
            self.compile_view.value = self._compile_html(self.last_recompile)
        else:
            self.compile_view.value = ""

    def _variant_name(self, step: int) -> str:
        """A variant in the compile table's head: the model the session started from, or the step's."""
        if step == 0:
            return self.debugger.baseline
        return "this variant" if step == len(self.debugger.history) else f"step {step}"

    def _before_after_html(
        self,
        before_db: float | None,
        before_ev: Evaluation | None,
        ev: Evaluation,
        compiled: RecompileResult | None,
    ) -> str:
        """The before/after table (before: the variant the step started from, named), then what the step changed
        (the Q/DQ pairs patched in your model) and its predicted vs measured gain."""
        rows = [("worst output SQNR", db_text(before_db), db_text(ev.output_sqnr_db))]
        if ev.accuracy is not None:
            rows.append(
                ("top-1 accuracy", pct_text(None if before_ev is None else before_ev.accuracy), pct_text(ev.accuracy))
            )
        if ev.report.task is not None:
            before_task = None if before_ev is None or before_ev.report.task is None else before_ev.report.task.value
            rows.append((f"task {ev.report.task.metric}", _task(before_task), _task(ev.report.task.value)))
        body = "".join(
            f"<tr><th>{html.escape(k)}</th><td class='qd-before'>{html.escape(a)}</td>"
            f"<td class='qd-after'>{html.escape(b)}</td></tr>"
            for k, a, b in rows
        )
        first = len(self.debugger.history) <= 1
        before_name = self.debugger.baseline if first else "the previous step"
        out = (
            f"<table class='qd-before-after'><tr><th></th><th>before: {html.escape(before_name)}</th>"
            f"<th>after</th></tr>{body}</table>{self._changes_html()}"
        )
        if compiled is not None:
            out += self._compile_html(compiled)
        return out

    def show_applied(self) -> None:
        """Show a variant another panel made current (the Fix tab's Apply, a diagnostic's remedy): the views, the
        before/after, the message."""
        hist = self.debugger.history
        ev = hist[-1]
        before_ev = hist[-2] if len(hist) > 1 else None
        gain = self.debugger.last_gain
        self.promotion = []
        self.refresh()
        self._forget_compiles(new_variant=True)
        self.download.value = ""  # links written before this step offer another variant's files
        self.plan_view.value = ""
        self.before_after.value = self._before_after_html(None if gain is None else gain.before_db, before_ev, ev, None)
        if ev.comparison is not None:
            self.comparison_box.children = [figure("comparison_figure", ev.comparison, css="qd-comparison")]
        what = "fix" if self.debugger.applied_fix else "remedy"
        self._say(self.fix_message, f"{what} applied: output SQNR {db_text(ev.output_sqnr_db)} (Undo goes back)")

    def _changes_html(self) -> str:
        """What the current step changed, in words: the patched Q/DQ pairs (your model) or the re-quantization (a
        model qdebug quantized), and the estimate beside the measurement."""
        dbg = self.debugger
        patch = dbg.changes
        step = dbg.step
        if dbg.applied_fix:
            what = "the Fix tab's fixed model (its remedies as the fix chose them; its recipe is the fix's)"
        elif step is not None and step.remedy is not None:
            what = step.remedy.describe()
        elif patch is not None:
            what = patch.describe()
        else:
            what = (
                f"re-quantized from the same calibration ranges as {dbg.baseline}, with "
                f"{', '.join(dbg.promoted) or 'nothing'} in 16 bits"
            )
        gain = dbg.last_gain
        said = "" if gain is None else f"<p class='qd-step-gain'>this step: {html.escape(gain.text())}</p>"
        return f"{said}<pre class='qd-changes' style='white-space:pre-wrap'>{html.escape(what)}</pre>"

    def on_undo_clicked(self, b: Any = None) -> None:
        """Return to the variant before the last promotion."""
        undone = self.debugger.undo()
        if undone is None:
            self._say(self.fix_message, "nothing to undo")
            return
        self.refresh()
        self._forget_compiles(new_variant=False)
        self.download.value = ""  # the links offered the undone variant's files
        self.before_after.value = ""
        self.plan_view.value = ""
        self.comparison_box.children = []
        self._say(
            self.fix_message,
            f"undone {step_label(undone.name)}: output SQNR back to {db_text(self.debugger.report.min_output_sqnr_db)}",
        )

    def on_export_clicked(self, b: Any = None) -> None:
        """Write the current overrides JSON (atomically) and offer it as a download link."""
        try:
            path = self.debugger.export_overrides(self.export_path)
        except Exception as exc:
            self._say(self.fix_message, f"export failed: {type(exc).__name__}: {exc}", "error")
            return
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        self.download.value = (
            f"<a class='qd-download' download='{html.escape(path.name)}' "
            f"href='data:application/json;base64,{data}'>download {html.escape(path.name)}</a>"
            f" <span class='qd-export-path'>{html.escape(hide_paths(str(path), self.hidden_folders))}</span>"
        )
        self._say(self.fix_message, f"overrides written to {path}", "ok")

    def on_export_fix_clicked(self, b: Any = None) -> dict[str, Path]:
        """Write the current variant's QDQ model, its recipe (the CLI rebuilds the same model from it) and, when it
        was compiled for the chosen target, the compiled files, and offer them as download links."""
        from .fix_panel import links_html

        folder = self.export_path.parent / "promoted"  # the Fix tab's "fixed" folder holds its own files
        try:
            saved = self.debugger.export_fix(folder, self.target)
        except Exception as exc:
            self._say(self.fix_message, f"download failed: {type(exc).__name__}: {exc}", "error")
            return {}
        how = (
            "qdebug quantize -f FLOAT --quant-model YOUR.qdq.onnx --overrides RECIPE -o OUT"
            if self.debugger.quant_model is not None
            else "qdebug quantize -f FLOAT --overrides RECIPE -o OUT"
        )
        self.download.value = (
            links_html(saved, self.hidden_folders)
            + f"<p class='qd-rebuild'>rebuild it: <code>{html.escape(how)}</code></p>"
        )
        self._say(self.fix_message, f"fixed model and recipe written to {folder}", "ok")
        return saved
