"""``DebuggerApp``: the dashboard. It holds only view state (traitlets) and composes widgets; every number comes
from a :class:`~widgets.session.QuantDebugger`, every figure from a pure function of :mod:`widgets.figures`.

Handlers are plain methods (``on_promote_clicked``, ``on_undo_clicked``, ``on_export_clicked``, ``on_select``)
so behaviour is tested in Python by setting traits and calling them, without a browser.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import traitlets as tr

if TYPE_CHECKING:
    from qdebug.build import RecompileResult
    from qdebug.mixed.session import Evaluation
    from qdebug.mixed.suggest import Suggestion
    from widgets.session import QuantDebugger

#: Metrics the table sorts by and the graph colours by (columns of ``DebugReport.to_dataframe()``).
METRICS = ("local_sqnr_db", "cumulative_sqnr_db", "mse", "max_abs_error")
SORT_KEYS = ("topo_index", *METRICS)


def _db(v: float | None) -> str:
    if v is None:
        return "n/a"
    if math.isinf(v):
        return "+inf dB" if v > 0 else "-inf dB"
    return f"{v:.2f} dB"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f} %"


def _placeholder(what: str, why: str) -> w.HTML:
    return w.HTML(f"<div class='qd-placeholder'><i>{html.escape(what)} unavailable: {html.escape(why)}</i></div>")


def _weight_owners(float_model: Any, df: Any) -> dict[str, str] | None:
    """Map fused nodes (Conv followed by a removed Relu) to the tensor that shows their weights."""
    try:
        from widgets.figures import weight_owners

        return weight_owners(float_model, df)
    except Exception:  # the heatmap then leaves those weight cells blank, as documented
        return None


def _figure(name: str, *args: Any) -> w.Widget:
    """The figure ``widgets.figures.<name>(*args)`` as a widget, or a placeholder saying why there is none (the
    figures module may lack the function, plotly's FigureWidget needs anywidget)."""
    try:
        from widgets import figures
    except Exception as exc:
        return _placeholder(name, f"widgets.figures does not import ({type(exc).__name__}: {exc})")
    fn: Callable[..., Any] | None = getattr(figures, name, None)
    if fn is None:
        return _placeholder(name, f"widgets.figures has no {name}()")
    try:
        fig = fn(*args)
    except Exception as exc:  # a figure bug must not take the dashboard down
        return _placeholder(name, f"{type(exc).__name__}: {exc}")
    try:
        import plotly.graph_objects as go

        return go.FigureWidget(fig)
    except Exception:  # no anywidget: a static render in an Output, shown by the front end
        out = w.Output()
        out.figure = fig  # kept for callers and tests (there is no front end outside a kernel)
        try:
            from IPython import get_ipython

            if get_ipython() is not None:
                with out:
                    from IPython.display import display

                    display(fig)  # type: ignore[no-untyped-call]
        except ImportError:
            pass
        return out


class DebuggerApp(w.VBox):  # type: ignore[misc]
    """The interactive debugger for one :class:`~widgets.session.QuantDebugger`.

    View state lives in traitlets (``selected``, ``metric``, ``threshold``, ``sort_key``, ``target``,
    ``status``); the session owns the data and computation.
    """

    selected = tr.Unicode("", help="the inspected tensor").tag(sync=True)
    metric = tr.Enum(METRICS, default_value="cumulative_sqnr_db").tag(sync=True)
    threshold = tr.Float(20.0, help="SQNR below this (dB) is highlighted").tag(sync=True)
    sort_key = tr.Enum(SORT_KEYS, default_value="topo_index").tag(sync=True)
    target = tr.Unicode("cpu").tag(sync=True)
    status = tr.Unicode("").tag(sync=True)

    def __init__(self, debugger: QuantDebugger, *, export_path: str | Path | None = None, **kwargs: Any) -> None:
        self.debugger = debugger
        self.export_path = Path(export_path) if export_path is not None else debugger.workdir / "overrides.json"
        self.last_plan_text = ""
        self.last_recompile: RecompileResult | None = None
        self._layout: Any = None
        self.progress = w.IntProgress(value=0, min=0, max=1, description="", layout=w.Layout(width="320px"))
        self.status_line = w.HTML("")
        self.table = w.HTML("")
        self.inspector = w.HTML("<i>select a tensor</i>")
        self.heatmap_box = w.Box()
        self.graph_box = w.Box()
        self.histogram_box = w.Box()
        self.suggestion_boxes: dict[str, w.Checkbox] = {}
        self.suggestions_box = w.VBox()
        self.plan_view = w.HTML("")
        self.before_after = w.HTML("")
        self.download = w.HTML("")
        self.tensor_picker = w.Dropdown(description="tensor", options=[])
        self.metric_picker = w.Dropdown(description="metric", options=list(METRICS), value=self.metric)
        self.sort_picker = w.Dropdown(description="sort by", options=list(SORT_KEYS), value=self.sort_key)
        self.threshold_picker = w.FloatText(description="threshold dB", value=self.threshold)
        self.target_picker = w.Dropdown(description="target")
        self.target_note = w.HTML("")
        self.promote_button = w.Button(description="Promote to 16-bit", button_style="primary", icon="arrow-up")
        self.undo_button = w.Button(description="Undo", icon="undo")
        self.export_button = w.Button(description="Export overrides JSON", icon="download")
        for widget, cls in (
            (self.promote_button, "qd-promote"),
            (self.undo_button, "qd-undo"),
            (self.export_button, "qd-export"),
            (self.status_line, "qd-status"),
            (self.progress, "qd-progress"),
            (self.table, "qd-table"),
            (self.inspector, "qd-inspector"),
            (self.target_picker, "qd-target"),
        ):
            widget.add_class(cls)
        self.promote_button.on_click(self.on_promote_clicked)
        self.undo_button.on_click(self.on_undo_clicked)
        self.export_button.on_click(self.on_export_clicked)
        # Widgets ↔ traits: the pickers write the view state, the observers below redraw from it.
        w.link((self.metric_picker, "value"), (self, "metric"))
        w.link((self.sort_picker, "value"), (self, "sort_key"))
        w.link((self.threshold_picker, "value"), (self, "threshold"))
        self.tensor_picker.observe(self._on_picker, names="value")
        self.target_picker.observe(self._on_target_picker, names="value")

        controls = w.HBox([self.metric_picker, self.sort_picker, self.threshold_picker])
        fix = w.VBox(
            [
                w.HTML("<b>Suggestions</b>"),
                self.suggestions_box,
                w.HBox([self.target_picker, self.promote_button, self.undo_button, self.export_button]),
                self.target_note,
                self.plan_view,
                self.before_after,
                self.download,
            ]
        )
        tabs = w.Tab(children=[w.VBox([controls, self.table]), self.heatmap_box, self.graph_box])
        for i, title in enumerate(("Tensors", "Heatmap", "Graph")):
            tabs.set_title(i, title)
        inspect = w.VBox([self.tensor_picker, self.inspector, self.histogram_box])
        super().__init__(
            [w.HBox([self.progress, self.status_line]), tabs, w.HBox([inspect, fix])],
            **kwargs,
        )
        self.add_class("qd-app")
        debugger.progress = self._on_progress
        self._refresh_targets()
        self.refresh()

    # ------------------------------------------------------------------ progress and status
    def _on_progress(self, done: int, total: int, message: str) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        self.status = message

    @tr.observe("status")
    def _status_changed(self, change: dict[str, Any]) -> None:
        self.status_line.value = f"<span>{html.escape(str(change['new']))}</span>"

    def _busy(self, message: str) -> None:
        # Feedback before a long call: the front end shows it while the kernel works.
        self.progress.value = 0
        self.status = message

    # ------------------------------------------------------------------ rendering
    def refresh(self) -> None:
        """Redraw everything that depends on the current report."""
        report = self.debugger.report
        names = [a.tensor_name for a in report.activations]
        self.tensor_picker.options = names
        if self.selected not in names:
            self.selected = ""
        self._render_table()
        self._render_suggestions()
        df = report.to_dataframe()
        owners = _weight_owners(self.debugger.session.float_proto, df)
        self.heatmap_box.children = [_figure("layer_heatmap", df, report.weights_dataframe(), "h", owners)]
        self._render_graph()
        self._render_inspector()

    def _render_table(self) -> None:
        df = self.debugger.report.to_dataframe()
        cols = [
            c
            for c in (
                "topo_index",
                "tensor_name",
                "producer_op",
                "quant_type",
                "local_sqnr_db",
                "cumulative_sqnr_db",
                "mse",
                "max_abs_error",
            )
            if c in df.columns
        ]
        df = df[cols].sort_values(self.sort_key, na_position="first")
        low = float(self.threshold)

        def shade(v: Any) -> str:
            return "background-color: #f8d7da" if isinstance(v, float) and v < low else ""

        def mark(row: Any) -> list[str]:
            bold = "font-weight: bold" if row["tensor_name"] == self.selected else ""
            return [bold] * len(row)

        try:
            styler = df.style.apply(mark, axis=1).format(precision=2)
            styler = styler.map(shade, subset=[c for c in ("local_sqnr_db", "cumulative_sqnr_db") if c in cols])
            self.table.value = styler.hide(axis="index").to_html()
        except Exception:  # Styler needs jinja2: plain HTML then
            self.table.value = df.to_html(index=False, float_format=lambda v: f"{v:.2f}")

    def _render_suggestions(self) -> None:
        picks: tuple[Suggestion, ...] = self.debugger.suggestions()
        old = {n: b.value for n, b in self.suggestion_boxes.items()}
        self.suggestion_boxes = {}
        rows = []
        for s in picks:
            label = f"{s.tensor_name} ({s.producer_op}, {s.role}): est. +{s.estimated_output_gain_db:.1f} dB at output"
            box = w.Checkbox(value=old.get(s.tensor_name, False), description=label, indent=False)
            box.add_class("qd-suggestion")
            self.suggestion_boxes[s.tensor_name] = box
            rows.append(box)
        if not rows:
            rows = [w.HTML("<i>no promotion candidates</i>")]
        self.suggestions_box.children = rows

    def _render_graph(self) -> None:
        report = self.debugger.report
        if self._layout is None:  # promotions keep the graph's tensors: lay it out once
            try:
                from widgets.graph_layout import layered_layout

                names = [a.tensor_name for a in report.activations]
                edges = [(i, a.tensor_name) for a in report.activations for i in a.inputs]
                self._layout = layered_layout(names, edges, method="longest_path")
            except Exception:
                self._layout = None
        metric = "local" if self.metric.startswith("local") else "cumulative"
        fig = _figure("graph_figure", report.to_dataframe(), metric, self._layout, self.selected or None)
        for trace in getattr(fig, "data", ()):  # a FigureWidget: clicking a node selects its tensor
            if getattr(trace, "customdata", None) is not None and hasattr(trace, "on_click"):
                trace.on_click(self._on_graph_click)
        self.graph_box.children = [fig]

    def _on_graph_click(self, trace: Any, points: Any, state: Any = None) -> None:
        idx = list(getattr(points, "point_inds", []) or [])
        if idx:
            self.on_select(str(trace.customdata[idx[0]]))

    def _render_inspector(self) -> None:
        name = self.selected
        if not name:
            self.inspector.value = "<i>select a tensor</i>"
            self.histogram_box.children = []
            return
        a = self.debugger.report.activation(name)
        rows = [
            ("tensor", a.tensor_name),
            ("producer", f"{a.producer_op} ({a.producer_node})"),
            ("quant type", a.quant_type or "not quantized"),
            ("scale / zero point", f"{a.scale} / {a.zero_point}"),
            ("local SQNR", _db(a.local_sqnr_db)),
            ("cumulative SQNR", _db(a.cumulative_sqnr_db)),
            ("float range", f"[{a.float_min}, {a.float_max}]"),
        ]
        body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
        self.inspector.value = f"<table class='qd-inspector-table'>{body}</table>"
        try:
            tv = self.debugger.tensor_values(name)
        except Exception as exc:
            self.histogram_box.children = [_placeholder("histogram", f"{type(exc).__name__}: {exc}")]
            return
        self.histogram_box.children = [
            _figure("histogram_figure", tv.float_values, tv.quant_values, tv.scale, tv.zero_point)
        ]

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

    # ------------------------------------------------------------------ observers
    @tr.observe("selected")
    def _selected_changed(self, change: dict[str, Any]) -> None:
        if change["new"] and self.tensor_picker.value != change["new"]:
            self.tensor_picker.value = change["new"]
        if change["new"]:
            self.status = f"inspecting {change['new']}"
        self._render_inspector()
        self._render_table()

    @tr.observe("metric")
    def _metric_changed(self, change: dict[str, Any]) -> None:
        self._render_graph()

    @tr.observe("sort_key", "threshold")
    def _table_changed(self, change: dict[str, Any]) -> None:
        self._render_table()

    @tr.observe("target")
    def _target_changed(self, change: dict[str, Any]) -> None:
        if self.target_picker.value != change["new"]:
            self.target_picker.value = change["new"]

    def _on_picker(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.selected = change["new"]

    def _on_target_picker(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.target = change["new"]

    # ------------------------------------------------------------------ handlers
    def on_select(self, tensor: str) -> None:
        """Inspect ``tensor`` (what a click on the table, heatmap or graph does)."""
        self.selected = tensor

    def checked(self) -> list[str]:
        """The suggestions ticked by the user."""
        return [n for n, b in self.suggestion_boxes.items() if b.value]

    def on_promote_clicked(self, b: Any = None) -> None:
        """Promote the ticked suggestions (or the selected tensor): plan → apply → recompile → before/after."""
        tensors = self.checked() or ([self.selected] if self.selected else [])
        if not tensors:
            self.status = "tick at least one suggestion (or select a tensor) to promote"
            return
        before = self.debugger.report
        before_ev = self.debugger.current
        try:
            self._busy(f"planning the promotion of {', '.join(tensors)}")
            plan = self.debugger.promote(tensors)
            self.last_plan_text = plan.describe()
            self.plan_view.value = f"<pre class='qd-plan'>{html.escape(self.last_plan_text)}</pre>"
            self._busy(f"re-quantizing with {len(plan.overrides)} override(s) and re-debugging")
            ev = self.debugger.apply(plan)
        except Exception as exc:
            self.status = f"promotion failed: {type(exc).__name__}: {exc}"
            return
        compiled, note = self._recompile()
        for box in self.suggestion_boxes.values():
            box.value = False
        self.refresh()
        self.before_after.value = self._before_after_html(before.min_output_sqnr_db, before_ev, ev, compiled)
        self.status = (
            f"promoted {len(plan.promoted)} tensor(s): output SQNR {_db(before.min_output_sqnr_db)} → "
            f"{_db(ev.output_sqnr_db)}"
            + ("" if ev.accuracy is None else f", accuracy {_pct(ev.accuracy)}")
            + (f", {note}" if compiled is None else f", {self.target}: {'ok' if compiled.ok else 'failed'}")
        )

    def _recompile(self) -> tuple[RecompileResult | None, str]:
        ok, reason = self.targets_info.get(self.target, (False, "unknown target"))
        self.last_recompile = None
        if not ok:
            return None, f"not compiled: {self.target} unavailable ({reason})"
        self._busy(f"compiling for {self.target}")
        try:
            self.last_recompile = self.debugger.recompile(self.target)
        except Exception as exc:
            return None, f"compile for {self.target} failed: {type(exc).__name__}: {exc}"
        return self.last_recompile, ""

    def _before_after_html(
        self,
        before_db: float | None,
        before_ev: Evaluation | None,
        ev: Evaluation,
        compiled: RecompileResult | None,
    ) -> str:
        rows = [("worst output SQNR", _db(before_db), _db(ev.output_sqnr_db))]
        if ev.accuracy is not None:
            rows.append(("top-1 accuracy", _pct(None if before_ev is None else before_ev.accuracy), _pct(ev.accuracy)))
        body = "".join(
            f"<tr><th>{html.escape(k)}</th><td>{html.escape(a)}</td><td>{html.escape(b)}</td></tr>" for k, a, b in rows
        )
        out = f"<table class='qd-before-after'><tr><th></th><th>before</th><th>after</th></tr>{body}</table>"
        if compiled is not None:
            c = compiled.compile
            fallback = ", ".join(f"{op}×{n}" for op, n in c.fallback_by_op().items()) or "none"
            out += (
                f"<p>{html.escape(c.target)} {html.escape(c.device)}: {'ok' if compiled.ok else 'FAILED'}; "
                f"{c.accelerator_partitions} accelerator partition(s), {c.accelerator_nodes} node(s) on it, "
                f"{c.cpu_nodes} on the CPU; fallback: {html.escape(fallback)}</p>"
            )
            if compiled.problems:
                out += "<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in compiled.problems) + "</ul>"
        return out

    def on_undo_clicked(self, b: Any = None) -> None:
        """Return to the variant before the last promotion."""
        undone = self.debugger.undo()
        if undone is None:
            self.status = "nothing to undo"
            return
        self.refresh()
        self.before_after.value = ""
        self.plan_view.value = ""
        self.status = f"undone {undone.name}: output SQNR back to {_db(self.debugger.report.min_output_sqnr_db)}"

    def on_export_clicked(self, b: Any = None) -> None:
        """Write the current overrides JSON and offer it as a download link."""
        try:
            path = self.debugger.export_overrides(self.export_path)
        except Exception as exc:
            self.status = f"export failed: {type(exc).__name__}: {exc}"
            return
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        self.download.value = (
            f"<a class='qd-download' download='{html.escape(path.name)}' "
            f"href='data:application/json;base64,{data}'>download {html.escape(path.name)}</a>"
        )
        self.status = f"overrides written to {path}"

    def show(self) -> DebuggerApp:
        """The root widget (display it in a notebook or Voila)."""
        return self


__all__ = ["METRICS", "SORT_KEYS", "DebuggerApp"]
