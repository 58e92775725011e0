"""The QNN HTP target: compile a QDQ model to an EPContext model, run it on the HTP (simulator on x86),
and measure how its numbers differ from ONNX Runtime's CPU.

* :func:`compile_qnn` compiles in a worker process (:mod:`qdebug.targets._qnn_worker`) with ORT's verbose
  log on, because node placement and QNN's rejection reasons are only visible there, and because a crash
  in the QNN libraries must not take the caller down. The log is kept next to the compiled model and
  parsed into a :class:`~qdebug.targets.base.CompileReport`.
* :func:`run_compiled` runs a compiled model sample by sample, in-process, and checks that the QNN
  provider really runs it (Python falls back to the CPU provider silently in some failure modes).
* :func:`htp_accuracy` compares HTP, CPU-QDQ and float model outputs, and, through a *probe* copy of the
  QDQ model whose activation QuantizeLinear outputs are extra graph outputs, every quantized activation's
  integer values on the HTP against ONNX Runtime CPU's, in steps of the quantization grid (LSB).

``onnxruntime_qnn`` is imported only through :func:`qdebug._lazy.require` (the ``qnn`` extra).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qdebug._lazy import OPTIONAL_MODULES, require
from qdebug.data import DataSource, Sample
from qdebug.errors import ConfigError, DataError, MissingExtraError, ModelError, TargetError
from qdebug.io import refuse_overwrite_input, temp_dir
from qdebug.metrics import ErrorSums, reduce_pair, reduce_pairs, sqnr_from_energies
from qdebug.ort import expose_outputs, make_session
from qdebug.pairing import (
    ModelKind,
    Pairing,
    constant_values,
    decode_constant,
    dequantize,
    input_specs,
    is_dq,
    is_q,
    load_model,
    model_kind,
    pair_models,
    quant_type_name,
)
from qdebug.passes import PassReport
from qdebug.report import TargetAccuracy, TargetOutputAccuracy, TargetTensorDiff
from qdebug.targets.base import (
    INT8_WEIGHTS,
    UINT8,
    UINT16,
    Availability,
    BuildOptions,
    Compiled,
    CompileJob,
    CompileReport,
    FallbackNode,
    Precision,
    Prepared,
    ShapeSource,
    TargetBase,
    register_target,
    shapes_for,
)
from qdebug.targets.divergence import (
    EXCESS_NOISE_THRESHOLD,
    Divergence,
    Upstream,
    excess_ratio,
    locate,
    sqnr_drop_db,
    upstream_compared,
)
from qdebug.targets.qnn_fixes import FIX_NAMES, apply_qnn_fixes

if TYPE_CHECKING:
    from qdebug.config import QuantConfig

__all__ = [
    "DATA_MOVEMENT_OPS",
    "SOC_MODELS",
    "CompileLog",
    "NodeUnitValidation",
    "QnnOptions",
    "QnnTarget",
    "compile_qnn",
    "htp_accuracy",
    "parse_compile_log",
    "qnn_available",
    "qnn_options",
    "qnn_session",
    "run_compiled",
]

QNN_EP = "QNNExecutionProvider"
CPU_EP = "CPUExecutionProvider"

#: SoC name → (QNN ``soc_model`` id, HTP architecture). Without a SoC the provider's default is used,
#: an HTP v68 (SM8350) on x86.
SOC_MODELS: dict[str, tuple[int, str]] = {
    "SM8350": (30, "v68"),
    "SM8450": (36, "v69"),
    "SM8475": (42, "v69"),
    "SM8550": (43, "v73"),
    "SM8635": (68, "v73"),
    "SM8650": (57, "v75"),
    "SM8735": (85, "v79"),
    "SM8750": (69, "v79"),
    "SM8850": (87, "v81"),
}
DEFAULT_HTP_ARCH = "v68"

#: Reasons for which QNN leaves a node on the CPU on purpose (``offload_graph_io_quantization``): the
#: graph-input QuantizeLinear and graph-output DequantizeLinear. Not a fallback the user has to fix.
BY_DESIGN_REASONS = (
    "QNN EP is configured to not take Q nodes that consume a graph input",
    "QNN EP is configured to not take DQ nodes that generate a graph output",
)

#: Ops that only move data. Exposing the quantized tensors around them as probe outputs can split the
#: HTP graph (QNN then can no longer fold the Q/DQ pair around the op), so the probe drops them on retry.
DATA_MOVEMENT_OPS = frozenset(
    {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Gather", "Slice", "Concat", "Split"}
)

_EP_CONTEXT = "EPContext"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class QnnOptions:
    """How to compile for (and run on) the QNN HTP. Validated on construction.

    ``soc`` is a name of :data:`SOC_MODELS` (case-insensitive; ``None``: the provider's default, HTP
    v68). ``fail_on_fallback`` makes a compile that leaves any node on the CPU (graph-I/O Q/DQ aside) a
    failure. ``enable_fp16`` runs float parts in fp16 on the HTP; it needs ``soc`` because without a
    ``soc_model`` QNN silently takes no node of a float model. ``timeout_s`` bounds the compile.
    """

    soc: str | None = None
    fail_on_fallback: bool = False
    enable_fp16: bool = False
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.soc is not None:
            norm = str(self.soc).strip().upper()
            if norm in SOC_MODELS:
                object.__setattr__(self, "soc", norm)
            else:
                problems.append(f"unknown soc {self.soc!r}; known: {', '.join(SOC_MODELS)}")
        for flag in ("fail_on_fallback", "enable_fp16"):
            if not isinstance(getattr(self, flag), bool):
                problems.append(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.enable_fp16 is True and self.soc is None:
            problems.append(
                "enable_fp16 needs a soc (e.g. soc='SM8650'): without a soc_model QNN silently takes no node "
                "of a float model"
            )
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            problems.append(f"timeout_s must be a positive number of seconds, got {t!r}")
        if problems:
            raise ConfigError("invalid QNN options: " + "; ".join(problems))

    @property
    def soc_model(self) -> int | None:
        """QNN's ``soc_model`` id, ``None`` for the provider's default."""
        return SOC_MODELS[self.soc][0] if self.soc else None

    @property
    def htp_arch(self) -> str:
        """The HTP architecture compiled for (``v68`` by default)."""
        return SOC_MODELS[self.soc][1] if self.soc else DEFAULT_HTP_ARCH

    def device_label(self) -> str:
        """E.g. ``"SM8650 (HTP v75)"`` or ``"default SoC (HTP v68)"``."""
        return f"{self.soc or 'default SoC'} (HTP {self.htp_arch})"

    def provider_options(self) -> dict[str, str]:
        """The QNN provider options these options map to (the only place that maps them)."""
        opts = {"backend_type": "htp"}
        if self.soc_model is not None:
            opts["soc_model"] = str(self.soc_model)
        if self.enable_fp16:
            opts["enable_htp_fp16_precision"] = "1"
        return opts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "soc": self.soc,
            "fail_on_fallback": self.fail_on_fallback,
            "enable_fp16": self.enable_fp16,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> QnnOptions:
        """Build from a plain mapping (e.g. the target interface's ``options``); strings are parsed.

        Unknown keys and unparsable values are reported together in one :class:`ConfigError`.
        """
        known = ("soc", "fail_on_fallback", "enable_fp16", "timeout_s")
        problems = [f"unknown QNN option {k!r}; known: {', '.join(known)}" for k in options if k not in known]
        kw: dict[str, Any] = {}
        if "soc" in options:
            soc = options["soc"]
            kw["soc"] = None if soc is None or (isinstance(soc, str) and not soc.strip()) else soc
        for flag in ("fail_on_fallback", "enable_fp16"):
            if flag in options:
                v = options[flag]
                if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
                    v = v.strip().lower() in _TRUE
                kw[flag] = v
        if "timeout_s" in options:
            v = options["timeout_s"]
            if isinstance(v, str):
                try:
                    v = float(v)
                except ValueError:
                    problems.append(f"timeout_s must be a number of seconds, got {v!r}")
            kw["timeout_s"] = v
        if problems:
            raise ConfigError("invalid QNN options: " + "; ".join(problems))
        return cls(**kw)


def qnn_available() -> tuple[bool, str]:
    """(usable here, a short description or why not); never raises.

    Looks for the package and its provider library without importing either: listing targets (the UI's
    dropdown, ``qdebug targets``) must not load optional backends.
    """
    try:
        import importlib.util
        from importlib.metadata import PackageNotFoundError, version

        spec = importlib.util.find_spec("onnxruntime_qnn")
        if spec is None or not spec.submodule_search_locations:
            extra, purpose = OPTIONAL_MODULES["onnxruntime_qnn"]
            return False, str(MissingExtraError("onnxruntime_qnn", extra, purpose))
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
        libs = [p for p in pkg_dir.rglob("*onnxruntime_providers_qnn*") if p.suffix in (".so", ".dll")]
        if not libs:
            return False, f"onnxruntime_qnn is installed but has no provider library under {pkg_dir}"
        import onnxruntime as ort

        if not hasattr(ort, "register_execution_provider_library"):
            return False, f"onnxruntime {ort.__version__} cannot load the QNN plugin provider (too old)"
        try:
            ver = version("onnxruntime-qnn")
        except PackageNotFoundError:
            ver = "?"
        where = "HTP simulator" if platform.machine().lower() in ("x86_64", "amd64") else "HTP"
        return True, f"onnxruntime-qnn {ver} ({where})"
    except Exception as exc:  # a broken install can raise anything
        return False, f"onnxruntime-qnn is unusable here: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- the compile log


@dataclass(frozen=True)
class NodeUnitValidation:
    """One ``Validation PASSED/FAILED for N nodes in OrtNodeUnit (Op)`` entry of the verbose log."""

    op_type: str
    passed: bool
    nodes: int
    node_names: tuple[str, ...]
    reason: str = ""
    #: QNN backend errors logged while building this unit, e.g. ``"FullyConnected: error 3110"``.
    backend_errors: tuple[str, ...] = ()

    @property
    def by_design(self) -> bool:
        """A graph-input Q / graph-output DQ that QNN leaves on the CPU on purpose."""
        return any(self.reason.startswith(r) for r in BY_DESIGN_REASONS)

    def describe(self) -> str:
        """The backend's reason, with QNN's own error codes when it logged any."""
        text = self.reason or "no reason logged"
        if self.backend_errors:
            text += f" (QNN backend: {', '.join(self.backend_errors)})"
        return text


@dataclass(frozen=True)
class CompileLog:
    """What ORT's verbose log says about a QNN compile.

    ``units`` are from the *last* capability pass only: ORT asks QNN twice (before and after the layout
    transformation to NHWC), and only the last answer decides the partitioning. ``placements`` counts
    nodes per provider in the partitioned graph (where a whole QNN partition is *one* node);
    ``cpu_placed`` lists (op type, node name) of what ORT placed on the CPU provider.
    """

    units: tuple[NodeUnitValidation, ...]
    passes: int
    placements: Mapping[str, int]
    cpu_placed: tuple[tuple[str, str], ...]

    @property
    def failed(self) -> tuple[NodeUnitValidation, ...]:
        """The node units QNN refused."""
        return tuple(u for u in self.units if not u.passed)


_PASS_RE = re.compile(r"GetCapability pass (\d+)")
_UNIT_RE = re.compile(r"Validation (PASSED|FAILED) for (\d+) nodes? in OrtNodeUnit \(([^)]*)\)")
_UNIT_NODE_RE = re.compile(r"^\s*Operator type: (\S+) Node name: (.*?) Node index: \d+\s*$")
_REASON_RE = re.compile(r"^\s*REASON\s*:\s*(.*?)\s*$")
_PLACED_RE = re.compile(r"(?:Node\(s\)|All nodes) placed on \[([^\]]+)\]\. Number of nodes: (\d+)")
_PLACED_NODE_RE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s{3,}(\S+) \((.*)\)\s*$")
_BACKEND_RE = re.compile(r"backendValidateOpConfig\(\) failed for node `[^`]*` of type `([^`]*)` with error code (\d+)")


def parse_compile_log(text: str) -> CompileLog:
    """Parse ORT's verbose log of a QNN compile (see :class:`CompileLog`)."""
    units: list[NodeUnitValidation] = []
    passes = 0
    placements: dict[str, int] = {}
    cpu_placed: list[tuple[str, str]] = []
    current: dict[str, Any] | None = None
    pending_backend: list[str] = []
    placing: str | None = None

    def flush() -> None:
        nonlocal current
        if current is not None:
            units.append(NodeUnitValidation(**{**current, "node_names": tuple(current["node_names"])}))
            current = None

    for line in text.splitlines():
        if m := _PASS_RE.search(line):
            flush()
            units.clear()
            pending_backend.clear()
            passes = max(passes, int(m.group(1)))
            continue
        if m := _UNIT_RE.search(line):
            flush()
            passed = m.group(1) == "PASSED"
            current = {
                "op_type": m.group(3),
                "passed": passed,
                "nodes": int(m.group(2)),
                "node_names": [],
                "reason": "",
                # QNN's backend errors are logged just before the unit they belong to.
                "backend_errors": () if passed else tuple(dict.fromkeys(pending_backend)),
            }
            pending_backend.clear()
            continue
        if m := _BACKEND_RE.search(line):
            pending_backend.append(f"{m.group(1)}: error {m.group(2)}")
            continue
        if current is not None:
            if m := _UNIT_NODE_RE.match(line):
                current["node_names"].append(m.group(2))
                continue
            if m := _REASON_RE.match(line):
                current["reason"] = m.group(1)
                continue
        if m := _PLACED_RE.search(line):
            flush()
            placing = m.group(1)
            placements[placing] = placements.get(placing, 0) + int(m.group(2))
            continue
        if placing is not None:
            if m := _PLACED_NODE_RE.search(line):
                if placing == CPU_EP:
                    cpu_placed.append((m.group(1), m.group(2)))
                continue
            placing = None
    flush()
    return CompileLog(tuple(units), passes, placements, tuple(cpu_placed))


# --------------------------------------------------------------------------- compiled models


@dataclass(frozen=True)
class _CompiledGraph:
    partitions: int  # EPContext nodes
    other_nodes: tuple[tuple[str, str], ...]  # (op type, name) of every other node: these run on the CPU
    graph_io_qdq: int  # of which graph-input Q / graph-output DQ
    context_bytes: int

    @property
    def cpu_nodes(self) -> int:
        return len(self.other_nodes) - self.graph_io_qdq


def _is_ep_context(node: onnx.NodeProto) -> bool:
    return node.op_type == _EP_CONTEXT and node.domain == "com.microsoft"


def _inspect_compiled(model: onnx.ModelProto, base_dir: Path) -> _CompiledGraph:
    g = model.graph
    inputs = {i.name for i in g.input}
    outputs = {o.name for o in g.output}
    partitions = 0
    context_bytes = 0
    others: list[tuple[str, str]] = []
    io_qdq = 0
    for n in g.node:
        if _is_ep_context(n):
            partitions += 1
            attrs = {a.name: a for a in n.attribute}
            embed = attrs["embed_mode"].i if "embed_mode" in attrs else 1
            if "ep_cache_context" in attrs:  # only the main context node of a split graph carries it
                blob = attrs["ep_cache_context"].s
                if embed == 1:
                    context_bytes += len(blob)
                else:  # embed mode 0: a file name relative to the model
                    f = base_dir / blob.decode("utf-8", "replace")
                    context_bytes += f.stat().st_size if f.is_file() else 0
            continue
        others.append((n.op_type, n.name or n.output[0]))
        if (is_q(n) and n.input[0] in inputs) or (is_dq(n) and n.output[0] in outputs):
            io_qdq += 1
    return _CompiledGraph(partitions, tuple(others), io_qdq, context_bytes)


def _check_compilable(model: onnx.ModelProto, path: Path, options: QnnOptions) -> None:
    if any(_is_ep_context(n) for n in model.graph.node):
        raise ModelError(f"{path}: is already a compiled QNN model (EPContext); compile its QDQ model instead")
    kind = model_kind(model)
    if kind is ModelKind.QOPERATOR:
        raise ModelError(
            f"{path}: is in QOperator format (QLinearConv, QGemm, ...); QNN compiles QDQ models: quantize "
            "with quant_format=QuantFormat.QDQ (qdebug quantize --target qnn)"
        )
    if kind is ModelKind.DYNAMIC:
        raise ModelError(
            f"{path}: is dynamically quantized (DynamicQuantizeLinear/MatMulInteger), which the HTP does not run; "
            "quantize statically in QDQ format (qdebug quantize --target qnn)"
        )
    if kind is ModelKind.FLOAT and not options.enable_fp16:
        raise ModelError(
            f"{path}: is a float model (no QuantizeLinear/DequantizeLinear); quantize it first "
            "(qdebug quantize --target qnn), or compile it in fp16 with enable_fp16=True and a soc"
        )
    dynamic = [f"{s.name!r} {list(s.shape)}" for s in input_specs(model) if not s.is_static]
    if dynamic:
        # QNN needs static shapes; with a symbolic dimension it silently takes nothing ("Cannot get shape").
        raise ModelError(
            f"{path}: QNN needs fixed input shapes, but input(s) {', '.join(dynamic)} have dynamic dimensions; "
            "fix them first (python -m onnxruntime.tools.make_dynamic_shape_fixed)"
        )


def has_16bit_weights(model: onnx.ModelProto) -> bool:
    """Whether a QDQ model dequantizes a 16-bit constant (QNN's recipe makes some weights 16-bit at uint16
    activations); the HTP runs those from v73 on."""
    consts = constant_values(model)
    sixteen = {onnx.TensorProto.INT16, onnx.TensorProto.UINT16}

    def dtype(c: onnx.TensorProto | onnx.NodeProto) -> int:
        if isinstance(c, onnx.TensorProto):
            return int(c.data_type)
        return next((int(a.t.data_type) for a in c.attribute if a.name == "value"), 0)

    return any(is_dq(n) and n.input[0] in consts and dtype(consts[n.input[0]]) in sixteen for n in model.graph.node)


#: The SoC a build compiles for when no --soc is given but the model needs HTP v73 (the oldest SoC that has it).
V73_SOC = "SM8550"

#: How a compile report's error starts when the QNN backend itself failed (as opposed to a timeout, a dead worker or
#: no node taken): the case where another SoC may succeed.
COMPILE_FAILED = "QNN could not compile"


def _hints(model: onnx.ModelProto, options: QnnOptions) -> list[str]:
    """Known causes of failure worth saying up front (they come back as vague backend errors)."""
    hints: list[str] = []
    if int(options.htp_arch[1:]) < 73 and has_16bit_weights(model):
        newer = ", ".join(k for k, (_, arch) in SOC_MODELS.items() if int(arch[1:]) >= 73)
        hints.append(
            f"the model has 16-bit weights, which need HTP v73 or newer (soc {newer}); "
            f"{options.device_label()} rejects the ops that use them"
        )
    return hints


def _check_name(name: str) -> None:
    if not name or name.startswith(".") or any(c in name for c in "/\\\0") or name != name.strip():
        raise ConfigError(f"invalid output name {name!r}: use a plain file stem such as 'model'")


def _worker_env() -> dict[str, str]:
    # The worker must import this very qdebug, installed or not.
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _log_tail(text: str, lines: int = 12) -> str:
    """The last non-verbose lines of a log (a traceback or an error), each cut to 400 characters."""
    all_lines = [ln for ln in text.splitlines() if ln.strip()]
    quiet = [ln for ln in all_lines if "[V:onnxruntime" not in ln and "[I:onnxruntime" not in ln]
    return "\n".join(ln[:400] for ln in (quiet or all_lines)[-lines:])


def _fallback_summary(fallback: Sequence[FallbackNode], limit: int = 8) -> str:
    items = [f for f in fallback if not f.by_design]
    parts = [f"{f.op_type} ({f.nodes} node{'s' if f.nodes != 1 else ''}): {f.reason}" for f in items[:limit]]
    if len(items) > limit:
        parts.append(f"… and {len(items) - limit} more group(s)")
    return "; ".join(parts)


def compile_qnn(
    model: str | Path,
    out_dir: str | Path,
    options: QnnOptions = QnnOptions(),
    name: str = "model",
) -> CompileReport:
    """Compile a QDQ model for the QNN HTP into ``out_dir/<name>.qnn_ctx.onnx`` (EPContext, embed mode 1).

    The compile runs in a worker process with ORT's verbose log, kept whole in
    ``out_dir/<name>.qnn_compile.log`` and parsed into the report. Outputs are produced in a hidden temp
    folder inside ``out_dir`` and moved into place only on success; on failure the log is still written
    and a stale ``<name>.qnn_ctx.onnx`` from an earlier run is removed, so the folder never shows a
    compiled model that does not match its log.

    The report's counts mean:

    * ``accelerator_partitions``: EPContext nodes in the compiled model (HTP graphs);
    * ``accelerator_nodes``: nodes of the *input* graph taken by QNN = input nodes (``Constant`` nodes
      excluded, ORT folds them) − nodes left outside the EPContext nodes of the compiled model. ORT's own
      "placed on [QNNExecutionProvider]" count is of the partitioned graph, one node per partition;
    * ``graph_io_qdq_on_cpu``: the graph-input Q / graph-output DQ nodes QNN leaves on the CPU by design;
    * ``cpu_nodes``: every other node left on the CPU (a real fallback);
    * ``fallback``: one entry per node unit QNN refused, with the backend's reason from the log;
    * ``compile_seconds``: the compiling session's creation in the worker (process start-up excluded).

    ``ok`` is False (with ``error``) when the worker fails, times out, QNN takes *no* node (ORT then
    "succeeds" silently and writes no context), or ``options.fail_on_fallback`` and ``cpu_nodes > 0``.
    Bad input raises: a missing/corrupt file (:class:`~qdebug.errors.InputFileError`); a float (unless
    ``enable_fp16``), QOperator, dynamically quantized, already compiled, dynamic-shape model, or one
    ONNX Runtime itself cannot load (:class:`~qdebug.errors.ModelError`).
    """
    if not isinstance(options, QnnOptions):
        raise ConfigError(f"options must be QnnOptions, got {type(options).__name__}")
    _check_name(name)
    src = Path(model)
    m = load_model(src, "model")
    _check_compilable(m, src, options)
    input_nodes = sum(1 for n in m.graph.node if n.op_type != "Constant")
    hints = _hints(m, options)
    del m
    require("onnxruntime_qnn")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx_dest = out / f"{name}.qnn_ctx.onnx"
    log_dest = out / f"{name}.qnn_compile.log"
    refuse_overwrite_input(ctx_dest, src)
    refuse_overwrite_input(log_dest, src)
    session_config = {
        "ep.context_enable": "1",
        "ep.context_embed_mode": "1",
    }
    report_options = {**options.provider_options(), **session_config, "fail_on_fallback": str(options.fail_on_fallback)}

    with temp_dir(prefix=f".{name}.qnn-", dir=out) as tmp:
        work = Path(tmp)
        ctx_tmp, log_tmp = work / ctx_dest.name, work / log_dest.name
        try:
            run = _run_worker(src, options, session_config, work, ctx_tmp, log_tmp)
            if run.result is not None and run.result.get("stage") == "load":
                raise ModelError(f"{src}: ONNX Runtime cannot load the model: {run.result.get('error')}")
            report = _make_report(run, ctx=ctx_tmp, input_nodes=input_nodes, options=options, src=src, hints=hints)
            if report.ok:
                os.replace(ctx_tmp, ctx_dest)
            os.replace(log_tmp, log_dest)
        except BaseException:
            ctx_dest.unlink(missing_ok=True)  # a stale context from an earlier run must not pass for this one
            raise
    if not report.ok:
        ctx_dest.unlink(missing_ok=True)
    return replace(
        report,
        compiled_model=str(ctx_dest) if report.ok else None,
        log_path=str(log_dest),
        options=report_options,
    )


@dataclass(frozen=True)
class _WorkerRun:
    """What the compile worker left: its result (``None`` if it died), its log, and how it ended."""

    result: dict[str, Any] | None
    log_text: str
    timed_out: bool
    returncode: int | None
    wall: float


def _run_worker(
    src: Path, options: QnnOptions, session_config: Mapping[str, str], work: Path, ctx_tmp: Path, log_tmp: Path
) -> _WorkerRun:
    """Compile in a worker process (a crash in the QNN libraries must not take the caller down), its verbose
    log in ``log_tmp``."""
    result_path, request_path = work / "result.json", work / "request.json"
    request = {
        "model": str(src.resolve()),
        "result": str(result_path),
        "provider_options": options.provider_options(),
        "session_config": {**session_config, "ep.context_file_path": str(ctx_tmp)},
    }
    request_path.write_text(json.dumps(request), encoding="utf-8")
    timed_out, returncode = False, None
    t0 = time.perf_counter()
    with open(log_tmp, "wb") as log_fh:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "qdebug.targets._qnn_worker", str(request_path)],
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                env=_worker_env(),
                timeout=options.timeout_s,
                check=False,
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:  # run() has killed the worker
            timed_out = True
    wall = time.perf_counter() - t0
    result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else None
    return _WorkerRun(result, log_tmp.read_text(encoding="utf-8", errors="replace"), timed_out, returncode, wall)


def _outcome(
    run: _WorkerRun, ctx: Path, src: Path, options: QnnOptions, fallback: Sequence[FallbackNode]
) -> tuple[str | None, _CompiledGraph | None]:
    """(why the compile failed, what it compiled) from the worker's result and the written context."""
    result = run.result
    if run.timed_out:
        return f"QNN compile of {src.name} did not finish within {options.timeout_s:g} s (worker stopped)", None
    if result is None:
        tail = _log_tail(run.log_text)
        return f"the QNN compile worker died (exit code {run.returncode}) without a result; log tail:\n{tail}", None
    if result.get("stage") != "done":
        error = f"{COMPILE_FAILED} {src.name}: {result.get('error')}"
        refused = _fallback_summary(fallback)  # empty when QNN only left graph-I/O Q/DQ out, by design
        return error + (f" (refused: {refused})" if refused else ""), None
    if QNN_EP not in result.get("providers", []):
        return f"ONNX Runtime did not create the QNN provider (providers: {result.get('providers')})", None
    if ctx.is_file():
        compiled = _inspect_compiled(onnx.load(str(ctx)), ctx.parent)
        return None, (compiled if compiled.partitions else None)
    return None, None


def _make_report(
    run: _WorkerRun, *, ctx: Path, input_nodes: int, options: QnnOptions, src: Path, hints: Sequence[str] = ()
) -> CompileReport:
    log = parse_compile_log(run.log_text)
    fallback = [FallbackNode(u.op_type, u.nodes, u.describe(), u.by_design) for u in log.failed]
    by_design = sum(f.nodes for f in fallback if f.by_design)
    refused = sum(f.nodes for f in fallback if not f.by_design)
    seconds = float(run.result["seconds"]) if run.result and "seconds" in run.result else run.wall
    warnings: list[str] = list(hints)
    error, compiled = _outcome(run, ctx, src, options, fallback)
    if error is None and compiled is None:
        # ORT creates the session and writes nothing when QNN takes no node: a failure, never a success.
        why = _fallback_summary(fallback) or "no reason in the log"
        error = f"QNN took none of the {input_nodes} nodes of {src.name}, so no context was written: {why}"
        refused = input_nodes - by_design

    if compiled is not None:
        partitions = compiled.partitions
        graph_io = compiled.graph_io_qdq
        cpu_nodes = compiled.cpu_nodes
        accelerator_nodes = max(0, input_nodes - len(compiled.other_nodes))
        context_bytes = compiled.context_bytes
        placed = log.placements.get(QNN_EP)
        if placed is not None and placed != partitions:
            warnings.append(f"the log places {placed} node(s) on QNN but the compiled model has {partitions} EPContext")
        if cpu_nodes and not any(not f.by_design for f in fallback):
            # The log format changed or said nothing: still say what is on the CPU.
            ops = Counter(op for op, _ in compiled.other_nodes)
            fallback += [FallbackNode(op, k, "left on the CPU (no reason in the QNN log)") for op, k in ops.items()]
    else:
        partitions, graph_io, cpu_nodes, accelerator_nodes, context_bytes = 0, by_design, refused, 0, 0

    if error is None and cpu_nodes > 0:
        msg = (
            f"{cpu_nodes} node(s) left on the CPU, the HTP graph is split into {partitions} partition(s): "
            f"{_fallback_summary(fallback)}"
        )
        if options.fail_on_fallback:
            error = f"fail_on_fallback: {msg}"
        else:
            warnings.append(msg)
    if error is not None and hints:
        error += " — hint: " + "; ".join(hints)
    return CompileReport(
        target="qnn",
        ok=error is None,
        compiled_model=None,
        compile_seconds=round(seconds, 4),
        accelerator_partitions=partitions,
        accelerator_nodes=accelerator_nodes,
        cpu_nodes=cpu_nodes,
        graph_io_qdq_on_cpu=graph_io,
        fallback=tuple(fallback),
        context_bytes=context_bytes,
        device=options.device_label(),
        error=error,
        warnings=tuple(warnings),
    )


# --------------------------------------------------------------------------- running on the HTP

_REGISTER_LOCK = threading.Lock()


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr for a while.

    The HTP simulator prints a banner (``# LIBNATIVE: ...``) to stdout when it first loads; it must not
    end up in a CLI's JSON output.
    """
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real stdout (e.g. some embedded interpreters): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).fflush(None)  # C stdio buffers of the native libraries
        os.dup2(saved, 1)
        os.close(saved)


def qnn_session(path: str | Path, options: QnnOptions = QnnOptions()) -> Any:
    """An in-process ONNX Runtime session of a compiled model on the QNN provider (the HTP simulator on x86).

    Raises :class:`~qdebug.errors.TargetError` when QNN cannot load the model or the session would not
    run on QNN (Python falls back to the CPU provider silently in some failure modes).
    """
    require("onnxruntime_qnn")
    import onnxruntime as ort

    from qdebug.targets._qnn_worker import register_qnn

    with _REGISTER_LOCK:
        devices = register_qnn(ort)
    if not devices:
        raise TargetError("onnxruntime-qnn registered no QNN device")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_provider_for_devices(devices, options.provider_options())
    try:
        with _stdout_to_stderr():
            sess = ort.InferenceSession(str(path), so)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise TargetError(f"{path}: QNN could not load the compiled model: {exc}") from exc
    providers = list(sess.get_providers())
    if QNN_EP not in providers:
        # Python can fall back to the CPU provider silently; numbers from it would not be the HTP's.
        raise TargetError(f"{path}: the session runs on {providers}, not on {QNN_EP}")
    return sess


def _load_compiled(path: Path) -> tuple[onnx.ModelProto, _CompiledGraph]:
    m = load_model(path, "compiled model")
    compiled = _inspect_compiled(m, path.parent)
    if compiled.partitions == 0:
        raise ModelError(f"{path}: is not a compiled QNN model (no EPContext node); compile it with compile_qnn")
    return m, compiled


def run_compiled(
    compiled_model: str | Path,
    data: DataSource,
    output_names: Sequence[str] | None = None,
    options: QnnOptions = QnnOptions(),
) -> Iterator[dict[str, np.ndarray]]:
    """Run a compiled (EPContext) model on the HTP, one sample at a time, yielding its outputs by name.

    The model and the session are checked before the first sample (bad input raises here, not on
    iteration): :class:`~qdebug.errors.ModelError` for a model that is not compiled,
    :class:`~qdebug.errors.TargetError` when QNN cannot load it or the session does not run on QNN.
    """
    path = Path(compiled_model)
    m, _ = _load_compiled(path)
    del m
    sess = qnn_session(path, options)
    available = [o.name for o in sess.get_outputs()]
    names = list(output_names) if output_names is not None else available
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ConfigError(f"unknown output name(s) {unknown}; the compiled model's outputs are {available}")
    return _run_samples(sess, names, data, path)


def _run_samples(sess: Any, names: list[str], data: DataSource, path: Path) -> Iterator[dict[str, np.ndarray]]:
    for i, sample in enumerate(data):
        try:
            values = sess.run(names, sample)
        except Exception as exc:
            raise TargetError(f"{path}: sample {i}: the HTP run failed: {exc}") from exc
        yield dict(zip(names, values, strict=True))


# --------------------------------------------------------------------------- accuracy on the HTP


@dataclass(frozen=True)
class _ProbeTensor:
    tensor_name: str  # the float model's name (joins DebugReport.activations)
    topo_index: int
    q_output: str  # the QuantizeLinear output (integer tensor) in the QDQ model
    quant_type: str
    scale: np.ndarray
    zero_point: np.ndarray | None
    axis: int
    near_data_movement: bool


def _probe_tensors(qmodel: onnx.ModelProto, pairing: Pairing) -> list[_ProbeTensor]:
    """Every quantized activation's QuantizeLinear output, in the float model's topological order."""
    consts = constant_values(qmodel)
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    producer: dict[str, onnx.NodeProto] = {}
    for n in qmodel.graph.node:
        for i in n.input:
            consumers[i].append(n)
        for o in n.output:
            producer[o] = n
    out: list[_ProbeTensor] = []
    graph_outputs = {o.name for o in qmodel.graph.output}
    for a in pairing.activations:
        # A model output's own Q is compared per output already; exposing it makes the compiled probe define
        # that tensor twice (the EPContext node and the by-design CPU DQ both reference it).
        if not a.quantized or a.post_qdq in graph_outputs:
            continue
        q = next(
            (
                n
                for n in consumers[a.pre_qdq]
                if is_q(n) and any(is_dq(c) and c.output[0] == a.post_qdq for c in consumers[n.output[0]])
            ),
            None,
        )
        if q is None or q.input[1] not in consts:
            continue
        scale = decode_constant(consts[q.input[1]])
        zp = decode_constant(consts[q.input[2]]) if len(q.input) > 2 and q.input[2] in consts else None
        axis = next((int(at.i) for at in q.attribute if at.name == "axis"), 1)
        src = producer.get(a.pre_qdq)
        dq_users = [u for c in consumers[q.output[0]] if is_dq(c) for u in consumers[c.output[0]]]
        near = (src is not None and src.op_type in DATA_MOVEMENT_OPS) or any(
            u.op_type in DATA_MOVEMENT_OPS for u in dq_users
        )
        qtype = a.params.quant_type if a.params is not None else quant_type_name(np.dtype(np.uint8))
        out.append(_ProbeTensor(a.tensor_name, a.topo_index, q.output[0], qtype, scale, zp, axis, near))
    return out


@dataclass(frozen=True)
class _Probe:
    compiled: Path | None
    tensors: tuple[_ProbeTensor, ...]
    faithful: bool  # the probe kept the compiled model's partitioning
    notes: tuple[str, ...]


def _build_probe(
    qmodel: onnx.ModelProto,
    pairing: Pairing,
    target: _CompiledGraph,
    out_dir: Path,
    options: QnnOptions,
) -> _Probe:
    """Compile the probe (``out_dir/probe.qnn_ctx.onnx``), retrying without data-movement tensors if it splits."""
    tensors = _probe_tensors(qmodel, pairing)
    if not tensors:
        return _Probe(None, (), False, ("probe: the QDQ model has no quantized activation to compare",))
    notes: list[str] = []
    probe_options = replace(options, fail_on_fallback=False)
    attempts = [tensors]
    kept = [t for t in tensors if not t.near_data_movement]
    if kept and len(kept) < len(tensors):
        attempts.append(kept)
    report: CompileReport | None = None
    used: list[_ProbeTensor] = []
    faithful = False
    with temp_dir(prefix=".probe.qdq-", dir=out_dir) as tmp:
        for k, attempt in enumerate(attempts):
            probe_path = Path(tmp) / "probe.qdq.onnx"
            onnx.save(expose_outputs(qmodel, [t.q_output for t in attempt]), str(probe_path))
            report = compile_qnn(probe_path, out_dir, probe_options, name="probe")
            used = attempt
            faithful = (
                report.ok
                and report.accelerator_partitions <= target.partitions
                and report.cpu_nodes <= target.cpu_nodes
            )
            if faithful:
                if k > 0:
                    dropped = [t.tensor_name for t in tensors if t.near_data_movement]
                    shown = ", ".join(dropped[:12]) + (f", … ({len(dropped) - 12} more)" if len(dropped) > 12 else "")
                    notes.append(
                        f"probe: {len(dropped)} tensor(s) next to data-movement ops "
                        f"({'/'.join(sorted(DATA_MOVEMENT_OPS))}) are not compared, because exposing them "
                        f"split the HTP graph: {shown}"
                    )
                break
    assert report is not None
    if not report.ok:
        notes.append(f"probe: compiling the probe model failed, no per-tensor comparison: {report.error}")
        return _Probe(None, (), False, tuple(notes))
    if not faithful:
        notes.append(
            f"probe: exposing the quantized tensors split the HTP graph into {report.accelerator_partitions} "
            f"partition(s) with {report.cpu_nodes} CPU node(s) (compiled model: {target.partitions}, "
            f"{target.cpu_nodes}); per-tensor values may differ from the compiled model's"
        )
    return _Probe(Path(str(report.compiled_model)), tuple(used), faithful, tuple(notes))


def _run(sess: Any, names: list[str], sample: Sample, i: int, what: str, error: type[Exception]) -> list[Any]:
    try:
        return list(sess.run(names, sample))
    except Exception as exc:
        raise error(f"sample {i}: {what} failed: {exc}") from exc


def _sqnr(s: ErrorSums) -> float | None:
    return s.sqnr[0]


def _check_models(
    fpath: Path, qpath: Path, cpath: Path
) -> tuple[onnx.ModelProto, onnx.ModelProto, _CompiledGraph, Pairing]:
    """The float and QDQ models, the compiled model's graph, their pairing; the compiled model must be the QDQ
    model's (same outputs)."""
    fmodel = load_model(fpath, "float model")
    qmodel = load_model(qpath, "QDQ model")
    cmodel, target = _load_compiled(cpath)
    pairing = pair_models(fmodel, qmodel)
    c_outputs = [o.name for o in cmodel.graph.output]
    missing = [o.quant_name for o in pairing.outputs if o.quant_name not in c_outputs]
    if missing:
        raise ModelError(
            f"{cpath}: has outputs {c_outputs}, not the QDQ model's {missing}: was it compiled from {qpath.name}?"
        )
    return fmodel, qmodel, target, pairing


class _OutputSums:
    """Per model output: HTP vs float, CPU-QDQ vs float, HTP vs CPU-QDQ (streaming sums)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.hf, self.cf, self.hc = ([ErrorSums()] * len(names) for _ in range(3))

    def add(self, f_vals: Sequence[np.ndarray], c_vals: Sequence[np.ndarray], h_vals: Sequence[np.ndarray]) -> None:
        for k, (f, c, h) in enumerate(zip(f_vals, c_vals, h_vals, strict=True)):
            if not (f.shape == c.shape == h.shape):
                raise ModelError(
                    f"model output {self.names[k]!r}: shapes float {f.shape}, CPU {c.shape}, HTP {h.shape}"
                )
            self.hf[k] = self.hf[k].merge(reduce_pair(f, h))
            self.cf[k] = self.cf[k].merge(reduce_pair(f, c))
            self.hc[k] = self.hc[k].merge(reduce_pair(c, h))

    def results(self) -> tuple[TargetOutputAccuracy, ...]:
        return tuple(
            TargetOutputAccuracy(name, _sqnr(self.hf[k]), _sqnr(self.cf[k]), _sqnr(self.hc[k]))
            for k, name in enumerate(self.names)
        )


class _TensorSums:
    """Per probed tensor: the integer values on the HTP vs ONNX Runtime CPU (max LSB, fraction differing, error
    energy of the dequantized values), the HTP's error energy vs float, the CPU-QDQ's (used when the caller has no
    debug report to take it from), and how far the probe's outputs are from the compiled model's."""

    def __init__(self, tensors: Sequence[_ProbeTensor]) -> None:
        n = len(tensors)
        self.tensors = list(tensors)
        self.max_lsb = np.zeros(n, dtype=np.int64)
        self.n_differ = np.zeros(n, dtype=np.int64)
        self.n_elems = np.zeros(n, dtype=np.int64)
        self.signal, self.noise = np.zeros(n), np.zeros(n)
        self.f_signal, self.f_noise, self.hf_noise = np.zeros(n), np.zeros(n), np.zeros(n)
        # Mean rounding noise per element of each tensor's grid (scale²/12; per-channel scales averaged).
        self.grid_noise = np.array([float(np.mean(np.square(t.scale.astype(np.float64)))) / 12.0 for t in tensors])
        self.probe_vs_compiled = 0.0

    def add(
        self,
        cpu: Sequence[np.ndarray],
        htp: Sequence[np.ndarray],
        probe_out: Sequence[np.ndarray],
        h_out: Sequence[np.ndarray],
        flt: Sequence[np.ndarray] = (),
    ) -> None:
        """One sample: the probed tensors' integers on the CPU and the HTP, the outputs of the probe and of the
        compiled model, and the float model's values of the probed tensors."""
        for po, ho in zip(probe_out, h_out, strict=True):
            d = np.abs(po.astype(np.float64) - ho.astype(np.float64))
            self.probe_vs_compiled = max(self.probe_vs_compiled, float(d.max()) if d.size else 0.0)
        refs, tests = [], []
        for j, (t, qc, qh) in enumerate(zip(self.tensors, cpu, htp, strict=True)):
            if qc.shape != qh.shape:
                raise TargetError(f"tensor {t.tensor_name!r}: HTP shape {qh.shape} vs CPU shape {qc.shape}")
            diff = np.abs(qh.astype(np.int64) - qc.astype(np.int64))
            if diff.size:
                self.max_lsb[j] = max(int(self.max_lsb[j]), int(diff.max()))
            self.n_differ[j] += int(np.count_nonzero(diff))
            self.n_elems[j] += diff.size
            refs.append(dequantize(qc, t.scale, t.zero_point, t.axis))
            tests.append(dequantize(qh, t.scale, t.zero_point, t.axis))
        if refs:
            b = reduce_pairs(refs, tests)
            self.signal += b.signal
            self.noise += b.noise
        if refs:
            # The HTP vs float, not only vs CPU: where the HTP is *closer* to float than ORT CPU (its Sigmoid at
            # 8 bits), HTP−CPU is as large as the quantization error and would look like a divergence.
            floats = [np.asarray(f, dtype=np.float64) for f in flt]
            fb = reduce_pairs(floats + floats, refs + tests)
            m = len(refs)
            self.f_signal += fb.signal[:m]
            self.f_noise += fb.noise[:m]
            self.hf_noise += fb.noise[m:]

    def _cpu_noise(self, j: int, cpu_db: Mapping[str, float | None] | None) -> tuple[float | None, float | None]:
        """(CPU-QDQ vs float SQNR in dB, its error energy): from the debug report's cumulative SQNR when given
        (energy = the float signal · 10^(−dB/10), its definition inverted), else from this run's float values;
        ``None`` when undefined."""
        if cpu_db is None:
            db = sqnr_from_energies(float(self.f_signal[j]), float(self.f_noise[j]))[0]
            return db, float(self.f_noise[j]) if db is not None else None
        db = cpu_db.get(self.tensors[j].tensor_name)
        if db is None:
            return None, None
        return db, 0.0 if math.isinf(db) else float(self.f_signal[j]) * 10.0 ** (-db / 10.0)

    def diffs(
        self, cpu_db: Mapping[str, float | None] | None, op_of: Mapping[str, str], threshold: float
    ) -> tuple[TargetTensorDiff, ...]:
        """Every probed tensor with its LSB figures and its excess-noise ratio (flagged above ``threshold``)."""
        out = []
        for j, t in enumerate(self.tensors):
            cpu_vs_float, cpu_noise = self._cpu_noise(j, cpu_db)
            ratio = excess_ratio(float(self.hf_noise[j]), cpu_noise, float(self.grid_noise[j] * self.n_elems[j]))
            out.append(
                TargetTensorDiff(
                    tensor_name=t.tensor_name,
                    topo_index=t.topo_index,
                    quant_type=t.quant_type,
                    max_lsb=int(self.max_lsb[j]),
                    fraction_differ=float(self.n_differ[j] / self.n_elems[j]) if self.n_elems[j] else 0.0,
                    sqnr_db=sqnr_from_energies(float(self.signal[j]), float(self.noise[j]))[0],
                    op_type=op_of.get(t.tensor_name, ""),
                    cpu_vs_float_db=cpu_vs_float,
                    target_vs_float_db=sqnr_from_energies(float(self.f_signal[j]), float(self.hf_noise[j]))[0],
                    excess_noise_ratio=ratio,
                    sqnr_drop_db=sqnr_drop_db(ratio),
                    flagged=ratio > threshold,
                )
            )
        return tuple(out)


def _producer_ops(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor name → the op type producing it (the float model's names, as the probe's tensors carry)."""
    return {o: n.op_type for n in model.graph.node for o in n.output}


@dataclass(frozen=True)
class _Graph:
    """What the divergence localisation needs from the float model, taken before it is released."""

    op_of: dict[str, str]
    upstream: dict[str, Upstream]


def _localise(
    tensors: _TensorSums, graph: _Graph, cpu_db: Mapping[str, float | None] | None, threshold: float
) -> tuple[tuple[TargetTensorDiff, ...], Divergence]:
    """The per-tensor figures and where the divergence starts (:mod:`qdebug.targets.divergence`)."""
    diffs = tensors.diffs(cpu_db, graph.op_of, threshold)
    order = [d.tensor_name for d in diffs]
    where = locate(order, [d.tensor_name for d in diffs if d.flagged], graph.upstream)
    return diffs, where


@dataclass(frozen=True)
class _Names:
    """What each session of the HTP check is asked for."""

    outputs: list[str]  # the float model's outputs
    float_tensors: list[str]  # the probed tensors in the float model
    quant_outputs: list[str]  # the QDQ (and compiled) model's outputs
    probed: list[str]  # the probed QuantizeLinear outputs


def _measure(
    sessions: tuple[Any, Any, Any, Any | None], names: _Names, data: DataSource, outs: _OutputSums, tensors: _TensorSums
) -> tuple[int, float]:
    """Run float (CPU), QDQ (CPU), compiled (HTP) and probe (HTP) on every sample into the sums; (samples, HTP
    seconds)."""
    f_sess, c_sess, htp, probe_sess = sessions
    f_names, q_names, t_names = names.outputs, names.quant_outputs, names.probed
    htp_seconds, n = 0.0, 0
    for i, sample in enumerate(data):
        f_vals = _run(f_sess, f_names + names.float_tensors, sample, i, "the float model on the CPU", DataError)
        c_vals = _run(c_sess, q_names + t_names, sample, i, "the QDQ model on the CPU", DataError)
        t0 = time.perf_counter()
        h_vals = _run(htp, q_names, sample, i, "the compiled model on the HTP", TargetError)
        htp_seconds += time.perf_counter() - t0
        outs.add(f_vals[: len(f_names)], c_vals[: len(q_names)], h_vals)
        if probe_sess is not None:
            p_vals = _run(probe_sess, t_names + q_names, sample, i, "the probe model on the HTP", TargetError)
            cpu_t, probe_t = c_vals[len(q_names) :], p_vals[: len(t_names)]
            tensors.add(cpu_t, probe_t, p_vals[len(t_names) :], h_vals, f_vals[len(f_names) :])
        n += 1
    return n, htp_seconds


def _check_thresholds(lsb_threshold: object, excess_threshold: object) -> None:
    """A :class:`ConfigError` unless the LSB threshold is a non-negative int and the excess one a positive number."""
    if isinstance(lsb_threshold, bool) or not isinstance(lsb_threshold, int) or lsb_threshold < 0:
        raise ConfigError(f"lsb_threshold must be a non-negative integer, got {lsb_threshold!r}")
    ok = isinstance(excess_threshold, int | float) and not isinstance(excess_threshold, bool)
    if not (ok and math.isfinite(excess_threshold) and excess_threshold > 0):  # type: ignore[arg-type,operator]
        raise ConfigError(f"excess_threshold must be a positive number, got {excess_threshold!r}")


def htp_accuracy(
    float_model: str | Path,
    qdq_model: str | Path,
    compiled_model: str | Path,
    data: DataSource,
    *,
    out_dir: str | Path,
    options: QnnOptions = QnnOptions(),
    probe_tensors: bool = True,
    lsb_threshold: int = 1,
    cpu_sqnr_db: Mapping[str, float | None] | None = None,
    excess_threshold: float = EXCESS_NOISE_THRESHOLD,
) -> TargetAccuracy:
    """How the compiled model's numbers on the HTP differ from the float and the CPU-QDQ model's.

    Per model output, over all samples (streaming sums): SQNR of HTP vs float, CPU-QDQ vs float and HTP
    vs CPU-QDQ (the CPU-QDQ model runs on ORT CPU with graph optimizations off, as written). With
    ``probe_tensors``, a probe copy of the QDQ model exposing every activation QuantizeLinear output is
    compiled into ``out_dir`` (``probe.qnn_ctx.onnx``) and run on the HTP; each quantized activation's
    values are compared with ORT CPU's in LSB (largest difference, fraction of elements that differ; for
    information) and with the float model's: the HTP's extra error vs float in units of the tensor's own
    quantization error (``excess_noise_ratio``, see :mod:`qdebug.targets.divergence`) flags it above
    ``excess_threshold``. The quantization error is the debug report's cumulative SQNR per float tensor name
    when ``cpu_sqnr_db`` is given (``build`` passes it), else measured here on the same samples.
    ``first_divergent`` is the first flagged tensor in topological order whose nearest compared inputs are not
    flagged and whose error reaches a flagged consumer (``divergence_starts`` has every start,
    ``isolated_starts`` those whose consumers are all unflagged).
    Tensors carry the float model's names, so they join :attr:`qdebug.report.DebugReport.activations`.
    ``probe_single_partition`` says whether the probe kept the compiled model's partitioning.
    """
    _check_thresholds(lsb_threshold, excess_threshold)
    cpath, out = Path(compiled_model), Path(out_dir)
    fmodel, qmodel, target, pairing = _check_models(Path(float_model), Path(qdq_model), cpath)
    if len(data) == 0:
        raise DataError(f"{data.description}: no samples")
    out.mkdir(parents=True, exist_ok=True)

    probe = _build_probe(qmodel, pairing, target, out, options) if probe_tensors else _Probe(None, (), False, ())
    notes = list(probe.notes)
    graph = _Graph(_producer_ops(fmodel), upstream_compared(fmodel, [t.tensor_name for t in probe.tensors]))
    names = _Names(
        [o.output_name for o in pairing.outputs],
        [t.tensor_name for t in probe.tensors],
        [o.quant_name for o in pairing.outputs],
        [t.q_output for t in probe.tensors],
    )
    f_sess = make_session(expose_outputs(fmodel, names.float_tensors), [CPU_EP])
    c_sess = make_session(expose_outputs(qmodel, names.probed), [CPU_EP])
    del fmodel, qmodel
    htp = qnn_session(cpath, options)
    probe_sess = qnn_session(probe.compiled, options) if probe.compiled is not None else None
    outs = _OutputSums(names.outputs)
    tensors = _TensorSums(probe.tensors)
    n, htp_seconds = _measure((f_sess, c_sess, htp, probe_sess), names, data, outs, tensors)
    if n == 0:
        raise DataError(f"{data.description}: no samples")
    diffs, where = _localise(tensors, graph, cpu_sqnr_db, float(excess_threshold))
    if probe_sess is not None and tensors.probe_vs_compiled > 0.0:
        notes.append(
            f"probe: its model outputs differ from the compiled model's by up to {tensors.probe_vs_compiled:.3g} "
            "(exposing tensors changed the HTP graph); per-tensor values are indicative"
        )
    return TargetAccuracy(
        target="qnn",
        device=options.device_label(),
        num_samples=n,
        seconds_per_sample=htp_seconds / n,
        outputs=outs.results(),
        tensors=diffs,
        lsb_threshold=lsb_threshold,
        first_divergent=where.first,
        probe_single_partition=probe.faithful if probe_tensors else None,
        notes=tuple(notes),
        excess_threshold=float(excess_threshold),
        divergence_starts=where.starts,
        isolated_starts=where.isolated,
        divergence_ops=where.op_types,
        first_divergent_nodes=where.first_nodes,
        probe_vs_compiled=tensors.probe_vs_compiled if probe_sess is not None else None,
    )


# --------------------------------------------------------------------------- the target


#: Fallback op type → the fix that removes it (QNN's own reason for these is vague, e.g. "error 3110").
FIX_FOR_OP = {"Erf": "gelu_fusion", "LayerNormalization": "layernorm_gamma_unsigned"}


def qnn_options(options: BuildOptions) -> QnnOptions:
    """The :class:`QnnOptions` of a QNN build (an unknown SoC is a ConfigError there)."""
    return QnnOptions(
        soc=options.soc,
        fail_on_fallback=options.fail_on_fallback,
        enable_fp16=not options.quantized,
        timeout_s=float(options.timeout_s),
    )


def _usable() -> None:
    """onnxruntime-qnn checked first (a missing one names the ``qnn`` extra), then its provider library."""
    require("onnxruntime_qnn")
    ok, why = qnn_available()
    if not ok:
        raise TargetError(f"QNN is not usable here: {why}")


def _outputs_of(result: Any, names: Sequence[str]) -> list[np.ndarray]:
    """``run_compiled``'s per-sample result as arrays in ``names`` order (a mapping or a sequence)."""
    if isinstance(result, Mapping):
        return [np.asarray(result[n]) for n in names]
    return [np.asarray(v) for v in result]


def fp16_accuracy(float_model: Path, compiled: Path, source: DataSource, options: QnnOptions) -> TargetAccuracy:
    """HTP fp16 vs the float model per output (there is no CPU QDQ model to compare with)."""
    ref = make_session(load_model(float_model, "float model"), ["CPUExecutionProvider"], optimize=True)
    names = [o.name for o in ref.get_outputs()]  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    results = list(run_compiled(compiled, source, output_names=names, options=options))
    seconds = time.perf_counter() - t0
    sums = [ErrorSums() for _ in names]
    for sample, res in zip(source, results, strict=True):
        outs = ref.run(names, dict(sample))  # type: ignore[attr-defined]
        for j, (r, t) in enumerate(zip(outs, _outputs_of(res, names), strict=True)):
            sums[j] = sums[j].merge(reduce_pair(np.asarray(r), t))
    outputs = tuple(TargetOutputAccuracy(n, s.sqnr[0], None, None) for n, s in zip(names, sums, strict=True))
    return TargetAccuracy(
        target="qnn",
        device=options.device_label(),
        num_samples=len(results),
        seconds_per_sample=round(seconds / max(len(results), 1), 6),
        outputs=outputs,
        notes=("fp16: no QDQ model, so the HTP is compared with the float model only",),
    )


def compiled_top1(
    compiled: Path, eval_data: Path, label_key: str, model: onnx.ModelProto, options: QnnOptions
) -> float:
    """Top-1 of a compiled model on the HTP over a labelled ``.npz``."""
    from qdebug.data import open_data, read_labels

    source = open_data(eval_data, input_specs(model), ignore=(label_key,))
    labels = read_labels(eval_data, label_key, len(source))
    first = model.graph.output[0].name
    hits = 0
    for i, res in enumerate(run_compiled(compiled, source, output_names=[first], options=options)):
        logits = _outputs_of(res, [first])[0]
        hits += int(int(np.argmax(logits.reshape(-1))) == int(labels[i]))
    return hits / len(source)


def _compiled_options(job: CompileJob, compiled: Compiled) -> QnnOptions:
    """The options the model was compiled with (the SoC may have been chosen by :meth:`QnnTarget.compile`)."""
    opts = qnn_options(job.options)
    soc = compiled.manifest.get("compiled_soc")
    return replace(opts, soc=soc) if soc and soc != opts.soc else opts


class QnnTarget(TargetBase):
    """The ``qnn`` target: QNN HTP through onnxruntime-qnn (EPContext; the HTP simulator on x86)."""

    name = "qnn"
    description = "Qualcomm QNN HTP (EPContext; the HTP simulator on x86)"
    precisions: Mapping[str, Precision] = {
        "uint8": UINT8,
        "uint16": UINT16,
        "int8": INT8_WEIGHTS,
        "fp16": Precision("fp16", None, "the float model in HTP fp16; needs --soc"),
    }
    activation_types = frozenset({"uint8", "uint16"})
    options = frozenset({"soc", "fail_on_fallback", "skip_fixes", "probe_tensors", "bisect", "remedies"})
    fix_names = FIX_NAMES

    def sixteen_bit_weights_note(self) -> str:
        """The HTP generations that take 16-bit weights."""
        return "QNN: 16-bit weights need HTP v73 or newer (e.g. --soc SM8550); older SoCs reject them"

    def float_fallback_note(self) -> str:
        """Float nodes on QNN: fp16 on the HTP where its generation has fp16, otherwise a split to the CPU."""
        return (
            "QNN: nodes kept in float run in fp16 on the HTP (an fp16 island with converts around it, on HTP "
            "generations with fp16) or, where the HTP cannot, split the graph to the CPU (a round trip per split)"
        )

    def available(self) -> Availability:
        """(usable here, why not) — never raises, never imports onnxruntime_qnn."""
        return Availability(*qnn_available())

    def precision_hint(self, precision: str) -> str:
        """No hint needed: every precision name is a QNN one."""
        return ""

    def option_problems(self, options: BuildOptions) -> list[str]:
        """fp16 needs a SoC model; the SoC must be one QNN knows."""
        p = []
        if not options.quantized and not options.soc:
            p.append(
                "precision fp16 on QNN needs --soc (e.g. SM8650): without a SoC model the HTP takes no node in fp16"
            )
        if options.soc is not None and str(options.soc).strip().upper() not in SOC_MODELS:
            p.append(f"unknown soc {options.soc!r}; known: {', '.join(SOC_MODELS)}")
        return p

    def config_problems(self, config: QuantConfig) -> list[str]:
        """16-bit weights must be symmetric."""
        p = []
        if config.weight_type.endswith("16") and config.weight_symmetric is False:
            p.append("target 'qnn' needs symmetric 16-bit weights (weight_symmetric=False conflicts)")
        return p

    def ort_config(self, config: QuantConfig, model: str | Path | onnx.ModelProto, reader: Any) -> Any:
        """ORT's ``get_qnn_qdq_config`` (QNN's own rules: e.g. 16-bit-weight and LayerNorm overrides)."""
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        from qdebug.config import ort_quant_options
        from qdebug.targets.base import _ort_call

        o = ort_quant_options(config)
        return _ort_call(
            get_qnn_qdq_config,
            model,
            reader,
            calibrate_method=o.method,
            activation_type=o.activation_type,
            weight_type=o.weight_type,
            per_channel=config.per_channel,
            init_overrides=o.overrides,
            activation_symmetric=config.activation_symmetric,
            weight_symmetric=config.weight_symmetric,
        )

    def prepare(
        self, model: onnx.ModelProto, config: QuantConfig | None, options: BuildOptions, shapes: ShapeSource
    ) -> Prepared:
        """The QNN compatibility fixes (:mod:`qdebug.targets.qnn_fixes`), before quantizing: calibration, the Q/DQ
        placement and the overrides must all see the graph QNN will compile (fixing shapes after quantizing left
        ~1,100 CPU nodes on a detector)."""
        _usable()
        qnn_options(options)  # an unknown SoC fails here, before any work
        given, source = shapes_for(model, shapes)
        fixed = apply_qnn_fixes(model, config, input_shapes=given, skip=options.skip_fixes)
        fixes = tuple(
            replace(r, detail=f"{r.detail} (shapes {source})") if r.name == "static_shapes" and r.changed else r
            for r in fixed.reports
        )
        return Prepared(fixed.model, fixed.config, fixes)

    def compile(self, job: CompileJob) -> Compiled:
        """EPContext with QNN (in a worker process; its verbose log is the report's source)."""
        from importlib.metadata import version

        _usable()
        opts, warnings = qnn_options(job.options), []
        if opts.soc is None and has_16bit_weights(load_model(job.model, "QDQ model")):
            # The default SoC (HTP v68) cannot run 16-bit weights: compile for one that can, and say so.
            opts = replace(opts, soc=V73_SOC)
            warnings.append(
                f"no --soc given and the QDQ model has 16-bit weights, which the default SoC (HTP {DEFAULT_HTP_ARCH}) "
                f"cannot run: compiled for {opts.device_label()}, the oldest SoC that can; pass --soc to choose"
            )
        job.progress(f"compiling for QNN {opts.device_label()}")
        report = compile_qnn(job.model, job.out_dir, opts, name=job.stem)
        if opts.soc is None and not report.ok and (report.error or "").startswith(COMPILE_FAILED):
            # HTP v68 has no float unit: a QDQ model that keeps an op in float (ORT leaves LSTM unquantized) fails to
            # finalize there ("QNN_COMMON_ERROR_MEM_ALLOC") yet compiles on current SoCs. The user named no SoC, so
            # the default must not be the reason the build fails: try the oldest SoC with float and 16-bit support.
            newer = replace(opts, soc=V73_SOC)
            job.progress(f"the default SoC failed; compiling for QNN {newer.device_label()}")
            retry = compile_qnn(job.model, job.out_dir, newer, name=job.stem)
            if retry.ok:
                warnings.append(
                    f"no --soc given and the default SoC (HTP {DEFAULT_HTP_ARCH}) could not compile the model "
                    f"({report.error}): compiled for {newer.device_label()}, which can; pass --soc to choose"
                )
                opts, report = newer, retry
        manifest = {"onnxruntime_qnn_version": version("onnxruntime-qnn"), "compiled_soc": opts.soc}
        return Compiled(report, manifest=manifest, warnings=tuple(warnings))

    def check(self, job: CompileJob, compiled: Compiled) -> TargetAccuracy | None:
        """The HTP simulator against CPU QDQ and float, per output and (probe) per tensor; fp16: vs float only."""
        opts = _compiled_options(job, compiled)
        compiled_path = Path(compiled.report.compiled_model or "")
        job.progress(f"running the HTP simulator on {len(job.samples)} samples")
        if job.qdq_model is None:
            assert job.float_model is not None
            return fp16_accuracy(job.float_model, compiled_path, job.samples, opts)
        assert job.float_model is not None
        with temp_dir(prefix="qdebug-htp-") as probe_dir:  # the probe model is not a result
            return htp_accuracy(
                job.float_model,
                job.qdq_model,
                compiled_path,
                job.samples,
                out_dir=Path(probe_dir),
                options=opts,
                probe_tensors=job.options.probe_tensors,
                cpu_sqnr_db=job.cpu_sqnr_db or None,
            )

    def compiled_top1(
        self, job: CompileJob, compiled: Compiled, eval_data: Path, qdq_top1: float | None
    ) -> float | None:
        """Top-1 of the EPContext model on the HTP simulator."""
        assert job.float_model is not None
        model = load_model(job.float_model, "float model")
        path = Path(compiled.report.compiled_model or "")
        return compiled_top1(path, eval_data, job.options.label_key, model, _compiled_options(job, compiled))

    def describe(self, report: CompileReport) -> list[str]:
        """Partitions, nodes on the HTP, CPU fallback, context size, compile time."""
        state = "OK" if report.ok else "FAILED"
        size = report.context_bytes
        kib = f"{size / 1024:.0f} KiB" if size < 1 << 20 else f"{size / (1 << 20):.1f} MiB"
        return [
            f"Compile report (QNN {report.device}): {state}",
            f"  EPContext partitions {report.accelerator_partitions}, nodes on the HTP {report.accelerator_nodes}, "
            f"CPU fallback {report.cpu_nodes} node(s), graph-I/O Q/DQ on CPU by design {report.graph_io_qdq_on_cpu}",
            f"  context {kib}, compile {report.compile_seconds:.2f} s",
        ]

    def hints(self, report: CompileReport, fixes: Sequence[PassReport]) -> list[str]:
        """Name the skipped fix (``--skip-fix``) that would have kept a fallen-back op on the HTP."""
        skipped = {f.name for f in fixes if f.skipped or f.detail == "skipped on request"}
        hints = []
        for op, n in sorted(report.fallback_by_op().items()):
            fix = FIX_FOR_OP.get(op)
            if fix in skipped:
                hints.append(f"{n} {op} node(s) fell back to the CPU; the skipped {fix} fix is what removes that")
        return hints


register_target("qnn", QnnTarget)
