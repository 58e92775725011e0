"""Compiling a QDQ model for the QNN HTP (:func:`compile_qnn`): checked first, compiled in a worker process
(:mod:`qdebug.targets._qnn_worker`, a request and a result as JSON files) with ORT's verbose log on, because node
placement and QNN's rejection reasons are only visible there and a crash in the QNN libraries must not take the caller
down; the log is kept next to the compiled model and parsed (:mod:`qdebug.targets.qnn_log`) into a
:class:`~qdebug.targets.compile_report.CompileReport`. Also what a compiled (EPContext) model holds
(:func:`inspect_compiled`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from qdebug._lazy import require
from qdebug.cancel import run_process
from qdebug.errors import ConfigError, ModelError
from qdebug.graph_index import constant_values
from qdebug.io import refuse_overwrite_input, temp_dir
from qdebug.model_io import ModelKind, input_specs, is_dq, is_q, load_model, model_kind
from qdebug.targets.compile_report import CompileReport, FallbackNode
from qdebug.targets.qnn_log import parse_compile_log
from qdebug.targets.qnn_options import DEFAULT_OPTIONS, QNN_EP, SOC_MODELS, QnnOptions

__all__ = [
    "COMPILE_FAILED",
    "CompiledGraph",
    "compile_qnn",
    "has_16bit_weights",
    "inspect_compiled",
    "load_compiled",
]

_EP_CONTEXT = "EPContext"


@dataclass(frozen=True)
class CompiledGraph:
    """What a compiled (EPContext) model holds: its HTP partitions and the nodes left outside them."""

    partitions: int  # EPContext nodes
    other_nodes: tuple[tuple[str, str], ...]  # (op type, name) of every other node: these run on the CPU
    graph_io_qdq: int  # of which graph-input Q / graph-output DQ
    context_bytes: int

    @property
    def cpu_nodes(self) -> int:
        """Nodes on the CPU that are a real fallback (graph-I/O Q/DQ aside)."""
        return len(self.other_nodes) - self.graph_io_qdq


def _is_ep_context(node: onnx.NodeProto) -> bool:
    return node.op_type == _EP_CONTEXT and node.domain == "com.microsoft"


def inspect_compiled(model: onnx.ModelProto, base_dir: Path) -> CompiledGraph:
    """The partitions, CPU nodes and context size of a compiled model (``base_dir``: where embed mode 0 files are)."""
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
    return CompiledGraph(partitions, tuple(others), io_qdq, context_bytes)


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
    options: QnnOptions = DEFAULT_OPTIONS,
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
            proc = run_process(  # a cancel kills the worker; the caller's temp_dir removes its folder
                [sys.executable, "-m", "qdebug.targets._qnn_worker", str(request_path)],
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                env=_worker_env(),
                timeout=options.timeout_s,
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:  # run() has killed the worker
            timed_out = True
    wall = time.perf_counter() - t0
    result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else None
    return _WorkerRun(result, log_tmp.read_text(encoding="utf-8", errors="replace"), timed_out, returncode, wall)


def _outcome(
    run: _WorkerRun, ctx: Path, src: Path, options: QnnOptions, fallback: Sequence[FallbackNode]
) -> tuple[str | None, CompiledGraph | None]:
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
        compiled = inspect_compiled(onnx.load(str(ctx)), ctx.parent)
        return None, (compiled if compiled.partitions else None)
    return None, None


def _make_report(
    run: _WorkerRun, *, ctx: Path, input_nodes: int, options: QnnOptions, src: Path, hints: Sequence[str] = ()
) -> CompileReport:
    log = parse_compile_log(run.log_text)
    fallback = [FallbackNode(u.op_type, u.nodes, u.describe(), u.by_design, u.node_names) for u in log.failed]
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


def load_compiled(path: Path) -> tuple[onnx.ModelProto, CompiledGraph]:
    """A compiled model and what it holds; a model without an EPContext node is a :class:`ModelError`."""
    m = load_model(path, "compiled model")
    compiled = inspect_compiled(m, path.parent)
    if compiled.partitions == 0:
        raise ModelError(f"{path}: is not a compiled QNN model (no EPContext node); compile it with compile_qnn")
    return m, compiled
