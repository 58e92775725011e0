"""ONNX Runtime's symbolic shape inference through :func:`qdebug._symbolic.symbolic_shapes`: shapes where it can,
``None`` where it cannot — and no ``sym_shape_infer_temp.onnx`` in the user's working directory, which the tool's own
``infer_shapes`` saves there before raising (a qdebug run on such a model left it behind)."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from qdebug._symbolic import symbolic_shapes


def _model(op: str, domain: str = "") -> object:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node(op, ["x"], ["t"], domain=domain), helper.make_node("Relu", ["t"], ["y"])]
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=opsets)


def test_shapes_where_it_can_and_nothing_left_where_it_cannot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    done = symbolic_shapes(_model("Sigmoid"))  # type: ignore[arg-type]
    assert done is not None
    dims = [d.dim_value for d in done.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [2, 3]
    assert symbolic_shapes(_model("Mystery", domain="custom")) is None  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_the_callers_leave_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both places qdebug runs the tool: sizing a sample for segmenting, and the QNN fixes' shape pass."""
    from qdebug.capture import segmented
    from qdebug.targets import model_fixes

    monkeypatch.chdir(tmp_path)
    assert segmented._symbolic(_model("Mystery", domain="custom")) is None  # type: ignore[arg-type]
    assert model_fixes._symbolic_infer(_model("Mystery", domain="custom")) is None  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
