"""qdebug: find where a quantized ONNX model loses accuracy, and fix it.

The core imports only numpy, onnx and onnxruntime; UI and target backends load lazily.
"""

from __future__ import annotations

from qdebug._version import __version__
from qdebug.config import ConvertOverride, QuantConfig, TensorOverride
from qdebug.debug import DebugOptions, debug
from qdebug.errors import (
    ConfigError,
    DataError,
    InputFileError,
    MissingExtraError,
    ModelError,
    QDebugError,
    TargetError,
)
from qdebug.quantize import QuantizeResult, quantize
from qdebug.report import ActivationResult, DebugReport, OutputResult, WeightResult
from qdebug.targets.base import to_ort_config

__all__ = [
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
    "TensorOverride",
    "WeightResult",
    "__version__",
    "debug",
    "quantize",
    "to_ort_config",
]
