"""Promotions of a QDQ model the user made, like for like (issue 38): the user's model as it is, the same model
"promoted" with nothing (a patch that changes nothing), the top-K suggestions promoted by patching the user's Q/DQ
pairs (what the dashboard does now), and the same two measured the old way — the float model re-quantized with the
user's recipe and ranges read back from its Q/DQ parameters — so the re-quantization's own loss shows.

The "user" model is made with ONNX Runtime's ``quantize_static`` directly (QDQ, uint8 activations, int8 per-channel
weights, percentile calibration on 16 samples of ``calib.npz``, ops ``--ops``): a recipe qdebug's quantizer does not
reproduce. Everything is debugged on ``--debug-samples`` of ``eval.npz``. Every number is measured; run::

    .venv/bin/python benchmarks/bench_promote_given.py --model yolov8n-nudenet [--top 1] [--debug-samples 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

CORPUS = Path.home() / ".cache" / "qdebug" / "realmodels"


def _user_model(name: str, out: Path, ops: list[str]) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    calib = np.load(CORPUS / name / "calib.npz")
    key = calib.files[0]

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.it = iter([{key: v} for v in calib[key][:16]])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    quantize_static(
        str(CORPUS / name / f"{name}.onnx"), str(out), Reader(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=ops,
        calibrate_method=CalibrationMethod.Percentile,
    )  # fmt: skip
    return out


def main() -> None:
    """Measure and print one line per variant."""
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.session import MixedPrecisionSession
    from qdebug.quantizer import quantize

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="yolov8n-nudenet")
    ap.add_argument("--top", type=int, default=1)
    ap.add_argument("--debug-samples", type=int, default=8)
    ap.add_argument("--ops", default="Conv,Mul,Add,Concat")
    args = ap.parse_args()
    d = CORPUS / args.model
    with tempfile.TemporaryDirectory(prefix="qdebug-bench-") as tmp:
        work = Path(tmp)
        user = _user_model(args.model, work / "user.qdq.onnx", args.ops.split(","))
        t0 = time.perf_counter()
        s = MixedPrecisionSession(
            d / f"{args.model}.onnx", d / "calib.npz", debug_data=d / "eval.npz", quant_model=user,
            debug_options=DebugOptions(num_samples=args.debug_samples), workdir=work / "session",
        )  # fmt: skip
        rows = [("your model", s.base.report.min_output_sqnr_db)]
        picks = [x.tensor_name for x in s.suggest(args.top, s.base.report)]
        est = sum(x.estimated_output_gain_db for x in s.suggest(args.top, s.base.report))
        rows.append(("patch: nothing promoted", s.evaluate(s.base_config, name="nothing").output_sqnr_db))
        plan = s.promote(picks)
        rows.append((f"patch: top-{args.top} promoted", s.evaluate(plan, name="top").output_sqnr_db))
        cache = s.base.quantization.calibration_cache
        for label, cfg in (
            ("re-quantized: nothing promoted", s.base_config),
            (f"re-quantized: top-{args.top}", plan.config),
        ):
            q = quantize(
                s.float_path, s.data, cfg, work / f"{len(rows)}.qdq.onnx", calibration_cache=cache, check=False
            )
            rows.append((label, s._debug(q.model_path, label).min_output_sqnr_db))
        print(f"{args.model}: top-{args.top} = {picks}; estimated +{est:.2f} dB ({time.perf_counter() - t0:.0f} s)")
        for label, db in rows:
            print(f"  {label:34s} {db:7.2f} dB")


if __name__ == "__main__":
    main()
