"""One purpose-built (float, QDQ) model pair per diagnostic of docs/diagnostics.md.

Each float model is a few numpy-defined nodes; the QDQ model is the float model with hand-chosen Q/DQ parameters
inserted the way ORT's quantizer inserts them (``<t>_QuantizeLinear_Output`` → ``<t>_DequantizeLinear_Output``,
weights as ``<w>_quantized`` + DequantizeLinear), so that each model shows exactly one problem on synthetic data
(uniform in [0, 1)).
"""

from __future__ import annotations

import numpy as np
import onnx
from builders import _model, quantize_per_tensor, scalar, value_info
from onnx import helper, numpy_helper

Params = dict[str, tuple[float, int, type]]


def insert_qdq(f: onnx.ModelProto, acts: Params, weights: Params | None = None) -> onnx.ModelProto:
    """``f`` with Q→DQ after each activation of ``acts`` (tensor → (scale, zero point, numpy int type)) and each
    weight of ``weights`` replaced by its quantized constant + DequantizeLinear (per tensor)."""
    g = f.graph
    inits = {t.name: t for t in g.initializer}
    new_inits = [t for t in g.initializer if t.name not in (weights or {})]
    rename = {}
    front: list[onnx.NodeProto] = []
    for w, (s, zp, dt) in (weights or {}).items():
        value = numpy_helper.to_array(inits[w])
        new_inits += [
            numpy_helper.from_array(quantize_per_tensor(value, s, zp, dt), f"{w}_quantized"),
            scalar(f"{w}_scale", s, np.float32), scalar(f"{w}_zero_point", zp, dt),
        ]  # fmt: skip
        front.append(
            helper.make_node("DequantizeLinear", [f"{w}_quantized", f"{w}_scale", f"{w}_zero_point"],
                             [f"{w}_DequantizeLinear_Output"], name=f"{w}_DQ")
        )  # fmt: skip
        rename[w] = f"{w}_DequantizeLinear_Output"

    def qdq(t: str) -> list[onnx.NodeProto]:
        s, zp, dt = acts[t]
        new_inits.extend([scalar(f"{t}_scale", s, np.float32), scalar(f"{t}_zero_point", zp, dt)])
        rename[t] = f"{t}_DequantizeLinear_Output"
        qo = f"{t}_QuantizeLinear_Output"
        return [
            helper.make_node("QuantizeLinear", [t, f"{t}_scale", f"{t}_zero_point"], [qo], name=f"{t}_Q"),
            helper.make_node("DequantizeLinear", [qo, f"{t}_scale", f"{t}_zero_point"], [rename[t]], name=f"{t}_DQ"),
        ]

    nodes = front + [n for i in g.input if i.name in acts for n in qdq(i.name)]
    for node in g.node:
        n = onnx.NodeProto()
        n.CopyFrom(node)
        for k, name in enumerate(n.input):
            n.input[k] = rename.get(name, name)
        nodes.append(n)
        nodes += [x for o in n.output if o in acts for x in qdq(o)]
    return _model(nodes, list(g.input), list(g.output), new_inits, opset=f.opset_import[0].version)


def _unary_chain(first: onnx.NodeProto, width: int, consts: list[onnx.TensorProto]) -> onnx.ModelProto:
    """x[1, width] → ``first`` (producing ``m``) → Neg → y (a float output: only ``m`` is quantized)."""
    nodes = [first, helper.make_node("Neg", ["m"], ["y"], name="neg")]
    return _model(nodes, [value_info("x", [1, width])], [value_info("y", [1, width])], consts)


def _mul(c: np.ndarray, width: int) -> onnx.ModelProto:
    k = numpy_helper.from_array(np.asarray(c, np.float32).reshape(1, -1), "k")
    return _unary_chain(helper.make_node("Mul", ["x", "k"], ["m"], name="mul"), width, [k])


def outlier_range() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``m = x * k`` with k = 1 except one element of 16384 at 1000: the int8 grid is set by that one value."""
    width = 16384
    k = np.ones(width)
    k[7] = 1000.0
    f = _mul(k, width)
    return f, insert_qdq(f, {"m": (1000.0 / 255, 0, np.uint8)})


def negative_unsigned() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``m = x - 0.5`` on a uint8 grid with zero point 0: every negative value is clipped to 0."""
    width = 64
    c = numpy_helper.from_array(np.full((1, width), 0.5, np.float32), "c")
    f = _unary_chain(helper.make_node("Sub", ["x", "c"], ["m"], name="sub"), width, [c])
    return f, insert_qdq(f, {"m": (0.5 / 255, 0, np.uint8)})


def wasted_range() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``m = x * 0.01`` on a uint8 grid spanning [0, 1]: 1% of the codes are used."""
    f = _mul(np.full(64, 0.01), 64)
    return f, insert_qdq(f, {"m": (1.0 / 255, 0, np.uint8)})


def saturation() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``m = x * 2`` on a uint8 grid spanning [0, 1]: half the values are clipped."""
    f = _mul(np.full(64, 2.0), 64)
    return f, insert_qdq(f, {"m": (1.0 / 255, 0, np.uint8)})


def scale_mismatch() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``Concat(x * 100, x * 0.1)``: input scales 1000x apart on one shared output grid."""
    big = numpy_helper.from_array(np.array(100.0, np.float32), "big")
    small = numpy_helper.from_array(np.array(0.1, np.float32), "small")
    nodes = [
        helper.make_node("Mul", ["x", "big"], ["a"], name="mul_a"),
        helper.make_node("Mul", ["x", "small"], ["b"], name="mul_b"),
        helper.make_node("Concat", ["a", "b"], ["cat"], name="concat", axis=1),
        helper.make_node("Neg", ["cat"], ["y"], name="neg"),
    ]
    f = _model(nodes, [value_info("x", [1, 16])], [value_info("y", [1, 32])], [big, small])
    q = insert_qdq(
        f, {"a": (100.0 / 255, 0, np.uint8), "b": (0.1 / 255, 0, np.uint8), "cat": (100.0 / 255, 0, np.uint8)}
    )
    return f, q


def per_channel_weight() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """x[1, 8] · W[8, 4] with output channel 0 a thousand times larger than the others, one int8 scale."""
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (8, 4)).astype(np.float32)
    w[:, 0] *= 1000.0
    f = _model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [value_info("x", [1, 8])], [value_info("y", [1, 4])], [numpy_helper.from_array(w, "W")],
    )  # fmt: skip
    q = insert_qdq(f, {"x": (1.0 / 255, 0, np.uint8)}, {"W": (float(np.abs(w).max()) / 127, 0, np.int8)})
    return f, q


def precision_cliff() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Softmax over 1024 values (each ~1/1024) on a uint8 grid of step 1/255: almost everything rounds to 0."""
    width = 1024
    f = _unary_chain(helper.make_node("Softmax", ["x"], ["m"], name="softmax", axis=-1), width, [])
    return f, insert_qdq(f, {"m": (1.0 / 255, 0, np.uint8)})


def bad_qparams() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``m = x * 2`` quantized with a negative scale: the model runs, its numbers are meaningless."""
    f = _mul(np.full(64, 2.0), 64)
    return f, insert_qdq(f, {"m": (-0.01, 0, np.uint8)})


#: diagnostic kind (its value) → (builder, the tensor it must name)
EXAMPLES = {
    "outlier_range": (outlier_range, "m"),
    "negative_unsigned": (negative_unsigned, "m"),
    "wasted_range": (wasted_range, "m"),
    "saturation": (saturation, "m"),
    "scale_mismatch": (scale_mismatch, "cat"),
    "per_channel_weight": (per_channel_weight, "W"),
    "precision_cliff": (precision_cliff, "m"),
    "bad_qparams": (bad_qparams, "m"),
}
