"""Small purpose-built ONNX models for the tests (numpy + onnx.helper only)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes, inputs, outputs, inits=(), opset: int = OPSET, domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    ops = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in domains]]
    m = helper.make_model(graph, opset_imports=ops)
    m.ir_version = 9
    return m


def tiny_convnet(seed: int = 0, batch: int | str = 1) -> onnx.ModelProto:
    """Conv → Relu → Conv → Add(residual) → GlobalAveragePool → Flatten → Gemm."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) * 0.5).astype(np.float32), "w1")
    b1 = numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "w2")
    b2 = numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "b2")
    wg = numpy_helper.from_array((rng.standard_normal((3, 4)) * 0.5).astype(np.float32), "wg")
    bg = numpy_helper.from_array((rng.standard_normal(3) * 0.1).astype(np.float32), "bg")
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a1"], name="add1"),
        helper.make_node("GlobalAveragePool", ["a1"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wg", "bg"], ["y"], name="gemm", transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    return _model(nodes, [x], [y], [w1, b1, w2, b2, wg, bg])


# --------------------------------------------------------------------------- more purpose-built models
# Hand-built QDQ pairs (float model, quantized model) use the naming ORT's quantizer uses, so that the
# reference code in the tests can find a weight's float twin by stripping ``_quantized``.


def value_info(name: str, shape, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A typed graph input/output."""
    return helper.make_tensor_value_info(name, elem, shape)


def qdq_pair(
    tensor: str, scale: str, zero_point: str, *, domain: str = "", out: str | None = None
) -> list[onnx.NodeProto]:
    """QuantizeLinear → DequantizeLinear on ``tensor`` (ORT's names: ``<t>_QuantizeLinear_Output`` ...)."""
    q_out = f"{tensor}_QuantizeLinear_Output"
    return [
        helper.make_node("QuantizeLinear", [tensor, scale, zero_point], [q_out], name=f"{tensor}_Q", domain=domain),
        helper.make_node(
            "DequantizeLinear",
            [q_out, scale, zero_point],
            [out or f"{tensor}_DequantizeLinear_Output"],
            name=f"{tensor}_DQ",
            domain=domain,
        ),
    ]


def scalar(name: str, value, dtype) -> onnx.TensorProto:
    """A 0-d initializer."""
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def constant_node(name: str, value: np.ndarray) -> onnx.NodeProto:
    """A ``Constant`` node producing ``name``."""
    return helper.make_node(
        "Constant", [], [name], name=f"{name}_const", value=numpy_helper.from_array(value, f"{name}_value")
    )


def quantize_per_tensor(w: np.ndarray, scale: float, zero_point: int, dtype) -> np.ndarray:
    """Round-half-even quantization in float64, saturated to ``dtype``."""
    info = np.iinfo(dtype)
    q = np.rint(np.asarray(w, dtype=np.float64) / scale) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


def matmul_constant_weight(seed: int = 0) -> tuple[onnx.ModelProto, onnx.ModelProto, dict]:
    """x[1,8] · W[8,4] with W a ``Constant`` node in both models; hand-built int8 QDQ."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((8, 4)) * 0.5).astype(np.float32)
    w_scale = float(np.abs(w).max() / 127.0)
    w_q = quantize_per_tensor(w, w_scale, 0, np.int8)
    fnodes = [constant_node("W", w), helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    f = _model(fnodes, [value_info("x", [1, 8])], [value_info("y", [1, 4])])
    qnodes = [
        constant_node("W_quantized", w_q),
        constant_node("W_scale", np.array(w_scale, np.float32)),
        constant_node("W_zero_point", np.array(0, np.int8)),
        helper.make_node(
            "DequantizeLinear",
            ["W_quantized", "W_scale", "W_zero_point"],
            ["W_DequantizeLinear_Output"],
            name="W_DQ",
        ),
        *qdq_pair("x", "x_scale", "x_zero_point"),
        helper.make_node("MatMul", ["x_DequantizeLinear_Output", "W_DequantizeLinear_Output"], ["y"], name="mm"),
    ]
    inits = [scalar("x_scale", 1.0 / 255.0, np.float32), scalar("x_zero_point", 0, np.uint8)]
    q = _model(qnodes, [value_info("x", [1, 8])], [value_info("y", [1, 4])], inits)
    return f, q, {"w": w, "w_q": w_q, "w_scale": w_scale}


def scalar_weight_mul(value: float = 0.7371, scale: float = 0.01, zero_point: int = 3) -> tuple:
    """x[1,8] * s with s a 0-d weight, quantized to a 0-d uint8 with a 0-d scale and zero point."""
    s_q = quantize_per_tensor(np.array(value), scale, zero_point, np.uint8).reshape(())
    f = _model(
        [helper.make_node("Mul", ["x", "s"], ["y"], name="mul")],
        [value_info("x", [1, 8])],
        [value_info("y", [1, 8])],
        [scalar("s", value, np.float32)],
    )
    qnodes = [
        helper.make_node("DequantizeLinear", ["s_quantized", "s_scale", "s_zero_point"], ["s_dq"], name="s_DQ"),
        *qdq_pair("x", "x_scale", "x_zero_point"),
        helper.make_node("Mul", ["x_DequantizeLinear_Output", "s_dq"], ["y"], name="mul"),
    ]
    inits = [
        numpy_helper.from_array(s_q, "s_quantized"),
        scalar("s_scale", scale, np.float32),
        scalar("s_zero_point", zero_point, np.uint8),
        scalar("x_scale", 1.0 / 255.0, np.float32),
        scalar("x_zero_point", 0, np.uint8),
    ]
    q = _model(qnodes, [value_info("x", [1, 8])], [value_info("y", [1, 8])], inits)
    return f, q, {"value": value, "s_q": s_q, "scale": scale, "zero_point": zero_point}


def per_channel_weights(seed: int = 0) -> tuple[onnx.ModelProto, onnx.ModelProto, dict]:
    """Gemm(W1[4,6], transB) → MatMul(W2[4,5]) → MatMul(W3[5,3]): three int8 per-channel weights.

    W1 is quantized along axis 0 (explicit, not the DequantizeLinear default), W2 along axis -1
    (explicit, negative) and W3 along axis 1 by omitting the attribute. In each, one channel gets a
    deliberately coarse scale so that the worst channel is known.
    """
    rng = np.random.default_rng(seed)
    ws = {
        "W1": (rng.standard_normal((4, 6)) * 0.5).astype(np.float32),
        "W2": (rng.standard_normal((4, 5)) * 0.5).astype(np.float32),
        "W3": (rng.standard_normal((5, 3)) * 0.5).astype(np.float32),
    }
    axes = {"W1": 0, "W2": -1, "W3": None}
    coarse = {"W1": 2, "W2": 4, "W3": 0}  # channel index with an 8× coarser scale
    info: dict = {"weights": ws, "axes": axes, "coarse": coarse, "quantized": {}, "scales": {}}
    qnodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    for name, w in ws.items():
        ax = (axes[name] if axes[name] is not None else 1) % w.ndim
        wm = np.moveaxis(w.astype(np.float64), ax, 0)
        scales = np.abs(wm.reshape(wm.shape[0], -1)).max(axis=1) / 127.0
        scales[coarse[name]] *= 8.0
        scales = scales.astype(np.float32)
        shape = [1] * w.ndim
        shape[ax] = -1
        qv = np.clip(np.rint(w / scales.astype(np.float64).reshape(shape)), -128, 127).astype(np.int8)
        info["quantized"][name], info["scales"][name] = qv, scales
        inits += [
            numpy_helper.from_array(qv, f"{name}_quantized"),
            numpy_helper.from_array(scales, f"{name}_scale"),
            numpy_helper.from_array(np.zeros(scales.size, np.int8), f"{name}_zero_point"),
        ]
        kw = {} if axes[name] is None else {"axis": axes[name]}
        qnodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"],
                [f"{name}_DequantizeLinear_Output"],
                name=f"{name}_DQ",
                **kw,
            )
        )
    fnodes = [
        helper.make_node("Gemm", ["x", "W1"], ["h1"], name="gemm", transB=1),
        helper.make_node("MatMul", ["h1", "W2"], ["h2"], name="mm2"),
        helper.make_node("MatMul", ["h2", "W3"], ["y"], name="mm3"),
    ]
    f = _model(
        fnodes,
        [value_info("x", [1, 6])],
        [value_info("y", [1, 3])],
        [numpy_helper.from_array(w, n) for n, w in ws.items()],
    )
    qnodes += [
        *qdq_pair("x", "act_scale", "act_zero_point"),
        helper.make_node(
            "Gemm", ["x_DequantizeLinear_Output", "W1_DequantizeLinear_Output"], ["h1"], name="gemm", transB=1
        ),
        *qdq_pair("h1", "act_scale", "act_zero_point"),
        helper.make_node("MatMul", ["h1_DequantizeLinear_Output", "W2_DequantizeLinear_Output"], ["h2"], name="mm2"),
        *qdq_pair("h2", "act_scale", "act_zero_point"),
        helper.make_node("MatMul", ["h2_DequantizeLinear_Output", "W3_DequantizeLinear_Output"], ["y"], name="mm3"),
    ]
    inits += [scalar("act_scale", 8.0 / 255.0, np.float32), scalar("act_zero_point", 0, np.int8)]
    q = _model(qnodes, [value_info("x", [1, 6])], [value_info("y", [1, 3])], inits)
    return f, q, info


def uint8_weight_with_zero_point(seed: int = 0) -> tuple[onnx.ModelProto, onnx.ModelProto, dict]:
    """x[1,8] · W[8,6], W asymmetric in [-0.3, 1.0], quantized to uint8 with a zero point of 59."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-0.3, 1.0, size=(8, 6)).astype(np.float32)
    scale = float((1.0 - -0.3) / 255.0)
    zp = round(0.3 / scale)
    w_q = quantize_per_tensor(w, scale, zp, np.uint8)
    f = _model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [value_info("x", [1, 8])], [value_info("y", [1, 6])], [numpy_helper.from_array(w, "W")],
    )  # fmt: skip
    qnodes = [
        helper.make_node("DequantizeLinear", ["W_quantized", "W_scale", "W_zero_point"], ["W_dq"], name="W_DQ"),
        *qdq_pair("x", "x_scale", "x_zero_point"),
        helper.make_node("MatMul", ["x_DequantizeLinear_Output", "W_dq"], ["y"], name="mm"),
    ]
    inits = [
        numpy_helper.from_array(w_q, "W_quantized"),
        scalar("W_scale", scale, np.float32),
        scalar("W_zero_point", zp, np.uint8),
        scalar("x_scale", 1.0 / 255.0, np.float32),
        scalar("x_zero_point", 0, np.uint8),
    ]
    q = _model(qnodes, [value_info("x", [1, 8])], [value_info("y", [1, 6])], inits)
    return f, q, {"w": w, "w_q": w_q, "scale": np.float32(scale), "zero_point": zp}


def matmul_div_unsqueeze(seed: int = 0) -> onnx.ModelProto:
    """x · W → m; graph outputs ``out_div = m / 2`` and ``out_unsq = Unsqueeze(m)`` (float model)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Div", ["m", "two"], ["out_div"], name="div"),
        helper.make_node("Unsqueeze", ["m", "axes"], ["out_unsq"], name="unsq"),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
        scalar("two", 2.0, np.float32),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
    ]
    return _model(
        nodes, [value_info("x", [1, 8])], [value_info("out_div", [1, 8]), value_info("out_unsq", [1, 1, 8])], inits
    )


def zero_tensors() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """All-zero tensors: ``zeros = x · 0`` (0 in both models), ``cz = ConstantOfShape(Shape(x))``,
    and ``diff = x − x`` which is 0 in the float model but ``DQ(Q(x)) − x`` ≠ 0 in the quantized one.
    """
    zeros = numpy_helper.from_array(np.zeros(8, np.float32), "Z")
    fnodes = [
        helper.make_node("Mul", ["x", "Z"], ["zeros"], name="mul0"),
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("ConstantOfShape", ["shp"], ["cz"], name="cos",
                         value=numpy_helper.from_array(np.zeros(1, np.float32), "v")),
        helper.make_node("Add", ["zeros", "cz"], ["zsum"], name="add0"),
        helper.make_node("Sub", ["x", "x"], ["diff"], name="sub"),
    ]  # fmt: skip
    outs = [value_info("zsum", [1, 8]), value_info("diff", [1, 8])]
    f = _model(fnodes, [value_info("x", [1, 8])], outs, [zeros])
    qnodes = [
        *qdq_pair("x", "x_scale", "x_zero_point"),
        helper.make_node("DequantizeLinear", ["Z_quantized", "Z_scale", "Z_zero_point"], ["Z_dq"], name="Z_DQ"),
        helper.make_node("Mul", ["x_DequantizeLinear_Output", "Z_dq"], ["zeros"], name="mul0"),
        *qdq_pair("zeros", "x_scale", "x_zero_point"),
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("ConstantOfShape", ["shp"], ["cz"], name="cos",
                         value=numpy_helper.from_array(np.zeros(1, np.float32), "v")),
        helper.make_node("Add", ["zeros_DequantizeLinear_Output", "cz"], ["zsum"], name="add0"),
        helper.make_node("Sub", ["x_DequantizeLinear_Output", "x"], ["diff"], name="sub"),
    ]  # fmt: skip
    inits = [
        scalar("x_scale", 1.0 / 255.0, np.float32),
        scalar("x_zero_point", 0, np.uint8),
        numpy_helper.from_array(np.zeros(8, np.int8), "Z_quantized"),
        scalar("Z_scale", 1.0, np.float32),
        scalar("Z_zero_point", 0, np.int8),
    ]
    q = _model(qnodes, [value_info("x", [1, 8])], outs, inits)
    return f, q


def exact_grid() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """x → Relu → r, with x quantized at scale 1: integer-valued inputs pass Q/DQ exactly."""
    f = _model(
        [helper.make_node("Relu", ["x"], ["r"], name="relu")], [value_info("x", [1, 8])], [value_info("r", [1, 8])]
    )
    qnodes = [*qdq_pair("x", "x_scale", "x_zero_point"),
              helper.make_node("Relu", ["x_DequantizeLinear_Output"], ["r"], name="relu")]  # fmt: skip
    inits = [scalar("x_scale", 1.0, np.float32), scalar("x_zero_point", 0, np.uint8)]
    q = _model(qnodes, [value_info("x", [1, 8])], [value_info("r", [1, 8])], inits)
    return f, q


def nonfinite_model() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``logx = Log(x)`` (NaN/−inf for x ≤ 0) and ``recip = 1/x`` (inf at 0, then quantized) → ``neg``."""
    one = scalar("one", 1.0, np.float32)
    fnodes = [
        helper.make_node("Log", ["x"], ["logx"], name="log"),
        helper.make_node("Div", ["one", "x"], ["recip"], name="div"),
        helper.make_node("Neg", ["recip"], ["neg"], name="neg"),
    ]
    outs = [value_info("logx", [1, 8]), value_info("neg", [1, 8])]
    f = _model(fnodes, [value_info("x", [1, 8])], outs, [one])
    qnodes = [
        *qdq_pair("x", "x_scale", "x_zero_point"),
        helper.make_node("Log", ["x_DequantizeLinear_Output"], ["logx"], name="log"),
        helper.make_node("Div", ["one", "x_DequantizeLinear_Output"], ["recip"], name="div"),
        *qdq_pair("recip", "r_scale", "r_zero_point"),
        helper.make_node("Neg", ["recip_DequantizeLinear_Output"], ["neg"], name="neg"),
    ]
    inits = [
        one,
        scalar("x_scale", 2.0 / 255.0, np.float32),
        scalar("x_zero_point", 0, np.int8),
        scalar("r_scale", 0.1, np.float32),
        scalar("r_zero_point", 0, np.int8),
    ]
    q = _model(qnodes, [value_info("x", [1, 8])], outs, inits)
    return f, q


def max_with_neg_inf(seed: int = 0) -> onnx.ModelProto:
    """x · W → Max(·, −inf constant) → · W2 (the −inf feeding a Max of the ORT recipe's failure 4)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Max", ["m", "ninf"], ["mx"], name="max"),
        helper.make_node("MatMul", ["mx", "W2"], ["y"], name="mm2"),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
        numpy_helper.from_array(np.full((1, 8), -np.inf, np.float32), "ninf"),
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W2"),
    ]
    return _model(nodes, [value_info("x", [1, 8])], [value_info("y", [1, 8])], inits)


def conv_clip(seed: int = 0) -> onnx.ModelProto:
    """Conv → Clip(0, 1) → Conv: ORT removes the Clip and lets the Q saturate instead."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["r"], name="clip"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w"),
        scalar("lo", 0.0, np.float32),
        scalar("hi", 1.0, np.float32),
        numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32), "w2"),
    ]
    return _model(nodes, [value_info("x", [1, 1, 6, 6])], [value_info("y", [1, 2, 6, 6])], inits)


def other_convnet(seed: int = 1) -> onnx.ModelProto:
    """Same input as :func:`tiny_convnet` but a different graph and a 5-way output ``y``."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["k1"], name="convk"),
        helper.make_node("GlobalAveragePool", ["k1"], ["kg"], name="gapk"),
        helper.make_node("Flatten", ["kg"], ["kf"], name="flatk"),
        helper.make_node("Gemm", ["kf", "kw"], ["y"], name="gemmk", transB=1),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3)).astype(np.float32), "k"),
        numpy_helper.from_array(rng.standard_normal((5, 2)).astype(np.float32), "kw"),
    ]
    return _model(nodes, [value_info("x", [1, 1, 6, 6])], [value_info("y", [1, 5])], inits)


def big_activations(channels: int = 4, side: int = 256) -> onnx.ModelProto:
    """x[1,C,S,S] → Mul → Add → Relu: with C=4, S=256 each tensor is 1 MiB (≈4 MiB per sample)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "b"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, channels, 1, 1)).astype(np.float32), "a"),
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, (1, channels, 1, 1)).astype(np.float32), "b"),
    ]
    shape = [1, channels, side, side]
    return _model(nodes, [value_info("x", shape)], [value_info("y", shape)], inits)


def elementwise_chain(ops: int = 32, elements: int = 1 << 20) -> onnx.ModelProto:
    """x[1,E] → (Mul, Add) × ops/2 → y: ``ops`` activations of ``4·E`` bytes each, and a skip connection from the
    first Mul to the last Add (a tensor that crosses every cut when the chain is segmented)."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(ops):
        op = "Mul" if i % 2 == 0 else "Add"
        c = rng.uniform(0.9, 1.1) if op == "Mul" else rng.uniform(-0.1, 0.1)
        inits.append(numpy_helper.from_array(np.full((1, 1), c, np.float32), f"c{i}"))
        nodes.append(helper.make_node(op, [prev, f"c{i}"], [f"t{i}"], name=f"op{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Add", [prev, "t0"], ["y"], name="skip"))
    shape = [1, elements]
    return _model(nodes, [value_info("x", shape)], [value_info("y", shape)], inits)


def neg_inf_weight() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Max(x, W) with W = −inf, stored as int8 −1 with an infinite scale: −inf on both sides."""
    f = _model(
        [helper.make_node("Max", ["x", "ninf"], ["y"], name="max")],
        [value_info("x", [1, 8])],
        [value_info("y", [1, 8])],
        [numpy_helper.from_array(np.full((1, 8), -np.inf, np.float32), "ninf")],
    )
    qnodes = [
        helper.make_node(
            "DequantizeLinear", ["ninf_quantized", "ninf_scale", "ninf_zero_point"], ["ninf_dq"], name="ninf_DQ"
        ),
        *qdq_pair("x", "x_scale", "x_zero_point"),
        helper.make_node("Max", ["x_DequantizeLinear_Output", "ninf_dq"], ["y"], name="max"),
    ]
    inits = [
        numpy_helper.from_array(np.full((1, 8), -1, np.int8), "ninf_quantized"),
        scalar("ninf_scale", np.inf, np.float32),
        scalar("ninf_zero_point", 0, np.int8),
        scalar("x_scale", 1.0 / 255.0, np.float32),
        scalar("x_zero_point", 0, np.uint8),
    ]
    q = _model(qnodes, [value_info("x", [1, 8])], [value_info("y", [1, 8])], inits)
    return f, q


def opset12_attention(seed: int = 0) -> onnx.ModelProto:
    """Opset-12 scores → Softmax(axis=1) → MatMul: raising it to opset 21 (16-bit Q/DQ) makes ONNX's version
    converter wrap the Softmax in Flatten/Reshape around a new ``<name>_intermediate`` tensor (Softmax-13 changed the
    meaning of ``axis``), which a calibration at opset 12 never saw — as on paddle2onnx's models, whose Softmax
    inputs have no static rank."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["scores"], name="scores_mm"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=1),
        helper.make_node("MatMul", ["probs", "Wv"], ["y"], name="out_mm"),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "Wq"),
        numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "Wv"),
    ]
    return _model(nodes, [value_info("x", [1, 3, 8])], [value_info("y", [1, 3, 4])], inits, opset=12)


def dead_channel_conv(seed: int = 0) -> onnx.ModelProto:
    """Depthwise 3×3 conv over 2 channels: channel 0 has weights ~1000 but its input is always 0 (a dead channel),
    channel 1 ordinary weights ~1. Per-tensor weights round channel 1's to 0 (the output is lost: 0 dB);
    per-channel weights keep it (the failure of u2netp and Silero VAD with per-tensor weights)."""
    rng = np.random.default_rng(seed)
    w = np.empty((2, 1, 3, 3), np.float32)
    w[0] = 1000.0 * rng.uniform(-1, 1, (1, 3, 3))
    w[1] = rng.uniform(0.2, 1.0, (1, 3, 3))
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], name="dw", group=2, pads=[1, 1, 1, 1])]
    inits = [numpy_helper.from_array(w, "W")]
    return _model(nodes, [value_info("x", [1, 2, 8, 8])], [value_info("y", [1, 2, 8, 8])], inits)


def scoped_residual_mlp(blocks: int = 60, width: int = 8, seed: int = 0, sigmoid_every: int = 0) -> onnx.ModelProto:
    """A float residual MLP named like a PyTorch export: block ``k`` is ``/model.k/fc1/MatMul`` → ``/fc1/Add``
    (bias) → ``/act/Tanh`` → ``/fc2/MatMul`` → ``/model.k/Add`` (residual), 5 tensors per block (60 blocks: 300
    tensors + the input), input ``x`` [1, width]. For the graph view's grouping and the ≥ 300-tensor UI tests.

    Every block is the same (the graph view merges them into one ×N group) unless ``sigmoid_every`` is set: then
    every ``sigmoid_every``-th block (k % sigmoid_every == sigmoid_every - 1) uses ``/act/Sigmoid``, which breaks the
    runs (Sigmoid, unlike Relu, is not fused into the Add before it, so the report keeps every tensor)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    h = "x"
    for k in range(blocks):
        p = f"/model.{k}"
        for j in (1, 2):
            w = (rng.standard_normal((width, width)) * 0.4).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"model.{k}.fc{j}.weight"))
        inits.append(numpy_helper.from_array((rng.standard_normal(width) * 0.05).astype(np.float32), f"model.{k}.b"))
        act = "Sigmoid" if sigmoid_every and k % sigmoid_every == sigmoid_every - 1 else "Tanh"
        t = {n: f"{p}/{n}_output_0" for n in ("fc1/MatMul", "fc1/Add", f"act/{act}", "fc2/MatMul", "Add")}
        w1, w2, b = f"model.{k}.fc1.weight", f"model.{k}.fc2.weight", f"model.{k}.b"
        nodes += [
            helper.make_node("MatMul", [h, w1], [t["fc1/MatMul"]], name=f"{p}/fc1/MatMul"),
            helper.make_node("Add", [t["fc1/MatMul"], b], [t["fc1/Add"]], name=f"{p}/fc1/Add"),
            helper.make_node(act, [t["fc1/Add"]], [t[f"act/{act}"]], name=f"{p}/act/{act}"),
            helper.make_node("MatMul", [t[f"act/{act}"], w2], [t["fc2/MatMul"]], name=f"{p}/fc2/MatMul"),
            helper.make_node("Add", [t["fc2/MatMul"], h], [t["Add"]], name=f"{p}/Add"),
        ]
        h = f"{p}/Add_output_0"
    return _model(nodes, [value_info("x", [1, width])], [value_info(h, [1, width])], inits)


def host_device_host(seed: int = 0) -> onnx.ModelProto:
    """A model in three parts, as MiniLM for an MCU: an int64 lookup (host) → a float MLP with an additive bias
    input (device) → an Unsqueeze (host). ``ids`` [1, 4] int64 → ``Gather(table)`` → ``h`` [1, 4, 8];
    ``bias`` = ``Cast(mask)·(−1)`` [1, 4, 1]; ``Add(MatMul(h, W1), bias)`` → Relu → ``MatMul(·, W2)`` → ``y``;
    ``Unsqueeze(y)`` → ``z`` (graph output). The device region: inputs ``h``, ``bias``; output ``y``."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["h"], name="lookup"),
        helper.make_node("Cast", ["mask"], ["maskf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["maskf", "minus"], ["bias"], name="bias"),
        helper.make_node("MatMul", ["h", "W1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "bias"], ["a1"], name="add"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "W2"], ["y"], name="mm2"),
        helper.make_node("Unsqueeze", ["y", "axes"], ["z"], name="unsq"),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "table"),
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.5, "W1"),
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.5, "W2"),
        scalar("minus", -1.0, np.float32),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
    ]
    inputs = [value_info("ids", [1, 4], TensorProto.INT64), value_info("mask", [1, 4, 1], TensorProto.INT64)]
    return _model(nodes, inputs, [value_info("z", [1, 1, 4, 8])], inits)


def constant_branch(seed: int = 0, features: int = 256, hidden: int = 8, steps: int = 16) -> onnx.ModelProto:
    """A model that computes part of itself from constants alone (like Silero VAD's STFT basis): ``wc = W0 * k``
    (``k`` a ``Constant`` node) and its transpose feed a MatMul, ``W * k`` an LSTM's weights (both kernels
    pre-pack a constant weight, which changes their sums from these sizes on), ``b = B0 + B1`` a bias; a second
    MatMul reads a ``Constant`` node's matrix (a constant weight to ONNX Runtime); the rest depends on the input
    ``x [1, steps, features]``."""
    rng = np.random.default_rng(seed)
    f, h = features, hidden
    w0 = numpy_helper.from_array((rng.standard_normal((f, f)) * f**-0.5).astype(np.float32), "W0")
    b0 = numpy_helper.from_array((rng.standard_normal(f) * 0.1).astype(np.float32), "B0")
    b1 = numpy_helper.from_array((rng.standard_normal(f) * 0.1).astype(np.float32), "B1")
    r = numpy_helper.from_array((rng.standard_normal((1, 4 * h, h)) * 0.3).astype(np.float32), "R")
    w = numpy_helper.from_array((rng.standard_normal((1, 4 * h, f)) * f**-0.5).astype(np.float32), "W")
    shape = numpy_helper.from_array(np.array([1, 4 * h, f], np.int64), "lstm_w_shape")
    nodes = [
        constant_node("k", np.array(1.5, np.float32)),
        helper.make_node("Mul", ["W0", "k"], ["wc"], name="scale_w"),
        helper.make_node("Transpose", ["wc"], ["wct"], name="transpose_w"),
        helper.make_node("Add", ["B0", "B1"], ["b"], name="bias"),
        helper.make_node("MatMul", ["x", "wct"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add_bias"),
        helper.make_node("Relu", ["hb"], ["hr"], name="relu"),
        constant_node("wk", (rng.standard_normal((f, f)) * f**-0.5).astype(np.float32)),
        helper.make_node("MatMul", ["hr", "wk"], ["h2"], name="mm_constant_node"),
        helper.make_node("Transpose", ["h2"], ["seq"], name="to_seq", perm=[1, 0, 2]),
        helper.make_node("Mul", ["W", "k"], ["w_raw"], name="scale_lstm_w"),
        helper.make_node("Reshape", ["w_raw", "lstm_w_shape"], ["lstm_w"], name="lstm_w"),
        helper.make_node("LSTM", ["seq", "lstm_w", "R"], ["y"], name="lstm", hidden_size=h),
    ]
    x = value_info("x", [1, steps, f])
    y = value_info("y", [steps, 1, 1, h])
    return _model(nodes, [x], [y], [w0, b0, b1, r, w, shape])
