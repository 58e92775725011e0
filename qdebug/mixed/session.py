"""A mixed-precision session: one float model, its data and base config; quantize once, then
promote, re-quantize from the cached calibration, re-debug and compare — as many times as needed.

The session owns the engine calls and caches (base quantization, calibration ranges, accuracies);
every operation returns a typed result. It is what the notebook views drive.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdebug.cluster import ClusterSpec
from qdebug.config import QuantConfig
from qdebug.data import DataSource
from qdebug.debugger import DebugOptions, WeightCache, debug
from qdebug.errors import ConfigError
from qdebug.io import atomic_save_model
from qdebug.mixed.compare import Accuracy, compare
from qdebug.mixed.evaluation import Evaluation, sixteen_bit_cost
from qdebug.mixed.given import GivenRecipe, overlay_ranges, read_recipe
from qdebug.mixed.promote import PromotionPlan, promote
from qdebug.mixed.search import SearchGoal, SearchResult, search
from qdebug.mixed.suggest import Suggestion, suggest
from qdebug.model_io import file_sha256, load_model
from qdebug.pairing import check_not_swapped
from qdebug.quantizer import QuantizeResult, count_quantized_nodes, quantize
from qdebug.report import DebugReport
from qdebug.targets.recompile import RecompileResult, recompile

if TYPE_CHECKING:
    from qdebug.mixed.patch import PatchResult
    from qdebug.mixed.target_fixes import TargetFixes

DataLike = str | Path | Mapping[str, np.ndarray] | DataSource | None


class MixedPrecisionSession:
    """Quantize ``float_model`` once, then explore promotions without re-calibrating.

    ``data`` calibrates; ``debug_data`` (default: ``data``) feeds every debug pass; ``eval_data`` is an
    optional labelled ``.npz`` (``label_key``) for top-1 accuracy; ``holdout_data`` (optional) are samples no search
    sees: a search measures the point it chose on them again (:meth:`evaluate_holdout`, :mod:`qdebug.mixed.holdout`).

    With a ``quant_model`` (a QDQ model the user made), that model *is* the base: its settings (types, symmetry,
    per-channel) replace ``config``'s (only the config's target is kept) and its Q/DQ parameters give the
    calibration ranges of every tensor it quantizes (:mod:`qdebug.mixed.given`), so a promotion changes only what
    was promoted and every comparison is against the user's model.

    ``target_fixes=True`` applies the config's target's compatibility fixes to the float model first (what
    ``qdebug build --target`` does before quantizing: :mod:`qdebug.mixed.target_fixes`), and the session works on
    that fixed copy (:attr:`float_path` in the working folder; :attr:`target_fixes` says which fixes ran):
    every quantization, debug pass and overrides file is of the model the target will compile.
    :attr:`float_sha256` stays the given file's (the model an overrides file is applied to). A
    :class:`~qdebug.mixed.target_fixes.TargetFixes` instead of ``True`` says the caller gave the fixed model already
    (it is recorded on the search results, nothing is applied).
    """

    def __init__(
        self,
        float_model: str | Path,
        data: DataLike = None,
        config: QuantConfig | None = None,
        *,
        debug_data: DataLike = None,
        eval_data: str | Path | None = None,
        label_key: str = "label",
        debug_options: DebugOptions | None = None,
        workdir: str | Path | None = None,
        quant_model: str | Path | None = None,
        target_fixes: bool | TargetFixes = False,
        holdout_data: DataLike = None,
    ) -> None:
        self.float_path = Path(float_model)
        self.float_proto = load_model(self.float_path, "float model")
        self.float_sha256 = file_sha256(self.float_path)
        self.data = data
        self.debug_data = debug_data if debug_data is not None else data
        self.holdout_data = holdout_data
        self.holdout_evaluations = 0  # debug passes on the held-out samples (not counted as search evaluations)
        self.base_config = config or QuantConfig()
        self.given_path = Path(quant_model) if quant_model is not None else None
        if self.given_path is not None:
            check_not_swapped(self.float_proto, self.given_path)  # before reading a recipe from a float model
        self.given_recipe = None if self.given_path is None else self._given_recipe(self.base_config.target)
        if self.given_recipe is not None:
            self.base_config = self.given_recipe.config
        if self.base_config.tensor_overrides and any(
            e.convert is not None for _, es in self.base_config.tensor_overrides for e in es
        ):
            raise ConfigError("the base config already holds mixed-precision converts; start from a plain config")
        self.eval_data = Path(eval_data) if eval_data is not None else None
        self.label_key = label_key
        self.debug_options = debug_options or DebugOptions(
            ignore_data_keys=(label_key,) if self.eval_data is not None else ()
        )
        # A folder the session made is the session's to remove (close(), or leaving a ``with`` block).
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="qdebug-mixed-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Also without close(): when the session is collected or the interpreter exits (a notebook's kernel).
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.workdir), True) if self._own_workdir else None
        self._base: Evaluation | None = None
        self._given_report: DebugReport | None = None
        #: what the last patch of the given model changed (:meth:`patch_given`; ``None``: no patch yet)
        self.last_patch: PatchResult | None = None
        #: ``progress(done, total, message)``: every long step says what it is doing (a UI shows it with an ETA)
        self.progress: Callable[[int, int, str], None] | None = None
        self._accuracy: dict[str, float] = {}
        self.requantizations = 0
        #: weight results shared by the session's debug passes: a variant re-measures only the weights it changed
        self.weights = WeightCache()
        self._held = contextlib.ExitStack()
        #: the target's compatibility fixes applied to the float model (``None``: the model is searched as given)
        self.target_fixes: TargetFixes | None = None
        if not isinstance(target_fixes, bool):  # the caller applied them (e.g. the dashboard): only recorded
            self.target_fixes = target_fixes
        elif target_fixes:
            if self.given_path is not None:
                self.close()
                raise ConfigError("target_fixes needs the session to quantize the float model (no quant_model)")
            try:
                self._apply_target_fixes()
            except BaseException:
                self.close()  # the folder the session made goes with the error
                raise

    # ------------------------------------------------------------------ base
    def close(self) -> None:
        """Remove the working folder if the session created it (a folder the caller gave is left as it is), and
        stop or leave the Ray cluster the ``with`` block held."""
        self._held.close()
        if self._cleanup is not None:
            self._cleanup()  # removes the folder once (later calls, and the finalizer at exit, do nothing)

    def __enter__(self) -> MixedPrecisionSession:
        if self.debug_options.cluster is not None:  # one cluster for every debug pass of the block, not one each
            from qdebug.cluster import connect

            self._held.enter_context(connect(self.debug_options.cluster))
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _apply_target_fixes(self) -> None:
        """The config's target's fixes on the float model, written to the working folder; the session switches to
        that copy and to the config the fixes return (a target without fixes changes nothing but is recorded)."""
        from qdebug.mixed.target_fixes import apply_target_fixes

        target = self.base_config.target
        self._say(0, 1, f"applying the {target} compatibility fixes to the float model")
        model, config, fixes = apply_target_fixes(
            self.float_proto, target, self.base_config, self.data,
            input_shapes=self.debug_options.input_shapes, label_key=self.label_key, given_sha256=self.float_sha256,
        )  # fmt: skip
        self.target_fixes = fixes
        if fixes.changed:
            path = self.workdir / f"{self.float_path.name.removesuffix('.onnx')}.{target}-fixed.onnx"
            atomic_save_model(model, path)
            self.float_path, self.float_proto = path, model
            self.base_config = config or self.base_config

    def overrides_origin(self) -> tuple[str, tuple[str, tuple[str, ...]] | None]:
        """What an overrides file made in this session is for: the sha256 of the float model file the user gave, and
        ``(target, fixes)`` when the session works on that model after the target's fixes that changed it
        (:attr:`qdebug.mixed.overrides.OverridesFile.target_fixes`), else ``None``."""
        f = self.target_fixes
        if f is None or not f.changed:
            return self.float_sha256, None
        return (f.given_sha256 or self.float_sha256), (f.target, f.changed)

    def _say(self, done: int, total: int, message: str) -> None:
        if self.progress is not None:
            self.progress(done, total, message)

    def _debug(self, qdq_model: str | Path, what: str) -> DebugReport:
        """``debug()`` of the float model against ``qdq_model``, reporting "<what>: debugging sample k/N"."""

        def each(done: int, total: int) -> None:
            self._say(done, total, f"{what}: debugging sample {done}/{total}")

        return debug(
            self.float_path, qdq_model, self.debug_data, self.debug_options, progress=each, weight_cache=self.weights
        )

    def _given_recipe(self, target: str) -> GivenRecipe:
        """The given model's recipe for ``target``, else for the CPU (a target whose rules the given settings break
        still gets the user's model as the base; the note says so)."""
        assert self.given_path is not None
        try:
            return read_recipe(self.given_path, target)
        except ConfigError as exc:
            r = read_recipe(self.given_path, "cpu")
            note = f"the given model's settings do not fit target {target!r} ({exc}); re-quantizing with them as is"
            return GivenRecipe(r.config, r.ranges, (*r.notes, note))

    @property
    def given_report(self) -> DebugReport | None:
        """The debug report of the given QDQ model (None without one); no calibration needed for it."""
        if self.given_path is None:
            return None
        if self._given_report is None:
            self._given_report = self._debug(self.given_path, "your quantized model")
        return self._given_report

    def _given_base(self) -> Evaluation:
        """The given model as the base: calibrate once for the tensors it leaves in float, then its own ranges on
        top (the cache every re-quantization reuses)."""
        assert self.given_path is not None and self.given_recipe is not None
        t0 = time.perf_counter()
        calibrated = self.workdir / "calibrated.qdq.onnx"
        self._say(0, 1, "calibrating the float model once (ranges for the tensors your model leaves in float)")
        q0 = quantize(self.float_path, self.data, self.base_config, calibrated, check=False)
        cache = overlay_ranges(q0.calibration_cache, self.given_recipe.ranges, self.workdir / "given.calib.json")
        calibrated.unlink(missing_ok=True)
        Path(q0.calibration_cache).unlink(missing_ok=True)
        quantized, total, qdq = count_quantized_nodes(load_model(self.given_path, "quantized model"))
        q = QuantizeResult(
            model_path=str(self.given_path),
            calibration_cache=str(cache),
            config=self.base_config,
            nodes_quantized=quantized,
            nodes_total=total,
            qdq_nodes=qdq,
            calibration_seconds=q0.calibration_seconds,
            qdq_seconds=0.0,
            num_calibration_samples=q0.num_calibration_samples,
            warnings=self.given_recipe.notes,
        )
        report = self.given_report
        assert report is not None
        return Evaluation(
            name="given",
            config=self.base_config,
            quantization=q,
            report=report,
            comparison=None,
            accuracy=self.accuracy(self.given_path),
            seconds=round(time.perf_counter() - t0, 4),
        )

    @property
    def base(self) -> Evaluation:
        """The base quantization (calibrated once) and its debug report; the given QDQ model when there is one."""
        if self._base is None and self.given_path is not None:
            self._base = self._given_base()
        if self._base is None:
            t0 = time.perf_counter()
            self._say(0, 1, "quantizing the float model (calibration, once per session)")
            # check=False: the base is the user's recipe exactly (its per-tensor weights are a finding, not a fix)
            q = quantize(self.float_path, self.data, self.base_config, self.workdir / "base.qdq.onnx", check=False)
            report = self._debug(q.model_path, "base model")
            self._base = Evaluation(
                name="base",
                config=self.base_config,
                quantization=q,
                report=report,
                comparison=None,
                accuracy=self.accuracy(q.model_path),
                seconds=round(time.perf_counter() - t0, 4),
            )
        return self._base

    @property
    def base_if_evaluated(self) -> Evaluation | None:
        """The base variant if it has been quantized and measured already (``None``: not yet; :attr:`base` makes it)."""
        return self._base

    @property
    def float_accuracy(self) -> float | None:
        """Top-1 accuracy of the float model (None without ``eval_data``)."""
        return self.accuracy(self.float_path)

    def accuracy(self, model_path: str | Path) -> float | None:
        """Top-1 accuracy on ``eval_data`` (cached per model file content)."""
        if self.eval_data is None:
            return None
        from qdebug.evaluate import top1_accuracy

        key = file_sha256(model_path)
        if key not in self._accuracy:
            self._accuracy[key] = top1_accuracy(model_path, self.eval_data, self.label_key)
        return self._accuracy[key]

    # ------------------------------------------------------------------ operations
    def suggest(self, top: int | None = 10, report: DebugReport | None = None) -> tuple[Suggestion, ...]:
        """Ranked promotion candidates (from the base report unless another is given); with a given QDQ model, only
        tensors it quantizes (one it keeps in float cannot be promoted by patching it)."""
        ranked = suggest(report or self.base.report, None if self.given_path is not None else top)
        if self.given_path is not None:
            ranked = tuple(s for s in ranked if s.tensor_name in self.given_quantized)[:top]
        return ranked

    def promote(self, tensors: Iterable[str], to: str = "uint16") -> PromotionPlan:
        """Plan a promotion (fixed overrides, shown before anything is re-quantized); with a given QDQ model, the
        tensors the fixer added that it keeps in float are left out of the plan (:meth:`PromotionPlan.without`): the
        patch leaves them as they are, so the plan shown is what the patch does."""
        plan = promote(self, tensors, to, config=self.base_config)
        if self.given_path is None:
            return plan
        touched = {*plan.promoted, *(c.tensor for c in plan.converts)}
        return plan.without(t for t in touched if t not in self.given_quantized)

    @functools.cached_property
    def given_quantized(self) -> frozenset[str]:
        """The activation tensors the given QDQ model quantizes (empty without one)."""
        from qdebug.mixed.patch import quantized_tensors

        if self.given_path is None:
            return frozenset()
        return quantized_tensors(load_model(self.given_path, "quantized model"))

    def requantize(self, config: QuantConfig, name: str | None = None) -> QuantizeResult:
        """Quantize with ``config`` reusing the base calibration ranges (one QDQ insertion, no calibration); one of
        :attr:`requantizations` (a search's evaluations)."""
        self.requantizations += 1
        return self._requantize(config, name)

    def _requantize(self, config: QuantConfig, name: str | None) -> QuantizeResult:
        """:meth:`requantize` without counting it; with a given model, a change of its activations' types is a patch
        of that model (:meth:`patch_given`) and the base's own file when nothing changes."""
        base = self.base
        tag = name or hashlib.sha256(config.to_json().encode()).hexdigest()[:12]
        if self.given_path is not None and self.patchable(config):
            return self.patch_given(config, self.workdir / f"{tag}.qdq.onnx")
        return quantize(
            self.float_path,
            self.data,
            config,
            self.workdir / f"{tag}.qdq.onnx",
            calibration_cache=base.quantization.calibration_cache,
            check=False,  # a search step follows its config exactly; the debug pass after it measures it
        )

    def patchable(self, config: QuantConfig) -> bool:
        """Whether ``config`` is the given model's recipe with only tensor overrides: it is then made by patching that
        model (:mod:`qdebug.mixed.patch`), every other Q/DQ kept (a tensor it keeps in float stays so)."""
        return self.given_path is not None and config.replace(tensor_overrides=()) == self.base_config

    def patch_given(self, config: QuantConfig, out: Path) -> QuantizeResult:
        """The given model with ``config``'s activation overrides applied to its own Q/DQ pairs, written to ``out``
        (the given file copied as is when there are none): :attr:`last_patch` says what changed."""
        from qdebug.io import atomic_write_bytes
        from qdebug.mixed.patch import patch_model

        assert self.given_path is not None
        t0 = time.perf_counter()
        given = load_model(self.given_path, "quantized model")
        result = patch_model(given, config.tensor_overrides, skip_float=True)
        if result.patches:
            atomic_save_model(result.model, out)
        else:  # nothing changed: the user's file byte for byte
            atomic_write_bytes(out, self.given_path.read_bytes())
        self.last_patch = result
        quantized, total, qdq = count_quantized_nodes(result.model)
        base = self.base.quantization
        return replace(
            base, model_path=str(out), config=config, nodes_quantized=quantized, nodes_total=total, qdq_nodes=qdq,
            calibration_seconds=0.0, qdq_seconds=round(time.perf_counter() - t0, 4), warnings=(),
        )  # fmt: skip

    def evaluate(self, config_or_plan: QuantConfig | PromotionPlan, name: str | None = None) -> Evaluation:
        """Re-quantize (no re-calibration), re-debug, and compare with the base."""
        config = config_or_plan.config if isinstance(config_or_plan, PromotionPlan) else config_or_plan
        t0 = time.perf_counter()
        what = name or "variant"
        self.base  # noqa: B018 — its calibration first (reported as its own step)
        self._say(0, 1, f"{what}: re-quantizing (calibration reused)")
        q = self.requantize(config, name)
        report = self._debug(q.model_path, what)
        return self._evaluation(config, name, q, report, t0)

    def hold_out(self, samples: int | None, data: DataLike = None) -> None:
        """Set :attr:`holdout_data`: ``samples`` samples of the debug data after the debug ones (those of
        ``debug_options.num_samples``), or of ``data`` (its first ``samples``; every one when ``samples`` is
        ``None``). ``samples=None`` without ``data``: no held-out check. A data set too short raises
        :class:`~qdebug.errors.DataError` naming it."""
        from qdebug.data import SYNTHETIC_SAMPLES, Window, open_data
        from qdebug.model_io import input_specs

        opts = self.debug_options
        if samples is not None and samples < 1:
            raise ConfigError(f"held-out samples must be 1 or more, got {samples}")
        if data is None and samples is None:
            self.holdout_data = None
            return

        def opened(d: DataLike, n: int | None) -> DataSource:
            return open_data(
                d, input_specs(self.float_proto), num_samples=n, seed=opts.seed, distribution=opts.distribution,
                input_shapes=opts.input_shapes, ignore=opts.ignore_data_keys,
            )  # fmt: skip

        if data is not None:
            self.holdout_data = opened(data, samples)
            return
        assert samples is not None
        n = opts.num_samples
        if n is None and self.debug_data is None:
            n = SYNTHETIC_SAMPLES  # what a debug pass generated: the held-out ones are the next seeded samples
        if n is None:
            raise ConfigError(
                "every sample of the debug data is debugged: held-out samples need fewer (debug_options.num_samples)"
            )
        self.holdout_data = Window(opened(self.debug_data, n + samples), n, n + samples)

    def evaluate_holdout(self, config: QuantConfig, name: str = "holdout") -> DebugReport:
        """``config`` quantized (calibration reused; the base's own model file when it is the base's config) and
        debugged on :attr:`holdout_data`: the same model measured on samples the search never saw. Not counted in
        :attr:`requantizations` (a search's evaluations), in :attr:`holdout_evaluations`."""
        if self.holdout_data is None:
            raise ConfigError("no held-out samples: give the session holdout_data")
        base = self.base
        if config == base.config:
            path = Path(base.quantization.model_path)
        else:
            path = Path(self._requantize(config, name).model_path)  # a check of a measured point: not counted
        self.holdout_evaluations += 1

        def each(done: int, total: int) -> None:
            self._say(done, total, f"{name}: held-out sample {done}/{total}")

        opts = replace(self.debug_options, num_samples=None, cluster=None)
        return debug(self.float_path, path, self.holdout_data, opts, progress=each, weight_cache=self.weights)

    def evaluate_many(self, plans: Sequence[PromotionPlan], names: Sequence[str]) -> list[Evaluation]:
        """:meth:`evaluate` of each plan, in order. With ``debug_options.cluster`` the debug passes run at once, one
        Ray task each (the re-quantizations stay here: they write the session's files); the same evaluations."""
        if self.debug_options.cluster is None:
            return [self.evaluate(p, name=n) for p, n in zip(plans, names, strict=True)]
        t0 = time.perf_counter()
        qs = [self.requantize(p.config, n) for p, n in zip(plans, names, strict=True)]
        opts = replace(self.debug_options, cluster=None)  # one task per candidate, each in one process
        reports = _debug_on_cluster(self.debug_options.cluster, self.float_path, qs, self.debug_data, opts)
        return [self._evaluation(p.config, n, q, r, t0) for p, n, q, r in zip(plans, names, qs, reports, strict=True)]

    def _evaluation(
        self, config: QuantConfig, name: str | None, q: QuantizeResult, report: DebugReport, t0: float
    ) -> Evaluation:
        acc = self.accuracy(q.model_path)
        base = self.base
        accuracy = None
        if acc is not None and base.accuracy is not None and self.float_accuracy is not None:
            accuracy = Accuracy(self.float_accuracy, base.accuracy, acc, _num_eval(self.eval_data))
        return Evaluation(
            name=name or Path(q.model_path).stem,
            config=config,
            quantization=q,
            report=report,
            comparison=compare(base.report, report, accuracy),
            accuracy=acc,
            seconds=round(time.perf_counter() - t0, 4),
        )

    def measure(self, model: str | Path, config: QuantConfig, name: str) -> Evaluation:
        """A QDQ model made elsewhere (e.g. a fix's model, quantized with ``config``) debugged on the debug samples and
        compared with the base, as :meth:`evaluate` does for a re-quantization; the file is only read."""
        t0 = time.perf_counter()
        self.base  # noqa: B018 — compared with the base
        path = Path(model)
        quantized, total, qdq = count_quantized_nodes(load_model(path, "quantized model"))
        q = replace(
            self.base.quantization, model_path=str(path), config=config, nodes_quantized=quantized, nodes_total=total,
            qdq_nodes=qdq, calibration_seconds=0.0, qdq_seconds=0.0, warnings=(),
        )  # fmt: skip
        return self._evaluation(config, name, q, self._debug(path, name), t0)

    def apply(self, plan: PromotionPlan) -> Evaluation:
        """Quantize and measure a promotion plan."""
        return self.evaluate(plan)

    def search(self, goal: SearchGoal) -> SearchResult:
        """Automatic promotion search (see :func:`qdebug.mixed.search.search`); the result records the target's
        fixes the session applied (:attr:`target_fixes`)."""
        result = search(self, goal)
        return result if self.target_fixes is None else replace(result, target_fixes=self.target_fixes)

    def target_data(self, num_samples: int | None = None) -> DataSource:
        """The debug samples as the target-side check reads them (the first ``num_samples`` of the debug set; ``None``:
        as many as a debug pass uses)."""
        from qdebug.data import open_data
        from qdebug.model_io import input_specs

        o = self.debug_options
        n = o.num_samples if num_samples is None else min(num_samples, o.num_samples or num_samples)
        return open_data(
            self.debug_data, input_specs(self.float_proto), num_samples=n, seed=o.seed,
            distribution=o.distribution, input_shapes=o.input_shapes, ignore=o.ignore_data_keys,
        )  # fmt: skip

    def recompile(self, evaluation: Evaluation, target: str = "qnn", options: Any = None) -> RecompileResult:
        """Compile an evaluated variant for ``target`` and check it there
        (:func:`qdebug.targets.recompile.recompile`; ``options``: a ``BuildOptions`` or the target's own options,
        e.g. ``QnnOptions``): for QNN the EPContext model in the workdir and the HTP simulator's accuracy on the
        debug samples."""
        self._say(0, 1, f"compiling for {target}")
        return recompile(
            evaluation.quantization.model_path,
            self.workdir / f"{evaluation.name}.{target}",
            target,
            float_model=self.float_path,
            data=self.target_data(),
            options=options,
            progress=lambda msg: self._say(0, 1, msg),
        )


def _debug_on_cluster(
    spec: ClusterSpec, float_path: Path, qs: Sequence[QuantizeResult], data: Any, opts: DebugOptions
) -> list[DebugReport]:
    """``debug()`` of each quantized model as a Ray task (retried by Ray on another worker if its worker dies), the
    reports in the order of ``qs``; a qdebug error in a task is raised here as it was raised there."""
    from qdebug.cluster import MAX_ATTEMPTS, connect
    from qdebug.errors import QDebugError

    with connect(spec) as cluster:
        ray = cluster.ray
        task = ray.remote(num_cpus=1, max_retries=MAX_ATTEMPTS - 1)(debug)
        refs = [task.remote(str(float_path), q.model_path, data, opts) for q in qs]
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayTaskError as exc:
            _cancel_pending(ray, refs)
            if isinstance(exc.cause, QDebugError):
                raise exc.cause from None
            raise
        except BaseException:  # Ctrl-C or a lost cluster: stop what still runs
            _cancel_pending(ray, refs)
            raise


def _cancel_pending(ray: Any, refs: Sequence[Any]) -> None:
    """Cancel the tasks of ``refs`` that have not finished. Finished ones are left alone: force-cancelling a task
    whose reply is already in crashed Ray 2.60's driver ("Tried to complete task that was not pending", seen in a
    full test run)."""
    _, pending = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    for ref in pending:
        ray.cancel(ref, force=True)


def _num_eval(path: Path | None) -> int:
    if path is None:
        return 0
    with np.load(path, allow_pickle=False) as npz:
        return int(next(iter(npz[k].shape[0] for k in npz.files)))


__all__ = ["DataLike", "Evaluation", "MixedPrecisionSession", "sixteen_bit_cost"]
