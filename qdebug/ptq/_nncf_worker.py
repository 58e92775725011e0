"""Quantize one float ONNX model with NNCF, in NNCF's own environment.

Run by :func:`qdebug.ptq.run_ptq` as ``<nncf-env>/bin/python _nncf_worker.py REQUEST.json`` with the interpreter
of the NNCF virtual environment, so it imports only the standard library, numpy, onnx and NNCF — never qdebug.

The request names the float model (already at opset >= 13: the caller converts it), the calibration ``.npz``
(one key per model input, samples stacked on a leading axis), the output path and the recipe's options. The
last line on stdout is ``QDEBUG_PTQ_RESULT <json>``; NNCF's own log goes to stdout/stderr before it.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from typing import Any

RESULT_PREFIX = "QDEBUG_PTQ_RESULT "
#: A library's error message is cut here: the caller shows it on one line.
_MESSAGE_CHARS = 400


def _import_nncf() -> Any:
    """NNCF without its telemetry: ``openvino_telemetry`` is made unimportable before NNCF loads, so NNCF takes
    its no-telemetry stub (it catches that ImportError) and the client, which would write a client id under
    ``~/intel`` and send usage events, never runs."""
    sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]  # None: "not importable", by Python's rule
    return importlib.import_module("nncf")


def _version() -> str:
    """NNCF's version, without importing it when it is not loaded yet (also after a failed import)."""
    nncf = sys.modules.get("nncf")
    return str(getattr(nncf, "__version__", "")) if nncf is not None else ""


def _samples(npz_path: str) -> list[dict[str, Any]]:
    """The calibration samples: one dict of input arrays per sample (key → leading axis)."""
    import numpy as np

    with np.load(npz_path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    n = min(len(a) for a in arrays.values())
    return [{k: a[i] for k, a in arrays.items()} for i in range(n)]


def _advanced(options: dict[str, Any]) -> Any:
    """NNCF's advanced parameters for the options that need them (SmoothQuant's alpha), else ``None``."""
    if "smooth_quant_alpha" not in options:
        return None
    params = importlib.import_module("nncf.quantization.advanced_parameters")
    alpha = float(options["smooth_quant_alpha"])
    smooth = params.AdvancedSmoothQuantParameters(matmul=alpha)
    return params.AdvancedQuantizationParameters(smooth_quant_alphas=smooth)


def quantize(request: dict[str, Any]) -> dict[str, Any]:
    """Run ``nncf.quantize`` as the request says and save the model; the result record."""
    import onnx

    nncf = _import_nncf()
    options: dict[str, Any] = dict(request.get("options") or {})
    model = onnx.load(request["model"])
    samples = _samples(request["calibration"])
    kwargs: dict[str, Any] = {"subset_size": len(samples)}
    if "preset" in options:
        kwargs["preset"] = nncf.QuantizationPreset(options["preset"])
    if options.get("model_type") == "transformer":
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    if "fast_bias_correction" in options:
        kwargs["fast_bias_correction"] = bool(options["fast_bias_correction"])
    advanced = _advanced(options)
    if advanced is not None:
        kwargs["advanced_parameters"] = advanced
    t0 = time.perf_counter()
    quantized = nncf.quantize(model, nncf.Dataset(samples), **kwargs)
    seconds = time.perf_counter() - t0
    onnx.save(quantized, request["out"])
    return {"ok": True, "version": str(nncf.__version__), "seconds": seconds, "notes": []}


def main(argv: list[str]) -> int:
    """``_nncf_worker.py REQUEST.json``: print the result line; exit 0 whether or not NNCF succeeded."""
    with open(argv[1], encoding="utf-8") as fh:
        request = json.load(fh)
    try:
        record = quantize(request)
    except Exception as exc:
        traceback.print_exc()
        message = " ".join(str(exc).split())[:_MESSAGE_CHARS]
        record = {"ok": False, "error": f"{type(exc).__name__}: {message}".rstrip(": "), "version": _version()}
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
