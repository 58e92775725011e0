"""``build()``: "I have a float ONNX model: quantize and compile it for my target" in one call.

The steps are the same for every target; each is the target's own (:class:`~qdebug.targets.base.Target`):
its compatibility fixes on the float model and its config → ``quantize`` → its post-quantize step (e.g. Deeploy's
scale snapping) → its compile → ``debug`` (CPU QDQ vs float) → its target-side check (e.g. the HTP simulator) →
top-1 on ``eval_data``. ``device`` × ``precision`` map onto the one :class:`~qdebug.config.QuantConfig` through
the target's :class:`~qdebug.targets.base.Precision` and :meth:`QuantConfig.merged`, so a config file that says
otherwise is a :class:`~qdebug.errors.ConfigError`.

Everything is built in a hidden folder next to ``out_dir`` (``.qd-<8 hex>.part``) and renamed into place at the
end: ``out_dir`` holds a complete build or nothing, with the mode ``mkdir`` would give it. A second build of the same
``out_dir`` while one runs is refused in one line (:func:`qdebug.io.output_lock`). The manifest (``manifest.json``)
names every input with its sha256, the config, the fixes, the quantization and compile figures, the accuracy and the
timings; paths in it are relative to it.

:func:`~qdebug.targets.recompile.recompile` (re-exported here) compiles an already-quantized model.

What the build reads and checks before any work is :mod:`qdebug.build_inputs`; the manifest and the result
:mod:`qdebug.build_manifest`. This module's ``__all__`` is the build API and re-exports their public names (docs/qnn.md
imports :class:`BuildManifest` from here).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qdebug._signals import signals_held
from qdebug._version import __version__
from qdebug.build_inputs import (
    BuildJob,
    DataLike,
    check_eval_data,
    check_overrides_after_fixes,
    prepare_out,
    read_inputs,
    resolve_config,
)
from qdebug.build_manifest import MANIFEST_SCHEMA_VERSION, BuildManifest, BuildResult, InputFile, OutputSqnr, TopOne
from qdebug.build_progress import BuildProgress
from qdebug.config import QuantConfig
from qdebug.data import DataSource, open_data
from qdebug.errors import ConfigError, DataError, InputFileError, ModelError, QDebugError, TargetError
from qdebug.io import atomic_save_model, atomic_write_text, new_temp_dir, output_lock
from qdebug.model_io import file_sha256, input_specs, load_model
from qdebug.passes import PassReport
from qdebug.quantizer import QuantizeResult
from qdebug.report import DebugReport, TargetAccuracy
from qdebug.targets.base import BuildOptions, Compiled, CompileJob, DiagnosisBudget, Prepared, ProgressFn, ShapeSource
from qdebug.targets.compile_report import CompileReport, compile_problems
from qdebug.targets.recompile import RecompileResult, recompile

if TYPE_CHECKING:
    from qdebug.mixed.overrides import OverridesFile

__all__ = [
    "MANIFEST_SCHEMA_VERSION",
    "BuildError",
    "BuildManifest",
    "BuildOptions",
    "BuildResult",
    "InputFile",
    "OutputSqnr",
    "RecompileResult",
    "TopOne",
    "build",
    "check_eval_data",
    "compile_problems",
    "recompile",
    "resolve_config",
]


class BuildError(TargetError):
    """The target failed (exit code 7); carries what is known so far (fixes, the compile report) for the CLI."""

    def __init__(
        self, message: str, *, compile_report: CompileReport | None = None, fixes: Sequence[PassReport] = ()
    ) -> None:
        super().__init__(message)
        self.compile_report = compile_report
        self.fixes = tuple(fixes)


def _relative_paths(report: CompileReport, staging: Path) -> CompileReport:
    """The compile report with its file paths relative to the output folder (it was written in the staging one)."""

    def rel(p: str | None) -> str | None:
        if p is None:
            return None
        try:
            return str(Path(p).resolve().relative_to(staging.resolve()))
        except ValueError:
            return p

    return replace(report, compiled_model=rel(report.compiled_model), log_path=rel(report.log_path))


def _rescue_log(report: CompileReport) -> CompileReport:
    """Move a failed build's compile log into a new temp folder (the staging folder is about to go)."""
    if not report.log_path or not Path(report.log_path).is_file():
        return report
    keep = Path(tempfile.mkdtemp(prefix="qdebug-build-failed-")) / Path(report.log_path).name
    shutil.move(report.log_path, keep)
    return replace(report, log_path=str(keep), compiled_model=None)


def _prepare(job: BuildJob, staging: Path) -> tuple[Prepared, Path]:
    """1. The target's compatibility fixes on the float model (and its config), written to the staging folder."""
    t0 = time.perf_counter()
    if job.target.fix_names:
        job.say(f"applying the {job.target.name} compatibility fixes")
    shapes = ShapeSource(job.options.input_shapes, job.data, job.options.label_key)
    prepared = job.target.prepare(job.model, job.cfg, job.options, shapes)
    job.fixes, job.cfg = prepared.fixes, prepared.config
    made_fixed = job.ofile is not None and job.ofile.target_fixes is not None
    if job.ofile is not None and prepared.config is not None and (prepared.changed or made_fixed):
        check_overrides_after_fixes(job.ofile, prepared.model, prepared.changed, job.target.name)
    if made_fixed and job.ofile is not None and job.ofile.target_fixes is not None:
        made_for, fixes = job.ofile.target_fixes
        if set(fixes) != set(prepared.changed) and made_for == job.target.name:
            job.warnings.append(
                f"the overrides were made for the model after the {made_for} fixes {list(fixes)}; this build's fixes "
                f"changed {list(prepared.changed)} (the overrides were checked against the model they made)"
            )
    float_path = staging / f"{_stem(job)}.float.onnx"
    atomic_save_model(prepared.model, float_path)
    job.timed("fixes_s", t0)
    return prepared, float_path


def _stem(job: BuildJob) -> str:
    return job.src.stem.removesuffix(".float")


def _shapes_after(job: BuildJob) -> Mapping[str, Sequence[int]] | None:
    # A target that fixes shapes has made them static already; otherwise --input-shape applies to the data.
    return None if "static_shapes" in job.target.fix_names else job.options.input_shapes


def _quantize(job: BuildJob, prepared: Prepared, float_path: Path, staging: Path) -> tuple[QuantizeResult, Path]:
    """2. Quantize the fixed float model (label arrays in the data are ignored, not an error)."""
    from qdebug.quantizer import quantize

    cfg = prepared.config
    assert cfg is not None
    job.say(f"quantizing ({cfg.activation_type} activations, {cfg.weight_type} weights)")
    t0 = time.perf_counter()
    calib = None
    if job.data is not None:
        calib = open_data(
            job.data,
            input_specs(prepared.model),
            num_samples=cfg.num_samples,
            ignore=(job.options.label_key,),
            input_shapes=_shapes_after(job),
        )
    qdq_path = staging / f"{_stem(job)}.qdq.onnx"
    # check=False: the target's recipe stays as asked; the build measures the result on the target itself
    quant = quantize(float_path, calib, cfg, qdq_path, input_shapes=_shapes_after(job), check=False)
    job.timed("quantize_s", t0)
    return quant, qdq_path


def _samples(job: BuildJob, model: onnx.ModelProto) -> DataSource:
    """The debug samples: ``debug_data``, else ``eval_data``, else the calibration data (synthetic ones use
    another seed than synthetic calibration: they are not the calibration set)."""
    source = next((d for d in (job.debug_data, job.eval_data, job.data) if d is not None), None)
    return open_data(
        source,
        input_specs(model),
        num_samples=job.options.debug_samples,
        seed=1,
        ignore=(job.options.label_key,),
        input_shapes=_shapes_after(job),
    )


def _compile(job: BuildJob, cjob: CompileJob) -> Compiled:
    """3. The target's compile; a failure (or, asked for, any fallback) is a :class:`BuildError`."""
    t0 = time.perf_counter()
    compiled = job.target.compile(cjob)
    job.compile_report = compiled.report
    job.timed("compile_s", t0)
    problems = compile_problems(compiled.report, job.options.fail_on_fallback)
    if problems:
        raise BuildError("; ".join(problems), compile_report=compiled.report, fixes=job.fixes)
    job.warnings += [*compiled.warnings, *job.target.hints(compiled.report, job.fixes)]
    return compiled


def _accuracy(
    job: BuildJob, cjob: CompileJob, compiled: Compiled, preds: _Predictions | None
) -> tuple[DebugReport | None, TargetAccuracy | None]:
    """4. CPU QDQ vs float (``debug``), then the target-side check (its samples counted on the progress lines, each
    model's outputs to ``preds`` for top-1)."""
    report = None
    if cjob.qdq_model is not None:
        from qdebug.debugger import DebugOptions, debug

        assert cjob.float_model is not None
        job.say(f"debugging the QDQ model on {len(cjob.samples)} samples")
        t0 = time.perf_counter()
        report = debug(cjob.float_model, cjob.qdq_model, cjob.samples, DebugOptions())
        job.timed("debug_s", t0)
        # The target's per-tensor check measures its error in units of these (same samples): reuse, not recompute.
        cjob = replace(cjob, cpu_sqnr_db={a.tensor_name: a.cumulative_sqnr_db for a in report.activations})
    t0 = time.perf_counter()
    checked = replace(cjob, samples=job.say.counted(cjob.samples, "target check"), outputs_sink=preds)
    acc = job.target.check(checked, compiled)
    if acc is not None:
        job.timed("simulator_s", t0)
        report = None if report is None else report.with_target_accuracy(acc)
    return report, acc


@dataclass(frozen=True)
class _Requantizer:
    """The build's :class:`~qdebug.targets.base.Requantizer`: the fixed float model re-quantized on the build's
    calibration ranges (no second calibration), promotions planned by :func:`qdebug.mixed.promote.promote`."""

    float_model: Path
    calibration_cache: Path
    samples: DataSource
    model_sha256: str

    def promote(self, config: QuantConfig, tensors: Sequence[str], to: str) -> QuantConfig:
        """``config`` with ``tensors`` promoted (ORT's mixed-precision fixer adds the converts)."""
        from qdebug.mixed.promote import promote

        return promote(self.float_model, tensors, to, config=config).config

    def quantize(self, config: QuantConfig, dest: Path) -> Path:
        """The float model quantized with ``config`` into ``dest``, exactly as asked (no output check)."""
        from qdebug.quantizer import quantize

        res = quantize(
            self.float_model, self.samples, config, dest, calibration_cache=self.calibration_cache, check=False
        )
        return Path(res.model_path)

    def save_overrides(self, config: QuantConfig, dest: Path, requested: Sequence[str], note: str) -> Path:
        """``config``'s overrides as an overrides file for the fixed float model."""
        from qdebug.mixed.overrides import OverridesFile

        ofile = OverridesFile.from_config(config, model_sha256=self.model_sha256, requested=requested, note=note)
        return ofile.save(dest)


def _diagnose(
    job: BuildJob, cjob: CompileJob, compiled: Compiled, acc: TargetAccuracy | None, quant: QuantizeResult | None
) -> Compiled:
    """The target's diagnosis after its check (QNN: bisection and remedies), folded into the compiled result's
    manifest entries and files."""
    if quant is not None and cjob.float_model is not None and job.cfg is not None:
        rq = _Requantizer(cjob.float_model, Path(quant.calibration_cache), cjob.samples, file_sha256(cjob.float_model))
        cjob = replace(cjob, config=job.cfg, requantizer=rq)
    left = job.options.time_budget_s
    trial_s = job.timings.get("compile_s", 0.0) + job.timings.get("simulator_s", 0.0)
    budget = DiagnosisBudget(
        asked=job.options.remedies or left is not None,
        deadline=None if left is None else job.say.start + left,
        trial_s=trial_s,
    )
    cjob = replace(cjob, samples=job.say.counted(cjob.samples, "diagnosis"), budget=budget)
    t0 = time.perf_counter()
    diag = job.target.diagnose(cjob, compiled, acc)
    job.skipped += list(diag.skipped)
    for line in diag.skipped:
        job.say(f"skipped {line}")
    if not diag.manifest and not diag.files:
        return compiled
    job.timed("diagnose_s", t0)
    job.warnings += list(diag.warnings)
    return replace(compiled, manifest={**compiled.manifest, **diag.manifest}, files={**compiled.files, **diag.files})


class _Predictions:
    """Each model's class per sample (argmax of the float model's first output), as the target's check ran them
    (:attr:`~qdebug.targets.base.CompileJob.outputs_sink`): top-1 without running the evaluation set again."""

    def __init__(self, first_output: str) -> None:
        self.first = first_output
        self.classes: dict[str, list[int]] = {}

    def __call__(self, role: str, names: Sequence[str], values: Sequence[Any]) -> None:
        k = list(names).index(self.first) if self.first in names else 0
        self.classes.setdefault(role, []).append(int(np.argmax(np.asarray(values[k]).reshape(-1))))

    def top1(self, role: str, labels: np.ndarray) -> float | None:
        """The fraction right, ``None`` unless the check ran this model on exactly the labelled samples."""
        got = self.classes.get(role, [])
        if len(got) != len(labels):
            return None
        return float(np.mean(np.asarray(got) == labels.astype(np.int64)))


def _predictions(job: BuildJob, model: onnx.ModelProto) -> _Predictions | None:
    """A listener for the check's outputs when its samples are the evaluation set's (no separate debug data)."""
    if job.eval_data is None or job.debug_data is not None or not model.graph.output:
        return None
    return _Predictions(model.graph.output[0].name)


def _top1(job: BuildJob, cjob: CompileJob, compiled: Compiled, preds: _Predictions | None) -> TopOne | None:
    """Top-1 of the float, QDQ and compiled models on the labelled evaluation set: from the outputs of the target's
    check when it ran every labelled sample (``preds``), else by running the set."""
    if job.eval_data is None:
        return None
    from qdebug.data import read_labels
    from qdebug.evaluate import top1_accuracy

    t0 = time.perf_counter()
    assert cjob.float_model is not None
    model = load_model(cjob.float_model, "float model")
    n = len(open_data(job.eval_data, input_specs(model), ignore=(job.options.label_key,)))
    labels = read_labels(job.eval_data, job.options.label_key, n)
    f, q, c = (None, None, None) if preds is None else (preds.top1(r, labels) for r in ("float", "qdq", "compiled"))
    if c is None or f is None or (q is None and cjob.qdq_model is not None):
        job.say(f"measuring top-1 accuracy on {n} labelled samples")
        f = top1_accuracy(cjob.float_model, job.eval_data, job.options.label_key)
        q = None if cjob.qdq_model is None else top1_accuracy(cjob.qdq_model, job.eval_data, job.options.label_key)
        c = job.target.compiled_top1(cjob, compiled, job.eval_data, q)
    job.timed("eval_s", t0)
    return TopOne(num_samples=n, float_model=f, qdq_model=q, compiled_model=c)


def _files(cjob: CompileJob, compiled: Compiled, quant: QuantizeResult | None, staging: Path) -> dict[str, str]:
    """Manifest roles → paths relative to the build folder."""
    assert cjob.float_model is not None
    files = {"float_model": cjob.float_model.name, "manifest": "manifest.json"}
    if cjob.qdq_model is not None and quant is not None:
        files["qdq_model"] = cjob.qdq_model.name
        files["calibration_cache"] = Path(quant.calibration_cache).name
    files["compiled_model"] = _relative(compiled.report.compiled_model, staging) or ""
    files.update(compiled.files)
    if compiled.report.log_path:
        files["compile_log"] = Path(compiled.report.log_path).name
    return files


def _relative(path: str | None, staging: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(staging.resolve()))
    except ValueError:
        return path


def _manifest(
    job: BuildJob,
    cjob: CompileJob,
    compiled: Compiled,
    quant: QuantizeResult | None,
    results: tuple[DebugReport | None, TargetAccuracy | None, TopOne | None],
    files: dict[str, str],
) -> BuildManifest:
    """5. The manifest (paths relative to the build folder)."""
    import onnxruntime as ort

    report, acc, top1 = results
    if quant is not None:
        quant = replace(quant, model_path=Path(quant.model_path).name, calibration_cache=files["calibration_cache"])
    return BuildManifest(
        qdebug_version=__version__,
        onnxruntime_version=ort.__version__,
        device=job.options.device,
        precision=job.options.precision,
        soc=job.options.soc,
        inputs=tuple(job.inputs),
        config=job.cfg,
        fixes=job.fixes,
        quantization=quant,
        compile=_relative_paths(compiled.report, cjob.out_dir),
        num_debug_samples=len(cjob.samples),
        cpu_qdq_vs_float=tuple(
            OutputSqnr(o.output_name, o.cumulative_sqnr_db, o.cumulative_status) for o in report.model_outputs
        )
        if report is not None
        else (),
        target_accuracy=acc,
        top1=top1,
        timings=job.timings,
        files=files,
        warnings=tuple(job.warnings),
        target_details={**compiled.manifest, **({"region": job.region.to_dict()} if job.region else {})},
        skipped=tuple(job.skipped),
    )


def _run(job: BuildJob, staging: Path) -> tuple[BuildManifest, DebugReport | None]:
    """Every step, in the staging folder."""
    prepared, float_path = _prepare(job, staging)
    quant, qdq_path = (None, None) if prepared.config is None else _quantize(job, prepared, float_path, staging)
    after: Mapping[str, Any] = {}
    model = qdq_path or float_path
    if qdq_path is not None:
        t0 = time.perf_counter()
        model, after = job.target.after_quantize(qdq_path, qdq_path, job.options, job.say)
        job.timings["quantize_s"] = round(job.timings["quantize_s"] + time.perf_counter() - t0, 4)
    cjob = CompileJob(
        model=model,
        out_dir=staging,
        options=job.options,
        float_model=float_path,
        qdq_model=qdq_path,
        samples=_samples(job, prepared.model),
        stem=_stem(job),
        progress=job.say,
        after=after,
    )
    compiled = _compile(job, cjob)
    preds = _predictions(job, prepared.model)
    report, acc = _accuracy(job, cjob, compiled, preds)
    compiled = _diagnose(job, cjob, compiled, acc, quant)
    top1 = _top1(job, cjob, compiled, preds)
    files = _files(cjob, compiled, quant, staging)
    if job.region is not None and job.eval_data is not None:  # the region's evaluation inputs (+ labels)
        files["region_eval_data"] = job.eval_data.name
    if report is not None:
        files["report"] = "report.json"
        final = job.out.resolve()  # the report names the models where they will be, not in the staging folder
        meta = replace(report.meta, float_model=str(final / float_path.name), quant_model=str(final / model.name))
        report = replace(report, meta=meta)
        report.save(staging / "report.json")
    return _manifest(job, cjob, compiled, quant, (report, acc, top1), files), report


def build(
    onnx_model: str | Path,
    out_dir: str | Path,
    options: BuildOptions,
    *,
    data: DataLike = None,
    eval_data: str | Path | None = None,
    debug_data: DataLike = None,
    config: QuantConfig | str | Path | None = None,
    overrides: OverridesFile | str | Path | None = None,
    progress: ProgressFn | None = None,
) -> BuildResult:
    """Fix, quantize and compile the float model ``onnx_model`` for ``options.device``; write ``out_dir``.

    ``data`` calibrates (``None``: synthetic); ``debug`` and the target-side check use the first
    ``options.debug_samples`` samples of ``debug_data``, else of ``eval_data``, else of ``data``; ``eval_data``
    (labelled ``.npz``, ``options.label_key``) gives top-1 accuracy of the float, QDQ and compiled models.
    ``config`` / ``overrides`` are a :class:`QuantConfig` / overrides file (objects or JSON paths) under the
    precision's settings.

    Raises :class:`BuildError` (exit 7) when the target fails, takes no node, or (``fail_on_fallback``) leaves
    nodes on the CPU; bad input raises the matching :class:`~qdebug.errors.QDebugError` before anything is written.
    ``out_dir`` must be new or empty and holds a complete build or nothing.
    """
    t_start = time.perf_counter()
    say = BuildProgress(progress or (lambda _msg: None))
    job = read_inputs(Path(onnx_model), Path(out_dir), options, config, overrides, data, eval_data, debug_data, say)
    job.out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(job.out):  # a second build of the same folder meanwhile fails in one line, not at the rename
        prepare_out(job.out)  # again, under the lock: another build may have filled it since
        manifest, report = _staged(job, t_start)
    return BuildResult(out_dir=job.out, manifest=manifest, report=report)


def _staged(job: BuildJob, t_start: float) -> tuple[BuildManifest, DebugReport | None]:
    """Every step in a new hidden folder next to ``job.out`` (same file system: the final rename is atomic), with the
    mode ``mkdir`` gives (it becomes the output folder), renamed into place at the end; removed on failure."""
    staging: Path | None = None
    try:
        with signals_held():  # a signal is raised inside the try, once staging is known
            staging = new_temp_dir(job.out.parent)
        if job.options.extract_inputs:
            _extract(job, staging)
        manifest, report = _run(job, staging)
        job.timings["total_s"] = round(time.perf_counter() - t_start, 4)
        manifest = replace(manifest, timings=job.timings)
        atomic_write_text(staging / "manifest.json", manifest.to_json())
        if job.out.exists():
            job.out.rmdir()  # empty (checked under the lock): a non-empty one fails here rather than mix two builds
        os.replace(staging, job.out)
    except BaseException as exc:
        if staging is None:
            raise
        _fail(exc, job, staging)
        named = _unstaged(exc, job, staging)
        if named is not None:
            raise named from exc
        raise
    return manifest, report


def _extract(job: BuildJob, staging: Path) -> None:
    """0. Cut the float model to the region asked for (:mod:`qdebug.region`); the data becomes the region's input
    values, computed by the float model on ONNX Runtime (labels of the evaluation set kept)."""
    from qdebug.region import Region, check_region, extract_region, probe, region_data

    t0 = time.perf_counter()
    region = Region(job.options.extract_inputs, job.options.extract_outputs)
    what = str(job.src)
    check_region(job.model, region, what)
    job.say(f"extracting the region {list(region.inputs)} -> {list(region.outputs)}")
    specs, label = input_specs(job.model), job.options.label_key
    shapes = job.options.input_shapes

    def source(d: Any, n: int | None = None) -> DataSource:
        return open_data(d, specs, num_samples=n, ignore=(label,), input_shapes=shapes)

    first_src = next((d for d in (job.data, job.debug_data, job.eval_data) if d is not None), None)
    first = next(iter(source(first_src, 1)))
    sub = extract_region(job.model, region, probe(job.model, first, (*region.inputs, *region.outputs), what), what)
    cfg_n = job.cfg.num_samples if job.cfg is not None else None
    if job.data is not None:
        job.data = region_data(job.model, source(job.data, cfg_n), region, what)
    if job.debug_data is not None:
        job.debug_data = region_data(job.model, source(job.debug_data, job.options.debug_samples), region, what)
    if job.eval_data is not None:
        arrays = region_data(job.model, source(job.eval_data), region, what)
        with np.load(job.eval_data, allow_pickle=False) as z:
            arrays.update({k: z[k] for k in z.files if k not in {s.name for s in specs}})
        job.eval_data = staging / f"{_stem(job)}.region_eval.npz"
        np.savez(job.eval_data, **arrays)  # type: ignore[arg-type]
    job.model = sub
    job.options = replace(job.options, input_shapes=None)  # they named the original inputs
    job.region = region
    job.timed("extract_s", t0)


def _unstaged(exc: BaseException, job: BuildJob, staging: Path) -> QDebugError | None:
    """The error with the user's file named instead of its copy in the staging folder (which is gone by now):
    the steps after the fixes read that copy, so their errors name it. ``None`` when there is nothing to rename."""
    text = str(exc)
    kinds: tuple[type[QDebugError], ...] = (ModelError, DataError, ConfigError, InputFileError)
    kind = next((k for k in kinds if type(exc) is k), None)  # exact types: their constructors take the message
    if kind is None or str(staging) not in text:
        return None
    user = str(job.src) if not job.target.fix_names else f"{job.src} (after the {job.target.name} fixes)"
    text = text.replace(str(staging / f"{_stem(job)}.float.onnx"), user).replace(str(staging), str(job.out))
    return kind(text)


def _fail(exc: BaseException, job: BuildJob, staging: Path) -> None:
    """Remove the staging folder; keep a failed compile's log (outside ``out_dir``) and say what was learned."""
    report = job.compile_report
    if isinstance(exc, TargetError) and report is not None:
        # The compile log is the one thing needed to understand a failed compile: keep it outside out_dir.
        report = _rescue_log(report)
        if isinstance(exc, BuildError):
            exc.compile_report = report
    shutil.rmtree(staging, ignore_errors=True)
    if isinstance(exc, TargetError) and not isinstance(exc, BuildError):
        raise BuildError(str(exc), compile_report=report, fixes=job.fixes) from exc
