"""Bit-exactness of the Deeploy export with and without scale snapping (the table in docs/deeploy.md).

For each model the script quantizes for target ``deeploy`` (int8), exports the QDQ model as it is and after
``qdebug.targets.deeploy_snap.snap_scales_for_deeploy`` on the fine and on the tie-free grid, and prints the
fraction of output elements equal to ONNX Runtime's CPU run of that QDQ model (requantized to the output grid),
the largest difference in LSB and the largest relative scale change. ``--layers`` adds, for ``digits_cnn``, the
per-layer *local* mismatches: every integer layer is fed ONNX Runtime's own quantized input, so only differences
born in that layer count, with the distance of each one's exact value from a rounding half; ``--accuracy`` the QDQ
models' top-1 and logits SQNR vs the float model on the eval digits.

Models: the residual conv test model (tests/test_deeploy_export.py; per-tensor and per-channel weights, 256
seeded int8 samples; calibrated as in that test file), the QAT end-to-end model (tests/qat_models.py, 256
uniform samples) and sample_models/digits_cnn.onnx (BatchNorm folded, calibrated on digits_calib.npz, all 540
digits of digits_eval.npz, ``label`` ignored). This is a measurement report, not a test.

Usage::

    .venv/bin/python benchmarks/bench_deeploy_snap.py [--models conv,conv_pc,qat,digits] [--layers] [--accuracy]
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from qdebug import quantize  # noqa: E402
from qdebug.config import QuantConfig  # noqa: E402
from qdebug.targets import deeploy_evaluate as dv  # noqa: E402
from qdebug.targets import deeploy_export as de  # noqa: E402
from qdebug.targets import deeploy_passes as dp  # noqa: E402
from qdebug.targets.deeploy_snap import snap_scales_for_deeploy  # noqa: E402
from qdebug.targets.model_fixes import fold_batchnorm  # noqa: E402

SAMPLES = ROOT / "sample_models"


def _cfg(per_channel: bool = False) -> QuantConfig:
    # The calibration sample counts of tests/test_deeploy_export.py (16 per tensor, 8 per channel).
    return QuantConfig(
        activation_type="int8", weight_type="int8", target="deeploy", per_channel=per_channel,
        num_samples=8 if per_channel else 16,
    )  # fmt: skip


def conv(work: Path, per_channel: bool = False) -> tuple[str, Any, int]:
    from test_deeploy_export import residual_convnet

    q = quantize(residual_convnet(int(per_channel)), None, _cfg(per_channel), work / "conv.onnx").model_path
    return str(q), None, 256


def qat_model(work: Path) -> tuple[str, Any, int]:
    import qat_models as qm

    from qdebug import qat

    canonical = qat.canonicalize(qm.qat_convnet("qcdq"), output=work / "qat.onnx")
    rng = np.random.default_rng(3)
    data = {"x": rng.uniform(-1.0, 1.0, (256, *qm.INPUT_SHAPE[1:])).astype(np.float32)[:, None]}
    return str(canonical.path), data, 256


def digits(work: Path) -> tuple[str, Any, int]:
    folded, _ = fold_batchnorm(onnx.load(str(SAMPLES / "digits_cnn.onnx")))
    q = quantize(folded, SAMPLES / "digits_calib.npz", _cfg(), work / "digits.onnx").model_path
    data = {k: v for k, v in np.load(SAMPLES / "digits_eval.npz").items() if k != "label"}
    return str(q), data, 540


MODELS: dict[str, Callable[[Path], tuple[str, Any, int]]] = {
    "conv": conv,
    "conv_pc": lambda w: conv(w, per_channel=True),
    "qat": qat_model,
    "digits": digits,
}


def local_mismatches(qdq: onnx.ModelProto, data: dict[str, np.ndarray], n: int) -> None:
    """Per Q tensor: elements that differ when the layer gets ORT's own input; and their distance from a half."""
    import onnxruntime as ort
    from onnx import helper

    from qdebug.model_io import is_q

    probe = onnx.ModelProto()
    probe.CopyFrom(qdq)
    q_outs = [nd.output[0] for nd in probe.graph.node if is_q(nd)]
    for t in q_outs:
        probe.graph.output.append(helper.make_tensor_value_info(t, onnx.TensorProto.INT8, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    net = onnx.ModelProto()
    net.CopyFrom(qdq)
    st = de.GraphState(net)
    for name, fn in dp.PASSES:
        if name not in dp.OPTIONAL_PASSES:
            fn(st)
    consts = {i.name: onnx.numpy_helper.to_array(i).astype(np.int64) for i in st.graph.initializer}
    producer = {nd.output[0]: nd for nd in st.graph.node}
    # The evaluator with a hook after every node: count, then replace the value by ORT's.
    src = inspect.getsource(dv._run).replace("def _run(", "def _run_hook(")
    src = src.replace(
        "        vals[node.output[0]] = np.asarray(y, dtype=np.int64)",
        "        vals[node.output[0]] = np.asarray(y, dtype=np.int64)\n        HOOK(node.output[0], vals)",
    )
    ns: dict[str, Any] = dict(vars(dv))
    exec(src, ns)  # the library's own evaluator, instrumented
    (inp, act), *_ = st.inputs.items()
    counts: dict[str, list[int]] = {}
    halves: list[float] = []
    for i in range(n):
        q = np.clip(np.rint(data[inp][i].astype(np.float64) / act.scale) + act.zero_point, -128, 127)
        feed = {inp: (act.scale * (q - act.zero_point)).astype(np.float32)}
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))

        def hook(t: str, vals: dict[str, np.ndarray], ref: dict[str, np.ndarray] = ref) -> None:
            if t not in ref or t not in st.acts or t in st.outputs:
                return
            r = ref[t].astype(np.int64)
            diff = vals[t] + st.acts[t].offset != r
            c = counts.setdefault(t, [0, 0])
            c[0] += int(diff.sum())
            c[1] += diff.size
            if diff.any():
                rq = producer[t]
                div = int(dv._tensor_attr(dv._attrs(rq)["div"]))
                num = np.broadcast_to(vals[rq.input[0]] * consts[rq.input[1]] + consts[rq.input[2]], diff.shape)
                halves.extend(abs(float(f) - 0.5) for f in (num[diff] % div) / div)
            vals[t] = r - st.acts[t].offset

        ns["HOOK"] = hook
        ns["_run_hook"](st.model, {inp: (q - act.offset).astype(np.int64)})
    print(f"  local mismatches (inputs from ORT), {n} samples:")
    for t, (bad, total) in counts.items():
        print(f"    {t}: {bad}/{total}")
    if halves:
        print(f"  their exact values lie {min(halves):.2e} .. {max(halves):.2e} LSB from a rounding half")


def _run_ort(model: onnx.ModelProto, data: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x})[0] for x in data[name]])


def accuracy(models: dict[str, onnx.ModelProto], data: dict[str, np.ndarray]) -> None:
    """digits_cnn: top-1 on the eval labels and logits SQNR vs the (BatchNorm-folded) float model."""
    folded, _ = fold_batchnorm(onnx.load(str(SAMPLES / "digits_cnn.onnx")))
    labels = np.load(SAMPLES / "digits_eval.npz")["label"]
    ref = _run_ort(folded, data)
    print(f"  digits top-1: float {np.mean(ref.argmax(1) == labels):.2%}")
    for name, model in models.items():
        y = _run_ort(model, data)
        sqnr = 10 * np.log10(np.sum(ref**2) / np.sum((ref - y) ** 2))
        print(f"  digits {name} QDQ: top-1 {np.mean(y.argmax(1) == labels):.2%}, logits SQNR vs float {sqnr:.2f} dB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layers", action="store_true", help="per-layer local mismatches for digits")
    ap.add_argument("--accuracy", action="store_true", help="digits: top-1 and logits SQNR vs float per variant")
    args = ap.parse_args()
    print(
        "| model | samples | without snapping: equal / max LSB | fine grid: equal / max LSB, largest scale change "
        "| tie-free grid (default): equal / max LSB, largest scale change |"
    )
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-deeploy-snap-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            path, data, n = MODELS[name](work)
            qdq = onnx.load(path)
            fine, rep_fine = snap_scales_for_deeploy(qdq, grid="fine")
            tie_free, rep_tf = snap_scales_for_deeploy(qdq, grid="tie_free")
            row = []
            for i, (model, rep) in enumerate(((qdq, None), (fine, rep_fine), (tie_free, rep_tf))):
                res = de.export(model, work / f"{name}_{i}", data=data, num_samples=n, verbose=False)
                cell = f"{res.equal_fraction:.2%} / {res.max_lsb_diff}"
                row.append(cell if rep is None else f"{cell}, {rep.max_rel_change:.1e}")
            print(f"| {name} | {n} | {' | '.join(row)} |", flush=True)
            for rep in (rep_fine, rep_tf):
                if rep.skipped:
                    print(f"  skipped ({rep.grid}): {rep.skipped}")
            if args.accuracy and name == "digits":
                accuracy({"unsnapped": qdq, "fine": fine, "tie-free": tie_free}, data)
            if args.layers and name == "digits":
                for grid, model in (("fine", fine), ("tie-free", tie_free)):
                    print(f"  {grid} grid:")
                    local_mismatches(model, data, n)


if __name__ == "__main__":
    main()
