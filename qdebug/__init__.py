"""qdebug: find where a quantized ONNX model loses accuracy, and fix it.

The public names below are imported on first use (PEP 562), so ``import qdebug`` — and the ``qdebug`` command's
start-up, where a Ctrl-C must not print a traceback — loads nothing heavy. The core imports only numpy, onnx and
onnxruntime; UI and target backends load lazily.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from qdebug._version import __version__

# ONNX Runtime's Linux wheels record usage events for upload to Microsoft and leave a session file in TMPDIR and a
# device id under ~/.cache on import: a debugger of the user's models opts out unless the user chose otherwise
# (ORT_DISABLE_TELEMETRY=0), in this process and in every worker it starts (Ray, QNN, Voila inherit it).
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
if "onnxruntime" in sys.modules and os.environ["ORT_DISABLE_TELEMETRY"] not in ("0", "false", "False"):
    getattr(sys.modules["onnxruntime"], "disable_telemetry_events", lambda: None)()

if TYPE_CHECKING:
    from qdebug.config import ConvertOverride, QuantConfig, TensorOverride
    from qdebug.debugger import DebugOptions, debug
    from qdebug.errors import (
        ConfigError,
        DataError,
        InputFileError,
        MissingExtraError,
        ModelError,
        QDebugError,
        TargetError,
    )
    from qdebug.quantizer import QuantizeResult, quantize
    from qdebug.report import ActivationResult, DebugReport, OutputResult, WeightResult
    from qdebug.targets.base import to_ort_config
    from qdebug.task_measure import measure_task
    from qdebug.task_metrics import TASK_METRICS, load_metric
    from qdebug.task_score import TaskMetric, TaskScore

#: public name -> the module that defines it
_LAZY = {
    **dict.fromkeys(("ConvertOverride", "QuantConfig", "TensorOverride"), "qdebug.config"),
    **dict.fromkeys(("DebugOptions", "debug"), "qdebug.debugger"),
    **dict.fromkeys(
        ("ConfigError", "DataError", "InputFileError", "MissingExtraError", "ModelError", "QDebugError", "TargetError"),
        "qdebug.errors",
    ),
    **dict.fromkeys(("QuantizeResult", "quantize"), "qdebug.quantizer"),
    **dict.fromkeys(("ActivationResult", "DebugReport", "OutputResult", "WeightResult"), "qdebug.report"),
    "to_ort_config": "qdebug.targets.base",
    **dict.fromkeys(("TASK_METRICS", "load_metric"), "qdebug.task_metrics"),
    **dict.fromkeys(("TaskMetric", "TaskScore"), "qdebug.task_score"),
    "measure_task": "qdebug.task_measure",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'qdebug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "TASK_METRICS",
    "ActivationResult",
    "ConfigError",
    "ConvertOverride",
    "DataError",
    "DebugOptions",
    "DebugReport",
    "InputFileError",
    "MissingExtraError",
    "ModelError",
    "OutputResult",
    "QDebugError",
    "QuantConfig",
    "QuantizeResult",
    "TargetError",
    "TaskMetric",
    "TaskScore",
    "TensorOverride",
    "WeightResult",
    "__version__",
    "debug",
    "load_metric",
    "measure_task",
    "quantize",
    "to_ort_config",
]
