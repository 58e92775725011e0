"""The ``cpu`` target: ONNX Runtime's CPU execution provider runs the QDQ model as it is.

"Compiling" is checking that the provider loads the QDQ model and runs one sample; the QDQ model is the
deliverable, so its top-1 is the compiled model's.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from qdebug.data import DataSource, open_data
from qdebug.errors import ModelError
from qdebug.model_io import input_specs, load_model
from qdebug.ort import ort_message
from qdebug.targets.base import (
    INT8_WEIGHTS,
    UINT8,
    UINT16,
    Availability,
    Compiled,
    CompileJob,
    Precision,
    TargetBase,
    register_target,
)
from qdebug.targets.compile_report import CompileReport, failed_report

__all__ = ["CpuTarget", "first_sample", "validate_cpu"]


def first_sample(source: DataSource) -> dict[str, np.ndarray]:
    """The first sample of ``source`` (a source with none is a :class:`ModelError` naming it)."""
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
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4  # fatal only: the error is reported below, in one line
        # The proto's bytes, not the path: ORT's Python bindings take UTF-8 paths only (a user's folder may not be)
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feed = first_sample(data if data is not None else open_data(None, input_specs(model), num_samples=1))
        outs = sess.run(None, feed)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types: report, do not crash
        error = f"ONNX Runtime CPU could not run the QDQ model: {ort_message(exc)}"
        return failed_report("cpu", device, t0, error)
    bad = [o.name for o, v in zip(sess.get_outputs(), outs, strict=True) if not np.all(np.isfinite(np.asarray(v)))]
    warnings = (f"output(s) {bad} hold NaN/Inf on the first sample",) if bad else ()
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
        warnings=warnings,
        accelerator=False,
    )


class CpuTarget(TargetBase):
    """ONNX Runtime CPU: the QDQ model is what runs (uint8/uint16 activations; ORT's "U8S8" for int8)."""

    name = "cpu"
    description = "ONNX Runtime CPU (runs the QDQ model as written)"
    precisions: Mapping[str, Precision] = {"uint8": UINT8, "int8": INT8_WEIGHTS, "uint16": UINT16}
    activation_types = frozenset({"uint8", "int8", "uint16", "int16"})

    def available(self) -> Availability:
        """Always: ONNX Runtime is a core dependency."""
        return Availability(True, "ONNX Runtime CPU (validates the QDQ model)")

    def compile(self, job: CompileJob) -> Compiled:
        """Check that ORT CPU loads and runs the QDQ model; the compiled model is the QDQ model itself."""
        job.progress("checking that ONNX Runtime CPU runs the QDQ model")
        report = validate_cpu(job.model, job.samples)
        return Compiled(report)

    def compiled_top1(
        self, job: CompileJob, compiled: Compiled, eval_data: Path, qdq_top1: float | None
    ) -> float | None:
        """The QDQ model is what the CPU runs: its top-1."""
        return qdq_top1

    def describe(self, report: CompileReport) -> list[str]:
        """``CPU check OK: <ORT CPU>, N nodes, s``."""
        state = "OK" if report.ok else "FAILED"
        return [f"CPU check {state}: {report.device}, {report.accelerator_nodes} nodes, {report.compile_seconds:.2f} s"]


register_target("cpu", CpuTarget)
