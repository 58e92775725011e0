"""ORT's quantizer with indexed look-ups (:mod:`qdebug.ort_index`) writes exactly the model it writes without them.

Each model is re-quantized twice through qdebug's own path — once as shipped (the look-ups indexed), once with ORT's
scans (the context manager replaced by a no-op in ``qdebug.quantizer``) — and the written files are compared byte for
byte: a plain 8-bit re-quantization and a mixed-precision one (16-bit regions from ORT's fixer, with converts), on
both sample models (the transformer: MatMul/LayerNorm/Softmax and an opset raised to 21; the CNN: Conv biases,
removable Relus, per-channel weights). The maps themselves are checked against ORT's ``find_by_name`` and
``replace_input_of_all_nodes`` through appends, removals, ``ClearField`` and renames on a graph built here.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import SAMPLE_MODELS
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import onnx_model, qdq_quantizer, quant_utils

from qdebug import ort_index
from qdebug.config import QuantConfig
from qdebug.mixed.promote import promote
from qdebug.quantizer import quantize

phases = importlib.import_module("qdebug.ort_phases")  # the module whose quantize_static uses the index

CALIB = SAMPLE_MODELS / "digits_calib.npz"
ORT_FIND = quant_utils.find_by_name
ORT_REPLACE = onnx_model.ONNXModel.replace_input_of_all_nodes
ORT_GET = onnx_model.ONNXModel.get_initializer
ORT_REPLACE_NODE_INPUT = onnx_model.ONNXModel.__dict__["replace_node_input"]  # the staticmethod itself


@contextlib.contextmanager
def _ort_scans() -> Iterator[bool]:
    yield False


def _requantized(model: Path, config: QuantConfig, cache: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The bytes of the re-quantization of ``model`` with the index (``out``) and without it (returned)."""
    indexed = quantize(model, CALIB, config, out, calibration_cache=cache, check=False)
    with monkeypatch.context() as m:
        m.setattr(phases, "indexed_quantizer", _ort_scans)
        plain = quantize(model, CALIB, config, out.with_name("plain.qdq.onnx"), calibration_cache=cache, check=False)
    assert indexed.model_path != plain.model_path
    return Path(plain.model_path).read_bytes()


@pytest.mark.parametrize(
    ("name", "per_channel"), [("digits_transformer", False), ("digits_cnn", False), ("digits_cnn", True)]
)
def test_the_written_model_is_byte_for_byte_ors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, per_channel: bool
) -> None:
    model = SAMPLE_MODELS / f"{name}.onnx"
    config = QuantConfig(num_samples=16, per_channel=per_channel)
    base = quantize(model, CALIB, config, tmp_path / "base.qdq.onnx", check=False, per_channel_fallback=False)
    float_model = onnx.load(str(model))
    # promote every third activation a node writes: regions of 16 bits with converts at their borders
    acts = [n.output[0] for n in float_model.graph.node if n.op_type in {"MatMul", "Conv", "Add", "Relu"}][::3]
    plan = promote(model, acts[:6], config=config)
    assert plan.converts and plan.promoted  # really mixed precision
    for label, cfg in (("8bit", config), ("mixed", plan.config)):
        out = tmp_path / f"{label}.qdq.onnx"
        plain = _requantized(model, cfg, base.calibration_cache, out, monkeypatch)
        assert out.read_bytes() == plain, f"{name} {label}: the indexed look-ups changed ORT's model"
    mixed = onnx.load(str(tmp_path / "mixed.qdq.onnx"))
    assert any(i.data_type == TensorProto.UINT16 for i in mixed.graph.initializer)  # 16-bit zero points written


def test_the_installed_ort_takes_the_indexed_path() -> None:
    """Pins that the speed-up is really used with the ORT this repository installs (a new release falls back to
    ORT's scans, and this test says so: re-run the byte comparison above, then add it to ``VERIFIED_ORT``)."""
    assert ort_index.unavailable() is None
    with ort_index.indexed_quantizer() as active:
        assert active
        assert qdq_quantizer.find_by_name is not ORT_FIND
        assert onnx_model.ONNXModel.replace_input_of_all_nodes is not ORT_REPLACE
    assert qdq_quantizer.find_by_name is ORT_FIND
    assert onnx_model.ONNXModel.replace_input_of_all_nodes is ORT_REPLACE
    assert onnx_model.ONNXModel.get_initializer is ORT_GET


def test_a_quantization_uses_the_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only swapped in: ORT's quantizer really looks names up in them during qdebug's quantize."""
    used: list[str] = []
    listing = ort_index._State.listing

    def spy(self: Any, field: Any, kind: str) -> Any:
        used.append(kind)
        return listing(self, field, kind)

    monkeypatch.setattr(ort_index._State, "listing", spy)
    quantize(SAMPLE_MODELS / "digits_cnn.onnx", CALIB, QuantConfig(num_samples=8), tmp_path / "q.onnx", check=False)
    assert {"name", "input"} <= set(used)


def test_a_changed_ort_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ort_index._SOURCES, "onnx_model:ONNXModel.get_initializer", "0" * 64)
    assert ort_index.unavailable() == "ORT's onnx_model:ONNXModel.get_initializer changed"
    with ort_index.indexed_quantizer() as active:
        assert not active
        assert onnx_model.ONNXModel.get_initializer is ORT_GET
    monkeypatch.setattr(ort_index, "VERIFIED_ORT", ("0.0.0",))
    assert "is not one whose quantizer was verified" in str(ort_index.unavailable())


def test_ort_functions_come_back_after_an_error_and_nested_entries() -> None:
    with pytest.raises(RuntimeError, match="boom"), ort_index.indexed_quantizer():
        with ort_index.indexed_quantizer() as inner:
            assert inner and qdq_quantizer.find_by_name is not ORT_FIND
        assert qdq_quantizer.find_by_name is not ORT_FIND  # the outer entry still holds them
        raise RuntimeError("boom")
    assert qdq_quantizer.find_by_name is ORT_FIND
    assert onnx_model.find_by_name is ORT_FIND
    assert onnx_model.ONNXModel.replace_input_of_all_nodes is ORT_REPLACE


def _graph(n: int) -> onnx.ModelProto:
    """A chain of ``n`` Add nodes, each adding its own initializer."""
    nodes = [helper.make_node("Add", [f"t{i}", f"w{i}"], [f"t{i + 1}"], name=f"add{i}") for i in range(n)]
    inits = [numpy_helper.from_array(np.full([1], i, np.float32), f"w{i}") for i in range(n)]
    x = helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits))


def _swap_one(m: Any) -> None:
    m.remove_initializer(m.model.graph.initializer[1])
    m.initializer_extend([numpy_helper.from_array(np.full([1], 2, np.float32), "w14")])  # appends, no look-up


def _renew_nodes(m: Any) -> None:
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in m.model.graph.node]
    m.model.graph.ClearField("node")
    m.model.graph.node.extend(reversed(nodes))


def _inputs(model: onnx.ModelProto) -> list[list[str]]:
    return [list(n.input) for n in model.graph.node]


def test_maps_answer_as_ort_through_edits() -> None:
    """Every kind of change ORT's quantizer makes (and a few it does not), each followed by look-ups compared with
    ORT's own scans on an identical copy."""
    fast, slow = _graph(12), _graph(12)
    # "renamed" is not looked up: an element renamed in place is found under its old name as ORT finds it (not at
    # all), but not under its new one — the one case the maps do not follow, and not one ORT's quantizer makes
    names = [f"w{i}" for i in range(15)] + ["t2", "t3", "t5", "x"]
    with ort_index.indexed_quantizer() as active:
        assert active
        fm, sm = onnx_model.ONNXModel(fast), onnx_model.ONNXModel(slow)
        edits = [
            lambda m: m.add_initializer(numpy_helper.from_array(np.zeros([1], np.float32), "w12")),
            lambda m: m.remove_initializer(m.model.graph.initializer[3]),  # a middle one: the map is rebuilt
            lambda m: m.model.graph.initializer.append(numpy_helper.from_array(np.ones([1], np.float32), "w13")),
            _swap_one,  # one removed, one added: the same length
            lambda m: setattr(m.model.graph.initializer[0], "name", "renamed"),
            lambda m: m.replace_input_of_all_nodes("t3", "x"),
            lambda m: m.add_node(helper.make_node("Relu", ["t0"], ["x"], name="relu")),
            lambda m: m.replace_node_input(m.model.graph.node[5], "t5", "x"),  # one node, as ORT's dedicated pairs
            lambda m: m.replace_input_of_all_nodes("x", "t2"),  # both nodes the edits above gave an "x"
            lambda m: m.remove_node(m.model.graph.node[2]),
            _renew_nodes,  # as ORT's topological_sort: ClearField("node"), then the nodes again (here reversed)
            lambda m: m.replace_input_of_all_nodes("t2", "t0"),
        ]
        for edit in edits:
            edit(fm)
            with _ort():
                edit(sm)
            for name in names:
                got = qdq_quantizer.find_by_name(name, fast.graph.initializer)  # the indexed one while entered
                want = ORT_FIND(name, slow.graph.initializer)
                assert (got is None) == (want is None), name
                assert got is None or got.SerializeToString() == want.SerializeToString()
                assert (fm.get_initializer(name) is None) == (want is None)
            assert _inputs(fast) == _inputs(slow)
    assert fast.SerializeToString() == slow.SerializeToString()


@contextlib.contextmanager
def _ort() -> Iterator[None]:
    """ORT's own methods on ONNXModel for the reference copy while the indexed ones are swapped in."""
    saved = {a: onnx_model.ONNXModel.__dict__[a] for a in ("replace_input_of_all_nodes", "replace_node_input",
                                                           "get_initializer")}  # fmt: skip
    finds = {m: m.find_by_name for m in (onnx_model, qdq_quantizer)}
    onnx_model.ONNXModel.replace_input_of_all_nodes = ORT_REPLACE
    onnx_model.ONNXModel.replace_node_input = ORT_REPLACE_NODE_INPUT
    onnx_model.ONNXModel.get_initializer = ORT_GET
    for m in finds:
        m.find_by_name = ORT_FIND
    try:
        yield
    finally:
        for a, v in saved.items():
            setattr(onnx_model.ONNXModel, a, v)
        for m, f in finds.items():
            m.find_by_name = f
