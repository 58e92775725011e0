"""The models a debug session starts from, made ready for a target (:mod:`qdebug.targets.prepare`): the dashboard's
Run calls this instead of doing model surgery itself (issue 36)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from test_qnn_fixes import conv_bn_net, dynamic_convnet

from qdebug.config import QuantConfig
from qdebug.model_io import input_specs, load_model
from qdebug.quantizer import quantize
from qdebug.targets.base import BuildOptions
from qdebug.targets.prepare import fix_pair_shapes, prepare_models


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shapes(path: Path) -> list[list[int | str]]:
    return [list(s.shape) for s in input_specs(load_model(path, "model"))]


def test_a_given_pair_gets_the_input_shapes_the_target_fixed(tmp_path: Path) -> None:
    float_path = _save(dynamic_convnet(), tmp_path / "dyn.onnx")
    quant_path = Path(quantize(float_path, None, QuantConfig(), tmp_path / "dyn.qdq.onnx").model_path)
    given = (_digest(float_path), _digest(quant_path))
    out = tmp_path / "run"
    out.mkdir()
    ready = prepare_models(float_path, quant_path, BuildOptions("deeploy", "int8"), None, None, out)
    assert ready.float_model.parent == out and ready.quant_model is not None and ready.quant_model.parent == out
    assert _shapes(ready.float_model) == _shapes(ready.quant_model) == [[1, 3, 32, 32]]  # the documented defaults
    assert ready.fixes is None  # the pair stays the user's pair: no fix record for a search
    assert (_digest(float_path), _digest(quant_path)) == given  # the user's files are only read


def test_a_pair_with_static_inputs_is_used_as_given(tmp_path: Path) -> None:
    float_path = _save(conv_bn_net(), tmp_path / "bn.onnx")
    quant_path = _save(conv_bn_net(seed=1), tmp_path / "bn2.onnx")
    assert fix_pair_shapes(float_path, quant_path, load_model(float_path, "m"), tmp_path) == (float_path, quant_path)


def test_a_float_model_gets_the_targets_fixes_in_a_copy(tmp_path: Path) -> None:
    float_path = _save(conv_bn_net(), tmp_path / "bn.onnx")
    given = _digest(float_path)
    config = QuantConfig(target="deeploy", activation_type="int8", weight_type="int8")
    messages: list[str] = []
    ready = prepare_models(float_path, None, BuildOptions("deeploy", "int8"), config, None, tmp_path, messages.append)
    assert ready.float_model == tmp_path / "bn.deeploy.onnx" and ready.quant_model is None
    assert ready.fixes is not None and "batchnorm_folding" in [f.name for f in ready.fixes if f.changed]
    assert not [n for n in load_model(ready.float_model, "m").graph.node if n.op_type == "BatchNormalization"]
    assert _digest(float_path) == given
    assert messages == ["applying the deeploy compatibility fixes"]


def test_a_model_the_fixes_leave_alone_is_not_copied(tmp_path: Path) -> None:
    float_path = _save(conv_bn_net(), tmp_path / "bn.onnx")
    ready = prepare_models(float_path, None, BuildOptions("cpu", "uint8"), QuantConfig(), None, tmp_path)
    assert ready.float_model == float_path and ready.fixes == ()
