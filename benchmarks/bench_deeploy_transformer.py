"""Deeploy export of the bundled transformer: per-op deviation of the integer forms and accuracy (docs/deeploy.md).

Quantizes ``sample_models/digits_transformer.onnx`` for target ``deeploy`` (int8, calibrated on
digits_calib.npz), zero-centres the MatMul/GELU operands and snaps the scales exactly as ``qdebug build --target
deeploy`` does, exports it with ``deeploy_export.export`` on the eval digits, and prints:

- the output bit-exactness (all eval digits);
- per op family, the *local* deviation: every integer node is fed ONNX Runtime's own quantized input, so only
  differences born in that op count (equal fraction and largest difference in LSB of its output grid);
- top-1 on the eval digits of the float model, the QDQ model on ONNX Runtime CPU and the integer network
  (``evaluate_integer``, Deeploy's kernel arithmetic), and the logits SQNR of the last two vs float.

Usage::

    .venv/bin/python benchmarks/bench_deeploy_transformer.py [--local-samples 64] [--platform Siracusa]

``--platform Siracusa`` measures the network Siracusa's code is generated from (LayerNorm as centring MatMul +
iRMSNorm, uint8 MatMul operands re-encoded to int8; ``deeploy_export.PLATFORM_FORMS``).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qdebug import quantize  # noqa: E402
from qdebug.config import QuantConfig  # noqa: E402
from qdebug.model_io import is_q  # noqa: E402
from qdebug.targets import deeploy_evaluate as dv  # noqa: E402
from qdebug.targets import deeploy_export as de  # noqa: E402
from qdebug.targets.deeploy_snap import snap_scales_for_deeploy  # noqa: E402
from qdebug.targets.deeploy_zero_centre import zero_centre_operands  # noqa: E402

MODEL = ROOT / "sample_models" / "digits_transformer.onnx"
CALIB = ROOT / "sample_models" / "digits_calib.npz"
EVAL = ROOT / "sample_models" / "digits_eval.npz"


def _session(model: onnx.ModelProto) -> Any:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _family(qdq: onnx.ModelProto, q_out: str, prod: dict[str, onnx.NodeProto], consts: set[str]) -> str:
    """The op family behind a quantized tensor, as the table names it."""
    q = next(n for n in qdq.graph.node if is_q(n) and n.output[0] == q_out)
    p = prod.get(q.input[0])
    if p is None:
        return "input"
    if p.op_type == "Mul" and "mlp.1" in p.name:
        return "GELU (Erf chain → RequantizediGELU)"
    if p.op_type in ("MatMul", "Add", "Mul"):
        const = any(prod.get(t) is not None and prod[t].input[0] in consts for t in p.input)
        return f"{p.op_type} ({'with a constant' if const else 'of two activations'})"
    return p.op_type


Family = Callable[[str, dict[str, onnx.NodeProto], set[str]], str]


def local_stats(
    qdq: onnx.ModelProto, net: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], family: Family
) -> dict[str, list[int]]:
    """Per op family: [equal, total, max LSB] of each integer node fed ONNX Runtime's own quantized inputs.

    ``family(q_out, producers, constant_names)`` names the op family of the Q output ``q_out``; shared with
    bench_deeploy_minilm.py, whose models have several inputs.
    """
    m = onnx.ModelProto()
    m.CopyFrom(qdq)
    q_outs = [nd.output[0] for nd in m.graph.node if is_q(nd)]
    for t in q_outs:
        m.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.INT8, None))
    sess = _session(m)
    names = [o.name for o in sess.get_outputs()]
    prod = {o: nd for nd in qdq.graph.node for o in nd.output}
    consts = {i.name for i in qdq.graph.initializer}
    elem = {v.name: v.type.tensor_type.elem_type for v in (*net.graph.value_info, *net.graph.output, *net.graph.input)}
    inits = {i.name: i for i in net.graph.initializer}
    subs = []
    for nd in net.graph.node:  # one single-node model per integer node, built once
        sub = onnx.helper.make_model(onnx.helper.make_graph([nd], "n", [], []))
        sub.graph.initializer.extend(inits[t] for t in nd.input if t in inits)
        subs.append((nd, sub))
    out_q = {o.name: prod[o.name].input[0] for o in qdq.graph.output}  # logits ← its DQ ← Q output
    inputs = {i.name for i in qdq.graph.input}
    in_q = {nd.input[0]: nd.output[0] for nd in qdq.graph.node if is_q(nd) and nd.input[0] in inputs}
    stats: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    u8 = onnx.TensorProto.UINT8
    for x in feeds:
        ref = dict(zip(names, sess.run(None, x), strict=True))
        vals = {n: ref[q].astype(np.int64) + (128 if elem.get(n) == u8 else 0) for n, q in in_q.items()}
        for nd, sub in subs:
            y = dv._run(sub, {t: vals[t] for t in nd.input if t in vals})[nd.output[0]]
            t = out_q.get(nd.output[0], nd.output[0])
            if t in ref:
                r = ref[t].astype(np.int64) + (128 if elem.get(nd.output[0]) == u8 else 0)
                d = np.abs(r - y)
                s = stats[family(t, prod, consts)]
                s[0], s[1], s[2] = s[0] + int((d == 0).sum()), s[1] + d.size, max(s[2], int(d.max()))
                y = r  # local: the next op sees ONNX Runtime's value
            vals[nd.output[0]] = y
    return stats


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - got) ** 2), 1e-30)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--local-samples", type=int, default=64)
    ap.add_argument("--platform", default="Generic", choices=sorted(de.PLATFORM_FORMS))
    args = ap.parse_args()
    ev = np.load(EVAL)
    x, labels = ev["input"].astype(np.float32), ev["label"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = QuantConfig(activation_type="int8", weight_type="int8", target="deeploy")
        qdq0 = onnx.load(str(quantize(MODEL, CALIB, cfg, Path(tmp) / "t.qdq.onnx").model_path))
        centred, changed = zero_centre_operands(qdq0)
        qdq, rep = snap_scales_for_deeploy(centred)
        print(f"zero-centred {len(changed)} tensor groups; snapped {len(rep.snapped)} requantizations")
        res = de.export(qdq, Path(tmp) / "out", data={"input": x}, num_samples=len(x), verbose=False,
                        platform=args.platform)  # fmt: skip
        net = onnx.load(str(Path(tmp) / "out" / "network.onnx"))
    print(f"output logits, {res.num_samples} eval digits: {res.equal_fraction:.2%} equal, max {res.max_lsb_diff} LSB")
    print(f"\nlocal deviation per op family ({args.local_samples} digits):")
    print("| op family | elements | equal | max LSB |\n| --- | --- | --- | --- |")
    feeds = [{qdq.graph.input[0].name: x[i]} for i in range(args.local_samples)]
    stats = local_stats(qdq, net, feeds, lambda t, prod, consts: _family(qdq, t, prod, consts))
    for fam, (eq, tot, mx) in sorted(stats.items()):
        print(f"| {fam} | {tot} | {eq / tot:.2%} | {mx} |")
    flt = _session(onnx.load(str(MODEL)))
    q_sess = _session(qdq)
    act = de._input_activations(qdq)["input"]
    f_log, q_log, i_log = [], [], []
    scale_out, zp_out = _output_qparams(qdq)
    for i in range(len(x)):
        f_log.append(flt.run(None, {"input": x[i]})[0])
        q_log.append(q_sess.run(None, {"input": x[i]})[0])
        q_in = np.clip(np.rint(x[i] / act.scale) + act.zero_point, -128, 127).astype(np.int64)
        got = de.evaluate_integer(net, {"input": q_in - act.offset})["logits"]
        i_log.append(scale_out * (got.astype(np.float64) - zp_out))
    f, q, it = (np.concatenate(v).astype(np.float64) for v in (f_log, q_log, i_log))
    print(f"\ntop-1 on {len(x)} eval digits: float {np.mean(f.argmax(1) == labels):.2%}, QDQ (ORT CPU) "
          f"{np.mean(q.argmax(1) == labels):.2%}, integer network {np.mean(it.argmax(1) == labels):.2%}")  # fmt: skip
    print(
        f"logits SQNR vs float: QDQ {_sqnr(f, q):.2f} dB, integer network {_sqnr(f, it):.2f} dB; "
        f"integer network vs QDQ {_sqnr(q, it):.2f} dB"
    )


def _output_qparams(qdq: onnx.ModelProto) -> tuple[float, int]:
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer}
    dq = next(n for n in qdq.graph.node if n.output[0] == qdq.graph.output[0].name)
    return float(consts[dq.input[1]]), int(consts[dq.input[2]])


if __name__ == "__main__":
    main()
