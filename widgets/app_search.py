"""The debugger's Search tab: the goal and the budgets, the automatic search from the base, its cost/quality curve
and Pareto front (optionally compiled for the chosen target), and a click on a point to apply it."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from qdebug.errors import ConfigError, DataError

from .app_base import AppBase, JobBar, button_layout, count_text, db_text
from .app_figure import figure, on_click

if TYPE_CHECKING:
    from qdebug.mixed.search import SearchGoal, SearchPoint, SearchResult

__all__ = ["SearchFlow"]


class SearchFlow(AppBase):
    """The automatic search (a room of :class:`~widgets.app.DebuggerApp`)."""

    def _make_search_widgets(self) -> None:
        """The goal, strategy, budgets and hold-out inputs, and where the search's results go."""
        self.last_search: SearchResult | None = None
        self.goal_db = w.FloatText(description="goal dB", value=0.0)
        self.goal_drop = w.FloatText(description="max drop %", value=0.0)
        from qdebug.mixed.search import STRATEGIES  # the engine's list: a new strategy shows up here by itself

        from .search_form import SearchBudgets  # imports the search engine too: when the app is built, as above

        self.strategy_picker = w.Dropdown(description="strategy", options=list(STRATEGIES), value="prefix")
        self.budgets = SearchBudgets(str(self.strategy_picker.value))  # shown per strategy, as the CLI's options
        self.search_button = w.Button(description="Search", icon="search", layout=button_layout())
        # Samples the search never sees: its choice is measured again on them (qdebug search --holdout-samples K).
        self.holdout_box = w.Text(
            description="held-out samples", placeholder="none", style={"description_width": "initial"},
            layout=w.Layout(width="210px"),
            tooltip="How many samples after the debug ones the search never sees: the point it chooses is measured "
            "again on them, and a choice that only fits the debug samples is said (or replaced by one that holds). "
            "Empty: no check.",
        )  # fmt: skip
        self.search_summary = w.HTML("")
        self.search_job = JobBar("qd-search-job")  # the search's progress and Cancel, under its button
        # After the search: compile the front for the fix panel's target (what `qdebug search --compile-points front`
        # does), each point also run on the target over a few debug samples; the front table shows both.
        self.compile_front_box = w.Checkbox(description="compile the front for the target", value=False, indent=False)
        self.target_samples = w.BoundedIntText(description="samples on target", value=2, min=0, max=256)
        self.front_view = w.HTML("")
        self.pareto_box = w.Box()

    def _wire_search(self) -> None:
        """CSS classes for the browser tests, the Search button, the budgets shown per strategy."""
        for widget, cls in (
            (self.search_button, "qd-search"),
            (self.search_summary, "qd-search-summary"),
            (self.compile_front_box, "qd-compile-front"),
            (self.front_view, "qd-front-box"),
        ):
            widget.add_class(cls)
        self.search_button.on_click(self.on_search_clicked)
        self.strategy_picker.observe(lambda c: self.budgets.show_for(str(c["new"])), names="value")

    def _search_tab(self) -> w.VBox:
        """The tab: the goal and budgets over the curve and the front."""
        return w.VBox(
            [
                w.HTML(
                    "<b>Automatic search</b>: promote the fewest tensors that reach the goal (0 = no goal on "
                    "that axis). Click a point of the curve to apply it."
                ),
                w.HBox([self.goal_db, self.goal_drop, self.strategy_picker, self.search_button]),
                self.budgets.box,
                w.HBox([self.holdout_box, self.compile_front_box, self.target_samples]),
                self.search_job,
                self.search_summary,
                self.pareto_box,
                self.front_view,
            ]
        )

    def on_search_clicked(self, b: Any = None) -> None:
        """Run the automatic search from the base and draw its cost/quality curve (the history is unchanged)."""
        try:
            goal = self.search_goal()
            from .search_form import whole_number

            self.debugger.hold_out(whole_number("held-out samples", self.holdout_box.value, like=8))
        except (ConfigError, DataError) as exc:  # a goal, budget or sample count it cannot use: said, nothing starts
            self._say(self.search_summary, f"search not started: {exc}", "error")
            return

        def work() -> tuple[SearchResult, str]:
            self._busy("searching promotions (each point is re-quantized and measured)")
            res = self.debugger.search(goal)
            return self._compile_front(res) if self.compile_front_box.value else (res, "")

        def failed(exc: BaseException) -> None:
            self._say(self.search_summary, f"search failed: {type(exc).__name__}: {exc}", "error")

        self.run_job(self.search_job, self.search_summary, "the search", work, lambda r: self._searched(*r), failed)

    def _searched(self, res: SearchResult, note: str) -> None:
        """Show a finished search: its curve, its summary and its front."""
        self.last_search = res
        fig = figure("pareto_figure", res, css="qd-pareto")
        on_click(fig, self._on_pareto_click)
        self.pareto_box.children = [fig]
        self.search_summary.value = self._search_text(res)
        self.front_view.value = self._front_html(res, note)
        self.status = "search done: click a point of the curve to apply it" + (f"; {note}" if note else "")

    def search_goal(self) -> SearchGoal:
        """The goal of the tab's inputs, built as ``qdebug search`` builds it from its options
        (:func:`~qdebug.mixed.search.user_goal`): 0 dB or 0 % is no goal on that axis, an empty budget its default;
        a value it cannot use raises :class:`~qdebug.errors.ConfigError` naming the input."""
        from qdebug.mixed.search import user_goal

        db = float(self.goal_db.value) or None
        drop = float(self.goal_drop.value) or None
        if db is None and drop is None:
            raise ConfigError("set a goal first: goal dB (the worst output's SQNR to reach) and/or max drop % (top-1 "
                              "accuracy lost vs the float model)")  # fmt: skip
        if drop is not None and not 0 < drop < 100:
            raise ConfigError(f"max drop %: must be more than 0 and less than 100 (percentage points), got {drop:g}")
        return user_goal(
            str(self.strategy_picker.value), output_sqnr_db=db, max_accuracy_drop_points=drop, **self.budgets.values()
        )

    def _compile_front(self, res: SearchResult) -> tuple[SearchResult, str]:
        """The search's front compiled for the chosen target (and run on it); a target that is unavailable or a
        compile that fails is a note, the search's result stands."""
        ok, reason = self.targets_info.get(self.target, (False, "unknown target"))
        if not ok:
            return res, f"front not compiled: {self.target} unavailable ({reason})"
        self._busy(f"compiling the Pareto front for {self.target}")
        try:
            return self.debugger.compile_points(res, "front", self.target, int(self.target_samples.value)), ""
        except Exception as exc:
            return res, f"compiling the front for {self.target} failed: {type(exc).__name__}: {exc}"

    @staticmethod
    def _front_html(res: SearchResult, note: str = "") -> str:
        """The Pareto front as ``qdebug search`` prints it (same columns and cells); SPLIT rows in red."""
        from qdebug.render.search_table import front_columns, points_html, split_note

        front = res.pareto()
        out = (
            "<style>.qd-front td,.qd-front th{padding:1px 8px;text-align:left}"
            ".qd-front tr.qd-split td{color:#d62728;font-weight:bold}.qd-front tr.qd-chosen td{background:#fff3bf}"
            "</style><b>Pareto front</b> (every point measured; cost: 16-bit elements; # as in "
            "<code>qdebug search --compile-points</code>)" + points_html(front, front_columns(front))
        )
        split = split_note(front)
        if split:
            out += f"<p class='qd-split-note' style='color:#d62728'><b>{html.escape(split)}</b></p>"
        if note:
            out += f"<p class='qd-compile-note'>{html.escape(note)}</p>"
        return out

    @staticmethod
    def _search_text(res: SearchResult) -> str:
        """The search's outcome in one line: what ``qdebug search`` ends with (reached or not and why, evaluations,
        time), then the points on the curve and the chosen one."""
        from qdebug.render.search_table import outcome_line

        points = {p.step: p for p in (*res.steps, *res.evaluated)}
        chosen = res.steps[res.chosen_step] if res.steps else None
        start = points.get(0)
        worse = (
            chosen is not None
            and start is not None
            and chosen.output_sqnr_db is not None
            and start.output_sqnr_db is not None
            and chosen.output_sqnr_db < start.output_sqnr_db
        )
        text = f"{outcome_line(res)}; {count_text(len(points), 'point')} measured"  # the CLI's last line, then more
        if chosen is not None:
            name = chosen.label or f"step {chosen.step}"  # as the CLI's tables name it ("step 3: +x", "prefix 4")
            text += f"; chosen: {name}, {count_text(len(chosen.promoted), 'tensor')}, {db_text(chosen.output_sqnr_db)}"
        if worse:
            text += " — worse than the start: keep the current model or pick another point"
        if res.target_fixes is not None and res.target_fixes.changed:  # what `qdebug search --target` prints too
            text += f"; {res.target_fixes.describe()}"
        if res.holdout is not None:  # the CLI's "held out: …" line
            text += f"; held out ({res.holdout.samples} samples): {res.holdout.note}"
        return f"<span class='qd-search-result'>{html.escape(text)}</span>"

    def _on_pareto_click(self, trace: Any, points: Any, state: Any = None) -> None:
        idx = list(getattr(points, "point_inds", []) or [])
        if idx and getattr(trace, "customdata", None) is not None:
            self.on_pareto_point(int(trace.customdata[idx[0]]))

    def search_point(self, step: int) -> SearchPoint | None:
        """The measured point of the last search with that step number."""
        if self.last_search is None:
            return None
        for p in (*self.last_search.steps, *self.last_search.evaluated):
            if p.step == step:
                return p
        return None

    def on_pareto_point(self, step: int) -> None:
        """Apply a point of the search curve: promote exactly its tensors (replacing the current promotion)."""
        point = self.search_point(step)
        if point is None:
            self.status = f"no search point {step}"
            return
        if point.label == "all16":  # a different recipe (every activation 16-bit), not a promotion set
            self.status = "the all-16-bit point is the ceiling: quantize with activation_type uint16 to use it"
            return
        if not point.promoted:
            self.debugger.reset()
            self.refresh()
            self.before_after.value = ""
            self.status = "search point 0 is the base: every promotion dropped"
            return
        tensors = list(point.promoted)
        self._apply(lambda: self.debugger.promote(tensors, replace=True), f"search point {step}")
