"""Deterministic synthetic ResNet-style conv net built with ``onnx.helper`` (no torch).

The network is untrained (He-initialised random weights) and exists to give
qdebug a larger, realistic-shaped graph for performance and robustness tests::

    input [1,3,64,64]
    conv1   3->32  3x3 s1 + Relu            @64x64
    conv2  32->32  3x3 s2 + Relu            @32x32
    conv3  32->32  3x3    + Relu            @32x32
    conv4  32->32  3x3                      @32x32
    add1   conv2 + conv4, Relu              (residual)
    conv5  32->64  3x3    + Relu            @32x32
    pool1  MaxPool 2x2 s2                   @16x16
    conv6  64->64  3x3    + Relu            @16x16
    conv7  64->64  3x3                      @16x16
    add2   pool1 + conv7, Relu              (residual)
    GlobalAveragePool -> Flatten -> Gemm(64->10) -> logits [1,10]

Compute: :data:`SYNTHETIC_FLOPS` = 139,199,744 FLOPs (2 x 69,599,872 MACs,
Conv and Gemm only; see :func:`count_flops`).

Usage::

    python sample_models/synthetic_convnet.py [OUT.onnx] [--seed N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
INPUT_SHAPE = (1, 3, 64, 64)
NUM_CLASSES = 10
#: FLOPs (2 x multiply-accumulates of Conv/Gemm) of the default architecture.
SYNTHETIC_FLOPS = 139_199_744

# name -> (in_channels, out_channels, stride, relu)
_CONVS: dict[str, tuple[int, int, int, bool]] = {
    "conv1": (3, 32, 1, True),
    "conv2": (32, 32, 2, True),
    "conv3": (32, 32, 1, True),
    "conv4": (32, 32, 1, False),
    "conv5": (32, 64, 1, True),
    "conv6": (64, 64, 1, True),
    "conv7": (64, 64, 1, False),
}


class _Builder:
    """Accumulates nodes and initializers for a single-graph model."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def _init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(self, name: str, x: str) -> str:
        """3x3 Conv (pad 1) configured by ``_CONVS[name]``; He-normal weights, small biases."""
        cin, cout, stride, relu = _CONVS[name]
        std = np.sqrt(2.0 / (cin * 9))
        w = self._init(f"{name}.weight", self.rng.normal(0.0, std, (cout, cin, 3, 3)))
        b = self._init(f"{name}.bias", self.rng.normal(0.0, 0.01, (cout,)))
        out = f"{name}_out"
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, w, b],
                [out],
                name=name,
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        return self.relu(f"{name}_relu", out) if relu else out

    def relu(self, name: str, x: str) -> str:
        """Relu node."""
        self.nodes.append(helper.make_node("Relu", [x], [f"{name}_out"], name=name))
        return f"{name}_out"

    def op(self, op_type: str, name: str, inputs: list[str], **attrs: Any) -> str:
        """Generic single-output node."""
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    def gemm(self, name: str, x: str, fin: int, fout: int) -> str:
        """Fully connected layer as Gemm with a [out, in] weight (transB=1, like PyTorch)."""
        std = np.sqrt(2.0 / fin)
        w = self._init(f"{name}.weight", self.rng.normal(0.0, std, (fout, fin)))
        b = self._init(f"{name}.bias", self.rng.normal(0.0, 0.01, (fout,)))
        self.nodes.append(helper.make_node("Gemm", [x, w, b], [OUTPUT_NAME], name=name, transB=1))
        return OUTPUT_NAME


def build_synthetic_convnet(seed: int = 0) -> onnx.ModelProto:
    """Build the synthetic conv net with weights drawn from ``np.random.default_rng(seed)``.

    The result is checked with ``onnx.checker`` (full check), carries inferred
    static ``value_info`` for every intermediate tensor, and is byte-identical
    for the same ``seed``.
    """
    b = _Builder(np.random.default_rng(seed))
    x = b.conv("conv1", INPUT_NAME)
    skip = b.conv("conv2", x)
    x = b.conv("conv3", skip)
    x = b.conv("conv4", x)
    x = b.relu("relu_add1", b.op("Add", "add1", [skip, x]))
    x = b.conv("conv5", x)
    skip = b.op("MaxPool", "pool1", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.conv("conv6", skip)
    x = b.conv("conv7", x)
    x = b.relu("relu_add2", b.op("Add", "add2", [skip, x]))
    x = b.op("GlobalAveragePool", "gap", [x])
    x = b.op("Flatten", "flatten", [x], axis=1)
    b.gemm("fc", x, 64, NUM_CLASSES)

    graph = helper.make_graph(
        b.nodes,
        "synthetic_convnet",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, NUM_CLASSES])],
        initializer=b.inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="qdebug-synthetic",
        ir_version=IR_VERSION,
    )
    model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Map every typed tensor (inputs, outputs, value_info, initializers) to its static shape."""
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return shapes


def count_flops(model: onnx.ModelProto) -> int:
    """Return 2 x multiply-accumulates of all Conv, Gemm and MatMul nodes.

    Needs static shapes (run shape inference first); element-wise ops, pooling
    and activations are not counted.
    """
    shapes = _static_shapes(onnx.shape_inference.infer_shapes(model))
    macs = 0
    for node in model.graph.node:
        if node.op_type == "Conv":
            out = shapes[node.output[0]]
            w = shapes[node.input[1]]  # [Cout, Cin/group, kh, kw]
            macs += int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type == "Gemm":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            a_shape = shapes[node.input[0]]
            k = a_shape[0] if attrs.get("transA", 0) else a_shape[1]
            macs += int(np.prod(shapes[node.output[0]])) * k
        elif node.op_type == "MatMul":
            k = shapes[node.input[0]][-1]
            macs += int(np.prod(shapes[node.output[0]])) * k
    return 2 * macs


def make_inputs(num: int = 16, seed: int = 0) -> np.ndarray:
    """Uniform [0, 1) float32 inputs of shape ``(num, 1, 3, 64, 64)`` for calibration/tests."""
    rng = np.random.default_rng(seed)
    return rng.random((num, *INPUT_SHAPE), dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    """CLI: build the model, save it and print its FLOP count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="synthetic_convnet.onnx", help="output .onnx path")
    parser.add_argument("--seed", type=int, default=0, help="weight RNG seed")
    args = parser.parse_args(argv)
    model = build_synthetic_convnet(args.seed)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    flops = count_flops(model)
    print(f"saved {path} ({path.stat().st_size} bytes), {flops:,} FLOPs ({flops / 1e6:.1f} MFLOPs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
