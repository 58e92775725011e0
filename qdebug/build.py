"""``build()``: "I have a float ONNX model: quantize and compile it for my device" in one call.

For ``device="qnn"`` the steps are: the QNN compatibility fixes (:mod:`qdebug.targets.qnn_fixes`) on the float
model and its config → ``quantize`` → ``compile_qnn`` (EPContext) → ``debug`` (CPU QDQ vs float) →
``htp_accuracy`` (the HTP simulator vs CPU QDQ vs float, per output and per tensor) → top-1 on ``eval_data``.
For ``device="cpu"`` the QDQ model is the deliverable; "compiling" is checking that ONNX Runtime's CPU provider
loads and runs it. ``precision="fp16"`` (QNN only) skips quantization and compiles the float model with HTP fp16.

``device`` × ``precision`` map onto the one :class:`~qdebug.config.QuantConfig` (:data:`PRECISION_FLAGS`) through
:meth:`QuantConfig.merged`, so a config file that says otherwise is a :class:`~qdebug.errors.ConfigError`.

Everything is built in a hidden folder next to ``out_dir`` and renamed into place at the end: ``out_dir`` holds a
complete build or nothing. The manifest (``manifest.json``) names every input with its sha256, the config, the
fixes, the quantization and compile figures, the accuracy and the timings; paths in it are relative to it.

:func:`recompile` is the engine's hook for the mixed-precision loop: compile an already-quantized QDQ model for a
target (and, given the float model and data, check it on the HTP simulator).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qdebug._version import __version__
from qdebug.config import QuantConfig
from qdebug.data import DataSource, open_data
from qdebug.errors import ConfigError, ModelError, TargetError
from qdebug.graph import ModelKind, file_sha256, input_specs, load_model, model_kind
from qdebug.io import atomic_save_model, atomic_write_text
from qdebug.metrics import ErrorSums, reduce_pair
from qdebug.quantize import QuantizeResult
from qdebug.report import DebugReport, TargetAccuracy, TargetOutputAccuracy, encode_number
from qdebug.targets.base import CompileReport, FixReport
from qdebug.targets.qnn_fixes import FIX_NAMES, apply_qnn_fixes

if TYPE_CHECKING:
    from qdebug.mixed.overrides import OverridesFile
    from qdebug.targets.qnn import QnnOptions

__all__ = [
    "DEVICES",
    "MANIFEST_SCHEMA_VERSION",
    "PRECISIONS",
    "PRECISION_FLAGS",
    "BuildError",
    "BuildManifest",
    "BuildOptions",
    "BuildResult",
    "DeeployBuild",
    "InputFile",
    "OutputSqnr",
    "RecompileResult",
    "TopOne",
    "build",
    "compile_deeploy",
    "compile_problems",
    "qnn_options",
    "recompile",
    "resolve_config",
    "validate_cpu",
]

MANIFEST_SCHEMA_VERSION = 1
DEVICES = ("qnn", "cpu", "deeploy")
PRECISIONS = ("uint8", "uint16", "int8", "fp16")

#: device → precision → the QuantConfig settings it stands for (``None``: not quantized). A pair that is missing
#: is not supported on that device.
PRECISION_FLAGS: dict[str, dict[str, dict[str, Any] | None]] = {
    "qnn": {
        "uint8": {"activation_type": "uint8", "weight_type": "uint8"},
        "uint16": {"activation_type": "uint16", "weight_type": "uint8"},
        # HTP activations are unsigned; "int8" means signed symmetric weights (the LayerNorm-gamma trap).
        "int8": {"activation_type": "uint8", "weight_type": "int8", "weight_symmetric": True},
        "fp16": None,
    },
    "cpu": {
        "uint8": {"activation_type": "uint8", "weight_type": "uint8"},
        "uint16": {"activation_type": "uint16", "weight_type": "uint8"},
        # ORT's recommended CPU format ("U8S8"): uint8 activations, signed symmetric int8 weights.
        "int8": {"activation_type": "uint8", "weight_type": "int8", "weight_symmetric": True},
    },
    # Deeploy's integer kernels: signed int8 activations and int8 symmetric weights, nothing else.
    "deeploy": {
        "int8": {"activation_type": "int8", "weight_type": "int8", "weight_symmetric": True},
    },
}

#: What ``--device deeploy`` takes, for the error message of any other precision.
DEEPLOY_PRECISION_HINT = "Deeploy takes --precision int8 only (int8 activations, int8 symmetric weights)"
#: The fixes that apply to a Deeploy build (Deeploy has no BatchNormalization and needs static shapes).
DEEPLOY_FIXES = ("static_shapes", "batchnorm_folding")
#: Deeploy platforms a build generates code for: the first must succeed, the others are tried ("where the ops
#: allow") and a failure there is a warning.
DEEPLOY_PLATFORMS = ("Generic", "Siracusa")

ProgressFn = Callable[[str], None]


class BuildError(TargetError):
    """The target failed (exit code 7); carries what is known so far (fixes, the compile report) for the CLI."""

    def __init__(
        self, message: str, *, compile_report: CompileReport | None = None, fixes: Sequence[FixReport] = ()
    ) -> None:
        super().__init__(message)
        self.compile_report = compile_report
        self.fixes = tuple(fixes)


# ---------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class BuildOptions:
    """What to build for, validated on construction (the SoC name is checked against QNN's list in :func:`build`).

    ``input_shapes`` fixes dynamic input dimensions (QNN static-shape fix, synthetic data); without it the first
    sample of the data decides. ``debug_samples`` caps the samples used by ``debug``, the HTP simulator check and
    (for QNN) nothing else; ``eval_data`` is always used whole. ``skip_fixes`` names QNN fixes not to apply.
    """

    device: str
    precision: str
    soc: str | None = None
    fail_on_fallback: bool = False
    debug_samples: int = 32
    input_shapes: Mapping[str, Sequence[int]] | None = None
    label_key: str = "label"
    skip_fixes: tuple[str, ...] = ()
    probe_tensors: bool = True
    timeout_s: float = 600.0
    #: ``--device deeploy``: snap the QDQ model's scales so every requantization is exactly ``mul/2^k`` inside
    #: Deeploy's int32 RequantShift (:func:`qdebug.targets.deeploy_snap.snap_scales_for_deeploy`); the snapped
    #: QDQ model is the one written, debugged and exported. ``False`` (``--no-snap-scales``) keeps the calibrated
    #: scales (the integer network then matches them on ~87–97 % of the elements, docs/deeploy.md).
    snap_scales: bool = True
    #: the snapping grid (``--snap-grid``): "tie_free" (default: no exact value near a rounding half, bit-exact
    #: against ORT's float32 run) or "fine" (largest shift, smallest scale change); docs/deeploy.md
    snap_grid: str = "tie_free"

    def __post_init__(self) -> None:
        object.__setattr__(self, "skip_fixes", tuple(self.skip_fixes))
        problems = self.problems()
        if problems:
            raise ConfigError("invalid build options: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid or conflicting option, all at once."""
        p: list[str] = []
        if self.device not in DEVICES:
            p.append(f"device {self.device!r} not in {list(DEVICES)}")
        elif self.precision not in PRECISIONS:
            p.append(f"precision {self.precision!r} not in {list(PRECISIONS)}")
        elif self.precision not in PRECISION_FLAGS[self.device]:
            ok = sorted(PRECISION_FLAGS[self.device])
            hint = " (fp16 runs on --device qnn with --soc)" if self.precision == "fp16" else ""
            if self.device == "deeploy":
                hint = f" ({DEEPLOY_PRECISION_HINT})"
            p.append(f"precision {self.precision!r} is not supported on device {self.device!r}; use one of {ok}{hint}")
        if self.device == "cpu":
            if self.soc is not None:
                p.append("--soc applies to --device qnn only")
            if self.fail_on_fallback:
                p.append("--fail-on-fallback applies to --device qnn only (the CPU has no fallback)")
            if self.skip_fixes:
                p.append("--skip-fix applies to --device qnn only (no fixes run for the CPU)")
        if self.device == "deeploy":
            if self.soc is not None:
                p.append("--soc applies to --device qnn only")
            if self.fail_on_fallback:
                p.append("--fail-on-fallback applies to --device qnn only (Deeploy has no CPU fallback)")
            not_here = sorted(set(self.skip_fixes) & (set(FIX_NAMES) - set(DEEPLOY_FIXES)))
            if not_here:
                p.append(f"--skip-fix {not_here} does not apply to --device deeploy (its fixes: {list(DEEPLOY_FIXES)})")
        elif not self.snap_scales:
            p.append("--no-snap-scales applies to --device deeploy only")
        if self.snap_grid not in ("tie_free", "fine"):
            p.append(f"snap_grid {self.snap_grid!r} not in ['tie_free', 'fine']")
        if self.device == "qnn" and self.precision == "fp16" and not self.soc:
            p.append(
                "precision fp16 on QNN needs --soc (e.g. SM8650): without a SoC model the HTP takes no node in fp16"
            )
        if not isinstance(self.debug_samples, int) or self.debug_samples < 1:
            p.append(f"debug_samples must be a positive integer, got {self.debug_samples!r}")
        unknown = sorted(set(self.skip_fixes) - set(FIX_NAMES))
        if unknown:
            p.append(f"unknown fix name(s) {unknown}; known: {list(FIX_NAMES)}")
        if not (isinstance(self.timeout_s, int | float) and self.timeout_s > 0):
            p.append(f"timeout_s must be positive, got {self.timeout_s!r}")
        return p

    @property
    def quantized(self) -> bool:
        """False for fp16 (the float model is compiled as is)."""
        return PRECISION_FLAGS.get(self.device, {}).get(self.precision) is not None


def resolve_config(
    device: str,
    precision: str,
    config: QuantConfig | None = None,
    overrides: OverridesFile | None = None,
) -> QuantConfig | None:
    """The :class:`QuantConfig` for ``device`` × ``precision`` on top of ``config`` and an overrides file.

    Settings the config (or the overrides file's ``base_config``) set explicitly and ``precision`` contradicts are
    a :class:`~qdebug.errors.ConfigError` (:meth:`QuantConfig.merged`). ``None`` for fp16, which quantizes nothing
    (a config or overrides given with it is an error: it would be silently ignored).
    """
    flags = PRECISION_FLAGS.get(device, {}).get(precision, "missing")
    if flags == "missing":
        hint = f" ({DEEPLOY_PRECISION_HINT})" if device == "deeploy" else ""
        raise ConfigError(f"precision {precision!r} is not supported on device {device!r}{hint}")
    if flags is None:
        if config is not None or overrides is not None:
            raise ConfigError(f"precision {precision} quantizes nothing: --config and --overrides do not apply")
        return None
    assert isinstance(flags, dict)
    base = overrides.resolve_base(config) if overrides is not None else config or QuantConfig()
    cfg = base.merged(target=device, **flags)
    if overrides is not None:
        cfg = overrides.apply_to(cfg)
    return cfg


# ---------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class InputFile:
    """One input of the build: its role, where it was read from, and its sha256 (a folder: over its files)."""

    role: str
    path: str
    sha256: str


@dataclass(frozen=True)
class OutputSqnr:
    """A model output's SQNR (dB) of some model against the float model, with the reason when undefined."""

    output_name: str
    sqnr_db: float | None
    status: str


@dataclass(frozen=True)
class TopOne:
    """Top-1 accuracy on the labelled evaluation set (``None`` for a model that was not built)."""

    num_samples: int
    float_model: float
    qdq_model: float | None
    compiled_model: float | None


@dataclass(frozen=True)
class BuildManifest:
    """What ``manifest.json`` holds. File paths are relative to the output folder."""

    qdebug_version: str
    onnxruntime_version: str
    onnxruntime_qnn_version: str | None
    device: str
    precision: str
    soc: str | None
    inputs: tuple[InputFile, ...]
    config: QuantConfig | None
    fixes: tuple[FixReport, ...]
    quantization: QuantizeResult | None
    compile: CompileReport
    num_debug_samples: int
    cpu_qdq_vs_float: tuple[OutputSqnr, ...]
    target_accuracy: TargetAccuracy | None
    top1: TopOne | None
    timings: Mapping[str, float]
    files: Mapping[str, str]
    warnings: tuple[str, ...] = ()
    #: ``--device deeploy`` only: ``{"export": {...bit-exactness, files}, "codegen": {platform: {ok, files,
    #: integer_only, float_buffers, error}}}`` (paths relative to the output folder).
    deeploy: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version`` (+inf SQNR as the string ``"inf"``)."""
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "qdebug_version": self.qdebug_version,
            "onnxruntime_version": self.onnxruntime_version,
            "onnxruntime_qnn_version": self.onnxruntime_qnn_version,
            "device": self.device,
            "precision": self.precision,
            "soc": self.soc,
            "inputs": [vars(i).copy() for i in self.inputs],
            "config": None if self.config is None else self.config.to_dict(),
            "fixes": [vars(f).copy() for f in self.fixes],
            "quantization": None if self.quantization is None else self.quantization.to_dict(),
            "compile": self.compile.to_dict(),
            "accuracy": {
                "num_debug_samples": self.num_debug_samples,
                "cpu_qdq_vs_float": [
                    {"output_name": o.output_name, "sqnr_db": encode_number(o.sqnr_db), "status": o.status}
                    for o in self.cpu_qdq_vs_float
                ],
                "target": None if self.target_accuracy is None else self.target_accuracy.to_dict(),
                "top1": None if self.top1 is None else vars(self.top1).copy(),
            },
            "timings": dict(self.timings),
            "files": dict(self.files),
            "warnings": list(self.warnings),
            "deeploy": None if self.deeploy is None else json.loads(json.dumps(self.deeploy)),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BuildManifest:
        """Inverse of :meth:`to_dict`; refuses other schema versions."""
        from qdebug.errors import InputFileError
        from qdebug.report import decode_number

        if d.get("schema_version") != MANIFEST_SCHEMA_VERSION:
            raise InputFileError(f"build manifest schema_version {d.get('schema_version')!r} is not supported")
        acc = d["accuracy"]
        return cls(
            qdebug_version=d["qdebug_version"],
            onnxruntime_version=d["onnxruntime_version"],
            onnxruntime_qnn_version=d.get("onnxruntime_qnn_version"),
            device=d["device"],
            precision=d["precision"],
            soc=d.get("soc"),
            inputs=tuple(InputFile(**i) for i in d["inputs"]),
            config=None if d["config"] is None else QuantConfig.from_dict(d["config"]),
            fixes=tuple(FixReport(**f) for f in d["fixes"]),
            quantization=None if d["quantization"] is None else QuantizeResult.from_dict(d["quantization"]),
            compile=CompileReport.from_dict(d["compile"]),
            num_debug_samples=acc["num_debug_samples"],
            cpu_qdq_vs_float=tuple(
                OutputSqnr(o["output_name"], decode_number(o["sqnr_db"]), o["status"]) for o in acc["cpu_qdq_vs_float"]
            ),
            target_accuracy=None if acc["target"] is None else TargetAccuracy.from_dict(acc["target"]),
            top1=None if acc["top1"] is None else TopOne(**acc["top1"]),
            timings=dict(d["timings"]),
            files=dict(d["files"]),
            warnings=tuple(d.get("warnings", ())),
            deeploy=d.get("deeploy"),
        )

    def to_json(self) -> str:
        """Strict JSON text."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> BuildManifest:
        """Read ``manifest.json``."""
        from qdebug.errors import InputFileError

        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputFileError(f"{path}: not a qdebug build manifest ({exc})") from exc


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build` wrote into ``out_dir`` (``manifest``) and the in-memory debug report."""

    out_dir: Path
    manifest: BuildManifest
    report: DebugReport | None

    def path(self, role: str) -> Path:
        """Absolute path of an output file by role (``float_model``, ``qdq_model``, ``compiled_model``, ...)."""
        return self.out_dir / self.manifest.files[role]

    def to_dict(self) -> dict[str, Any]:
        """The manifest's dict."""
        return self.manifest.to_dict()


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

    @property
    def ok(self) -> bool:
        """Compiled, with at least one node on the accelerator (and no fallback if that was asked)."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "ok": self.ok,
            "problems": list(self.problems),
            "compile": self.compile.to_dict(),
            "target_accuracy": None if self.target_accuracy is None else self.target_accuracy.to_dict(),
            "qdq_model": self.qdq_model,
            "notes": list(self.notes),
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
        )


# ---------------------------------------------------------------------------------------------- helpers
def _qnn() -> Any:
    """The QNN target module, with onnxruntime-qnn checked first (a missing one names the ``qnn`` extra)."""
    from qdebug._lazy import require

    require("onnxruntime_qnn")
    from qdebug.targets import qnn

    ok, why = qnn.qnn_available()
    if not ok:
        raise TargetError(f"QNN is not usable here: {why}")
    return qnn


def qnn_options(options: BuildOptions) -> QnnOptions:
    """The :class:`~qdebug.targets.qnn.QnnOptions` of a QNN build (an unknown SoC is a ConfigError there)."""
    from qdebug.targets.qnn import QnnOptions

    return QnnOptions(
        soc=options.soc,
        fail_on_fallback=options.fail_on_fallback,
        enable_fp16=options.precision == "fp16",
        timeout_s=float(options.timeout_s),
    )


def compile_problems(report: CompileReport, fail_on_fallback: bool = False) -> list[str]:
    """Why a compile report is a failure: an error, zero nodes on the accelerator, or (asked for) CPU fallback."""
    name = report.target.upper()
    if not report.ok:
        return [f"{name} compile failed: {report.error or 'no reason given'}"]
    out = []
    if report.accelerator_partitions == 0 or report.accelerator_nodes == 0:
        by_op = ", ".join(f"{op} {n}" for op, n in sorted(report.fallback_by_op().items())) or "see the compile log"
        out.append(f"{name} took no node of the model: everything would run on the CPU ({by_op})")
    elif fail_on_fallback and report.cpu_nodes > 0:
        by_op = ", ".join(f"{op} {n}" for op, n in sorted(report.fallback_by_op().items()))
        out.append(f"--fail-on-fallback: {report.cpu_nodes} node(s) fall back to the CPU ({by_op})")
    return out


@dataclass(frozen=True)
class DeeployBuild:
    """What :func:`compile_deeploy` did: the compile report, the manifest's ``deeploy`` entry, the warnings."""

    compile: CompileReport
    info: dict[str, Any]
    warnings: tuple[str, ...]


def _deeploy_failure(device: str, t0: float, error: str, nodes: int = 0) -> CompileReport:
    return CompileReport(
        target="deeploy",
        ok=False,
        compiled_model=None,
        compile_seconds=round(time.perf_counter() - t0, 4),
        accelerator_partitions=0,
        accelerator_nodes=nodes,
        cpu_nodes=0,
        graph_io_qdq_on_cpu=0,
        device=device,
        error=error,
    )


def compile_deeploy(
    qdq_model: str | Path,
    out_dir: str | Path,
    samples: DataSource | Sequence[Mapping[str, np.ndarray]] | None = None,
    *,
    platforms: Sequence[str] = DEEPLOY_PLATFORMS,
    progress: ProgressFn | None = None,
) -> DeeployBuild:
    """Export the int8 QDQ model to Deeploy's integer network in ``out_dir`` (``network.onnx``, ``inputs.npz``,
    ``outputs.npz``) and generate ``Network.c``/``Network.h`` per platform into ``out_dir/<platform lower>/``.

    The first platform must succeed with an integer-only network; the others are tried and their failure is a
    warning. An unsupported op (the export names the node), a Deeploy rejection or a float buffer in the
    generated code raise :class:`~qdebug.errors.TargetError` with the reason.
    """
    from qdebug.targets import deeploy_env, deeploy_export

    say = progress or (lambda _msg: None)
    out = Path(out_dir)
    device = f"Deeploy {deeploy_env.DEEPLOY_VERSION} ({', '.join(platforms)})"
    t0 = time.perf_counter()
    data = None if samples is None else [dict(s) for s in samples]
    say("exporting the QDQ model to Deeploy's integer network")
    exp = deeploy_export.export(
        qdq_model, out, data=data, verbose=False, num_samples=len(data) if data else 16
    )  # raises TargetError naming the node or tensors it cannot export
    network = onnx.load(str(out / "network.onnx"))
    nodes = len(network.graph.node)
    info: dict[str, Any] = {
        "export": {
            "dir": out.name,
            "files": [f"{out.name}/{f}" for f in ("network.onnx", "inputs.npz", "outputs.npz")],
            "num_samples": exp.num_samples,
            "equal_fraction": exp.equal_fraction,
            "max_lsb_diff": exp.max_lsb_diff,
            "bit_exact_ok": exp.bit_exact_ok,
            "worst_requant_rel_error": exp.worst_requant_rel_error,
            "nodes": nodes,
        },
        "codegen": {},
    }
    warnings: list[str] = []
    if not exp.bit_exact_ok:
        warnings.append(
            f"the integer network matches the CPU QDQ model on {exp.equal_fraction:.2%} of the output elements "
            f"(max {exp.max_lsb_diff} LSB, {exp.num_samples} samples); the target is ≥ 99.9 % and ≤ 1 LSB "
            "(docs/deeploy.md, Bit-exactness)"
        )
    compiled: str | None = None
    for i, plat in enumerate(platforms):
        say(f"generating Deeploy code for {plat}")
        dest = out / plat.lower()
        res = deeploy_env.generate(out, dest, plat)
        rel = f"{out.name}/{plat.lower()}"
        entry: dict[str, Any] = {
            "ok": res.ok,
            "dir": rel,
            "files": [f"{rel}/{f}" for f in res.files],
            "integer_only": res.integer_only,
            "float_buffers": list(res.float_buffers),
            "error": res.error,
            "seconds": round(res.seconds, 4),
        }
        info["codegen"][plat] = entry
        problem = None
        if not res.ok:
            problem = f"Deeploy rejected the network for {plat}: {res.error}"
        elif res.integer_only is not True:
            problem = (
                f"Deeploy generated code for {plat} but it is not integer-only (float buffers: "
                f"{', '.join(res.float_buffers) or 'unknown'})"
            )
        if problem is None:
            if compiled is None:
                compiled = str(dest / "Network.c")
            continue
        if i == 0:
            raise TargetError(problem)
        warnings.append(f"{problem} (the {platforms[0]} code is complete; {plat} is optional)")
    report = CompileReport(
        target="deeploy",
        ok=True,
        compiled_model=compiled,
        compile_seconds=round(time.perf_counter() - t0, 4),
        accelerator_partitions=sum(1 for e in info["codegen"].values() if e["ok"]),
        accelerator_nodes=nodes,
        cpu_nodes=0,
        graph_io_qdq_on_cpu=0,
        device=device,
    )
    return DeeployBuild(report, info, tuple(warnings))


def _first_sample(source: DataSource) -> dict[str, np.ndarray]:
    for sample in source:
        return dict(sample)
    raise ModelError(f"{source.description}: holds no samples")


def validate_cpu(qdq_model: str | Path, data: DataSource | None = None) -> CompileReport:
    """The CPU "compile": ONNX Runtime's CPU provider loads ``qdq_model`` and runs one sample (the first of
    ``data``, else a synthetic one). ``ok`` is False with the error when either fails; every node counts as taken
    by the target."""
    import onnxruntime as ort

    path = Path(qdq_model)
    model = load_model(path, "QDQ model")
    device = f"ONNX Runtime {ort.__version__} CPUExecutionProvider ({platform.machine()})"
    t0 = time.perf_counter()
    warnings: list[str] = []
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        feed = _first_sample(data if data is not None else open_data(None, input_specs(model), num_samples=1))
        outs = sess.run(None, feed)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types: report, do not crash
        return CompileReport(
            target="cpu",
            ok=False,
            compiled_model=None,
            compile_seconds=round(time.perf_counter() - t0, 4),
            accelerator_partitions=0,
            accelerator_nodes=0,
            cpu_nodes=0,
            graph_io_qdq_on_cpu=0,
            device=device,
            error=f"ONNX Runtime CPU could not run the QDQ model: {type(exc).__name__}: {exc}",
        )
    bad = [o.name for o, v in zip(sess.get_outputs(), outs, strict=True) if not np.all(np.isfinite(np.asarray(v)))]
    if bad:
        warnings.append(f"output(s) {bad} hold NaN/Inf on the first sample")
    return CompileReport(
        target="cpu",
        ok=True,
        compiled_model=str(path),
        compile_seconds=round(time.perf_counter() - t0, 4),
        accelerator_partitions=1,
        accelerator_nodes=len(model.graph.node),
        cpu_nodes=0,
        graph_io_qdq_on_cpu=0,
        device=device,
        warnings=tuple(warnings),
    )


def _sample_source(
    data: Any, model: onnx.ModelProto, n: int, label_key: str, input_shapes: Mapping[str, Sequence[int]] | None
) -> DataSource:
    # Synthetic debug samples use another seed than synthetic calibration (seed 0): not the calibration set.
    return open_data(data, input_specs(model), num_samples=n, seed=1, ignore=(label_key,), input_shapes=input_shapes)


def _outputs_of(result: Any, names: Sequence[str]) -> list[np.ndarray]:
    """``run_compiled``'s per-sample result as arrays in ``names`` order (a mapping or a sequence)."""
    if isinstance(result, Mapping):
        return [np.asarray(result[n]) for n in names]
    return [np.asarray(v) for v in result]


def _fp16_accuracy(
    float_model: Path, compiled: Path, source: DataSource, options: QnnOptions, device: str
) -> TargetAccuracy:
    """HTP fp16 vs the float model per output (there is no CPU QDQ model to compare with)."""
    import onnxruntime as ort

    from qdebug.targets.qnn import run_compiled

    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(str(float_model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    t0 = time.perf_counter()
    results = list(run_compiled(compiled, source, output_names=names, options=options))
    seconds = time.perf_counter() - t0
    sums = [ErrorSums() for _ in names]
    for sample, res in zip(source, results, strict=True):
        for j, (r, t) in enumerate(zip(ref.run(names, dict(sample)), _outputs_of(res, names), strict=True)):
            sums[j] = sums[j].merge(reduce_pair(np.asarray(r), t))
    outputs = tuple(TargetOutputAccuracy(n, s.sqnr[0], None, None) for n, s in zip(names, sums, strict=True))
    return TargetAccuracy(
        target="qnn",
        device=device,
        num_samples=len(results),
        seconds_per_sample=round(seconds / max(len(results), 1), 6),
        outputs=outputs,
        notes=("fp16: no QDQ model, so the HTP is compared with the float model only",),
    )


def _top1_compiled(
    compiled: Path, eval_data: Path, label_key: str, model: onnx.ModelProto, options: QnnOptions
) -> float:
    from qdebug.targets.qnn import run_compiled

    source = open_data(eval_data, input_specs(model), ignore=(label_key,))
    labels = _labels(eval_data, label_key, len(source))
    first = model.graph.output[0].name
    hits = 0
    for i, res in enumerate(run_compiled(compiled, source, output_names=[first], options=options)):
        logits = _outputs_of(res, [first])[0]
        hits += int(int(np.argmax(logits.reshape(-1))) == int(labels[i]))
    return hits / len(source)


def _labels(eval_data: Path, label_key: str, n: int) -> np.ndarray:
    from qdebug.errors import DataError

    with np.load(eval_data, allow_pickle=False) as npz:
        if label_key not in npz.files:
            raise DataError(f"{eval_data}: no label array {label_key!r}")
        labels = np.asarray(npz[label_key]).reshape(-1)
    if labels.shape[0] != n:
        raise DataError(f"{eval_data}: {labels.shape[0]} labels for {n} samples")
    return labels


def _data_sha256(path: Path) -> str:
    if path.is_dir():
        import hashlib

        h = hashlib.sha256()
        for f in sorted(path.glob("*.npz")):
            h.update(f"{f.name}\0{file_sha256(f)}\n".encode())
        return h.hexdigest()
    return file_sha256(path)


def _is_epcontext(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "EPContext" for n in model.graph.node)


def _check_float_model(model: onnx.ModelProto, path: Path) -> None:
    if _is_epcontext(model):
        raise ModelError(f"{path}: is a compiled EPContext model; build takes the float ONNX model it came from")
    kind = model_kind(model)
    if kind is not ModelKind.FLOAT:
        raise ModelError(f"{path}: is already quantized ({kind.value}); build takes the float model")


def _prepare_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an empty folder; choose a new output folder")


def _dynamic_shapes(
    model: onnx.ModelProto, given: Mapping[str, Sequence[int]] | None, data: Any, label_key: str
) -> tuple[dict[str, list[int]], str]:
    """Shapes for the static-shape fix: ``given`` first, then the first data sample, then the documented defaults."""
    from qdebug.data import resolve_shapes

    specs = input_specs(model)
    dynamic = [s for s in specs if not s.is_static]
    shapes = {k: list(v) for k, v in (given or {}).items()}
    missing = [s for s in dynamic if s.name not in shapes]
    if not missing:
        return shapes, "from --input-shape" if given else ""
    if data is not None:
        first = _first_sample(open_data(data, specs, num_samples=1, ignore=(label_key,), input_shapes=given))
        for s in missing:
            shapes[s.name] = list(first[s.name].shape)
        return shapes, "from the first data sample"
    for s in missing:
        shapes[s.name] = list(resolve_shapes([s])[s.name])
    return shapes, "defaults (batch 1, other dims 32: no data and no --input-shape)"


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


# ---------------------------------------------------------------------------------------------- build
def build(
    onnx_model: str | Path,
    out_dir: str | Path,
    options: BuildOptions,
    *,
    data: str | Path | Mapping[str, np.ndarray] | DataSource | None = None,
    eval_data: str | Path | None = None,
    config: QuantConfig | str | Path | None = None,
    overrides: OverridesFile | str | Path | None = None,
    progress: ProgressFn | None = None,
) -> BuildResult:
    """Fix, quantize and compile the float model ``onnx_model`` for ``options.device``; write ``out_dir``.

    ``data`` calibrates (``None``: synthetic) and feeds ``debug`` and the simulator check (its first
    ``options.debug_samples`` samples, or those of ``eval_data`` when given); ``eval_data`` (labelled ``.npz``,
    ``options.label_key``) gives top-1 accuracy of the float, QDQ and compiled models. ``config`` / ``overrides``
    are a :class:`QuantConfig` / overrides file (objects or JSON paths) under the precision's settings.

    Raises :class:`BuildError` (exit 7) when the target fails, takes no node, or (``fail_on_fallback``) leaves
    nodes on the CPU; bad input raises the matching :class:`~qdebug.errors.QDebugError` before anything is written.
    ``out_dir`` must be new or empty and holds a complete build or nothing.
    """
    import onnxruntime as ort

    say = progress or (lambda _msg: None)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    src = Path(onnx_model)
    out = Path(out_dir)
    model = load_model(src, "model")
    _check_float_model(model, src)
    _prepare_out(out)

    inputs = [InputFile("model", str(src.resolve()), file_sha256(src))]
    for role, value in (("data", data), ("eval_data", eval_data)):
        if isinstance(value, str | Path) and Path(value).exists():
            inputs.append(InputFile(role, str(Path(value).resolve()), _data_sha256(Path(value))))
    cfg_obj: QuantConfig | None = None
    if isinstance(config, str | Path):
        cfg_obj = QuantConfig.load(config)
        inputs.append(InputFile("config", str(Path(config).resolve()), file_sha256(config)))
    else:
        cfg_obj = config
    warnings: list[str] = []
    ofile: OverridesFile | None = None
    if overrides is not None:
        from qdebug.mixed.overrides import OverridesFile, check_against_model

        ofile = overrides if isinstance(overrides, OverridesFile) else OverridesFile.load(overrides)
        warnings += check_against_model(ofile, model, inputs[0].sha256)
        if isinstance(overrides, str | Path):
            inputs.append(InputFile("overrides", str(Path(overrides).resolve()), file_sha256(overrides)))
    cfg = resolve_config(options.device, options.precision, cfg_obj, ofile)
    if ofile is not None and cfg is not None:
        warnings += ofile.drift(cfg)
    if eval_data is not None and not Path(eval_data).is_file():
        from qdebug.errors import InputFileError

        raise InputFileError(f"evaluation data {eval_data}: no such file")

    qnn = None
    qopts = None
    if options.device == "qnn":
        qnn = _qnn()
        qopts = qnn_options(options)

    stem = src.stem.removesuffix(".float")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = _staging_dir(out)
    fixes: tuple[FixReport, ...] = ()
    compile_report: CompileReport | None = None
    deeploy_info: dict[str, Any] | None = None
    snap_info: dict[str, Any] | None = None
    try:
        # 1. QNN compatibility fixes on the float model: before quantizing, so that calibration, the Q/DQ placement
        #    and the overrides all see the graph QNN will compile (fixing shapes after quantizing left ~1,100 CPU
        #    nodes on a detector).
        t0 = time.perf_counter()
        fixed_model = model
        if options.device == "qnn":
            say("applying QNN compatibility fixes")
            shapes, shape_source = _dynamic_shapes(model, options.input_shapes, data, options.label_key)
            fixed = apply_qnn_fixes(model, cfg, input_shapes=shapes, skip=options.skip_fixes)
            fixes = tuple(
                replace(r, detail=f"{r.detail} (shapes {shape_source})") if r.name == "static_shapes" and r.changed
                else r
                for r in fixed.reports
            )  # fmt: skip
            fixed_model, cfg = fixed.model, fixed.config
            if ofile is not None and cfg is not None and fixed.changed:
                _check_overrides_after_fixes(ofile, fixed_model, fixed.changed)
        elif options.device == "deeploy":
            say("applying the Deeploy fixes (static shapes, BatchNorm folding)")
            fixed_model, fixes = _deeploy_fixes(model, options, data)
            changed = [f.name for f in fixes if f.changed]
            if ofile is not None and changed:
                _check_overrides_after_fixes(ofile, fixed_model, changed)
        float_path = staging / f"{stem}.float.onnx"
        atomic_save_model(fixed_model, float_path)
        timings["fixes_s"] = round(time.perf_counter() - t0, 4)

        # 2. Quantize (not for fp16). Label arrays in the data are ignored, not an error.
        quant: QuantizeResult | None = None
        qdq_path: Path | None = None
        shapes_after = None if options.device in ("qnn", "deeploy") else options.input_shapes
        if cfg is not None:
            say(f"quantizing ({cfg.activation_type} activations, {cfg.weight_type} weights)")
            from qdebug.quantize import quantize

            t0 = time.perf_counter()
            calib = None if data is None else open_data(
                data, input_specs(fixed_model), num_samples=cfg.num_samples, ignore=(options.label_key,),
                input_shapes=shapes_after,
            )  # fmt: skip
            qdq_path = staging / f"{stem}.qdq.onnx"
            quant = quantize(float_path, calib, cfg, qdq_path, input_shapes=shapes_after)
            if options.device == "deeploy":
                snap_info = _snap_for_deeploy(qdq_path, qdq_path, options.snap_scales, say, options.snap_grid)
            timings["quantize_s"] = round(time.perf_counter() - t0, 4)

        debug_src = eval_data if eval_data is not None else data
        samples = _sample_source(debug_src, fixed_model, options.debug_samples, options.label_key, shapes_after)

        # 3. Compile (QNN) or check that ORT CPU runs the QDQ model.
        t0 = time.perf_counter()
        if options.device == "qnn":
            assert qnn is not None and qopts is not None
            say(f"compiling for QNN {qopts.device_label()}")
            compile_report = qnn.compile_qnn(qdq_path or float_path, staging, qopts, name=stem)
        elif options.device == "deeploy":
            assert qdq_path is not None
            dbuild = compile_deeploy(qdq_path, staging / "deeploy", samples, progress=say)
            compile_report, deeploy_info = dbuild.compile, {**dbuild.info, "snap": snap_info}
            warnings += dbuild.warnings
        else:
            assert qdq_path is not None
            say("checking that ONNX Runtime CPU runs the QDQ model")
            compile_report = validate_cpu(qdq_path, samples)
        timings["compile_s"] = round(time.perf_counter() - t0, 4)
        assert compile_report is not None
        problems = compile_problems(compile_report, options.fail_on_fallback)
        if problems:
            raise BuildError("; ".join(problems), compile_report=compile_report, fixes=fixes)
        compiled_path = Path(compile_report.compiled_model or "")
        warnings += _fallback_hints(compile_report, fixes)

        # 4. Accuracy: CPU QDQ vs float (debug), the target vs both (simulator), top-1.
        report: DebugReport | None = None
        target_acc: TargetAccuracy | None = None
        if qdq_path is not None:
            from qdebug.debug import DebugOptions, debug

            say(f"debugging the QDQ model on {len(samples)} samples")
            t0 = time.perf_counter()
            report = debug(float_path, qdq_path, samples, DebugOptions())
            timings["debug_s"] = round(time.perf_counter() - t0, 4)
        if options.device == "qnn":
            assert qnn is not None and qopts is not None
            say(f"running the HTP simulator on {len(samples)} samples")
            t0 = time.perf_counter()
            if qdq_path is not None:
                with tempfile.TemporaryDirectory(prefix="qdebug-htp-") as probe_dir:
                    target_acc = qnn.htp_accuracy(
                        float_path,
                        qdq_path,
                        compiled_path,
                        samples,
                        out_dir=Path(probe_dir),
                        options=qopts,
                        probe_tensors=options.probe_tensors,
                    )
            else:
                target_acc = _fp16_accuracy(float_path, compiled_path, samples, qopts, qopts.device_label())
            timings["simulator_s"] = round(time.perf_counter() - t0, 4)
            if report is not None and target_acc is not None:
                report = report.with_target_accuracy(target_acc)
        top1 = None
        if eval_data is not None:
            say("measuring top-1 accuracy")
            t0 = time.perf_counter()
            top1 = _top1(float_path, qdq_path, compiled_path, Path(eval_data), options, fixed_model, qopts)
            timings["eval_s"] = round(time.perf_counter() - t0, 4)

        # 5. Manifest and report, then move the folder into place.
        files = {"float_model": float_path.name, "manifest": "manifest.json"}
        if qdq_path is not None and quant is not None:
            files["qdq_model"] = qdq_path.name
            files["calibration_cache"] = Path(quant.calibration_cache).name
            quant = replace(quant, model_path=qdq_path.name, calibration_cache=Path(quant.calibration_cache).name)
        if deeploy_info is not None:
            files["compiled_model"] = str(compiled_path.relative_to(staging))
            files["deeploy_network"] = "deeploy/network.onnx"
            files["deeploy_inputs"] = "deeploy/inputs.npz"
            files["deeploy_outputs"] = "deeploy/outputs.npz"
            for plat, entry in deeploy_info["codegen"].items():
                for f in entry["files"]:
                    files[f"{plat.lower()}_{Path(f).stem.lower()}_{Path(f).suffix.lstrip('.')}"] = f
        else:
            files["compiled_model"] = compiled_path.name
        if compile_report.log_path:
            files["compile_log"] = Path(compile_report.log_path).name
        if report is not None and qdq_path is not None:
            files["report"] = "report.json"
            final = out.resolve()  # the report names the models where they will be, not in the staging folder
            f_final, q_final = str(final / float_path.name), str(final / qdq_path.name)
            report = replace(report, meta=replace(report.meta, float_model=f_final, quant_model=q_final))
            report.save(staging / "report.json")
        timings["total_s"] = round(time.perf_counter() - t_start, 4)
        qnn_version = None
        if options.device == "qnn":
            from importlib.metadata import version

            qnn_version = version("onnxruntime-qnn")
        manifest = BuildManifest(
            qdebug_version=__version__,
            onnxruntime_version=ort.__version__,
            onnxruntime_qnn_version=qnn_version,
            device=options.device,
            precision=options.precision,
            soc=options.soc,
            inputs=tuple(inputs),
            config=cfg,
            fixes=fixes,
            quantization=quant,
            compile=_relative_paths(compile_report, staging),
            num_debug_samples=len(samples),
            cpu_qdq_vs_float=tuple(
                OutputSqnr(o.output_name, o.cumulative_sqnr_db, o.cumulative_status) for o in report.model_outputs
            )
            if report is not None
            else (),
            target_accuracy=target_acc,
            top1=top1,
            timings=timings,
            files=files,
            warnings=tuple(warnings),
            deeploy=deeploy_info,
        )
        atomic_write_text(staging / "manifest.json", manifest.to_json())
        if out.exists():
            out.rmdir()  # empty (checked above); a non-empty one makes this fail rather than mix two builds
        os.replace(staging, out)
    except BaseException as exc:
        if isinstance(exc, TargetError) and compile_report is not None:
            # The compile log is the one thing needed to understand a failed compile: keep it outside out_dir.
            compile_report = _rescue_log(compile_report)
            if isinstance(exc, BuildError):
                exc.compile_report = compile_report
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, TargetError) and not isinstance(exc, BuildError):
            raise BuildError(str(exc), compile_report=compile_report, fixes=fixes) from exc
        raise
    return BuildResult(out_dir=out, manifest=manifest, report=report)


#: Fallback op type → the fix that removes it (QNN's own reason for these is vague, e.g. "error 3110").
_FIX_FOR_OP = {"Erf": "gelu_fusion", "LayerNormalization": "layernorm_gamma_unsigned"}


def _fallback_hints(report: CompileReport, fixes: Sequence[FixReport]) -> list[str]:
    """Name the skipped fix (``--skip-fix``) that would have kept a fallen-back op on the HTP."""
    skipped = {f.name for f in fixes if f.detail == "skipped on request"}
    hints = []
    for op, n in sorted(report.fallback_by_op().items()):
        fix = _FIX_FOR_OP.get(op)
        if fix in skipped:
            hints.append(f"{n} {op} node(s) fell back to the CPU; the skipped {fix} fix is what removes that")
    return hints


def _staging_dir(out: Path) -> Path:
    """A new hidden folder next to ``out`` (same file system: the final rename is atomic). Unlike mkdtemp's 0700
    it gets the user's umask, since it becomes the output folder."""
    import secrets

    for _ in range(100):
        path = out.parent / f".{out.name}.building-{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"could not create a staging folder next to {out}")


def _rescue_log(report: CompileReport) -> CompileReport:
    """Move a failed build's compile log into a new temp folder (the staging folder is about to go)."""
    if not report.log_path or not Path(report.log_path).is_file():
        return report
    keep = Path(tempfile.mkdtemp(prefix="qdebug-build-failed-")) / Path(report.log_path).name
    shutil.move(report.log_path, keep)
    return replace(report, log_path=str(keep), compiled_model=None)


def _snap_for_deeploy(src: Path, dest: Path, enabled: bool, say: ProgressFn, grid: str = "tie_free") -> dict[str, Any]:
    """Snap the QDQ model ``src`` for Deeploy into ``dest`` (may be ``src``); the manifest's ``deeploy.snap``."""
    if not enabled:
        return {"enabled": False}
    from qdebug.targets.deeploy_snap import snap_scales_for_deeploy

    say(f"snapping the requantization scales to Deeploy's int32 RequantShift ({grid} grid)")
    snapped, rep = snap_scales_for_deeploy(load_model(src, "QDQ model"), grid=grid)
    atomic_save_model(snapped, dest)
    return {"enabled": True, **rep.to_dict()}


def _deeploy_fixes(
    model: onnx.ModelProto, options: BuildOptions, data: Any
) -> tuple[onnx.ModelProto, tuple[FixReport, ...]]:
    """The QNN fixes that also apply to Deeploy: static shapes (its buffers are static) and BatchNorm folding (it
    has no BatchNormalization kernel)."""
    from qdebug.targets.qnn_fixes import fix_static_shapes, fold_batchnorm

    reports: list[FixReport] = []
    m = model
    for name in DEEPLOY_FIXES:
        if name in options.skip_fixes:
            reports.append(FixReport(name, False, "skipped on request"))
            continue
        if name == "static_shapes":
            shapes, source = _dynamic_shapes(m, options.input_shapes, data, options.label_key)
            m, rep = fix_static_shapes(m, shapes)
            if rep.changed:
                rep = replace(rep, detail=f"{rep.detail} (shapes {source})")
        else:
            m, rep = fold_batchnorm(m)
        reports.append(rep)
    if m is model:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    return m, tuple(reports)


def _check_overrides_after_fixes(ofile: OverridesFile, model: onnx.ModelProto, changed: Sequence[str]) -> None:
    """The user's overrides must still name tensors (and consumers) of the *fixed* model."""
    from qdebug.mixed.overrides import OverridesError, OverridesFile, check_against_model

    try:
        check_against_model(OverridesFile(ofile.overrides), model, "")
    except OverridesError as exc:
        raise ConfigError(
            f"the overrides no longer fit the model after the QNN fix(es) {list(changed)}: "
            + "; ".join(exc.problems)
            + " (make them for the fixed float model, or pass --skip-fix for the fix that removed the tensors)"
        ) from exc


def _top1(
    float_path: Path,
    qdq_path: Path | None,
    compiled: Path,
    eval_data: Path,
    options: BuildOptions,
    model: onnx.ModelProto,
    qopts: QnnOptions | None,
) -> TopOne:
    from qdebug.evaluate import top1_accuracy

    f = top1_accuracy(float_path, eval_data, options.label_key)
    q = None if qdq_path is None else top1_accuracy(qdq_path, eval_data, options.label_key)
    if options.device == "cpu":
        c = q
    elif options.device == "deeploy":
        c = None  # the generated C is not run here (no PULP simulator); the integer network matches q (export)
    else:
        assert qopts is not None
        c = _top1_compiled(compiled, eval_data, options.label_key, model, qopts)
    n = len(open_data(eval_data, input_specs(model), ignore=(options.label_key,)))
    return TopOne(num_samples=n, float_model=f, qdq_model=q, compiled_model=c)


# ---------------------------------------------------------------------------------------------- recompile
def recompile(
    qdq_model: str | Path,
    out_dir: str | Path,
    target: str = "qnn",
    *,
    float_model: str | Path | None = None,
    data: Any = None,
    options: QnnOptions | None = None,
    num_samples: int | None = None,
    snap_scales: bool = True,
    snap_grid: str = "tie_free",
) -> RecompileResult:
    """Compile an already-quantized QDQ model for ``target`` (``"qnn"``: EPContext; ``"cpu"``: check that ORT CPU
    loads and runs it; ``"deeploy"``: export to ``out_dir/deeploy/`` and generate Network.c/.h for Generic, and
    Siracusa where the ops allow, via :func:`compile_deeploy`) into ``out_dir``, e.g. after a mixed-precision
    promotion (promote → re-quantize → recompile). A Deeploy failure (e.g. the 16-bit tensors a promotion made,
    all named) is reported in ``problems``.

    Deeploy and ``snap_scales`` (default): the QDQ model's scales are first snapped so that every requantization
    is exactly ``mul/2^k`` in Deeploy's int32 RequantShift (:mod:`qdebug.targets.deeploy_snap`; ``snap_grid``
    "tie_free" (default): output scales move by up to ~4e-2 relative, 100 % of the output elements equal measured;
    "fine": scale changes ≤ ~1e-3, ≥ 99.8 % equal). The given file is untouched; the snapped copy is written to
    ``out_dir/<stem>.snapped.onnx`` and named in ``qdq_model``: the generated network corresponds to *it*, not to
    the given model (87–97 % equal there, docs/deeploy.md). ``snap_scales=False`` exports the given scales as
    they are; ``notes`` gives the equal fraction either way.

    With ``float_model`` the QNN result carries the HTP simulator's :class:`TargetAccuracy` on ``data`` (any data
    spec; ``None``: 8 seeded synthetic samples; ``num_samples`` caps it). A compile that fails or takes no node is
    *reported* (``ok`` False, ``problems``), not raised; bad input (a float, QOperator or EPContext model instead of a
    QDQ model) raises :class:`ModelError`, a missing onnxruntime-qnn :class:`~qdebug.errors.MissingExtraError`.
    """
    path = Path(qdq_model)
    out = Path(out_dir)
    qmodel = load_model(path, "QDQ model")
    if _is_epcontext(qmodel):
        raise ModelError(f"{path}: is already a compiled EPContext model; recompile takes the QDQ model")
    if model_kind(qmodel) is not ModelKind.QDQ:
        raise ModelError(f"{path}: is not a QDQ model ({model_kind(qmodel).value}); quantize it first")
    if target not in DEVICES:
        raise ConfigError(f"unknown target {target!r}; recompile supports {list(DEVICES)}")
    source: DataSource | None = None
    if float_model is not None:
        fmodel = load_model(float_model, "float model")
        source = open_data(data, input_specs(fmodel), num_samples=num_samples, seed=1)
    elif data is not None:
        source = open_data(data, input_specs(qmodel), num_samples=num_samples)
    out.mkdir(parents=True, exist_ok=True)
    if target == "deeploy":
        # Export + code generation; a model Deeploy cannot take (16-bit tensors after a promotion, an op with no
        # integer form, a Deeploy rejection) is reported with the reason, as a failed QNN compile is.
        t0 = time.perf_counter()
        dest = out / "deeploy"
        if dest.exists():
            shutil.rmtree(dest)  # a previous recompile's output in this (qdebug-owned) folder
        samples = None
        if source is not None:
            samples = [dict(s) for s in source]
        notes: list[str] = []
        export_from = path
        if snap_scales:
            export_from = out / f"{path.name.removesuffix('.onnx')}.snapped.onnx"
            if snap_grid not in ("tie_free", "fine"):
                raise ConfigError(f"snap_grid {snap_grid!r} not in ['tie_free', 'fine']")
            snap = _snap_for_deeploy(path, export_from, True, lambda _msg: None, snap_grid)
            notes.append(
                f"scales snapped for Deeploy's int32 RequantShift ({snap_grid} grid): {len(snap['snapped'])} "
                "requantization(s), "
                f"largest relative scale change {snap['max_rel_change']:.2e}; the network corresponds to "
                f"{export_from}"
            )
        try:
            dbuild = compile_deeploy(export_from, dest, samples)
        except TargetError as exc:
            report = _deeploy_failure(f"Deeploy ({', '.join(DEEPLOY_PLATFORMS)})", t0, str(exc))
            return RecompileResult(report, None, tuple(compile_problems(report)), None, tuple(notes))
        e = dbuild.info["export"]
        notes.append(
            f"integer network vs CPU QDQ on {e['num_samples']} samples: {e['equal_fraction']:.2%} of output "
            f"elements equal, max {e['max_lsb_diff']} LSB"
        )
        notes += dbuild.warnings
        qdq_out = str(export_from) if snap_scales else None
        return RecompileResult(dbuild.compile, None, (), qdq_out, tuple(notes))
    if target == "cpu":
        report = validate_cpu(path, source)
        return RecompileResult(report, None, tuple(compile_problems(report)))
    qnn = _qnn()
    from qdebug.targets.qnn import QnnOptions

    opts = options or QnnOptions()
    report = qnn.compile_qnn(path, out, opts, name=path.stem.removesuffix(".qdq"))
    problems = compile_problems(report, opts.fail_on_fallback)
    acc = None
    if not problems and float_model is not None and source is not None:
        with tempfile.TemporaryDirectory(prefix="qdebug-htp-") as probe_dir:  # the probe model is not a result
            acc = qnn.htp_accuracy(
                Path(float_model), path, Path(report.compiled_model or ""), source, out_dir=probe_dir, options=opts
            )
    return RecompileResult(report, acc, tuple(problems))
