"""qdebug: find where a quantized ONNX model loses accuracy, and fix it.

The core imports only numpy, onnx and onnxruntime; UI and target backends load lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"

from qdebug.config import ConvertOverride, QuantConfig, TensorOverride, to_ort_config  # noqa: E402
from qdebug.debug import DebugOptions, debug  # noqa: E402
from qdebug.errors import (  # noqa: E402
    ConfigError,
    DataError,
    InputFileError,
    MissingExtraError,
    ModelError,
    QDebugError,
    TargetError,
)
from qdebug.quantize import QuantizeResult, quantize  # noqa: E402
from qdebug.report import ActivationResult, DebugReport, OutputResult, WeightResult  # noqa: E402

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
