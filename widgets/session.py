"""``QuantDebugger``: the user-facing object behind the dashboard. It owns the engine calls, the current
quantized variant and the history of applied promotions; it holds no widget (the views in
:mod:`widgets.app` keep only view state and call into it).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions
from qdebug.errors import ConfigError
from qdebug.mixed.session import DataLike, Evaluation, MixedPrecisionSession
from qdebug.model_io import file_sha256, load_model
from qdebug.pairing import pair_models
from qdebug.render.fmt import fmt_db_text
from qdebug.tensor_values import TensorValues

from .session_steps import Step, StepGain, suggestion_line, zip_folder

if TYPE_CHECKING:
    from qdebug.findings import Diagnostics, Remedy
    from qdebug.fix import FixOptions, FixResult
    from qdebug.mixed.overrides import OverridesFile
    from qdebug.mixed.patch import PatchResult
    from qdebug.mixed.promote import PromotionPlan
    from qdebug.mixed.search import SearchGoal, SearchResult
    from qdebug.mixed.suggest import Suggestion
    from qdebug.mixed.target_fixes import TargetFixes
    from qdebug.quantizer import QuantizeResult
    from qdebug.report import DebugReport
    from qdebug.targets.recompile import RecompileResult
    from qdebug.task_metrics import MetricSpec

#: ``progress(done, total, message)`` — called by long operations so a view can show where they are.
ProgressCallback = Callable[[int, int, str], None]

#: Targets every machine has (ORT's CPU provider validates the QDQ model); the others come from the registry.
CPU_TARGET = "cpu"


class QuantDebugger:
    """Debug a quantized model and fix it by promoting tensors to 16 bits, one undoable step at a time.

    With ``quant_model=None`` the float model is quantized (``data`` calibrates, ``config`` the settings)
    through a :class:`~qdebug.mixed.session.MixedPrecisionSession`. With a ``quant_model`` the given pair is
    debugged as is and stays the base: a promotion re-quantizes the float model with *that model's* settings and
    calibration ranges (read from its Q/DQ parameters, :mod:`qdebug.mixed.given`; ``config`` only names the
    target), so "before" is always the user's model and a promotion changes only what it promotes.

    ``progress(done, total, message)`` is called by every long operation. ``target_fixes`` (see
    :class:`~qdebug.mixed.session.MixedPrecisionSession`): ``True`` debugs, promotes and searches the float model after
    the config's target's compatibility fixes, as ``qdebug search --target`` does; a
    :class:`~qdebug.mixed.target_fixes.TargetFixes` records fixes the caller applied already (the dashboard).
    ``metric``: a task metric (a built-in name, ``"module:function"``, a per-sample callable
    ``(float_outputs, quant_outputs[, label]) -> float`` or a :class:`~qdebug.task_metrics.TaskMetric`) scored
    against the float model on every debug pass (``report.task``), shown beside the output SQNR.
    """

    def __init__(
        self,
        float_model: str | Path,
        quant_model: str | Path | None = None,
        data: DataLike = None,
        config: QuantConfig | None = None,
        *,
        debug_data: DataLike = None,
        eval_data: str | Path | None = None,
        label_key: str = "label",
        workdir: str | Path | None = None,
        debug_options: DebugOptions | None = None,
        progress: ProgressCallback | None = None,
        target_fixes: bool | TargetFixes = False,
        metric: MetricSpec | None = None,
    ) -> None:
        if metric is not None:  # every debug pass (base, promotions, held-out) scores it: report.task
            opts = debug_options or DebugOptions(ignore_data_keys=(label_key,) if eval_data is not None else ())
            debug_options = replace(opts, task_metric=metric, task_label_key=label_key)
        self.float_model = Path(float_model)
        self.quant_model = Path(quant_model) if quant_model is not None else None
        self.progress = progress
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="qdebug-ui-"))
        # A folder made here goes with the debugger (close(), its collection, or the kernel's exit); a given one stays.
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.workdir), True) if workdir is None else None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.session = MixedPrecisionSession(
            self.float_model,
            data,
            config,
            debug_data=debug_data,
            eval_data=eval_data,
            label_key=label_key,
            debug_options=debug_options,
            workdir=self.workdir / "mixed",
            quant_model=self.quant_model,
            target_fixes=target_fixes,
        )
        self.float_model = self.session.float_path  # the target-fixed copy when the session made one
        self.session.progress = self._step  # the engine's own steps (debugging sample k/N, re-quantizing, …)
        self._given: DebugReport | None = None
        self._history: list[Evaluation] = []
        self._steps: list[Step] = []  # per applied step (beside _history): how it was made, predicted vs measured
        #: every measured step by tensor, kept through undo (a suggestion shown again says what it measured)
        self.measured: dict[str, StepGain] = {}
        self._tensor_cache: dict[tuple[str, int, str], TensorValues] = {}
        self.report  # noqa: B018 — quantize and debug now, so the object is ready when the view shows it

    def close(self) -> None:
        """Remove the working folder if the debugger made it (a folder the caller gave is left as it is)."""
        self.session.close()
        if self._cleanup is not None:
            self._cleanup()

    # ------------------------------------------------------------------ progress
    def _step(self, done: int, total: int, message: str) -> None:
        if self.progress is not None:
            self.progress(done, total, message)

    # ------------------------------------------------------------------ state
    @property
    def history(self) -> tuple[Evaluation, ...]:
        """Applied promotions, oldest first (the last one is current)."""
        return tuple(self._history)

    @property
    def current(self) -> Evaluation | None:
        """The evaluation the report comes from (None for a given pair before any promotion)."""
        if self._history:
            return self._history[-1]
        if self.quant_model is not None:
            return None
        return self._base_eval()

    def _base_eval(self) -> Evaluation:
        done = self.session.base_if_evaluated
        if done is not None:
            return done
        self._step(0, 2, "quantizing and debugging the base model")
        base = self.session.base
        self._step(2, 2, "base model quantized and debugged")
        return base

    @property
    def report(self) -> DebugReport:
        """The current :class:`~qdebug.report.DebugReport` (the last applied promotion, else the base)."""
        if self._history:
            return self._history[-1].report
        if self.quant_model is not None:
            if self._given is None:
                self._given = self.session.given_report
            assert self._given is not None
            return self._given
        return self._base_eval().report

    @property
    def config(self) -> QuantConfig:
        """The quantization config of the current variant (overrides included)."""
        return self._history[-1].config if self._history else self.session.base_config

    @property
    def quant_model_path(self) -> Path:
        """The QDQ model the current report describes."""
        if self._history:
            return Path(self._history[-1].quantization.model_path)
        if self.quant_model is not None:
            return self.quant_model
        return Path(self._base_eval().quantization.model_path)

    @property
    def changes(self) -> PatchResult | None:
        """What the current variant changed in the QDQ model you gave (``None``: no step applied, or the float
        model was quantized by qdebug)."""
        return self._steps[-1].patch if self._steps else None

    @property
    def last_gain(self) -> StepGain | None:
        """The current step's predicted and measured gain (``None``: no step applied)."""
        return self._steps[-1].gain if self._steps else None

    def suggestion_text(self, s: Suggestion) -> str:
        """A suggestion's line: the calibrated estimate, and once a promotion of it was measured, what it measured."""
        return suggestion_line(s, self.measured.get(s.tensor_name))

    @property
    def baseline(self) -> str:
        """What "before" is: the QDQ model you gave, else qdebug's quantization of the float model."""
        if self.quant_model is not None:
            return f"your model ({self.quant_model.name})"
        return "qdebug's quantization of your float model"

    @property
    def promoted(self) -> tuple[str, ...]:
        """The tensors the current config overrides."""
        return tuple(name for name, _ in self.config.tensor_overrides)

    # ------------------------------------------------------------------ operations
    def suggestions(self, top: int | None = 10) -> tuple[Suggestion, ...]:
        """Ranked promotion candidates for the current report (already-16-bit tensors excluded)."""
        picks = self.session.suggest(None, self.report)
        wide = {a.tensor_name for a in self.report.activations if a.quant_type and a.quant_type.endswith("16")}
        picks = tuple(s for s in picks if s.tensor_name not in wide)
        return picks if top is None else picks[:top]

    def promote(self, tensors: Iterable[str], to: str = "uint16", *, replace: bool = False) -> PromotionPlan:
        """Plan promoting ``tensors``: the fixed overrides, nothing quantized yet.

        On top of what is promoted already, or instead of it with ``replace=True`` (applying a point of a
        search, which was measured from the base).
        """
        if self._steps and self._steps[-1].plan is None:
            what = "a fix is" if self._steps[-1].fix_recipe is not None else "a remedy is"
            raise ConfigError(f"{what} applied: promotions start from the model before it; undo it to promote")
        wanted = tuple(dict.fromkeys([*(() if replace else self._requested()), *tensors]))
        if not wanted:
            raise ConfigError("select at least one tensor to promote")
        self._step(0, 1, f"planning the promotion of {len(wanted)} tensor(s)")
        plan = self.session.promote(wanted, to)
        self._step(1, 1, "promotion planned")
        return plan

    def _requested(self) -> tuple[str, ...]:
        return next((st.plan.requested for st in reversed(self._steps) if st.plan is not None), ())

    def apply(self, plan: PromotionPlan) -> Evaluation:
        """Re-quantize with ``plan`` (no re-calibration), re-debug, compare with the base; becomes current. The
        session reports each step (calibrating once, re-quantizing, debugging sample k/N)."""
        from qdebug.mixed.diagnosis import predicted_promotion_gain

        before = self.report
        added = tuple(t for t in plan.requested if t not in self._requested())
        predicted = predicted_promotion_gain(before, added)
        self.session.last_patch = None
        ev = self.session.evaluate(plan, name=f"step{len(self._history) + 1}")
        self._history.append(ev)
        gain = StepGain(added, before.min_output_sqnr_db, ev.report.min_output_sqnr_db, predicted)
        self._steps.append(Step(gain, plan=plan, patch=self.session.last_patch))
        self.measured.update(dict.fromkeys(added, gain))
        self._tensor_cache.clear()
        self._step(1, 1, f"applied: worst output SQNR {fmt_db_text(ev.output_sqnr_db)}")
        return ev

    def adopt_fix(self, result: FixResult) -> Evaluation:
        """Make a fix's model (:meth:`fix`: its remedies — weights, ranges, sentinel clamps, float fallback, 16-bit
        blocks — as it chose them) the current variant, debugged on the debug samples and compared with the base
        like a promotion; undo returns to the variant before it. Its recipe is the fix's
        (:func:`qdebug.fix.recipe.recipe_json`)."""
        from qdebug.fix.recipe import recipe_json
        from qdebug.io import atomic_write_bytes

        if result.model_path is None:
            raise ConfigError("this fix kept your model as it was: there is no fixed model to apply")
        chosen = result.trial(result.chosen)
        before = self.report
        name = f"step{len(self._history) + 1}"
        kept = self.workdir / f"{name}.fix.qdq.onnx"  # the fix's folder may be reused by the next fix
        atomic_write_bytes(kept, Path(result.model_path).read_bytes())
        ev = self.session.measure(kept, chosen.config or self.config, name)
        self._history.append(ev)
        gain = StepGain((), before.min_output_sqnr_db, ev.report.min_output_sqnr_db, None)
        self._steps.append(Step(gain, fix_recipe=recipe_json(result, self.float_model)))
        self._tensor_cache.clear()
        self._step(1, 1, f"fix applied: worst output SQNR {fmt_db_text(ev.output_sqnr_db)}")
        return ev

    @property
    def applied_fix(self) -> bool:
        """Whether the current variant is a fix's model (:meth:`adopt_fix`)."""
        return bool(self._steps) and self._steps[-1].fix_recipe is not None

    def apply_remedy(self, remedy: Remedy) -> Evaluation:
        """Apply a diagnostic's remedy (:meth:`diagnostics`) to the current model and measure it like a promotion:
        ``promote_16bit`` promotes its tensors; ``per_channel`` and ``float_fallback`` patch the current QDQ model
        (:mod:`qdebug.mixed.patch_remedies`: the weight quantized per channel from the float weight, the nodes run in
        float; every other byte kept). The remedies that change the whole quantization (percentile ranges, sentinel
        clamps, parameters) are measured by the Fix tab: a :class:`ConfigError` says so."""
        from qdebug.findings import RemedyKind
        from qdebug.io import atomic_save_model
        from qdebug.mixed.patch_remedies import keep_in_float, per_channel_weights

        if remedy.kind == RemedyKind.PROMOTE_16BIT:
            return self.apply(self.promote(remedy.tensors))
        if remedy.kind not in (RemedyKind.PER_CHANNEL, RemedyKind.FLOAT_FALLBACK):
            raise ConfigError(f"{remedy.kind.value.replace('_', ' ')} changes the whole quantization: the Fix tab "
                              "measures it (Fix, then Apply to the debugger)")  # fmt: skip
        if self.applied_fix:
            raise ConfigError("a fix is applied: undo it to apply a remedy to the model before it")
        before = self.report
        qm, fm = load_model(self.quant_model_path, "quantized model"), self.session.float_proto
        last = self._steps[-1] if self._steps else None
        per_channel, nodes = (last.per_channel, last.float_nodes) if last is not None else ((), ())
        if remedy.kind == RemedyKind.PER_CHANNEL:
            patched = per_channel_weights(qm, fm, remedy.tensors)
            per_channel = tuple(dict.fromkeys([*per_channel, *remedy.tensors]))
        else:
            patched = keep_in_float(qm, fm, remedy.nodes)
            nodes = tuple(dict.fromkeys([*nodes, *remedy.nodes]))
        if not patched.changes:
            raise ConfigError(f"{remedy.text}: already so in the current model, nothing to change")
        name = f"step{len(self._history) + 1}"
        path = atomic_save_model(patched.model, self.workdir / f"{name}.remedy.qdq.onnx")
        ev = self.session.measure(path, self.config, name)
        self._history.append(ev)
        gain = StepGain(remedy.tensors, before.min_output_sqnr_db, ev.report.min_output_sqnr_db, None)
        patch = last.patch if last is not None else None  # the promotions under it stay in the recipe
        self._steps.append(Step(gain, patch=patch, remedy=patched, per_channel=per_channel, float_nodes=nodes))
        self._tensor_cache.clear()
        self._step(1, 1, f"remedy applied: worst output SQNR {fmt_db_text(ev.output_sqnr_db)}")
        return ev

    @property
    def step(self) -> Step | None:
        """How the current variant was made (``None``: no step applied)."""
        return self._steps[-1] if self._steps else None

    def undo(self) -> Evaluation | None:
        """Drop the last applied promotion; returns it (None if there was nothing to undo)."""
        if not self._history:
            return None
        self._steps.pop()
        self._tensor_cache.clear()
        return self._history.pop()

    def reset(self) -> int:
        """Drop every applied promotion (back to the base); returns how many were dropped."""
        n = len(self._history)
        self._history.clear()
        self._steps.clear()
        self._tensor_cache.clear()
        return n

    def targets(self) -> dict[str, tuple[bool, str]]:
        """Every registered compile target with (available here, why not)."""
        return self.available_targets()

    @staticmethod
    def available_targets() -> dict[str, tuple[bool, str]]:
        """:meth:`targets` without a session (the dashboard lists them before anything is loaded)."""
        from qdebug.targets.base import available_targets

        return {name: (a.ok, a.reason) for name, a in available_targets().items()}

    def recompile(self, target: str = CPU_TARGET, options: Any = None, step: int | None = None) -> RecompileResult:
        """Compile the current variant (``step``: that step's; 0 the first model) for a registered ``target``;
        ``options``: a ``BuildOptions`` (e.g. an earlier compile's SoC, so that before and after share a device)."""
        self._step(0, 1, f"compiling for {target}")
        n = len(self._history) if step is None else step
        ev = self._history[n - 1] if n else (None if self.quant_model is not None else self._base_eval())
        if ev is None:  # a given pair: compile the given QDQ model
            from qdebug.targets.recompile import recompile

            assert self.quant_model is not None
            res = recompile(
                self.quant_model,
                self.workdir / f"given.{target}",
                target,
                float_model=self.float_model,
                data=self.session.target_data(),  # the samples a promoted variant is checked on: before = after
                options=options,
                progress=lambda msg: self._step(0, 1, msg),
            )
        else:
            res = self.session.recompile(ev, target, options)
        self._step(1, 1, f"compiled for {target}: {'ok' if res.ok else 'failed'}")
        return res

    def hold_out(self, samples: int | None) -> None:
        """Measure a search's choice again on ``samples`` samples of the debug data after the debug ones (``None``:
        no check; :meth:`~qdebug.mixed.session.MixedPrecisionSession.hold_out`)."""
        self.session.hold_out(samples)

    def search(self, goal: SearchGoal) -> SearchResult:
        """Automatic promotion search from the base (the history is not changed)."""
        self._step(0, 1, "searching promotions")
        # every measured point says so: "search, point prefix3: debugging sample 12/64"
        self.session.progress = lambda done, total, msg: self._step(done, total, f"search, point {msg}")
        try:
            res = self.session.search(goal)
        finally:
            self.session.progress = self._step
        self._step(1, 1, "search done")
        return res

    def fix(self, options: FixOptions | None = None, *, data: DataLike = None) -> FixResult:
        """``qdebug fix`` on this debugger's float model (and your QDQ model, if one was given): measured remedies,
        a fixed QDQ model within a 16-bit budget, checked on held-out samples (:func:`qdebug.fix.fix`; ``data``
        defaults to the calibration data, whose last samples are held out). Returns the
        :class:`~qdebug.fix.FixResult`; its ``model_path`` is in this debugger's working folder."""
        from qdebug.fix import fix

        work = self.workdir / f"fix{len(list(self.workdir.glob('fix*')))}"
        result = fix(self.float_model, data if data is not None else self.session.data, options,
                     quant_model=self.quant_model, workdir=work, progress=self._step)  # fmt: skip
        self._step(1, 1, "fix done")
        return result

    def save_fix(self, result: FixResult, folder: str | Path) -> dict[str, Path]:
        """Write a fix's model, its recipe (the overrides JSON ``qdebug quantize --overrides`` applies, or the PTQ
        library recipe that won), its measurements and its HTML report into ``folder``, all or none, named after
        the float model (``<stem>.fixed.qdq.onnx``, ``….recipe.json``, ``….fix.json``, ``<stem>.fix.html``): what
        ``qdebug fix -o … --html …`` writes. Returns ``{"model", "recipe", "result", "html"}`` → path."""
        from qdebug.cli.fix import write_fix

        out = Path(folder)
        stem = self.float_model.stem
        return write_fix(result, self.float_model, out / f"{stem}.fixed.qdq.onnx", out / f"{stem}.fix.html")

    def compile_points(self, result: SearchResult, spec: str, target: str, samples: int = 0) -> SearchResult:
        """The search result with the points ``spec`` names (``front``, ``chosen``, ``0,2``) compiled for ``target``
        and, with ``samples`` > 0, run on it (:func:`qdebug.mixed.target_cost.compile_points`)."""
        from qdebug.mixed.target_cost import compile_points, pick_points

        points = pick_points(result, spec)
        self._step(0, len(points), f"compiling {len(points)} search point(s) for {target}")
        out = compile_points(self.session, result, points, target, samples=samples)
        self._step(len(points), len(points), f"compiled {len(points)} search point(s) for {target}")
        return out

    def diagnostics(self, stats_samples: int = 8) -> Diagnostics:
        """Why tensors of the current variant lose precision, with the fix to try (:mod:`qdebug.diagnose`: the
        report, both models' constants and ``stats_samples`` samples of the debug data); kept per variant."""
        from qdebug.diagnose import diagnose_models

        report = self.report
        cached: tuple[DebugReport, Diagnostics] | None = getattr(self, "_diagnosed", None)
        if cached is None or cached[0] is not report:
            o = self.session.debug_options
            diags = diagnose_models(
                report, self.float_model, self.quant_model_path, self.session.debug_data, max_samples=stats_samples,
                input_shapes=o.input_shapes, synthetic={"seed": o.seed, "distribution": o.distribution},
            )  # fmt: skip
            self._diagnosed = (report, diags)
            return diags
        return cached[1]

    def measured_gains(self) -> dict[str, float]:
        """The worst output's SQNR gained by each applied promotion (dB, vs the variant before it; the first vs
        the re-quantized base), under each tensor that promotion added: the HTML report's *measured* gains."""
        if not self._history:
            return {}
        gains: dict[str, float] = {}
        prev_db = self._base_eval().report.min_output_sqnr_db
        seen: set[str] = set()
        for ev in self._history:
            now = ev.report.min_output_sqnr_db
            added = [t for t, _ in ev.config.tensor_overrides if t not in seen]
            seen.update(added)
            if now is not None and prev_db is not None:
                gains.update({t: now - prev_db for t in added})
            prev_db = now
        return gains

    def write_html_report(self, path: str | Path) -> Path:
        """The one-file HTML report of the current variant (:mod:`qdebug.render.html`): verdict, diagnostics,
        suggestions with predicted and measured gains, heatmaps, graph, worst tables."""
        from qdebug.render.html import write_report_html

        return write_report_html(
            path, self.report, diagnostics=self.diagnostics(), suggestions=self.suggestions(),
            measured_gains=self.measured_gains(),
        )  # fmt: skip

    def recipe(self) -> OverridesFile:
        """The current variant's recipe: what the CLI rebuilds the same model from (:mod:`qdebug.mixed.recipe`) — for
        your QDQ model, its patch (``qdebug quantize --quant-model``); else the overrides with every calibration
        range (``qdebug quantize --overrides``)."""
        from qdebug.mixed.recipe import patch_recipe, ranges_recipe

        sha, fixes = self.session.overrides_origin()
        kw: dict[str, Any] = {"model_sha256": sha, "requested": self._requested(), "target_fixes": fixes}
        st = self.step
        if self.quant_model is not None:
            from qdebug.mixed.patch_remedies import channel_axis

            patch = self.changes
            note = "qdebug dashboard: apply with qdebug quantize -f FLOAT --quant-model YOUR.qdq.onnx --overrides THIS"
            fm = self.session.float_proto
            return patch_recipe(
                () if patch is None else patch.patches, self.config, quant_model_sha256=file_sha256(self.quant_model),
                per_channel={w: channel_axis(fm, w) for w in (st.per_channel if st else ())},
                float_nodes=st.float_nodes if st else (), note=note, **kw,
            )  # fmt: skip
        if st is not None and (st.per_channel or st.float_nodes):
            raise ConfigError(
                "a remedy patched qdebug's own quantization: its recipe is for a QDQ model you give (quantize the "
                "float model with qdebug quantize, give that file as the quantized model, then apply the remedy)"
            )
        cache = (self.current or self._base_eval()).quantization.calibration_cache
        note = (
            "qdebug dashboard: apply with qdebug quantize -f FLOAT --overrides THIS (the ranges are the calibration's)"
        )
        return ranges_recipe(self.session.float_proto, self.config, cache, note=note, **kw)

    def export_fix(self, folder: str | Path, target: str | None = None) -> dict[str, Path]:
        """Write the current variant's QDQ model, its recipe (:meth:`recipe`) and, when the current variant was
        compiled for ``target`` here (:meth:`recompile`), the compiled files zipped, into ``folder``, all or none, named
        ``<stem>.fixed.qdq.onnx``, ``<stem>.recipe.json``, ``<stem>.<target>.zip``. Returns ``{"model", "recipe"
        [, "compiled"]}`` → path."""
        from qdebug.io import atomic_write_bytes, atomic_write_text

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        stem = self.float_model.name.removesuffix(".onnx")
        fixed = self._steps[-1].fix_recipe if self._steps else None
        recipe = self.recipe().to_json() if fixed is None else fixed
        written: dict[str, Path] = {}
        try:
            written["model"] = atomic_write_bytes(out / f"{stem}.fixed.qdq.onnx", self.quant_model_path.read_bytes())
            written["recipe"] = atomic_write_text(out / f"{stem}.recipe.json", recipe)
            compiled = None if target is None else self._compiled_zip(out, stem, target)
            if compiled is not None:
                written["compiled"] = compiled
        except BaseException:
            for p in written.values():
                p.unlink(missing_ok=True)
            raise
        return written

    def _compiled_zip(self, out: Path, stem: str, target: str) -> Path | None:
        """The last compile of the current variant for ``target`` (EPContext model, Deeploy's C code, ...) zipped."""
        ev = self.current
        name = "given" if ev is None else ev.name
        folder = (self.workdir if ev is None else self.workdir / "mixed") / f"{name}.{target}"
        return zip_folder(folder, out / f"{stem}.{target}.zip")

    def export_overrides(self, path: str | Path) -> Path:
        """Write the current config's overrides as an overrides JSON (loadable by ``OverridesFile.load``)."""
        from qdebug.mixed.overrides import OverridesFile

        # made for the target-fixed model: name the user's file and the fixes (`qdebug build` runs them again)
        sha, fixes = self.session.overrides_origin()
        ofile = OverridesFile.from_config(
            self.config,
            model_sha256=sha,
            requested=self._requested(),
            note="exported from the qdebug dashboard",
            target_fixes=fixes,
        )
        return ofile.save(path)

    # ------------------------------------------------------------------ on-demand values
    def tensor_values(self, name: str, sample: int = 0) -> TensorValues:
        """One tensor's values on one sample in the float and the quantized model, fetched now for that tensor
        only (:func:`qdebug.tensor_values.tensor_values`)."""
        from qdebug.data import open_data
        from qdebug.model_io import input_specs
        from qdebug.tensor_values import tensor_values

        qpath = self.quant_model_path
        key = (name, sample, str(qpath))
        if key in self._tensor_cache:
            return self._tensor_cache[key]
        act = self.report.activation(name)  # KeyError for an unknown tensor
        fm = self.session.float_proto
        qm = load_model(qpath, "quantized model")
        pair = next((p for p in pair_models(fm, qm).activations if p.tensor_name == name), None)
        if pair is None:
            raise KeyError(name)
        o = self.session.debug_options
        source = open_data(
            self.session.debug_data, input_specs(fm), num_samples=o.num_samples, seed=o.seed,
            distribution=o.distribution, input_shapes=o.input_shapes, ignore=o.ignore_data_keys,
        )  # fmt: skip
        tv = tensor_values(
            fm, qm, (name, pair.post_qdq), source, sample, providers=o.providers, params=(act.scale, act.zero_point)
        )
        self._tensor_cache[key] = tv
        return tv

    # ------------------------------------------------------------------ text for views
    def summary(self) -> Mapping[str, Any]:
        """The headline numbers of the current variant (worst output SQNR, accuracy, 16-bit tensors)."""
        ev = self.current
        return {
            "output_sqnr_db": self.report.min_output_sqnr_db,
            "task": self.report.task,
            "accuracy": None if ev is None else ev.accuracy,
            "float_accuracy": self.session.float_accuracy,
            "promoted": self.promoted,
            "steps": len(self._history),
        }

    @property
    def quantization(self) -> QuantizeResult | None:
        """The current variant's quantization (None for a given pair)."""
        ev = self.current
        return None if ev is None else ev.quantization

    @property
    def model_sha256(self) -> str:
        """Checksum of the current QDQ model."""
        return file_sha256(self.quant_model_path)


__all__ = ["CPU_TARGET", "ProgressCallback", "QuantDebugger", "StepGain", "TensorValues"]
