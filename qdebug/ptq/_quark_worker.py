"""Quantize one float ONNX model with AMD Quark (``quark.onnx``), in Quark's own environment.

Run by :func:`qdebug.ptq.run_ptq` as ``<quark-env>/bin/python _quark_worker.py REQUEST.json`` with the interpreter
of the Quark virtual environment (torch, ``onnxruntime<=1.28``), so it imports only the standard library, numpy,
onnx, onnxruntime and Quark — never qdebug.

The request names the float model (already at opset >= 13), the calibration ``.npz`` (one key per model input,
samples stacked on a leading axis), the output path, the activation and weight types and the recipe's options:
``scale`` ("float" | "pow2"), ``calibrate_method`` (a ``CalibMethod`` name, default Quark's Percentile),
``per_channel`` (weights, default true), ``cle``, ``smooth_quant_alpha``, ``adaround`` / ``adaround_steps``. The
last line on stdout is ``QDEBUG_PTQ_RESULT <json>``; Quark's own log goes to stdout/stderr before it.
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

_SPECS = {"uint8": "UInt8Spec", "int8": "Int8Spec", "uint16": "UInt16Spec", "int16": "Int16Spec"}
_CALIB = {"minmax": "MinMax", "minmse": "MinMSE", "percentile": "Percentile", "entropy": "Entropy"}


def _version() -> str:
    """Quark's version, without importing it when it is not loaded yet (also after a failed import)."""
    quark = sys.modules.get("quark")
    return str(getattr(quark, "__version__", "")) if quark is not None else ""


def _samples(npz_path: str) -> list[dict[str, Any]]:
    """The calibration samples: one dict of input arrays per sample (key → leading axis)."""
    import numpy as np

    with np.load(npz_path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    n = min(len(a) for a in arrays.values())
    return [{k: a[i] for k, a in arrays.items()} for i in range(n)]


def _reader(samples: list[dict[str, Any]]) -> Any:
    """An ONNX Runtime ``CalibrationDataReader`` over the samples (Quark's calibration reads one)."""
    base = importlib.import_module("onnxruntime.quantization").CalibrationDataReader

    class Reader(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = iter(samples)

    return Reader()


def _tensor_spec(spec_mod: Any, qtype: str, options: dict[str, Any], *, weight: bool) -> Any:
    spec = getattr(spec_mod, _SPECS[qtype])()
    if options.get("scale") == "pow2":
        spec.set_scale_type(spec_mod.ScaleType.PowerOf2)
        spec.set_symmetric(True)  # Quark's power-of-two (NPU CNN) mode refuses asymmetric activations
    method = options.get("calibrate_method")
    if method and not weight:
        spec.set_calibration_method(getattr(spec_mod.CalibMethod, _CALIB[str(method)]))
    if weight and options.get("per_channel", True):
        spec.set_quant_granularity(spec_mod.QuantGranularity.Channel)
    return spec


def _algorithms(quark_onnx: Any, options: dict[str, Any], n_samples: int) -> list[Any]:
    algos: list[Any] = []
    if options.get("cle"):
        algos.append(quark_onnx.CLEConfig())
    if "smooth_quant_alpha" in options:
        algos.append(quark_onnx.SmoothQuantConfig(alpha=float(options["smooth_quant_alpha"])))
    if options.get("adaround"):
        steps = int(options.get("adaround_steps", 1000))
        algos.append(
            quark_onnx.AdaRoundConfig(
                optim_device="cpu", infer_device="cpu", batch_size=1, data_size=n_samples,
                num_iterations=steps, early_stop=True,
            )
        )  # fmt: skip
    return algos


def quantize(request: dict[str, Any]) -> dict[str, Any]:
    """Run Quark's ``ModelQuantizer`` as the request says and save the model; the result record."""
    quark_onnx = importlib.import_module("quark.onnx")
    spec_mod = importlib.import_module("quark.onnx.quantization.config.spec")
    options: dict[str, Any] = dict(request.get("options") or {})
    samples = _samples(request["calibration"])
    layer = spec_mod.QLayerConfig(
        activation=_tensor_spec(spec_mod, request["activation_type"], options, weight=False),
        weight=_tensor_spec(spec_mod, request["weight_type"], options, weight=True),
    )
    # Quark's own A8W8 extra options, minus the ones that change the graph beyond Q/DQ insertion
    extra = {"ForceQuantizeNoInputCheck": True, "AlignSlice": False, "AlignConcat": True}
    config = quark_onnx.QConfig(
        global_config=layer, algo_config=_algorithms(quark_onnx, options, len(samples)), extra_options=extra
    )
    t0 = time.perf_counter()
    quark_onnx.ModelQuantizer(config).quantize_model(request["model"], request["out"], _reader(samples))
    seconds = time.perf_counter() - t0
    return {"ok": True, "version": _version(), "seconds": seconds, "notes": []}


def main(argv: list[str]) -> int:
    """``_quark_worker.py REQUEST.json``: print the result line; exit 0 whether or not Quark succeeded."""
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
