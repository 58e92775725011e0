"""The QNN HTP target (:class:`QnnTarget`): QNN's rules for a config, its ORT recipe, its compatibility fixes, the
compile (choosing a SoC that can run the model when none is given) and the check on the HTP simulator, each step
delegated to the QNN rooms below it:

* :mod:`qdebug.targets.qnn_options` — the SoCs, :class:`~qdebug.targets.qnn_options.QnnOptions`, availability;
* :mod:`qdebug.targets.qnn_log` — ORT's verbose compile log parsed;
* :mod:`qdebug.targets.qnn_compile` — the compile in a worker process (:mod:`qdebug.targets._qnn_worker`) and its
  report;
* :mod:`qdebug.targets.qnn_session` — a compiled model run on the HTP in-process;
* :mod:`qdebug.targets.qnn_accuracy` — the HTP compared with CPU-QDQ and float, per output and per tensor.

``onnxruntime_qnn`` is imported only through :func:`qdebug._lazy.require` (the ``qnn`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from qdebug._lazy import require
from qdebug.errors import TargetError
from qdebug.io import temp_dir
from qdebug.model_io import load_model
from qdebug.passes import PassReport
from qdebug.report import TargetAccuracy
from qdebug.targets.base import (
    INT8_WEIGHTS,
    UINT8,
    UINT16,
    Availability,
    BuildOptions,
    Compiled,
    CompileJob,
    Precision,
    Prepared,
    ShapeSource,
    TargetBase,
    register_target,
    shapes_for,
)
from qdebug.targets.compile_report import CompileReport
from qdebug.targets.model_fixes import FIX_NAMES, apply_qnn_fixes
from qdebug.targets.qnn_accuracy import compiled_top1, fp16_accuracy, htp_accuracy
from qdebug.targets.qnn_compat import COMPAT_FIX, CompatReport, StopReason, run_compat_loop
from qdebug.targets.qnn_compile import COMPILE_FAILED, compile_qnn, has_16bit_weights
from qdebug.targets.qnn_options import DEFAULT_HTP_ARCH, SOC_MODELS, V73_SOC, QnnOptions, qnn_available, qnn_options

if TYPE_CHECKING:
    from qdebug.config import QuantConfig

__all__ = ["FIX_FOR_OP", "QnnTarget", "compiled_options"]

#: Fallback op type → the fix that removes it (QNN's own reason for these is vague, e.g. "error 3110").
FIX_FOR_OP = {"Erf": "gelu_fusion", "LayerNormalization": "layernorm_gamma_unsigned", "Einsum": COMPAT_FIX}


def _usable() -> None:
    """onnxruntime-qnn checked first (a missing one names the ``qnn`` extra), then its provider library."""
    require("onnxruntime_qnn")
    ok, why = qnn_available()
    if not ok:
        raise TargetError(f"QNN is not usable here: {why}")


def compiled_options(job: CompileJob, compiled: Compiled) -> QnnOptions:
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
    options = frozenset(
        {
            "soc",
            "fail_on_fallback",
            "skip_fixes",
            "probe_tensors",
            "bisect",
            "remedies",
            "time_budget_s",
            "probe_samples",
        }
    )
    fix_names = (*FIX_NAMES, COMPAT_FIX)

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
        """The QNN compatibility fixes (:mod:`qdebug.targets.model_fixes`), before quantizing: calibration, the Q/DQ
        placement and the overrides must all see the graph QNN will compile (fixing shapes after quantizing left
        ~1,100 CPU nodes on a detector)."""
        _usable()
        qnn_options(options)  # an unknown SoC fails here, before any work
        given, source = shapes_for(model, shapes)
        skip = tuple(s for s in options.skip_fixes if s != COMPAT_FIX)
        fixed = apply_qnn_fixes(model, config, input_shapes=given, skip=skip)
        fixes = tuple(
            replace(r, detail=f"{r.detail} (shapes {source})") if r.name == "static_shapes" and r.changed else r
            for r in fixed.reports
        )
        # The compatibility loop (qnn_compat): QNN's own rejections, answered by the rewrite catalogue.
        fixed_model, loop = fixed.model, CompatReport((), StopReason.SKIPPED)
        if COMPAT_FIX not in options.skip_fixes:
            cfg = fixed.config
            ort_config = None if cfg is None else (lambda path, reader: self.ort_config(cfg, path, reader))
            opts = qnn_options(options)
            fixed_model, loop = run_compat_loop(fixed.model, opts, ort_config, shapes.data, shapes.label_key)
        return Prepared(fixed_model, fixed.config, (*fixes, loop.pass_report()))

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
        opts = compiled_options(job, compiled)
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
                outputs_sink=job.outputs_sink,
                probe_samples=job.options.probe_samples,
            )

    def compiled_top1(
        self, job: CompileJob, compiled: Compiled, eval_data: Path, qdq_top1: float | None
    ) -> float | None:
        """Top-1 of the EPContext model on the HTP simulator."""
        assert job.float_model is not None
        model = load_model(job.float_model, "float model")
        path = Path(compiled.report.compiled_model or "")
        return compiled_top1(path, eval_data, job.options.label_key, model, compiled_options(job, compiled))

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
