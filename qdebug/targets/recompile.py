"""``recompile()``: compile an already-quantized QDQ model for a target — the mixed-precision loop's last step
(promote → re-quantize → recompile → check on the target). Target-agnostic: every step is the target's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qdebug.data import DataSource, open_data
from qdebug.errors import ModelError, TargetError
from qdebug.model_io import ModelKind, input_specs, load_model, model_kind
from qdebug.report import TargetAccuracy
from qdebug.targets.base import BuildOptions, CompileJob, Target, get_target
from qdebug.targets.compile_report import CompileReport, compile_problems, failed_report

__all__ = ["RECOMPILE_SCHEMA_VERSION", "RecompileResult", "build_options", "recompile"]

RECOMPILE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RecompileResult:
    """A QDQ model compiled for a target, and (given the float model and data) its accuracy on the target."""

    compile: CompileReport
    target_accuracy: TargetAccuracy | None = None
    problems: tuple[str, ...] = ()
    #: the QDQ model the compiled network corresponds to, when it is not the one given (Deeploy: the snapped copy)
    qdq_model: str | None = None
    #: what the recompile did besides compiling (Deeploy: the scale snapping, the bit-exactness figures)
    notes: tuple[str, ...] = ()
    #: the SoC compiled for (QNN); ``None``: the target's default device, or a target without SoCs. A caller that
    #: compiles several variants passes it back (``soc=``) so that all run on one device
    soc: str | None = None

    @property
    def ok(self) -> bool:
        """Compiled, with at least one node on the accelerator (and no fallback if that was asked)."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "schema_version": RECOMPILE_SCHEMA_VERSION,
            "ok": self.ok,
            "problems": list(self.problems),
            "compile": self.compile.to_dict(),
            "target_accuracy": None if self.target_accuracy is None else self.target_accuracy.to_dict(),
            "qdq_model": self.qdq_model,
            "notes": list(self.notes),
            "soc": self.soc,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecompileResult:
        """Inverse of :meth:`to_dict`."""
        acc = d.get("target_accuracy")
        return cls(
            compile=CompileReport.from_dict(d["compile"]),
            target_accuracy=None if acc is None else TargetAccuracy.from_dict(acc),
            problems=tuple(d.get("problems", ())),
            qdq_model=d.get("qdq_model"),
            notes=tuple(d.get("notes", ())),
            soc=d.get("soc"),
        )


def _options(t: Target, options: Any, snap_scales: bool, snap_grid: str) -> BuildOptions:
    """The build options of a recompile: given ones, or the fields a target's own options object (e.g.
    :class:`~qdebug.targets.qnn_options.QnnOptions`) shares with :class:`BuildOptions`."""
    if isinstance(options, BuildOptions):
        return options
    precision = next(p.name for p in t.precisions.values() if p.quantized)
    kw: dict[str, Any] = {}
    if options is not None:
        kw = {k: getattr(options, k) for k in ("soc", "fail_on_fallback", "timeout_s") if hasattr(options, k)}
    if "snap_scales" in t.options:
        kw.update(snap_scales=snap_scales, snap_grid=snap_grid)
    return BuildOptions(t.name, precision, **kw)


def build_options(target: str, options: Any = None, **changes: Any) -> BuildOptions:
    """The :class:`BuildOptions` :func:`recompile` would use for ``target`` and ``options``, with ``changes`` applied
    (e.g. ``probe_tensors=False``: the target-side check compares the model outputs only)."""
    return replace(_options(get_target(target), options, True, "tie_free"), **changes)


def _check_qdq(path: Path) -> None:
    qmodel = load_model(path, "QDQ model")
    if any(n.op_type == "EPContext" for n in qmodel.graph.node):
        raise ModelError(f"{path}: is already a compiled EPContext model; recompile takes the QDQ model")
    if model_kind(qmodel) is not ModelKind.QDQ:
        raise ModelError(f"{path}: is not a QDQ model ({model_kind(qmodel).value}); quantize it first")


def _source(path: Path, float_model: str | Path | None, data: Any, num_samples: int | None) -> DataSource | None:
    if float_model is not None:
        fmodel = load_model(float_model, "float model")
        return open_data(data, input_specs(fmodel), num_samples=num_samples, seed=1)
    if data is not None:
        return open_data(data, input_specs(load_model(path, "QDQ model")), num_samples=num_samples)
    return None


def recompile(
    qdq_model: str | Path,
    out_dir: str | Path,
    target: str = "qnn",
    *,
    float_model: str | Path | None = None,
    data: Any = None,
    options: Any = None,
    num_samples: int | None = None,
    snap_scales: bool = True,
    snap_grid: str = "tie_free",
    progress: Callable[[str], None] | None = None,
) -> RecompileResult:
    """Compile an already-quantized QDQ model for ``target`` into ``out_dir`` (e.g. after a mixed-precision
    promotion). The target's own steps run: QNN compiles an EPContext model; the CPU checks that ONNX Runtime
    runs the QDQ model; Deeploy snaps the scales into ``out_dir/<stem>.snapped.onnx`` (the given file is
    untouched; ``snap_scales=False`` exports the given scales), exports to ``out_dir/deeploy/`` and generates
    Network.c/.h.

    ``options`` is a :class:`BuildOptions` or a target's own options object (e.g. ``QnnOptions``). With
    ``float_model`` the result carries the target-side :class:`TargetAccuracy` on ``data`` (any data spec;
    ``None``: 8 seeded synthetic samples; ``num_samples`` caps it). ``progress(message)`` hears each step (compiling,
    running the simulator). A compile that fails or takes no node is
    *reported* (``ok`` False, ``problems``), not raised; bad input (a float, QOperator or EPContext model instead
    of a QDQ model) raises :class:`ModelError`, an unknown target a ConfigError, a missing backend
    :class:`~qdebug.errors.MissingExtraError`.
    """
    path, out = Path(qdq_model), Path(out_dir)
    t = get_target(target)
    _check_qdq(path)
    opts = _options(t, options, snap_scales, snap_grid)
    source = _source(path, float_model, data, num_samples)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    snapped = out / f"{path.name.removesuffix('.onnx')}.snapped.onnx"
    say = progress or (lambda _msg: None)
    model, after = t.after_quantize(path, snapped, opts, say)
    job = CompileJob(
        model=model,
        out_dir=out,
        options=opts,
        float_model=None if float_model is None else Path(float_model),
        qdq_model=path,
        samples=source,
        stem=path.stem.removesuffix(".qdq"),
        after=after,
        progress=say,
    )
    qdq_out = None if model == path else str(model)
    try:
        compiled = t.compile(job)
    except TargetError as exc:  # e.g. Deeploy cannot take a promoted model's 16-bit tensors: reported, not raised
        report = failed_report(t.name, t.description, t0, str(exc))
        return RecompileResult(report, None, tuple(compile_problems(report)), qdq_out)
    problems = tuple(compile_problems(compiled.report, opts.fail_on_fallback))
    acc = None
    if not problems and float_model is not None and source is not None:
        acc = t.check(job, compiled)
    soc = compiled.manifest.get("compiled_soc")  # the SoC the target chose (QNN moves a 16-bit-weight model to v73)
    notes = (*compiled.notes, *compiled.warnings)
    return RecompileResult(compiled.report, acc, problems, qdq_out, notes, None if soc is None else str(soc))
