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
