"""The ``deeploy`` target: PULP microcontrollers through Deeploy (integer RequantShift ONNX + generated C).

The QDQ model's scales are first snapped so every requantization is exactly ``mul/2^k`` inside Deeploy's int32
RequantShift (:mod:`qdebug.targets.deeploy_snap`), then exported to Deeploy's integer network
(:mod:`qdebug.targets.deeploy_export`) and handed to Deeploy's own code generation in its separate environment
(:mod:`qdebug.targets.deeploy_env`) for Generic and, where the ops allow, Siracusa.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qdebug.data import DataSource
from qdebug.errors import DataError, TargetError
from qdebug.io import atomic_save_model
from qdebug.model_io import load_model
from qdebug.report import TargetAccuracy
from qdebug.targets.base import (
    Availability,
    BuildOptions,
    Compiled,
    CompileJob,
    Precision,
    Prepared,
    ProgressFn,
    ShapeSource,
    TargetBase,
    register_target,
    shapes_for,
)
from qdebug.targets.compile_report import CompileReport
from qdebug.targets.quant_constraints import OpRule, QuantConstraints, RuleWhen, Storage, ZeroPoint

if TYPE_CHECKING:
    from qdebug.config import QuantConfig

__all__ = [
    "DEEPLOY_CONSTRAINTS",
    "DEEPLOY_FIXES",
    "DEEPLOY_PLATFORMS",
    "DEEPLOY_PRECISION_HINT",
    "DeeployBuild",
    "DeeployTarget",
    "compile_deeploy",
    "snap_for_deeploy",
    "zero_centre_for_deeploy",
]

#: What ``--target deeploy`` takes, for the error message of any other precision.
DEEPLOY_PRECISION_HINT = "Deeploy takes --precision int8 only (int8 activations, int8 symmetric weights)"
#: The fixes that apply to a Deeploy build (Deeploy has no BatchNormalization and needs static shapes).
DEEPLOY_FIXES = ("static_shapes", "batchnorm_folding")
#: Deeploy platforms a build generates code for: the first must succeed, the others are tried ("where the ops
#: allow") and a failure there is a warning.
DEEPLOY_PLATFORMS = ("Generic", "Siracusa")
#: How the accuracy table names the target when the Generic code ran on the host (no MCU is run).
HOST_TARGET_LABEL = "Deeploy Generic code on the host"


#: What Deeploy 0.2.1's integer kernels need of the quantization (docs/deeploy.md, "Quantizing for Deeploy"): the
#: quantizer puts each named input on a symmetric grid beforehand, so the export never has to refuse it.
DEEPLOY_CONSTRAINTS = QuantConstraints(
    target="deeploy",
    activation_storage=Storage.EITHER,
    weight_symmetric=True,
    power_of_two_scales=False,
    scales="any ratio, realised as mul/2^k in an int32 RequantShift (snapped after quantizing)",
    rules=(
        OpRule("Conv", (0,), ZeroPoint.ZERO, RuleWhen.PADDED, Storage.EITHER,
               "Deeploy pads a Conv's input with the stored integer 0 (its ExtractPaddingFromConvPass), the real 0 "
               "only on a symmetric grid or a non-negative tensor stored unsigned"),
    ),
)  # fmt: skip


@dataclass(frozen=True)
class DeeployBuild:
    """What :func:`compile_deeploy` did: the compile report, the manifest's ``deeploy`` entry, the warnings."""

    compile: CompileReport
    info: dict[str, Any]
    warnings: tuple[str, ...]


def snap_for_deeploy(src: Path, dest: Path, enabled: bool, say: ProgressFn, grid: str = "tie_free") -> dict[str, Any]:
    """Snap the QDQ model ``src`` for Deeploy into ``dest`` (may be ``src``); the manifest's ``deeploy.snap``."""
    if not enabled:
        return {"enabled": False}
    from qdebug.targets.deeploy_snap import snap_scales_for_deeploy

    say(f"snapping the requantization scales to Deeploy's int32 RequantShift ({grid} grid)")
    snapped, rep = snap_scales_for_deeploy(load_model(src, "QDQ model"), grid=grid)
    atomic_save_model(snapped, dest)
    return {"enabled": True, **rep.to_dict()}


def zero_centre_for_deeploy(src: Path, dest: Path, say: ProgressFn) -> tuple[Path, list[str]]:
    """Requantize to zero point 0 the operands of a MatMul of two activations and of a GELU (Deeploy's integer
    kernels take no zero point there; :func:`qdebug.targets.deeploy_zero_centre.zero_centre_operands`) into
    ``dest``; returns the model to continue from and what changed (nothing for a CNN: ``src`` is returned)."""
    from qdebug.targets.deeploy_zero_centre import zero_centre_operands

    model, changed = zero_centre_operands(load_model(src, "QDQ model"))
    if not changed:
        return src, []
    say(f"zero-centring {len(changed)} tensor group(s) for Deeploy's integer MatMul/GELU")
    atomic_save_model(model, dest)
    return dest, changed


def _export_info(out: Path, exp: Any, nodes: int) -> dict[str, Any]:
    return {
        "dir": out.name,
        "files": [f"{out.name}/{f}" for f in ("network.onnx", "inputs.npz", "outputs.npz")],
        "num_samples": exp.num_samples,
        "equal_fraction": exp.equal_fraction,
        "max_lsb_diff": exp.max_lsb_diff,
        "bit_exact_ok": exp.bit_exact_ok,
        "worst_requant_rel_error": exp.worst_requant_rel_error,
        "nodes": nodes,
    }


def _platform_network(
    out: Path, plat: str, qdq_model: str | Path, data: Sequence[Mapping[str, np.ndarray]] | None
) -> tuple[Path, int, dict[str, Any] | None]:
    """The network Deeploy generates ``plat``'s code from: ``network.onnx``, or for Generic its Generic form
    (``network.generic.onnx``, :mod:`qdebug.targets.deeploy_generic`) when that differs, or for a PULP platform
    its own export (``network.<plat>.onnx``: LayerNorm as iRMSNorm, int8 MatMul operands;
    ``deeploy_export.PLATFORM_FORMS``) when that differs; (path, Generic terms rewritten, the platform export's
    figures or None)."""
    from qdebug.targets import deeploy_export

    path = out / "network.onnx"
    if plat != "Generic":
        if deeploy_export.PLATFORM_FORMS.get(plat) in (None, deeploy_export.PLATFORM_FORMS["Generic"]):
            return path, 0, None
        return _pulp_network(out, plat, qdq_model, data)
    from qdebug.targets.deeploy_generic import generic_form

    model, rewritten = generic_form(onnx.load(str(path)))
    if not rewritten:
        return path, 0, None
    generic = out / "network.generic.onnx"
    atomic_save_model(model, generic)
    return generic, rewritten, None


def _pulp_network(
    out: Path, plat: str, qdq_model: str | Path, data: Sequence[Mapping[str, np.ndarray]] | None
) -> tuple[Path, int, dict[str, Any] | None]:
    """Export ``qdq_model`` again in ``plat``'s form; kept as ``network.<plat>.onnx`` only where it differs from
    ``network.onnx`` (a CNN's does not). Its inputs are encoded as network.onnx's (same ``inputs.npz``)."""
    from qdebug.targets import deeploy_export

    tmp = out / f".{plat.lower()}-export"
    try:
        exp = deeploy_export.export(qdq_model, tmp, data=data, verbose=False, num_samples=len(data) if data else 16,
                                    platform=plat)  # fmt: skip
        same = (tmp / "network.onnx").read_bytes() == (out / "network.onnx").read_bytes()
        dest = out / f"network.{plat.lower()}.onnx"
        if not same:
            os.replace(tmp / "network.onnx", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if same:
        return out / "network.onnx", 0, None
    layernorm, int8_matmul = deeploy_export.PLATFORM_FORMS[plat]
    figures = {
        "layernorm": layernorm,
        "int8_matmul_operands": int8_matmul,
        "num_samples": exp.num_samples,
        "equal_fraction": exp.equal_fraction,
        "max_lsb_diff": exp.max_lsb_diff,
        "bit_exact_ok": exp.bit_exact_ok,
        "mismatch_warning": _mismatch_warning(f"the {plat} network ({out.name}/{dest.name})", exp),
    }
    return dest, 0, figures


def _mismatch_warning(what: str, exp: Any) -> str:
    """The warning for an export that misses the bit-exact target: the reason when the export can tell (only outputs
    after an approximating integer kernel differ, :meth:`~qdebug.targets.deeploy_export.ExportResult.mismatch_reason`),
    else the target it misses."""
    head = (
        f"{what} matches the CPU QDQ model on {exp.equal_fraction:.2%} of the output elements "
        f"(max {exp.max_lsb_diff} LSB, {exp.num_samples} samples)"
    )
    reason = exp.mismatch_reason()
    if exp.approximation_only:
        return f"{head}: {reason}"
    tail = f"; {reason}" if reason else ""
    return f"{head}; the target is ≥ 99.9 % and ≤ 1 LSB (docs/deeploy.md, Bit-exactness){tail}"


def _host_run(
    out: Path,
    entry: Mapping[str, Any],
    qdq_model: str | Path,
    data: Sequence[Mapping[str, np.ndarray]],
    float_model: str | Path | None = None,
) -> tuple[dict[str, Any], str | None]:
    """Run the Generic code on the debug samples (:mod:`qdebug.targets.deeploy_host`): the manifest's
    ``deeploy.run.Generic`` entry and a warning, if any (no C compiler, or outputs that differ)."""
    from qdebug.targets import deeploy_host
    from qdebug.targets.deeploy_env import DeeployBuffer

    label = {"label": deeploy_host.HOST_RUN_LABEL}
    try:
        io = [DeeployBuffer.from_dict(b) for b in entry["io"]]
        run = deeploy_host.check_generated(out, out / "generic", io, qdq_model, data, float_model=float_model)
    except (TargetError, DataError) as exc:  # no compiler, a kernel the host library lacks, a sample it cannot take
        return {**label, "ran": False, "error": str(exc)}, f"the generated Generic code was not run: {exc}"
    warning = None
    if not run.bit_exact:
        warning = (
            f"{deeploy_host.HOST_RUN_LABEL} differs from the integer network: {run.equal_fraction_vs_integer_onnx:.2%} "
            f"of the output elements equal (max {run.max_diff_vs_integer_onnx}) on {run.num_samples} samples"
        )
    return {"ran": True, **run.to_dict()}, warning


def _codegen(
    out: Path, plat: str, qdq_model: str | Path, data: Sequence[Mapping[str, np.ndarray]] | None
) -> tuple[dict[str, Any], str | None, Path]:
    """Deeploy's code generation for one platform: the manifest entry, the problem (if any), the folder."""
    from qdebug.targets import deeploy_env

    dest = out / plat.lower()
    rel = f"{out.name}/{plat.lower()}"
    try:
        network, rewritten, platform_export = _platform_network(out, plat, qdq_model, data)
    except TargetError as exc:  # the platform's own form cannot take an op (e.g. iRMSNorm's LayerNorm, D > 128)
        failed: dict[str, Any] = {
            **dict.fromkeys(("network", "platform_export", "integer_only")),
            "generic_add_terms_rewritten": 0,
            "ok": False,
            "dir": rel,
            "files": [],
            "float_buffers": [],
            "error": str(exc),
            "seconds": 0.0,
            "io": [],
        }
        return failed, f"the {plat} network cannot be exported: {exc}", dest
    res = deeploy_env.generate(network, dest, plat, inputs_npz=out / "inputs.npz")
    entry: dict[str, Any] = {
        "network": f"{out.name}/{network.name}",
        "generic_add_terms_rewritten": rewritten,
        "platform_export": platform_export,
        "ok": res.ok,
        "dir": rel,
        "files": [f"{rel}/{f}" for f in res.files],
        "integer_only": res.integer_only,
        "float_buffers": list(res.float_buffers),
        "error": res.error,
        "seconds": round(res.seconds, 4),
        "io": [{**asdict(b), "shape": list(b.shape)} for b in res.io],
    }
    problem = None
    if not res.ok:
        problem = f"Deeploy rejected the network for {plat}: {res.error}"
    elif res.integer_only is not True:
        problem = (
            f"Deeploy generated code for {plat} but it is not integer-only (float buffers: "
            f"{', '.join(res.float_buffers) or 'unknown'})"
        )
    return entry, problem, dest


def compile_deeploy(
    qdq_model: str | Path,
    out_dir: str | Path,
    samples: DataSource | Sequence[Mapping[str, np.ndarray]] | None = None,
    *,
    platforms: Sequence[str] = DEEPLOY_PLATFORMS,
    progress: ProgressFn | None = None,
    float_model: str | Path | None = None,
) -> DeeployBuild:
    """Export the int8 QDQ model to Deeploy's integer network in ``out_dir`` (``network.onnx``, ``inputs.npz``,
    ``outputs.npz``) and generate ``Network.c``/``Network.h`` per platform into ``out_dir/<platform lower>/``.

    The first platform must succeed with an integer-only network; the others are tried and their failure is a
    warning. An unsupported op (the export names the node), a Deeploy rejection or a float buffer in the
    generated code raise :class:`~qdebug.errors.TargetError` with the reason. With ``float_model``, the host run
    of the Generic code also measures each output's SQNR vs float and vs CPU-QDQ (:meth:`DeeployTarget.check`).
    """
    from qdebug.targets import deeploy_env, deeploy_export

    say = progress or (lambda _msg: None)
    out = Path(out_dir)
    t0 = time.perf_counter()
    data = None if samples is None else [dict(s) for s in samples]
    say("exporting the QDQ model to Deeploy's integer network")
    exp = deeploy_export.export(
        qdq_model, out, data=data, verbose=False, num_samples=len(data) if data else 16
    )  # raises TargetError naming the node or tensors it cannot export
    nodes = len(onnx.load(str(out / "network.onnx")).graph.node)
    info: dict[str, Any] = {"export": _export_info(out, exp, nodes), "codegen": {}}
    warnings: list[str] = []
    if not exp.bit_exact_ok:
        warnings.append(_mismatch_warning("the integer network", exp))
    compiled: str | None = None
    for i, plat in enumerate(platforms):
        say(f"generating Deeploy code for {plat}")
        entry, problem, dest = _codegen(out, plat, qdq_model, data)
        pe = entry["platform_export"]
        mismatch = None if pe is None else pe.pop("mismatch_warning")  # a warning, not a manifest entry
        if mismatch is not None and not pe["bit_exact_ok"]:
            warnings.append(mismatch)
        info["codegen"][plat] = entry
        if problem is None:
            compiled = compiled or str(dest / "Network.c")
        elif i == 0:
            raise TargetError(problem)
        else:
            warnings.append(f"{problem} (the {platforms[0]} code is complete; {plat} is optional)")
    generic = info["codegen"].get("Generic")
    if generic is not None and generic["ok"] and data:
        say("running the generated Generic code (gcc + qdebug's host kernels)")
        run, warning = _host_run(out, generic, qdq_model, data, float_model)
        info["run"] = {"Generic": run}
        warnings += [warning] if warning else []
    if "Siracusa" in info["codegen"]:
        from qdebug.targets.deeploy_host import SIRACUSA_NOT_RUN

        info.setdefault("run", {})["Siracusa"] = {"ran": False, "why": SIRACUSA_NOT_RUN}
    report = CompileReport(
        target="deeploy",
        ok=True,
        compiled_model=compiled,
        compile_seconds=round(time.perf_counter() - t0, 4),
        accelerator_partitions=sum(1 for e in info["codegen"].values() if e["ok"]),
        accelerator_nodes=nodes,
        cpu_nodes=0,
        graph_io_qdq_on_cpu=0,
        device=f"Deeploy {deeploy_env.DEEPLOY_VERSION} ({', '.join(platforms)})",
    )
    return DeeployBuild(report, info, tuple(warnings))


def _notes(job: CompileJob, info: Mapping[str, Any]) -> tuple[str, ...]:
    """What ``recompile`` says besides the compile report: the snapping, the integer network's bit-exactness."""
    notes = []
    snap = info.get("snap") or {}
    if snap.get("enabled"):
        notes.append(
            f"scales snapped for Deeploy's int32 RequantShift ({job.options.snap_grid} grid): "
            f"{len(snap['snapped'])} requantization(s), largest relative scale change {snap['max_rel_change']:.2e}; "
            f"the network corresponds to {job.model}"
        )
    e = info["export"]
    notes.append(
        f"integer network vs CPU QDQ on {e['num_samples']} samples: {e['equal_fraction']:.2%} of output "
        f"elements equal, max {e['max_lsb_diff']} LSB"
    )
    notes += [line.strip() for line in _describe_runs(info.get("run") or {})]
    return tuple(notes)


def _describe_runs(runs: Mapping[str, Any]) -> list[str]:
    """One line per platform: the host run's equality figures, or why the code was not run."""
    lines = []
    for plat, r in runs.items():
        if r.get("ran"):
            lines.append(
                f"  {plat} code run ({r['label']}, {r['compiler']}): on {r['num_samples']} samples "
                f"{r['equal_fraction_vs_integer_onnx']:.2%} of output elements equal to the integer network "
                f"(max {r['max_diff_vs_integer_onnx']}), {r['equal_fraction_vs_qdq']:.2%} to the CPU QDQ model "
                f"(max {r['max_lsb_vs_qdq']} LSB)"
            )
        else:
            lines.append(f"  {plat} code not run: {r.get('why') or r.get('error')}")
    return lines


class DeeployTarget(TargetBase):
    """PULP microcontrollers through Deeploy: int8 activations and int8 symmetric weights, integer kernels only."""

    name = "deeploy"
    description = "PULP microcontrollers through Deeploy (integer RequantShift ONNX + generated C)"
    precisions: Mapping[str, Precision] = {
        "int8": Precision(
            "int8",
            {"activation_type": "int8", "weight_type": "int8", "weight_symmetric": True},
            "s8 activations, s8 symmetric weights; writes deeploy/ with network.onnx and Network.c/.h",
        ),
    }
    activation_types = frozenset({"int8"})
    weight_types = frozenset({"int8"})
    options = frozenset({"skip_fixes", "snap_scales"})
    fix_names = DEEPLOY_FIXES

    def quant_constraints(self) -> QuantConstraints:
        """Deeploy's integer contract as quantizing can meet it (:data:`DEEPLOY_CONSTRAINTS`)."""
        return DEEPLOY_CONSTRAINTS

    def available(self) -> Availability:
        """Whether Deeploy's own environment exists (it is created on first use, ``make deeploy-env``)."""
        from qdebug.targets.deeploy_env import deeploy_available

        return Availability(*deeploy_available())

    def precision_hint(self, precision: str) -> str:
        """What Deeploy takes."""
        return f" ({DEEPLOY_PRECISION_HINT})"

    def config_problems(self, config: QuantConfig) -> list[str]:
        """int8 activations and weights, symmetric weights."""
        p = []
        if config.activation_type != "int8" or config.weight_type != "int8":
            p.append(
                "target 'deeploy' takes int8 activations and int8 weights, got "
                f"activation_type={config.activation_type}, weight_type={config.weight_type}"
            )
        if config.weight_symmetric is False:
            p.append("target 'deeploy' needs symmetric weights (weight_symmetric=False conflicts)")
        return p

    def prepare(
        self, model: onnx.ModelProto, config: QuantConfig | None, options: BuildOptions, shapes: ShapeSource
    ) -> Prepared:
        """Static shapes (Deeploy's buffers are static) and BatchNorm folding (it has no BatchNormalization)."""
        from qdebug.passes import run_passes
        from qdebug.targets.model_fixes import fix_passes

        given, source = shapes_for(model, shapes)
        m, reports = run_passes(model, fix_passes(DEEPLOY_FIXES, input_shapes=given, skip=options.skip_fixes))
        reports = tuple(
            replace(r, detail=f"{r.detail} (shapes {source})") if r.name == "static_shapes" and r.changed else r
            for r in reports
        )
        if m is model:
            m = onnx.ModelProto()
            m.CopyFrom(model)
        return Prepared(m, config, tuple(reports))

    def after_quantize(
        self, qdq_model: Path, dest: Path, options: BuildOptions, progress: ProgressFn
    ) -> tuple[Path, Mapping[str, Any]]:
        """Zero-centre the operands Deeploy's transformer kernels need without a zero point, then snap the
        requantization scales, into ``dest`` (that model is the one debugged and exported)."""
        src, centred = zero_centre_for_deeploy(qdq_model, dest, progress)
        snap = snap_for_deeploy(src, dest, options.snap_scales, progress, options.snap_grid)
        after: dict[str, Any] = {"snap": snap}
        if centred:
            after["zero_centred"] = centred
        return (dest if snap["enabled"] or centred else qdq_model), after

    def compile(self, job: CompileJob) -> Compiled:
        """Export + Deeploy code generation into ``out_dir/deeploy`` (a previous one there is replaced)."""
        dest = job.out_dir / "deeploy"
        if dest.exists():
            shutil.rmtree(dest)  # a previous recompile's output in this qdebug-owned folder
        dbuild = compile_deeploy(job.model, dest, job.samples, progress=job.progress, float_model=job.float_model)
        files = {
            "compiled_model": str(Path(dbuild.compile.compiled_model or "").relative_to(job.out_dir)),
            "deeploy_network": "deeploy/network.onnx",
            "deeploy_inputs": "deeploy/inputs.npz",
            "deeploy_outputs": "deeploy/outputs.npz",
        }
        for plat, entry in dbuild.info["codegen"].items():
            if entry.get("network") not in (None, "deeploy/network.onnx"):
                files[f"deeploy_{plat.lower()}_network"] = entry["network"]
            for f in entry["files"]:
                files[f"{plat.lower()}_{Path(f).stem.lower()}_{Path(f).suffix.lstrip('.')}"] = f
        info = {**dbuild.info, **job.after}
        return Compiled(
            dbuild.compile, files=files, manifest={"deeploy": info}, warnings=dbuild.warnings, notes=_notes(job, info)
        )

    def check(self, job: CompileJob, compiled: Compiled) -> TargetAccuracy | None:
        """The host run's per-output SQNR (the Generic code's outputs dequantized with the output grids) vs float and
        vs CPU-QDQ, measured during :meth:`compile` on the same samples; ``None`` when the code was not run."""
        run = ((compiled.manifest.get("deeploy") or {}).get("run") or {}).get("Generic") or {}
        if not run.get("ran") or not run.get("outputs"):
            return None
        from qdebug.targets.deeploy_host import HostRun

        host = HostRun.from_dict(run)
        return TargetAccuracy(
            target="deeploy",
            device=HOST_TARGET_LABEL,
            num_samples=host.num_samples,
            seconds_per_sample=round(host.run_seconds / max(host.num_samples, 1), 6),
            outputs=host.outputs,
            notes=(f"{host.label} (compiled with {host.compiler}); the MCU itself was not run",),
        )

    def compiled_top1(
        self, job: CompileJob, compiled: Compiled, eval_data: Path, qdq_top1: float | None
    ) -> float | None:
        """Top-1 of Deeploy's generated Generic code run with qdebug's host kernels (``None`` when it was not run:
        no C compiler, or no Generic code)."""
        d = compiled.manifest.get("deeploy") or {}
        if not (d.get("run") or {}).get("Generic", {}).get("ran"):
            return None
        from qdebug.targets.deeploy_host import run_top1

        assert job.float_model is not None
        return run_top1(job.out_dir / "deeploy", d["codegen"]["Generic"], job.model, eval_data, job.options.label_key)

    def describe(self, report: CompileReport) -> list[str]:
        """Headline: state, device, integer nodes, time."""
        state = "OK" if report.ok else "FAILED"
        return [
            f"Deeploy code generation {state}: {report.device}, {report.accelerator_nodes} integer nodes, "
            f"{report.compile_seconds:.2f} s"
        ]

    def describe_manifest(self, manifest: Mapping[str, Any]) -> list[str]:
        """Snapping, bit-exactness of the integer network, and each platform's generated files."""
        d = manifest.get("deeploy")
        if d is None:
            return []
        lines = []
        snap = d.get("snap") or {}
        if snap.get("enabled"):
            lines.append(
                f"  scales snapped to Deeploy's int32 RequantShift ({snap.get('grid', 'fine')} grid): "
                f"{len(snap['snapped'])} requantization(s), largest relative scale change {snap['max_rel_change']:.2e}"
            )
        elif snap:
            lines.append("  scales not snapped (--no-snap-scales)")
        e = d["export"]
        lines.append(
            f"  integer network vs CPU QDQ on {e['num_samples']} samples: {e['equal_fraction']:.2%} of output "
            f"elements equal, max {e['max_lsb_diff']} LSB"
        )
        for plat, c in d["codegen"].items():
            what = (
                f"{', '.join(c['files'])} (integer only: {c['integer_only']})" if c["ok"] else f"failed: {c['error']}"
            )
            lines.append(f"  {plat}: {what}")
            pe = c.get("platform_export")
            if pe:
                lines.append(
                    f"    from {c['network']} (LayerNorm as {pe['layernorm']}, int8 MatMul operands: "
                    f"{pe['int8_matmul_operands']}): vs CPU QDQ on {pe['num_samples']} samples "
                    f"{pe['equal_fraction']:.2%} of output elements equal, max {pe['max_lsb_diff']} LSB"
                )
        lines += _describe_runs(d.get("run") or {})
        return lines


register_target("deeploy", DeeployTarget)
