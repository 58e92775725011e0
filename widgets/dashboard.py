"""``Dashboard``: the no-code entry point behind ``notebooks/dashboard.ipynb`` (served by Voila, ``make dashboard``).

The user picks a float model (a bundled sample, a file on the server via a small file browser, or an upload of at
most :data:`MAX_UPLOAD_MB` MB), optionally a quantized model and a data file (or synthetic data), a target and a
precision, and presses Run; the :class:`~widgets.app.DebuggerApp` then appears below. Every failure becomes a
readable message in the page (an unexpected one also writes its traceback to ``error.log`` in the run's folder),
and the form stays usable for the next attempt. Uploads are written atomically into a private run folder; the
user's own files are only read.
"""

from __future__ import annotations

import atexit
import html
import os
import re
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import traitlets as tr

from qdebug.cli.dashboard import upload_limit_mb
from qdebug.config import QuantConfig
from qdebug.errors import EXIT_USAGE, QDebugError
from qdebug.samples import SAMPLE_DIR, list_samples

from .status import StepClock, user_text, verdict

if TYPE_CHECKING:
    from qdebug.mixed.target_fixes import TargetFixes

#: Largest upload accepted (MB). Uploads travel through the kernel's websocket as one message; bigger models belong
#: on the server, chosen with the file browser. ``QDEBUG_MAX_UPLOAD_MB`` changes it.
MAX_UPLOAD_MB = upload_limit_mb()  # validated as the CLI validates it: a bad value is one line naming the variable
#: Debug samples used by the dashboard (enough for stable SQNR on the samples, quick on a laptop).
DEBUG_SAMPLES = 64
#: The precisions offered per target (fp16 compiles without quantizing: nothing for the debugger to show).

SOURCES = (("bundled sample", "sample"), ("file on the server", "server"), ("upload", "upload"))
DATA_CHOICES = (
    ("the sample's calibration data", "sample"),
    ("synthetic (random inputs)", "synthetic"),
    ("file on the server (.npz)", "server"),
    ("upload (.npz)", "upload"),
)


class DashboardInputError(QDebugError):
    """The form is incomplete or an upload is unusable (shown in the page, never raised to Voila)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class RunInputs:
    """What one press of Run resolved the form to."""

    float_model: Path
    quant_model: Path | None
    data: Path | None
    eval_data: Path | None
    target: str
    precision: str


def _in_kernel() -> bool:
    """Whether this runs in a live Jupyter kernel (Voila's, a notebook's): its page can send a Cancel while a job
    runs only if the job leaves the kernel free."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def _safe_name(name: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name).lstrip(".")
    return base or "upload"


def _upload_item(value: Any) -> tuple[str, bytes] | None:
    """(name, content) of a FileUpload's single file (ipywidgets 8: a tuple of dicts with a memoryview)."""
    items = list(value or ())
    if not items:
        return None
    item = items[0]
    return str(item["name"]), bytes(item["content"])


class OutsideRootError(DashboardInputError):
    """A typed or picked path leaves the dashboard's folder (``QDEBUG_DASHBOARD_ROOT``, ``qdebug dashboard --root``)."""


def confined(root: Path, path: str | Path, what: str) -> Path:
    """``path`` resolved (symbolic links and ``..`` followed), which must lie inside ``root``; relative paths are
    relative to ``root``. Anything else is an :class:`OutsideRootError` naming the folder."""
    base = root.resolve()
    p = Path(path).expanduser()
    full = (p if p.is_absolute() else base / p).resolve()
    if full != base and base not in full.parents:
        raise OutsideRootError(
            f"{what} {str(path)!r} is outside the dashboard's folder {base} (set by --root / QDEBUG_DASHBOARD_ROOT); "
            "put the file there"
        )
    return full


class FileBrowser(w.VBox):  # type: ignore[misc]
    """A minimal server-side file chooser inside ``root``: a folder listing (folders and files with ``suffixes``)
    and a path box. It never lists above ``root`` (the paths typed are checked by :func:`confined` when used).

    Selecting a folder enters it; selecting a file puts its path in :attr:`path`, which can also be typed.
    """

    path = tr.Unicode("")

    def __init__(self, root: Path, suffixes: tuple[str, ...], css: str, **kwargs: Any) -> None:
        self.root = root.resolve()
        self.cwd = self.root
        self.suffixes = suffixes
        self.listing = w.Select(options=[], rows=8, layout=w.Layout(width="520px"))
        self.path_box = w.Text(
            placeholder=f"path of a {'/'.join(suffixes)} file in this folder", layout=w.Layout(width="520px")
        )
        self.here = w.HTML("")
        self.listing.add_class(f"{css}-browser")
        self.path_box.add_class(f"{css}-path")
        self.listing.observe(self._picked, names="value")
        w.link((self.path_box, "value"), (self, "path"))
        super().__init__([self.here, self.listing, self.path_box], **kwargs)
        self.show_dir(self.cwd)

    def show_dir(self, folder: Path) -> None:
        """List ``folder`` (unreadable folders say so instead of failing; a folder outside the root lists the root)."""
        folder = folder.resolve()
        if folder != self.root and self.root not in folder.parents:
            folder = self.root
        self.cwd = folder
        self.here.value = f"<code>{html.escape(str(folder))}</code>"
        try:
            entries = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name.lower()))
        except OSError as exc:
            self.here.value += f" <i>cannot list: {html.escape(str(exc))}</i>"
            entries = []
        opts: list[tuple[str, str]] = [("⬆ ..", str(folder.parent))] if folder != self.root else []
        for p in entries:
            if p.name.startswith("."):  # hidden files, .ipynb_checkpoints
                continue
            if p.is_dir():
                opts.append((f"📁 {p.name}/", str(p)))
            elif p.suffix.lower() in self.suffixes:
                opts.append((p.name, str(p)))
        self.listing.unobserve(self._picked, names="value")
        self.listing.options = opts
        self.listing.value = None
        self.listing.observe(self._picked, names="value")

    def _picked(self, change: dict[str, Any]) -> None:
        if not change["new"]:
            return
        p = Path(change["new"])
        if p.is_dir():
            self.show_dir(p)
        else:
            self.path = str(p)


class Dashboard(w.VBox):  # type: ignore[misc]
    """Pick model/data/target, Run, then debug and fix in the embedded :class:`~widgets.app.DebuggerApp`.

    ``root`` is the only folder whose files the page can read (the file browser and typed paths; default:
    ``$QDEBUG_DASHBOARD_ROOT``, else the working directory; the bundled samples are always offered). Each page
    gets its own folder for uploads and outputs: ``workdir`` itself when given, else a new folder inside
    ``$QDEBUG_DASHBOARD_WORKDIR`` or the system's temporary folder, removed by :meth:`close` — which runs when the
    page's kernel shuts down (Voila shuts it down when the page closes). ``samples_dir`` the bundled samples.
    ``background``: the debugger's promote, search and compile run on a thread with their progress and a Cancel
    beside their button, Run disabled meanwhile (default: in a live kernel, as under Voila; a script's or a test's
    clicks then return when the work is done).
    """

    def __init__(
        self,
        *,
        root: str | Path | None = None,
        workdir: str | Path | None = None,
        samples_dir: Path = SAMPLE_DIR,
        debug_samples: int = DEBUG_SAMPLES,
        background: bool | None = None,
        **kwargs: Any,
    ) -> None:
        # ``make dashboard`` passes these through the environment: Voila starts the kernel in notebooks/.
        root = root if root is not None else os.environ.get("QDEBUG_DASHBOARD_ROOT") or Path.cwd()
        self.root = Path(root).resolve()
        self._own_workdir = workdir is None
        if workdir is None:
            parent = os.environ.get("QDEBUG_DASHBOARD_WORKDIR") or None
            if parent:
                Path(parent).mkdir(parents=True, exist_ok=True)
            workdir = tempfile.mkdtemp(prefix="qdebug-dashboard-", dir=parent)
            atexit.register(self.release)  # the kernel exits when Voila shuts it down (page closed, or culled)
        self.workdir = Path(workdir)
        self.clock = StepClock()
        self.debug_samples = debug_samples
        self.background = _in_kernel() if background is None else background
        self.runs = 0
        self.app: Any = None
        self.debugger: Any = None
        try:
            self.samples = {s.name: s for s in list_samples(samples_dir)}
        except QDebugError:
            self.samples = {}
        self._make_widgets()
        self._wire()
        super().__init__([self._form(), self.app_box], **kwargs)
        self.add_class("qd-dashboard")
        self._layout_form()

    def release(self) -> None:
        """Release what this page holds: Netron if it was opened, and the page's folder if the dashboard made it."""
        app = getattr(self, "app", None)
        if app is not None and getattr(app, "netron", None) is not None:
            app.netron.stop()
            app.netron = None
        if getattr(self, "_own_workdir", False):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _make_widgets(self) -> None:
        """The form's widgets, each with a CSS class the browser tests select by."""
        self.source = w.ToggleButtons(options=SOURCES, value="sample" if self.samples else "server")
        self.sample_picker = w.Dropdown(options=sorted(self.samples), description="sample")
        self.sample_note = w.HTML("")
        self.model_browser = FileBrowser(self.root, (".onnx",), "qd-dash-model")
        self.model_upload = w.FileUpload(accept=".onnx", multiple=False, description="float model")
        self.quant_path = w.Text(placeholder="optional: path of its quantized QDQ model", description="quantized")
        self.quant_upload = w.FileUpload(accept=".onnx", multiple=False, description="quantized (opt.)")
        self.data_choice = w.Dropdown(options=DATA_CHOICES, value="sample", description="data")
        self.data_path = w.Text(placeholder="path of an .npz with one array per model input", description="data file")
        self.data_upload = w.FileUpload(accept=".npz", multiple=False, description="data (.npz)")
        self.target_picker = w.Dropdown(description="target")
        self.precision_picker = w.Dropdown(description="precision")
        self.precision_note = w.HTML("")
        self.target_note = w.HTML("")
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.message = w.HTML("")
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="320px"))
        self.progress_text = w.HTML("")
        self.app_box = w.VBox()
        for widget, cls in (
            (self.source, "qd-dash-source"),
            (self.sample_picker, "qd-dash-sample"),
            (self.model_upload, "qd-dash-upload"),
            (self.quant_path, "qd-dash-quant"),
            (self.quant_upload, "qd-dash-quant-upload"),
            (self.data_choice, "qd-dash-data-choice"),
            (self.data_path, "qd-dash-data"),
            (self.data_upload, "qd-dash-data-upload"),
            (self.target_picker, "qd-dash-target"),
            (self.precision_picker, "qd-dash-precision"),
            (self.precision_note, "qd-dash-precision-note"),
            (self.target_note, "qd-dash-target-note"),
            (self.run_button, "qd-dash-run"),
            (self.message, "qd-dash-message"),
            (self.progress, "qd-dash-progress"),
            (self.app_box, "qd-dash-app"),
        ):
            widget.add_class(cls)

    def _wire(self) -> None:
        """Re-layout on source/data/sample changes, precisions per target, the Run button."""
        self.model_panel = w.VBox()
        self.data_panel = w.VBox()
        self.source.observe(lambda ch: self._layout_form(), names="value")
        self.data_choice.observe(lambda ch: self._layout_form(), names="value")
        self.sample_picker.observe(lambda ch: self._layout_form(), names="value")
        self.target_picker.observe(self._target_changed, names="value")
        self.quant_path.observe(lambda ch: self._sync_precision(), names="value")
        self.quant_upload.observe(lambda ch: self._sync_precision(), names="value")
        self.run_button.on_click(self.on_run_clicked)
        for upload, what in (
            (self.model_upload, "the float model"),
            (self.quant_upload, "the quantized model"),
            (self.data_upload, "the data file"),
        ):
            upload.observe(lambda ch, what=what: self._received(what, ch["new"]), names="value")
        self._fill_targets()

    def _received(self, what: str, value: Any) -> None:
        """Say at once that an upload arrived, and whether it is over the limit (not only when Run is pressed)."""
        item = _upload_item(value)
        if item is None:
            return
        name, content = item
        size = len(content) / 1e6
        if size > MAX_UPLOAD_MB:
            self._say(
                f"{what} {name!r} is {size:.1f} MB, above the {MAX_UPLOAD_MB:g} MB upload limit: put it on the "
                "server and choose it there",
                "error",
            )
        else:
            self._say(f"{what} {name!r} received ({size:.1f} MB); press Run", "info")

    def _form(self) -> w.VBox:
        """The form: model, data, target, Run."""
        return w.VBox(
            [
                w.HTML(
                    "<h2>qdebug — where did my quantized model lose accuracy?</h2>"
                    "<p>1. Choose the float model (and, if you have one, its quantized version). 2. Choose data "
                    "(or synthetic inputs). 3. Choose where it will run. 4. Press <b>Run</b>. Then read the "
                    "heatmap and the table, select the worst tensors, press <b>Promote to 16-bit</b>, and export "
                    "the overrides file for the command line.</p>"
                ),
                w.HTML("<b>Model</b>"),
                self.source,
                self.model_panel,
                w.HTML("<b>Data</b>"),
                self.data_panel,
                w.HTML("<b>Target</b>"),
                w.HBox([self.target_picker, self.precision_picker]),
                self.precision_note,
                self.target_note,
                w.HBox([self.run_button, self.progress, self.progress_text]),
                self.message,
            ]
        )

    # ------------------------------------------------------------------ form
    def _fill_targets(self) -> None:
        from .session import QuantDebugger

        self.targets_info = QuantDebugger.available_targets()
        # The menu says only "(unavailable)": a reason cut to fit a menu ("needs the optional package 'o…") says
        # nothing; the note under the pickers gives it whole.
        self.target_picker.options = [
            (name if ok else f"{name} (unavailable)", name) for name, (ok, _) in self.targets_info.items()
        ]
        first = next(iter(self.targets_info))
        self.target_picker.value = first
        self._target_changed({"new": first})

    def _target_changed(self, change: dict[str, Any]) -> None:
        from qdebug.targets.base import get_target

        # Only precisions that quantize: the dashboard debugs a QDQ model against its float parent.
        ok, reason = self.targets_info.get(str(change["new"]), (True, ""))
        self.target_note.value = (
            ""
            if ok
            else f"<i class='qd-dash-target-why'>{html.escape(str(change['new']))} is unavailable here: "
            f"{html.escape(reason)}</i>"
        )
        opts = [p.name for p in get_target(str(change["new"])).precisions.values() if p.quantized]
        self.precision_picker.options = opts
        self.precision_picker.value = opts[0]

    def gives_quant_model(self) -> bool:
        """Whether the form names a quantized model of the user's (typed on the server, or uploaded)."""
        if self.source.value == "server":
            return bool(self.quant_path.value.strip())
        return self.source.value == "upload" and _upload_item(self.quant_upload.value) is not None

    def _sync_precision(self) -> None:
        """With your own QDQ model its own grids are used, so the precision picker is disabled and says so."""
        given = self.gives_quant_model()
        self.precision_picker.disabled = given
        self.precision_note.value = (
            "<i>precision: your model's own grids (the types and scales of your quantized model are used)</i>"
            if given
            else ""
        )

    def _layout_form(self) -> None:
        src = self.source.value
        self._sync_precision()
        if src == "sample":
            s = self.samples.get(str(self.sample_picker.value))
            self.sample_note.value = f"<i>{html.escape(s.description)}</i>" if s else ""
            self.model_panel.children = [self.sample_picker, self.sample_note]
        elif src == "server":
            self.model_panel.children = [self.model_browser, self.quant_path]
        else:
            self.model_panel.children = [
                w.HTML(f"<i>at most {MAX_UPLOAD_MB:g} MB per file; larger models: use a file on the server</i>"),
                self.model_upload,
                self.quant_upload,
            ]
        choices = [c for c in DATA_CHOICES if src == "sample" or c[1] != "sample"]
        if [v for _, v in choices] != [v for _, v in self.data_choice.options]:
            current = self.data_choice.value
            self.data_choice.options = choices
            self.data_choice.value = current if current in [v for _, v in choices] else choices[0][1]
        extra: list[w.Widget] = []
        if self.data_choice.value == "server":
            extra = [self.data_path]
        elif self.data_choice.value == "upload":
            extra = [self.data_upload]
        self.data_panel.children = [self.data_choice, *extra]

    # ------------------------------------------------------------------ run
    def _store_upload(self, upload: w.FileUpload, what: str, suffix: str, run_dir: Path) -> Path | None:
        from qdebug.io import atomic_write_bytes

        item = _upload_item(upload.value)
        if item is None:
            return None
        name, content = item
        if len(content) > MAX_UPLOAD_MB * 1e6:
            raise DashboardInputError(
                f"{what} {name!r} is {len(content) / 1e6:.1f} MB, above the {MAX_UPLOAD_MB:g} MB upload limit: "
                "put it on the server and choose it there"
            )
        if not name.lower().endswith(suffix):
            raise DashboardInputError(f"{what} {name!r} is not a {suffix} file")
        return atomic_write_bytes(run_dir / "uploads" / _safe_name(name), content)

    def resolve_inputs(self, run_dir: Path) -> RunInputs:
        """The form as paths (uploads stored in ``run_dir``); a :class:`DashboardInputError` says what is missing."""
        src = self.source.value
        eval_data: Path | None = None
        quant: Path | None = None
        if src == "sample":
            s = self.samples.get(str(self.sample_picker.value))
            if s is None:
                raise DashboardInputError("choose a sample model")
            model = s.path
            eval_data = s.evaluation
        elif src == "server":
            if not self.model_browser.path.strip():
                raise DashboardInputError("choose a float model: click an .onnx file in the list or type its path")
            model = confined(self.root, self.model_browser.path.strip(), "the float model")
            if self.quant_path.value.strip():
                quant = confined(self.root, self.quant_path.value.strip(), "the quantized model")
        else:
            stored = self._store_upload(self.model_upload, "the float model", ".onnx", run_dir)
            if stored is None:
                raise DashboardInputError("upload a float model (.onnx)")
            model = stored
            quant = self._store_upload(self.quant_upload, "the quantized model", ".onnx", run_dir)
        choice = self.data_choice.value
        data: Path | None
        if choice == "sample":
            s = self.samples[str(self.sample_picker.value)]
            data = s.calibration
        elif choice == "synthetic":
            data = None
        elif choice == "server":
            if not self.data_path.value.strip():
                raise DashboardInputError("type the path of the data file (.npz), or choose synthetic data")
            data = confined(self.root, self.data_path.value.strip(), "the data file")
        else:
            data = self._store_upload(self.data_upload, "the data file", ".npz", run_dir)
            if data is None:
                raise DashboardInputError("upload a data file (.npz), or choose synthetic data")
        target = str(self.target_picker.value)
        return RunInputs(model, quant, data, eval_data, target, str(self.precision_picker.value))

    def _progress(self, done: int, total: int, message: str) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        self.progress_text.value = (
            f"<span class='qd-dash-progress-text'>{html.escape(self.clock.text(done, total, message))}</span>"
        )

    def _app_busy(self, busy: bool) -> None:
        """While the debugger runs a job (promote, search, compile), Run cannot start another session."""
        self.run_button.disabled = busy

    def _end_progress(self, *, done: bool = False) -> None:
        """The progress line when the work ends: a full bar (done) or an empty one, never the last step's words."""
        self.progress.max = 1
        self.progress.value = 1 if done else 0
        self.progress_text.value = ""

    def _say(self, text: str, kind: str = "info", colour: str | None = None, extra: str = "") -> None:
        colour = colour or {"error": "#c92a2a", "ok": "#2b8a3e"}.get(kind, "#495057")
        self.message.value = f"<div class='qd-dash-{kind} {extra}' style='color:{colour}'>{html.escape(text)}</div>"

    def on_run_clicked(self, b: Any = None) -> None:
        """Resolve the form, quantize/debug, and show the debugger; failures become a message, never a traceback."""
        from qdebug.build_inputs import resolve_config
        from qdebug.debugger import DebugOptions

        from .app import DebuggerApp
        from .session import QuantDebugger

        if self.app is not None and self.app.job_running:  # Run is disabled meanwhile; a late click does nothing
            return
        self.runs += 1
        run_dir = self.workdir / f"run{self.runs}"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_button.disabled = True
        if self.app is not None:
            self.app.set_busy(True)  # the previous debugger's buttons: its session is being replaced
        self._say("working… (the progress line above says on what)")
        try:
            inputs = self.resolve_inputs(run_dir)
            config = resolve_config(inputs.target, inputs.precision)
            float_model, quant_model, config, fixes = self._prepare_float(inputs, config, run_dir)
            label = "label" if inputs.eval_data is not None else None
            dbg = QuantDebugger(
                float_model,
                quant_model,
                data=inputs.data,
                config=config,
                debug_data=inputs.eval_data if inputs.eval_data is not None else inputs.data,
                eval_data=inputs.eval_data,
                workdir=run_dir / "session",
                debug_options=DebugOptions(num_samples=self.debug_samples, ignore_data_keys=(label,) if label else ()),
                progress=self._progress,
                target_fixes=fixes or False,  # recorded on its search results and exported overrides
            )
            app = DebuggerApp(
                dbg, export_path=run_dir / "overrides.json", target=inputs.target, background=self.background
            )
            app.busy_listeners.append(self._app_busy)
            app.hidden_folders = (self.workdir,)  # its messages name the page's files by name, not server paths
            app.fix_panel.hidden_folders = app.hidden_folders  # the Fix tab's messages and links too
        except Exception as exc:  # a bug too gets a sentence in the page; its traceback goes to the run's error.log
            if not isinstance(exc, QDebugError):
                (run_dir / "error.log").write_text(traceback.format_exc(), encoding="utf-8")
            self._end_progress()
            self._say(f"Could not debug this model: {user_text(exc, [self.workdir])}", "error")
            return
        finally:
            self.run_button.disabled = False
        self._end_progress(done=True)
        self.debugger, self.app = dbg, app
        self.app_box.children = [app]
        v = verdict(dbg.report.min_output_sqnr_db)
        self._say(
            f"{float_model.name}: {len(dbg.report.activations)} tensors debugged; {v.text}.",
            "ok",
            colour=v.colour,
            extra=f"qd-verdict-{v.kind}",
        )
        # Run also compiles for the chosen target (as `qdebug build` does), so its report is there before a fix.
        app.compile_current()

    def _prepare_float(
        self, inputs: RunInputs, config: QuantConfig | None, run_dir: Path
    ) -> tuple[Path, Path | None, QuantConfig | None, TargetFixes | None]:
        """The models as the target needs them, with the compatibility fixes ``qdebug build`` applies
        (:func:`qdebug.targets.prepare.prepare_models`: copies in the run folder, the user's files only read). Returns
        (float model, QDQ model, config, the fixes applied to a float model quantized here: what ``qdebug search
        --target`` applies too, so the search tab searches the model ``qdebug build`` will quantize, and its results
        say so)."""
        from qdebug.mixed.target_fixes import TargetFixes
        from qdebug.model_io import file_sha256
        from qdebug.targets.base import BuildOptions
        from qdebug.targets.prepare import prepare_models

        options = BuildOptions(inputs.target, inputs.precision)
        ready = prepare_models(
            inputs.float_model, inputs.quant_model, options, config, inputs.data, run_dir,
            progress=lambda message: self._progress(0, 1, message),
        )  # fmt: skip
        if ready.fixes is None:
            return ready.float_model, ready.quant_model, ready.config, None
        fixes = TargetFixes(inputs.target, ready.fixes, file_sha256(inputs.float_model))
        return ready.float_model, ready.quant_model, ready.config, fixes


__all__ = ["DATA_CHOICES", "MAX_UPLOAD_MB", "Dashboard", "DashboardInputError", "FileBrowser", "RunInputs"]
