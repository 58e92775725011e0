"""Tensor lists shaped like real architectures, for the graph grouping tests: names, ``(input, tensor)`` edges,
producer ops and element counts in topological order, as a debug report gives them (no ONNX model needed: the
grouping reads only these)."""

from __future__ import annotations

Shapes = tuple[list[str], list[tuple[str, str]], dict[str, str], dict[str, int]]


class _Graph:
    def __init__(self, scoped: bool) -> None:
        self.scoped = scoped
        self.names: list[str] = []
        self.edges: list[tuple[str, str]] = []
        self.ops: dict[str, str] = {}
        self.sizes: dict[str, int] = {}

    def add(self, scope: str, op: str, inputs: tuple[str, ...], size: int) -> str:
        """One tensor: ``/scope/Op_output_0`` when scoped, else a legacy exporter's ``onnx::Op_N`` / ``N``."""
        n = len(self.names)
        if self.scoped:
            name = f"/{scope}/{op}_output_0" if scope else f"/{op}_{n}_output_0"
            while name in self.ops:  # a second Concat in the same scope: Concat_1, as torch names it
                name = name.replace("_output_0", "_1_output_0")
        else:
            name = f"onnx::{op}_{300 + n}" if n % 3 else str(300 + n)
        self.names.append(name)
        self.ops[name] = op
        self.sizes[name] = size
        self.edges += [(i, name) for i in inputs]
        return name

    def shapes(self) -> Shapes:
        return self.names, self.edges, self.ops, self.sizes


def resnet50(scoped: bool = True, fused_relu: bool = True) -> Shapes:
    """ResNet-50 as torch exports it: ``/layer2/layer2.1/conv2/Conv_output_0`` (scoped) or ``onnx::Conv_412``
    (legacy, no scope); with ``fused_relu`` a Conv followed by a Relu is not a tensor of its own (ORT's QDQ)."""
    g = _Graph(scoped)
    x = g.add("", "input", (), 3 * 224 * 224)
    g.names[0] = "input"
    g.ops = {"input": "input"}
    g.sizes = {"input": 3 * 224 * 224}
    x = "input"

    def conv_relu(scope: str, conv: str, relu: str, inp: str, size: int, relu_after: bool = True) -> str:
        if fused_relu and relu_after:
            return g.add(f"{scope}/{relu}", "Relu", (inp,), size)
        c = g.add(f"{scope}/{conv}", "Conv", (inp,), size)
        return g.add(f"{scope}/{relu}", "Relu", (c,), size) if relu_after else c

    x = conv_relu("", "conv1", "relu", x, 64 * 112 * 112)
    x = g.add("maxpool", "MaxPool", (x,), 64 * 56 * 56)
    for s, (blocks, width, hw) in enumerate(((3, 64, 56), (4, 128, 28), (6, 256, 14), (3, 512, 7)), start=1):
        for b in range(blocks):
            sc = f"layer{s}/layer{s}.{b}"
            a = conv_relu(sc, "conv1", "relu", x, width * hw * hw)
            a = conv_relu(sc, "conv2", "relu_1", a, width * hw * hw)
            a = conv_relu(sc, "conv3", "", a, 4 * width * hw * hw, relu_after=False)
            skip = g.add(f"{sc}/downsample/downsample.0", "Conv", (x,), 4 * width * hw * hw) if b == 0 else x
            a = g.add(sc, "Add", (a, skip), 4 * width * hw * hw)
            x = g.add(f"{sc}/relu_2", "Relu", (a,), 4 * width * hw * hw)
    x = g.add("avgpool", "GlobalAveragePool", (x,), 2048)
    x = g.add("", "Flatten", (x,), 2048)
    g.add("fc", "Gemm", (x,), 1000)
    return g.shapes()


def yolov8(depth: tuple[int, ...] = (1, 2, 2)) -> Shapes:
    """YOLOv8n's modules ``model.0`` … ``model.22`` (Conv, C2f, SPPF, Upsample, Concat, Detect) with ultralytics'
    scoped names (``/model.2/m.0/cv1/conv/Conv_output_0``, SiLU as Sigmoid·Mul) and the neck's skip concats."""
    g = _Graph(True)
    g.names, g.ops, g.sizes = ["images"], {"images": "input"}, {"images": 3 * 640 * 640}

    def conv(sc: str, inp: str, size: int) -> str:
        c = g.add(f"{sc}/conv", "Conv", (inp,), size)
        s = g.add(f"{sc}/act", "Sigmoid", (c,), size)
        return g.add(f"{sc}/act", "Mul", (c, s), size)

    def c2f(sc: str, inp: str, size: int, n: int) -> str:
        a = conv(f"{sc}/cv1", inp, size)
        parts = [g.add(sc, "Split", (a,), size // 2)]
        for i in range(n):
            b = conv(f"{sc}/m.{i}/cv1", parts[-1], size // 2)
            b = conv(f"{sc}/m.{i}/cv2", b, size // 2)
            parts.append(g.add(f"{sc}/m.{i}", "Add", (parts[-1], b), size // 2))
        cat = g.add(sc, "Concat", tuple(parts), size)
        return conv(f"{sc}/cv2", cat, size)

    x, hw, ch, keep = "images", 320, 16, {}
    x = conv("model.0", x, ch * hw * hw)
    for i, k in enumerate((0, 1, 2)):  # model.1/2, 3/4, 5/6 (and 7/8 below): a strided Conv then a C2f
        m = 2 * i + 1
        hw, ch = hw // 2, ch * 2
        x = conv(f"model.{m}", x, ch * hw * hw)
        x = c2f(f"model.{m + 1}", x, ch * hw * hw, depth[k])
        keep[m + 1] = x
    hw, ch = hw // 2, ch * 2
    x = conv("model.7", x, ch * hw * hw)
    x = c2f("model.8", x, ch * hw * hw, 1)
    a = conv("model.9/cv1", x, ch * hw * hw // 2)
    pools = [a]
    for _ in range(3):
        pools.append(g.add("model.9/m", "MaxPool", (pools[-1],), ch * hw * hw // 2))
    cat = g.add("model.9", "Concat", tuple(pools), 2 * ch * hw * hw)
    x = keep[9] = conv("model.9/cv2", cat, ch * hw * hw)
    up = g.add("model.10", "Resize", (x,), 4 * ch * hw * hw)
    x = g.add("model.11", "Concat", (up, keep[6]), 6 * ch * hw * hw)
    x = keep[12] = c2f("model.12", x, 2 * ch * hw * hw, 1)
    up = g.add("model.13", "Resize", (x,), 8 * ch * hw * hw)
    x = g.add("model.14", "Concat", (up, keep[4]), 12 * ch * hw * hw)
    x = p3 = c2f("model.15", x, 4 * ch * hw * hw, 1)
    x = conv("model.16", x, ch * hw * hw)
    x = g.add("model.17", "Concat", (x, keep[12]), 3 * ch * hw * hw)
    x = p4 = c2f("model.18", x, 2 * ch * hw * hw, 1)
    x = conv("model.19", x, ch * hw * hw // 2)
    x = g.add("model.20", "Concat", (x, keep[9]), 3 * ch * hw * hw // 2)
    p5 = c2f("model.21", x, ch * hw * hw, 1)
    outs = []
    for j, p in enumerate((p3, p4, p5)):
        for head in ("cv2", "cv3"):
            h = conv(f"model.22/{head}.{j}/{head}.{j}.0", p, 64 * 400)
            h = conv(f"model.22/{head}.{j}/{head}.{j}.1", h, 64 * 400)
            outs.append(g.add(f"model.22/{head}.{j}/{head}.{j}.2", "Conv", (h,), 64 * 400))
        outs.append(g.add("model.22", "Concat", tuple(outs[-2:]), 144 * 400))
    cat = g.add("model.22", "Concat", tuple(outs[2::3]), 144 * 8400)
    g.add("", "Sigmoid", (cat,), 80 * 8400)
    return g.shapes()


def tiny_resnet(blocks: tuple[int, ...] = (2, 2, 3, 2), seed: int = 0) -> object:
    """A small ResNet as an ONNX model, named as torch 1.x exports it: Conv outputs ``input.N`` (no scope) under
    scoped node names (``/layer2/layer2.0/conv1/Conv``), Relu and Add outputs ``/layer2/layer2.0/relu/Relu_output_0``;
    bottlenecks with a downsampling Conv first in each stage; input ``input`` [1, 3, 32, 32]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    count = [0]

    def conv(scope: str, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        count[0] += 1
        w = numpy_helper.from_array((rng.normal(0, (2 / (cin * k * k)) ** 0.5, (cout, cin, k, k))).astype(np.float32),
                                    f"onnx::Conv_{1000 + count[0]}")  # fmt: skip
        b = numpy_helper.from_array(rng.normal(0, 0.05, cout).astype(np.float32), f"onnx::Conv_{2000 + count[0]}")
        inits.extend([w, b])
        out = f"input.{4 * count[0]}"
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [out], name=f"/{scope}/Conv",
                                      kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4))  # fmt: skip
        return out

    def op(kind: str, scope: str, inputs: list[str], **attrs: object) -> str:
        out = f"/{scope}/{kind}_output_0" if scope else f"/{kind}_output_0"
        nodes.append(helper.make_node(kind, inputs, [out], name=f"/{scope}/{kind}" if scope else f"/{kind}", **attrs))
        return out

    x = op("Relu", "relu", [conv("conv1", "input", 3, 8, 3)])
    x = op("MaxPool", "maxpool", [x], kernel_shape=[2, 2], strides=[2, 2])
    cin = 8
    for s, n in enumerate(blocks, start=1):
        width = 4 * 2 ** (s - 1)
        for b in range(n):
            sc, stride = f"layer{s}/layer{s}.{b}", (2 if s > 1 and b == 0 else 1)
            a = op("Relu", f"{sc}/relu", [conv(f"{sc}/conv1", x, cin, width, 1)])
            a = op("Relu", f"{sc}/relu_1", [conv(f"{sc}/conv2", a, width, width, 3, stride)])
            a = conv(f"{sc}/conv3", a, width, 2 * width, 1)
            skip = conv(f"{sc}/downsample/downsample.0", x, cin, 2 * width, 1, stride) if b == 0 else x
            x = op("Relu", f"{sc}/relu_2", [op("Add", sc, [a, skip])])
            cin = 2 * width
    x = op("GlobalAveragePool", "avgpool", [x])
    x = op("Flatten", "", [x], axis=1)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (10, cin)).astype(np.float32), "fc.weight")
    bias = numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias")
    inits += [w, bias]
    nodes.append(helper.make_node("Gemm", [x, w.name, bias.name], ["output"], name="/fc/Gemm", transB=1))
    graph = helper.make_graph(nodes, "tiny_resnet", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                              [1, 3, 32, 32])], [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])],
                              inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
