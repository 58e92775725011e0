"""Weight pairing on a detector whose nodes are all unnamed (issue 34): the quantizer renames a Conv's output (a
fused Relu, or a graph output written to ``<name>_QuantizeLinear_Input``) and one activation feeds several Convs
(FPN laterals, head convs), so neither names nor "the one Conv reading this activation" find the float twin. Every
quantized weight must still pair with the right float weight, whoever quantized the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import save
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions, debug
from qdebug.graph_index import GraphIndex
from qdebug.pairing import pair_models, weight_arrays
from qdebug.quantizer import quantize

SIDE = 12
#: (weight, output channels, input channels, kernel, input tensor, output tensor, followed by a Relu)
CONVS = (
    ("w_stem", 8, 3, 3, "x", "stem", True),
    # FPN-like laterals: four Convs read 'stem', three of them with weights of the same shape
    ("w_lat1", 8, 8, 1, "stem", "lat1", True),
    ("w_lat2", 8, 8, 1, "stem", "lat2", True),
    ("w_lat3", 8, 8, 1, "stem", "lat3", False),  # a graph output
    ("w_box", 4, 8, 3, "stem", "box", False),  # a graph output
    # heads: three Convs of the same shape read 'fused'
    ("w_h1", 4, 8, 3, "fused", "h1", True),
    ("w_h2", 4, 8, 3, "fused", "h2", True),
    ("w_h3", 4, 8, 3, "fused", "cls", False),  # a graph output
)
OUTPUTS = {"lat3": 8, "box": 4, "cls": 4, "score": 4}


def unnamed_detector(seed: int = 0, opset: int = 9) -> onnx.ModelProto:
    """The detector's Conv/Relu/Add graph at ``opset``, every node unnamed."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    for w, cout, cin, k, src, out, relu in CONVS:
        inits.append(numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) * 0.3).astype(np.float32), w))
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"{w}_b"))
        conv_out = f"{out}_pre" if relu else out
        nodes.append(helper.make_node("Conv", [src, w, f"{w}_b"], [conv_out], pads=[k // 2] * 4))
        if relu:
            nodes.append(helper.make_node("Relu", [conv_out], [out]))
        if out == "lat2":
            nodes.append(helper.make_node("Add", ["lat1", "lat2"], ["fused"]))
    nodes.append(helper.make_node("Add", ["h1", "h2"], ["score"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIDE, SIDE])
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, c, SIDE, SIDE]) for o, c in OUTPUTS.items()]
    m = helper.make_model(
        helper.make_graph(nodes, "detector", [x], outs, inits), opset_imports=[helper.make_opsetid("", opset)]
    )
    m.ir_version = 7
    return m


class _Reader(CalibrationDataReader):
    def __init__(self, n: int = 8) -> None:
        rng = np.random.default_rng(1)
        self._it = iter([{"x": rng.standard_normal((1, 3, SIDE, SIDE)).astype(np.float32)} for _ in range(n)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _ort(f: Path, q: Path, per_channel: bool) -> Path:
    quantize_static(
        str(f), str(q), _Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8,
    )  # fmt: skip
    return q


def _qdebug(f: Path, q: Path, per_channel: bool) -> Path:
    quantize(f, None, QuantConfig(num_samples=8, per_channel=per_channel, weight_type="int8"), q)
    return q


def _sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return float(20 * np.log10(np.linalg.norm(ref) / max(float(np.linalg.norm(ref - test)), 1e-30)))


def _reversed(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with its nodes stored in reverse (qdebug orders them again): the quantized Convs that read
    one activation then come in another order than their float twins, so only their values tell them apart."""
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


@pytest.mark.parametrize("order", ["stored", "reversed"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("quantizer", [_qdebug, _ort], ids=["qdebug", "ort"])
def test_every_weight_pairs_with_its_own_float_weight(tmp_path: Path, quantizer, per_channel: bool, order) -> None:
    fm = unnamed_detector()
    assert not any(n.name for n in fm.graph.node)
    f = save(fm, tmp_path / "det.onnx")
    qm = onnx.load(str(quantizer(f, tmp_path / "det.qdq.onnx", per_channel)))
    qm = _reversed(qm) if order == "reversed" else qm
    # What made the old pairing fail: renamed Conv outputs and an activation several Convs read.
    assert fm.opset_import[0].version == 9 and qm.opset_import[0].version >= 11  # ORT upgrades opset 9
    conv_outputs = {n.output[0] for n in qm.graph.node if n.op_type == "Conv"}
    assert {"stem", "lat1", "h1", "box_QuantizeLinear_Input", "cls_QuantizeLinear_Input"} <= conv_outputs
    assert not any(n.op_type == "Relu" for n in qm.graph.node)  # every Relu fused into its Conv's Q

    pairing = pair_models(fm, qm)
    assert not [w for w in pairing.warnings if "no float counterpart" in w], pairing.warnings
    # ORT names a quantized weight '<float name>_quantized': the test's reference; the pairing never reads it.
    got = {w.quant_name: (w.weight_name, w.kind, w.input_index) for w in pairing.weights}
    want = {}
    for w, *_ in CONVS:
        want[f"{w}_quantized"] = (w, "weight", 1)
        want[f"{w}_b_quantized"] = (f"{w}_b", "bias", 2)
    assert got == want
    fi, qi = GraphIndex(fm), GraphIndex(qm)
    sqnr = {w.weight_name: _sqnr_db(*weight_arrays(w, fi, qi)) for w in pairing.weights}
    assert min(sqnr.values()) > 30, sqnr  # right partners: another layer's weights would be near 0 dB


def test_debug_reports_every_weight_of_the_unnamed_detector(tmp_path: Path) -> None:
    """Through ``debug``: all 16 weights in the report, each above 30 dB, and no 'no float counterpart' warning."""
    f = save(unnamed_detector(), tmp_path / "det.onnx")
    q = _qdebug(f, tmp_path / "det.qdq.onnx", per_channel=True)
    rep = debug(f, q, None, DebugOptions(num_samples=2))
    assert not [w for w in rep.meta.warnings if "no float counterpart" in w], rep.meta.warnings
    assert sorted(w.weight_name for w in rep.weights) == sorted(n for w, *_ in CONVS for n in (w, f"{w}_b"))
    assert all(w.weight_sqnr_db is not None and w.weight_sqnr_db > 30 for w in rep.weights), rep.weights


def test_convs_with_equal_weights_on_one_activation_pair_with_distinct_float_nodes(tmp_path: Path) -> None:
    """Two Convs on one activation with the very same weights: values cannot tell them apart, so each quantized Conv
    takes its own float node (both float weights are in the pairing, neither twice)."""
    fm = unnamed_detector()
    inits = {t.name: t for t in fm.graph.initializer}
    for suffix in ("", "_b"):
        inits[f"w_lat2{suffix}"].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(inits[f"w_lat1{suffix}"]),
                                                                  f"w_lat2{suffix}"))  # fmt: skip
    f = save(fm, tmp_path / "det.onnx")
    qm = onnx.load(str(_ort(f, tmp_path / "det.qdq.onnx", per_channel=False)))
    pairing = pair_models(fm, qm)
    lat = sorted((w.weight_name, w.consumer_node) for w in pairing.weights if w.weight_name.startswith("w_lat"))
    assert [n for n, _ in lat] == ["w_lat1", "w_lat1_b", "w_lat2", "w_lat2_b", "w_lat3", "w_lat3_b"]
    consumers = {w.weight_name: w.consumer_node for w in pairing.weights}
    assert len({consumers["w_lat1"], consumers["w_lat2"], consumers["w_lat3"]}) == 3
