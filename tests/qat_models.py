"""Purpose-built QAT-style models for the ``qdebug.qat`` tests (numpy + onnx.helper + ORT for ranges).

The conv model is Conv → Relu → Conv → Flatten → Gemm with activation fake-quant points on ``x``,
``r1`` (after the Relu), ``c2`` and the output ``y``, int8 per-tensor weights and int32 biases with
scale = s_in·s_w. It is spelled in three styles with the same scales:

- ``qcdq``: decomposed float arithmetic (Div/Add/Round/Clip[/Cast] then [Cast]/Sub/Mul; weights
  Div/Round/Clip/Mul or Mul(1/s)/Round/Clip/Mul on constants),
- ``msft``: ``com.microsoft`` QuantizeLinear/DequantizeLinear with integer weight initializers,
- ``fakequant``: OpenVINO ``FakeQuantize`` with stored min/max for activations and weights.

Run as a script to write them to a folder: ``python tests/qat_models.py OUT_DIR``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
ACT_POINTS = ("x", "r1", "c2", "y")
INPUT_SHAPE = (1, 1, 8, 8)
I8 = np.iinfo(np.int8)


def _model(nodes, inputs, outputs, inits=(), opset: int = OPSET, domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    ops = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in domains]]
    m = helper.make_model(graph, opset_imports=ops)
    m.ir_version = 9
    return m


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((4, 1, 3, 3)) * 0.5).astype(np.float32),
        "b1": (rng.standard_normal(4) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32),
        "b2": (rng.standard_normal(4) * 0.1).astype(np.float32),
        "wg": (rng.standard_normal((3, 256)) * 0.1).astype(np.float32),
        "bg": (rng.standard_normal(3) * 0.1).astype(np.float32),
    }


def float_parent(seed: int = 0) -> onnx.ModelProto:
    """The float model: Conv → Relu → Conv → Flatten → Gemm, no fake quantization."""
    w = _weights(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["c2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="gemm", transB=1),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(INPUT_SHAPE))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    return _model(nodes, [x], [y], inits)


@dataclass(frozen=True)
class QParams:
    """Per-tensor int8 parameters of one fake-quant point."""

    scale: float
    zero_point: int


def calibrate(seed: int = 0, samples: int = 4) -> dict[str, QParams]:
    """int8 parameters from the float model's activation ranges on a few uniform [0, 1) inputs."""
    import onnxruntime as ort

    m = float_parent(seed)
    for t in ACT_POINTS[1:-1]:
        m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1234)
    lo = dict.fromkeys(ACT_POINTS, 0.0)  # ranges include 0 so zero is exactly representable
    hi = dict.fromkeys(ACT_POINTS, 0.0)
    names = [o.name for o in sess.get_outputs()]
    for _ in range(samples):
        x = rng.random(INPUT_SHAPE, dtype=np.float32)
        vals = dict(zip(names, sess.run(None, {"x": x}), strict=True)) | {"x": x}
        for t in ACT_POINTS:
            lo[t], hi[t] = min(lo[t], float(vals[t].min())), max(hi[t], float(vals[t].max()))
    out: dict[str, QParams] = {}
    for t in ACT_POINTS:
        if lo[t] >= 0:  # one-sided (input, after Relu): use the whole int8 range, zp = -128 (even: see docs)
            out[t] = QParams(float(np.float32(hi[t] / 255.0)), -128)
        else:  # symmetric
            out[t] = QParams(float(np.float32(max(-lo[t], hi[t]) / 127.0)), 0)
    w = _weights(seed)
    for k in ("w1", "w2", "wg"):
        out[k] = QParams(float(np.float32(np.abs(w[k]).max() / 127.0)), 0)
    for b, (xin, wk) in {"b1": ("x", "w1"), "b2": ("r1", "w2"), "bg": ("c2", "wg")}.items():
        out[b] = QParams(float(np.float32(out[xin].scale) * np.float32(out[wk].scale)), 0)
    return out


def _f32(name: str, v: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, dtype=np.float32), name)


class _Builder:
    def __init__(self, style: str, params: dict[str, QParams], weights: dict[str, np.ndarray]) -> None:
        self.style, self.p, self.w = style, params, weights
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def act(self, t: str, out: str, variant: int = 0) -> None:
        """Fake-quantize activation ``t`` into ``out``."""
        p = self.p[t]
        if self.style == "qcdq":
            self._qcdq_act(t, out, p, variant)
        elif self.style == "msft":
            self.inits += [_f32(f"{t}_s", p.scale), numpy_helper.from_array(np.array(p.zero_point, np.int8), f"{t}_z")]
            self.nodes += [
                helper.make_node("QuantizeLinear", [t, f"{t}_s", f"{t}_z"], [f"{t}_q"], f"{t}_Q",
                                 domain="com.microsoft"),
                helper.make_node("DequantizeLinear", [f"{t}_q", f"{t}_s", f"{t}_z"], [out], f"{t}_DQ",
                                 domain="com.microsoft"),
            ]  # fmt: skip
        else:
            self._fakequant(t, out, p)

    def _qcdq_act(self, t: str, out: str, p: QParams, variant: int) -> None:
        n, i = self.nodes, self.inits
        i.append(_f32(f"{t}_s", p.scale))
        if p.zero_point:
            i.append(_f32(f"{t}_z", float(p.zero_point)))
        i += [_f32(f"{t}_lo", float(I8.min)), _f32(f"{t}_hi", float(I8.max))]
        n.append(helper.make_node("Div", [t, f"{t}_s"], [f"{t}_div"], f"{t}_div"))
        if p.zero_point:
            n.append(helper.make_node("Add", [f"{t}_div", f"{t}_z"], [f"{t}_add"], f"{t}_add"))
        n.append(helper.make_node("Round", [n[-1].output[0]], [f"{t}_round"], f"{t}_round"))
        n.append(helper.make_node("Clip", [f"{t}_round", f"{t}_lo", f"{t}_hi"], [f"{t}_clip"], f"{t}_clip"))
        last = f"{t}_clip"
        if variant == 1:  # Cast → int8 → Cast back, as Brevitas' QCDQ export does
            n.append(helper.make_node("Cast", [last], [f"{t}_i8"], f"{t}_cast_i8", to=TensorProto.INT8))
            n.append(helper.make_node("Cast", [f"{t}_i8"], [f"{t}_cf"], f"{t}_cast_f", to=TensorProto.FLOAT))
            last = f"{t}_cf"
        if p.zero_point:
            n.append(helper.make_node("Sub", [last, f"{t}_z"], [f"{t}_sub"], f"{t}_sub"))
            last = f"{t}_sub"
        n.append(helper.make_node("Mul", [last, f"{t}_s"], [out], f"{t}_mul"))

    def _fakequant(self, t: str, out: str, p: QParams) -> None:
        lo = np.float32((I8.min - p.zero_point) * np.float32(p.scale))
        hi = np.float32((I8.max - p.zero_point) * np.float32(p.scale))
        self.inits += [_f32(f"{t}_lo", float(lo)), _f32(f"{t}_hi", float(hi))]
        self.nodes.append(
            helper.make_node(
                "FakeQuantize", [t, f"{t}_lo", f"{t}_hi", f"{t}_lo", f"{t}_hi"], [out], f"{t}_fq",
                domain="org.openvinotoolkit", levels=256,
            )
        )  # fmt: skip

    def weight(self, k: str, variant: int = 0) -> str:
        """Fake-quantized weight ``k``; returns the tensor the consumer reads."""
        p, w = self.p[k], self.w[k]
        self.inits.append(numpy_helper.from_array(w, k))
        if self.style == "fakequant":
            self._fakequant(k, f"{k}_fq", p)
            return f"{k}_fq"
        q = np.clip(np.rint(w / np.float32(p.scale)), I8.min, I8.max).astype(np.int8)
        if self.style == "msft":
            self.inits[-1] = numpy_helper.from_array(q, f"{k}_quantized")
            self.inits += [_f32(f"{k}_s", p.scale), numpy_helper.from_array(np.array(0, np.int8), f"{k}_z")]
            self.nodes.append(helper.make_node("DequantizeLinear", [f"{k}_quantized", f"{k}_s", f"{k}_z"], [f"{k}_dq"],
                                               f"{k}_DQ", domain="com.microsoft"))  # fmt: skip
            return f"{k}_dq"
        n = self.nodes
        self.inits += [_f32(f"{k}_s", p.scale), _f32(f"{k}_lo", float(I8.min)), _f32(f"{k}_hi", float(I8.max))]
        if variant == 1:  # multiply by the reciprocal instead of dividing
            self.inits.append(_f32(f"{k}_inv", float(np.float32(1.0) / np.float32(p.scale))))
            n.append(helper.make_node("Mul", [k, f"{k}_inv"], [f"{k}_div"], f"{k}_div"))
        else:
            n.append(helper.make_node("Div", [k, f"{k}_s"], [f"{k}_div"], f"{k}_div"))
        n.append(helper.make_node("Round", [f"{k}_div"], [f"{k}_round"], f"{k}_round"))
        n.append(helper.make_node("Clip", [f"{k}_round", f"{k}_lo", f"{k}_hi"], [f"{k}_clip"], f"{k}_clip"))
        n.append(helper.make_node("Mul", [f"{k}_clip", f"{k}_s"], [f"{k}_fq"], f"{k}_mul"))
        return f"{k}_fq"

    def bias(self, k: str) -> str:
        """int32 bias with scale s_in·s_w (what integer targets need)."""
        p, b = self.p[k], self.w[k]
        if self.style != "qcdq":
            q = np.rint(b / np.float32(p.scale)).astype(np.int32)
            dom = "com.microsoft" if self.style == "msft" else ""
            self.inits += [numpy_helper.from_array(q, f"{k}_quantized"), _f32(f"{k}_s", p.scale),
                           numpy_helper.from_array(np.array(0, np.int32), f"{k}_z")]  # fmt: skip
            self.nodes.append(helper.make_node("DequantizeLinear", [f"{k}_quantized", f"{k}_s", f"{k}_z"], [f"{k}_dq"],
                                               f"{k}_DQ", domain=dom))  # fmt: skip
            return f"{k}_dq"
        self.inits += [numpy_helper.from_array(b, k), _f32(f"{k}_s", p.scale)]
        self.inits += [_f32(f"{k}_lo", -(2.0**31)), _f32(f"{k}_hi", 2.0**31 - 1)]
        self.nodes += [
            helper.make_node("Div", [k, f"{k}_s"], [f"{k}_div"], f"{k}_div"),
            helper.make_node("Round", [f"{k}_div"], [f"{k}_round"], f"{k}_round"),
            helper.make_node("Clip", [f"{k}_round", f"{k}_lo", f"{k}_hi"], [f"{k}_clip"], f"{k}_clip"),
            helper.make_node("Mul", [f"{k}_clip", f"{k}_s"], [f"{k}_fq"], f"{k}_mul"),
        ]
        return f"{k}_fq"


def qat_convnet(style: str = "qcdq", seed: int = 0) -> onnx.ModelProto:
    """The fake-quantized conv model in ``style`` ('qcdq', 'msft' or 'fakequant'); see the module doc."""
    if style not in ("qcdq", "msft", "fakequant"):
        raise ValueError(f"unknown style {style!r}")
    b = _Builder(style, calibrate(seed), _weights(seed))
    b.act("x", "x_fq", variant=1)
    w1, b1 = b.weight("w1"), b.bias("b1")
    b.nodes += [
        helper.make_node("Conv", ["x_fq", w1, b1], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
    ]
    b.act("r1", "r1_fq")
    w2, b2 = b.weight("w2", variant=1), b.bias("b2")
    b.nodes.append(helper.make_node("Conv", ["r1_fq", w2, b2], ["c2"], name="conv2", pads=[1, 1, 1, 1]))
    b.act("c2", "c2_fq", variant=1)
    wg, bg = b.weight("wg"), b.bias("bg")
    b.nodes += [
        helper.make_node("Flatten", ["c2_fq"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", wg, bg], ["y_float"], name="gemm", transB=1),
    ]
    # The output's fake quant keeps the float model's output name on its last node.
    b.p["y_float"] = b.p["y"]
    b.act("y_float", "y")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(INPUT_SHAPE))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    domains = {"msft": ("com.microsoft",), "fakequant": ("org.openvinotoolkit",)}.get(style, ())
    return _model(b.nodes, [x], [y], b.inits, domains=domains)


def redundant_dq_q() -> onnx.ModelProto:
    """x → Q → DQ → Q(same) → DQ → Relu → Q → DQ → Q(other scale) → DQ → y: one redundant pair."""
    z = numpy_helper.from_array(np.array(0, np.int8), "z")
    inits = [_f32("s", 0.02), _f32("s2", 0.05), z]

    def q(i: str, o: str, s: str) -> onnx.NodeProto:
        return helper.make_node("QuantizeLinear", [i, s, "z"], [o], f"Q_{o}")

    def dq(i: str, o: str, s: str) -> onnx.NodeProto:
        return helper.make_node("DequantizeLinear", [i, s, "z"], [o], f"DQ_{o}")

    nodes = [
        q("x", "xq", "s"), dq("xq", "xd", "s"), q("xd", "xq2", "s"), dq("xq2", "xd2", "s"),
        helper.make_node("Relu", ["xd2"], ["r"], "relu"),
        q("r", "rq", "s"), dq("rq", "rd", "s"), q("rd", "rq2", "s2"), dq("rq2", "y", "s2"),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])
    return _model(nodes, [x], [y], inits)


def training_leftovers() -> onnx.ModelProto:
    """Identity chain, Dropout, an orphan node, an unused initializer and an initializer listed as input."""
    inits = [_f32("k", 1.5), _f32("unused", 3.0), _f32("shadow", 0.0)]
    nodes = [
        helper.make_node("Identity", ["x"], ["i1"], "id1"),
        helper.make_node("Identity", ["i1"], ["i2"], "id2"),
        helper.make_node("Relu", ["i2"], ["r"], "relu"),
        helper.make_node("Dropout", ["r"], ["d"], "dropout"),
        helper.make_node("Neg", ["r"], ["orphan"], "orphan_neg"),
        helper.make_node("Abs", ["orphan"], ["orphan2"], "orphan_abs"),
        helper.make_node("Mul", ["d", "k"], ["m"], "mul"),
        helper.make_node("Identity", ["m"], ["y"], "id_out"),  # produces a graph output: stays
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    shadow = helper.make_tensor_value_info("shadow", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    return _model(nodes, [x, shadow], [y], inits)


def main(argv: list[str]) -> int:
    """Write every model to ``argv[0]`` (default ``qat_models``)."""
    out = Path(argv[0] if argv else "qat_models")
    out.mkdir(parents=True, exist_ok=True)
    models = {
        "float_parent": float_parent(),
        "qat_qcdq": qat_convnet("qcdq"),
        "qat_msft": qat_convnet("msft"),
        "qat_fakequant": qat_convnet("fakequant"),
        "redundant_dq_q": redundant_dq_q(),
        "training_leftovers": training_leftovers(),
    }
    for name, m in models.items():
        onnx.save(m, str(out / f"{name}.onnx"))
        print(out / f"{name}.onnx")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
