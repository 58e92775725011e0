"""The overrides file: JSON layout and round-trips, every-problem validation, model checks, ORT acceptance,
and the proof that an exported file reproduces the in-memory quantization byte for byte through the CLI."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import builders
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE_MODELS, assert_one_line_error, save, sha256
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
from onnxruntime.quantization import quantize as ort_quantize
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
from onnxruntime.quantization.execution_providers.qnn.mixed_precision_overrides_utils import (
    MixedPrecisionTensorQuantOverridesFixer,
)
from onnxruntime.quantization.tensor_quant_overrides import TensorQuantOverridesHelper

from qdebug.config import ConvertOverride, QuantConfig, TensorOverride
from qdebug.data import SyntheticData, as_ort_reader
from qdebug.errors import EXIT_INPUT_FILE, EXIT_OK, EXIT_USAGE, ConfigError, InputFileError
from qdebug.mixed.overrides import (
    OVERRIDES_SCHEMA_VERSION,
    TARGET_FIXES_SCHEMA_VERSION,
    OverridesError,
    OverridesFile,
    check_against_model,
)
from qdebug.model_io import file_sha256, input_specs
from qdebug.quantizer import quantize

BASE = QuantConfig(activation_type="uint8", weight_type="uint8", target="qnn", num_samples=8)

#: What ORT's mixed-precision fixer makes of ``{"a1": [{"quant_type": QUInt16}]}`` on tiny_convnet with uint8
#: activations: Add's inputs are converted up for add1, GlobalAveragePool's output back down for flatten.
FIXED_A1 = {
    "a1": [{"quant_type": "QUInt16"}],
    "c2": [{"quant_type": "QUInt8", "convert": {"quant_type": "QUInt16", "recv_nodes": ["add1"]}}],
    "gap": [{"quant_type": "QUInt16", "convert": {"quant_type": "QUInt8", "recv_nodes": ["flatten"]}}],
    "r1": [{"quant_type": "QUInt8", "convert": {"quant_type": "QUInt16", "recv_nodes": ["add1"]}}],
}


def _ort_fix(model: onnx.ModelProto, init: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """ORT's own mixed-precision fixer, exactly as get_qnn_qdq_config runs it (uint8 activations)."""
    helper = TensorQuantOverridesHelper(copy.deepcopy(init))
    MixedPrecisionTensorQuantOverridesFixer.create_from_model(helper, model, QuantType.QUInt8).apply(
        QuantType.QUInt8, False
    )
    return helper.get_dict()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(builders.tiny_convnet(), tmp_path_factory.mktemp("ov") / "tiny.onnx")


def _rich() -> OverridesFile:
    """A file using every key: activation convert, explicit scale/zp, per-channel weight, ranges."""
    return OverridesFile(
        overrides={
            "r1": [{"quant_type": "uint8", "convert": {"quant_type": "QUInt16", "recv_nodes": ["conv2", "add1"]}}],
            "c2": [TensorOverride(scale=0.05, zero_point=3)],
            "a1": [{"quant_type": "int16", "symmetric": True, "rmin": -2.5, "rmax": 2.5}],
            "w2": [{"axis": 0, "quant_type": "int8", "symmetric": True, "reduce_range": False}]
            + [{"rmin": -1.0 - i, "rmax": 1.0 + i} for i in range(3)],
        },
        model_sha256="ab" * 32,
        base_config=BASE,
        requested=("a1", "r1"),
        note="hand-written",
    )


# ------------------------------------------------------------------------------------------ layout
def test_overrides_made_for_the_target_fixed_model_say_so(tmp_path: Path) -> None:
    """A search of the model after a target's fixes writes schema 2 with ``target_fixes``; it round-trips; a file
    without it stays schema 1 byte for byte; checked against a model whose tensors it does not find, the error says
    to apply it with `qdebug build --target` (which runs the same fixes first)."""
    plain = _rich()
    fixed = OverridesFile.from_config(
        BASE.replace(tensor_overrides=plain.overrides), model_sha256="ab" * 32, requested=("a1",),
        target_fixes=("qnn", ["static_shapes", "batchnorm_folding"]),
    )  # fmt: skip
    d = json.loads(fixed.to_json())
    assert d["schema_version"] == TARGET_FIXES_SCHEMA_VERSION == 2
    assert d["target_fixes"] == {"target": "qnn", "fixes": ["static_shapes", "batchnorm_folding"]}
    again = OverridesFile.load(fixed.save(tmp_path / "o.json"))
    assert again == fixed and again.target_fixes == ("qnn", ("static_shapes", "batchnorm_folding"))
    assert "target_fixes" not in plain.to_dict() and plain.to_dict()["schema_version"] == 1
    assert OverridesFile.from_json(plain.to_json()).target_fixes is None
    model = onnx.load(str(SAMPLE_MODELS / "digits_cnn.onnx"))
    with pytest.raises(OverridesError) as info:
        check_against_model(fixed, model, "ab" * 32)
    assert any("qdebug build --target qnn --overrides" in p for p in info.value.problems)
    with pytest.raises(OverridesError) as info:
        check_against_model(plain, model, "ab" * 32)
    assert not any("qdebug build --target" in p for p in info.value.problems)


def test_json_layout_is_ort_structure() -> None:
    d = json.loads(_rich().to_json())
    assert d["schema_version"] == OVERRIDES_SCHEMA_VERSION == 1
    assert d["model_sha256"] == "ab" * 32 and d["requested"] == ["a1", "r1"] and d["note"] == "hand-written"
    assert "tensor_overrides" not in d["base_config"]
    assert QuantConfig.from_dict(d["base_config"]) == BASE
    tqo = d["tensor_quant_overrides"]
    assert list(tqo) == ["a1", "c2", "r1", "w2"]
    # ORT type names, recv_nodes a sorted list, only the keys that were set
    assert tqo["r1"] == [
        {"quant_type": "QUInt8", "convert": {"quant_type": "QUInt16", "recv_nodes": ["add1", "conv2"]}}
    ]
    assert tqo["c2"] == [{"scale": 0.05, "zero_point": 3}]
    assert tqo["a1"] == [{"quant_type": "QInt16", "symmetric": True, "rmin": -2.5, "rmax": 2.5}]
    assert tqo["w2"][0] == {"quant_type": "QInt8", "symmetric": True, "reduce_range": False, "axis": 0}
    assert tqo["w2"][1:] == [{"rmin": -1.0 - i, "rmax": 1.0 + i} for i in range(3)]
    minimal = OverridesFile({"a1": [{"quant_type": "uint16"}]}).to_dict()
    assert minimal == {
        "schema_version": 1,
        "model_sha256": None,
        "base_config": None,
        "requested": [],
        "tensor_quant_overrides": {"a1": [{"quant_type": "QUInt16"}]},
    }


def test_round_trips_dict_json_file(tmp_path: Path) -> None:
    f = _rich()
    assert OverridesFile.from_dict(f.to_dict()) == f
    assert OverridesFile.from_json(f.to_json()) == f
    path = tmp_path / "sub" / "o.json"
    assert f.save(path) == path
    assert OverridesFile.load(path) == f
    assert sorted(p.name for p in path.parent.iterdir()) == ["o.json"]  # atomic write left no temp file
    # qdebug's own spellings are accepted on input and written back as ORT names
    d = f.to_dict()
    d["tensor_quant_overrides"]["a1"][0]["quant_type"] = "int16"
    assert OverridesFile.from_dict(d) == f
    # the typed form is the config's: it applies as-is
    cfg = f.apply_to(BASE)
    assert cfg.tensor_overrides == f.overrides and cfg.replace(tensor_overrides=()) == BASE
    assert OverridesFile.from_config(cfg, model_sha256="ab" * 32, requested=["a1", "r1"], note="hand-written") == f
    assert f.tensors == ("a1", "c2", "r1", "w2")


def test_ort_dict_round_trip() -> None:
    f = _rich()
    d = f.to_ort()
    assert d["r1"][0]["quant_type"] is QuantType.QUInt8
    assert d["r1"][0]["convert"] == {"quant_type": QuantType.QUInt16, "recv_nodes": {"add1", "conv2"}}
    assert d["a1"][0]["quant_type"] is QuantType.QInt16
    assert f.to_ort() is not d and f.to_ort() == d  # a fresh copy every time (ORT's fixer mutates in place)
    back = OverridesFile.from_ort(d, model_sha256=f.model_sha256, base_config=BASE, requested=f.requested, note=f.note)
    assert back == f
    # names instead of members, lists instead of sets, numpy values (as ORT's QNN helper writes them)
    loose = {
        "r1": [{"quant_type": "QUInt8", "convert": {"quant_type": QuantType.QUInt16, "recv_nodes": ["conv2", "add1"]}}],
        "c2": [{"scale": np.array(0.05, dtype=np.float32), "zero_point": np.array(3, dtype=np.uint16)}],
    }
    lf = OverridesFile.from_ort(loose)
    assert dict(lf.overrides)["r1"][0].convert == ConvertOverride("uint16", ("add1", "conv2"))
    c2 = dict(lf.overrides)["c2"][0]
    assert c2.zero_point == 3 and isinstance(c2.zero_point, int)
    assert c2.scale == pytest.approx(0.05) and isinstance(c2.scale, float)


# -------------------------------------------------------------------------------------- validation
def _doc(tqo: Any, **top: Any) -> dict[str, Any]:
    return {"schema_version": 1, "tensor_quant_overrides": tqo, **top}


def _problems(d: Any) -> list[str]:
    with pytest.raises(OverridesError) as info:
        OverridesFile.from_dict(d)
    assert isinstance(info.value, ConfigError)
    assert str(info.value).count("\n") == 0  # one line: the CLI prints it as one error
    return info.value.problems


def test_every_problem_at_once() -> None:
    d = _doc(
        {
            "a1": [{"quant_type": "QUInt12"}],  # 1 bad type name
            "c2": [{"scale": 0.1}],  # 2 scale without zero_point
            "r1": [{"scale": 0.1, "zero_point": 0, "rmin": -1.0}],  # 3 scale with rmin
            "gap": [{"rmin": 1.0, "rmax": -1.0}],  # 4 rmin > rmax
            "flat": [{"convert": {"recv_nodes": ["gemm"]}}],  # 5 convert without quant_type
            "y": [{"quant_type": "QUInt16", "colour": "red"}],  # 6 unknown key
        }
    )
    p = _problems(d)
    assert len(p) == 6, p
    needles = (
        "a1: unknown quant_type 'QUInt12'",
        "c2: 'scale' and 'zero_point'",
        "r1: rmin cannot be combined",
        "gap: rmin 1.0 > rmax -1.0",
        "flat: convert must give a quant_type",
        "y: unknown key(s) ['colour']",
    )
    for needle in needles:
        assert sum(needle in x for x in p) == 1, (needle, p)
    with pytest.raises(OverridesError) as info:
        OverridesFile.from_dict(d)
    msg = str(info.value)
    assert msg.startswith("invalid tensor overrides (6 problems): ")
    assert all(x in msg for x in p)


@pytest.mark.parametrize(
    ("tqo", "needle"),
    [
        ({"a1": [{"zero_point": 3}]}, "a1: 'scale' and 'zero_point' must be given together"),
        ({"a1": [{"scale": 0.1, "zero_point": 1, "symmetric": True}]}, "symmetric cannot be combined"),
        ({"a1": [{"scale": 0.1, "zero_point": 1, "reduce_range": True}]}, "reduce_range cannot be combined"),
        ({"a1": [{"scale": -0.1, "zero_point": 1}]}, "scale must be a finite positive number"),
        ({"a1": [{"scale": math.nan, "zero_point": 1}]}, "scale must be a finite positive number"),
        ({"a1": [{"rmin": -math.inf, "rmax": 1.0}]}, "rmin must be finite"),
        ({"a1": [{"rmax": math.nan}]}, "rmax must be finite"),
        ({"a1": [{"quant_type": "QInt4"}]}, "4-bit quant_type 'QInt4' is not supported by qdebug"),
        ({"a1": [{"quant_type": "QFLOAT8E4M3FN"}]}, "unknown quant_type 'QFLOAT8E4M3FN'"),
        ({"a1": [{"quant_type": 4}]}, "quant_type must be a type name"),
        ({"a1": [{"quant_type": "QUInt16", "convert": {"quant_type": "QUInt16"}}]}, "must differ from the tensor's"),
        ({"a1": [{"convert": {"quant_type": "QUInt16", "recv_nodes": "gap"}}]}, "recv_nodes must be a list"),
        ({"a1": [{"convert": {"quant_type": "QUInt16", "recv_nodes": ["gap", 3]}}]}, "recv_nodes must be a list"),
        ({"a1": [{"convert": {"quant_type": "QUInt16", "recv_nodes": []}}]}, "recv_nodes is empty"),
        ({"a1": [{"convert": {"quant_type": "QUInt16", "symmetric": True}}]}, "not supported by qdebug yet"),
        ({"a1": [{"convert": {"quant_type": "QUInt16", "rcv_nodes": ["gap"]}}]}, "unknown key(s) ['rcv_nodes']"),
        ({"a1": [{"convert": "QUInt16"}]}, "a1: convert must be an object"),
        ({"a1": []}, "a1: empty override list"),
        ({"a1": {"quant_type": "QUInt16"}}, "a1: overrides must be a list"),
        ({"a1": ["QUInt16"]}, "a1: an override must be an object"),
        ({"a1": [{"zero_point": 1.5, "scale": 0.1}]}, "zero_point must be an integer"),
        ({"a1": [{"zero_point": True, "scale": 0.1}]}, "zero_point must be an integer"),
        ({"a1": [{"symmetric": "yes"}]}, "symmetric must be true or false"),
        ({"a1": [{"rmin": "0", "rmax": 1}]}, "rmin must be a number"),
        ({"a1": [{"quant_type": "QUInt8", "scale": 0.1, "zero_point": 300}]}, "zero_point 300 is outside uint8"),
        ({"w1": [{"quant_type": "QInt8"}, {"quant_type": "QInt8"}]}, "need 'axis' in the first"),
        ({"w1": [{"axis": 0}, {"axis": 1}]}, "channels disagree on axis"),
        ({"w1": [{"axis": 0, "scale": 0.1, "zero_point": 0}, {"rmin": 0.0}]}, "scale/zero_point must be given for"),
        ({"a1": [{"axis": 0, "convert": {"quant_type": "QUInt16"}}]}, "cannot be combined with axis"),
        (["a1"], "tensor_quant_overrides must be an object"),
        ({"": [{"quant_type": "QUInt16"}]}, "tensor name '' must be a non-empty string"),
    ],
)
def test_single_problem(tqo: Any, needle: str) -> None:
    p = _problems(_doc(tqo))
    assert len(p) == 1 and needle in p[0], p


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"tensor_quant_overrides": {}}, "missing schema_version"),
        (_doc({}, schema_version=3), "schema_version 3 is not supported"),
        (_doc({}, schema_version=2), "schema_version 2 needs target_fixes"),
        (
            _doc({}, target_fixes={"target": "qnn", "fixes": ["batchnorm_folding"]}),
            "target_fixes needs schema_version 2",
        ),
        (_doc({}, schema_version=2, target_fixes={"target": "qnn"}), "target_fixes must be an object with"),
        (_doc({}, schema_version=2, target_fixes={"target": "", "fixes": []}), "needs a target name"),
        (_doc({}, schema_version="1"), "schema_version '1' is not supported"),
        (_doc({}, schema_version=True), "schema_version True is not supported"),
        ({"schema_version": 1}, "missing tensor_quant_overrides"),
        (_doc({}, overrides={}), "unknown top-level key(s) ['overrides']"),
        (_doc({}, model_sha256="abc"), "model_sha256 must be 64 lowercase hex digits"),
        (_doc({}, model_sha256=12), "model_sha256 must be a string"),
        (_doc({}, requested="a1"), "requested must be a list"),
        (_doc({}, note=3), "note must be a string"),
        (_doc({}, base_config=[]), "base_config must be an object"),
        (_doc({}, base_config={"target": "gpu"}), "base_config: invalid quantization config: target 'gpu'"),
        (_doc({}, base_config={"tensor_overrides": {"a1": [{"quant_type": "int16"}]}}), "must not carry"),
        (_doc({"a1": [{"convert": {"quant_type": "QUInt8"}}]}, base_config={}), "equals the default activation type"),
        (
            _doc(
                {"a1": [{"quant_type": "QUInt16"}]},
                base_config={"target": "deeploy", "activation_type": "int8", "weight_type": "int8"},
            ),
            "takes int8 only",
        ),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_top_level_problems(doc: Any, needle: str) -> None:
    p = _problems(doc)
    assert len(p) == 1 and needle in p[0], p


def test_wrong_schema_version_and_bad_entries_reported_together() -> None:
    p = _problems({"schema_version": 7, "tensor_quant_overrides": {"a1": [{"scale": 1.0}]}, "extra": 1})
    assert len(p) == 3 and "schema_version 7" in p[1] and "extra" in p[0] and "a1" in p[2], p


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    bad_line = '  "tensor_quant_overrides": {"a1": [{"quant_type": }]}'
    path.write_text('{\n  "schema_version": 1,\n' + bad_line + "\n}\n")
    with pytest.raises(OverridesError) as info:
        OverridesFile.load(path)
    assert str(info.value).startswith(f"{path}: invalid tensor overrides (1 problem): not valid JSON: ")
    assert f"line 3, column {bad_line.index(' }') + 2}" in str(info.value)  # at the missing value
    assert info.value.source == str(path)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file"):
        OverridesFile.load(tmp_path / "nope.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputFileError, match="cannot read"):
        OverridesFile.load(tmp_path / "bin.json")


def test_constructor_validates_too() -> None:
    with pytest.raises(OverridesError) as info:
        OverridesFile(
            overrides=(("a1", ()), ("c2", (TensorOverride(scale=0.1),))),
            base_config=BASE.replace(tensor_overrides={"x": [{"quant_type": "uint16"}]}),
            model_sha256="XYZ",
        )
    assert len(info.value.problems) == 4, info.value.problems
    # plain dicts are parsed like a file (a convert without quant_type is a problem, not a KeyError)
    with pytest.raises(OverridesError) as info:
        OverridesFile(
            {"a1": [{"convert": {}}], "c2": [{"quant_type": "QUInt9"}], "r1": [TensorOverride(rmin=2.0, rmax=1.0)]}
        )
    assert len(info.value.problems) == 3, info.value.problems


def test_apply_to_never_silently_replaces_overrides() -> None:
    f = OverridesFile(FIXED_A1)
    same = f.apply_to(BASE)
    assert f.apply_to(same) == same  # the same overrides again: fine
    other = BASE.replace(tensor_overrides={"c2": [{"quant_type": "uint16"}]})
    with pytest.raises(ConfigError, match="different tensor overrides for 'a1', 'c2', 'gap', 'r1'"):
        f.apply_to(other)
    with pytest.raises(OverridesError, match="c2: convert quant_type uint16 equals the default activation type"):
        OverridesFile({"c2": [{"convert": {"quant_type": "QUInt16"}}]}).apply_to(BASE.replace(activation_type="uint16"))


def test_resolve_base_and_drift() -> None:
    f = OverridesFile(FIXED_A1, base_config=BASE)
    assert f.resolve_base(None) == BASE
    assert f.resolve_base(BASE) == BASE
    assert OverridesFile(FIXED_A1).resolve_base(None) == QuantConfig()
    with pytest.raises(ConfigError) as info:
        f.resolve_base(BASE.replace(target="cpu", num_samples=4))
    assert "num_samples: config says 4, overrides file says 8" in str(info.value)
    assert "target: config says 'cpu', overrides file says 'qnn'" in str(info.value)
    assert f.drift(BASE.replace(seed=4)) == []
    assert (
        "activation_type='uint8' but are applied with activation_type='int8'"
        in f.drift(BASE.replace(activation_type="int8"))[0]
    )


# ----------------------------------------------------------------------------------- against a model
def test_check_against_model_ok(tiny: Path) -> None:
    sha = file_sha256(tiny)
    f = OverridesFile(FIXED_A1, model_sha256=sha, requested=("a1",))
    assert check_against_model(f, onnx.load(str(tiny)), sha) == []
    # weights take per-channel overrides and reduce_range
    w = OverridesFile({"w2": [{"axis": 0, "symmetric": True}] + [{}] * 3, "w1": [{"reduce_range": True}]})
    assert check_against_model(w, onnx.load(str(tiny)), sha) == []


def test_checksum_mismatch_warns_and_lists_unknown_tensors(tiny: Path) -> None:
    model = onnx.load(str(tiny))
    sha = file_sha256(tiny)
    f = OverridesFile(FIXED_A1, model_sha256="0" * 64)
    (warning,) = check_against_model(f, model, sha)
    assert "different model file" in warning and sha[:12] in warning and "every overridden tensor exists" in warning

    extra = {"/blocks.0/ln1/out": [{"quant_type": "QUInt16"}], "zz": [{"rmin": 0.0}]}
    g = OverridesFile({**FIXED_A1, **extra}, model_sha256="0" * 64)
    with pytest.raises(OverridesError) as info:
        check_against_model(g, model, sha)
    (problem,) = info.value.problems
    assert "2 overridden tensor(s) are not tensors of the model" in problem
    assert "'/blocks.0/ln1/out', 'zz'" in problem
    # the warning is returned only when nothing is wrong; when something is, the error lists the same tensors
    h = OverridesFile({"zz": [{"rmin": 0.0}]}, model_sha256=sha)
    with pytest.raises(OverridesError, match="'zz'"):
        check_against_model(h, model, sha)


def test_model_rules_all_at_once(tiny: Path) -> None:
    model = onnx.load(str(tiny))
    f = OverridesFile(
        {
            "r1": [{"quant_type": "uint8", "convert": {"quant_type": "uint16", "recv_nodes": ["add1", "gemm", "x"]}}],
            "w1": [{"quant_type": "uint8", "convert": {"quant_type": "uint16"}}],  # weight with convert
            "c2": [{"reduce_range": True}],  # activation with reduce_range
            "a1": [{"axis": 1}],  # activation with an axis
            "w2": [{"axis": 0}, {}, {}],  # 3 channels given, 4 exist
            "wg": [{"axis": 2}],  # rank 2
            "nowhere": [{"quant_type": "int16"}],
        }
    )
    with pytest.raises(OverridesError) as info:
        check_against_model(f, model, file_sha256(tiny))
    p = info.value.problems
    assert len(p) == 7, p
    assert any(
        "r1: recv_nodes ['gemm', 'x'] do not consume this tensor (its consumers: ['add1', 'conv2'])" in x for x in p
    )
    assert any("w1: is a weight (initializer); 'convert' applies only to activations" in x for x in p)
    assert any("c2: is an activation; 'reduce_range' applies only to weights" in x for x in p)
    assert any("a1: is an activation; per-channel overrides (axis)" in x for x in p)
    assert any("w2: 3 channel overrides but the weight has 4 channels along axis 0" in x for x in p)
    assert any("wg: axis 2 is out of range for a rank-2 weight" in x for x in p)
    assert any("'nowhere'" in x for x in p)


def test_non_float_tensor_and_unknown_requested_warn() -> None:
    model = builders.tiny_convnet()
    shape = onnx.helper.make_node("Shape", ["x"], ["xs"], name="shape")
    model.graph.node.append(shape)
    model.graph.output.append(onnx.helper.make_tensor_value_info("xs", onnx.TensorProto.INT64, [4]))
    f = OverridesFile({"xs": [{"quant_type": "uint16"}]}, requested=("ghost",))
    w = check_against_model(f, model, "1" * 64)
    assert len(w) == 2
    assert "requested tensor(s) not in the model: 'ghost'" in w[0]
    assert "xs: is INT64, not float" in w[1]


# ----------------------------------------------------------------------------------- ORT accepts it
def _has_16bit_q(model: onnx.ModelProto, tensor: str) -> bool:
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] == tensor:
            return inits[n.input[2]].data_type == onnx.TensorProto.UINT16
    raise AssertionError(f"no QuantizeLinear on {tensor}")


def _run(path: Path) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.linspace(0, 1, 36, dtype=np.float32).reshape(1, 1, 6, 6)
    (y,) = sess.run(None, {"x": x})
    assert y.shape == (1, 3) and np.isfinite(y).all()
    return np.asarray(y)


def test_to_ort_accepted_by_get_qnn_qdq_config(tiny: Path, tmp_path: Path) -> None:
    model = onnx.load(str(tiny))
    f = OverridesFile.from_ort(_ort_fix(model, {"a1": [{"quant_type": QuantType.QUInt16}]}))
    assert f.to_dict()["tensor_quant_overrides"] == FIXED_A1
    init = f.to_ort()
    snapshot = copy.deepcopy(init)
    reader = as_ort_reader(SyntheticData(input_specs(model), 4))
    cfg = get_qnn_qdq_config(str(tiny), reader, init_overrides=init)
    assert init == snapshot  # ORT copies it; and since it is already fixed, its fixer leaves it as it is
    assert OverridesFile.from_ort(cfg.extra_options["TensorQuantOverrides"]) == f
    out = tmp_path / "qnn.onnx"
    ort_quantize(str(tiny), str(out), cfg)
    q = onnx.load(str(out))
    assert _has_16bit_q(q, "a1") and not _has_16bit_q(q, "r1")
    assert any(n.output[0] == "r1_convert_DequantizeLinear_Output" for n in q.graph.node)
    _run(out)


def test_to_ort_accepted_by_quantize_static(tiny: Path, tmp_path: Path) -> None:
    f = OverridesFile(FIXED_A1)
    model = onnx.load(str(tiny))
    out = tmp_path / "static.onnx"
    quantize_static(
        str(tiny),
        str(out),
        as_ort_reader(SyntheticData(input_specs(model), 4)),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QUInt8,
        extra_options={"TensorQuantOverrides": f.to_ort(), "UseQDQContribOps": True},
    )
    q = onnx.load(str(out))
    assert _has_16bit_q(q, "a1") and _has_16bit_q(q, "gap")
    assert any(n.output[0] == "gap_convert_DequantizeLinear_Output" for n in q.graph.node)
    _run(out)


# --------------------------------------------------------------------------------- the round trip
@pytest.mark.parametrize("target", ["qnn", "cpu"])
def test_exported_file_reproduces_quantization_through_cli(tiny: Path, tmp_path: Path, run_cli, target: str) -> None:
    model = onnx.load(str(tiny))
    fixed = _ort_fix(model, {"a1": [{"quant_type": QuantType.QUInt16}]})
    overrides = OverridesFile.from_ort(fixed).overrides
    cfg = BASE.replace(target=target, seed=5, tensor_overrides=overrides)
    api = quantize(model, None, cfg, tmp_path / "api.qdq.onnx")  # in memory, from a ModelProto

    exported = OverridesFile.from_config(api.config, model_sha256=file_sha256(tiny), requested=["a1"])
    path = exported.save(tmp_path / "overrides.json")
    assert OverridesFile.load(path) == exported
    before = sha256(path)

    cli_out = tmp_path / "cli.qdq.onnx"
    r = run_cli("quantize", "-f", tiny, "-o", cli_out, "--overrides", path, "--json")
    assert r.code == EXIT_OK, r.stderr
    assert r.stderr == ""  # same model file: no checksum warning
    assert json.loads(r.out)["config"] == api.config.to_dict()
    assert cli_out.read_bytes() == Path(api.model_path).read_bytes()  # ORT is byte-deterministic here
    assert sha256(path) == before  # the user's file is only read
    q = onnx.load(str(cli_out))
    assert _has_16bit_q(q, "a1") and not _has_16bit_q(q, "c2")


def test_fixer_is_idempotent_so_unfixed_and_fixed_quantize_alike(tiny: Path, tmp_path: Path) -> None:
    # get_qnn_qdq_config runs ORT's fixer again on already-fixed overrides: it must change nothing.
    model = onnx.load(str(tiny))
    fixed = _ort_fix(model, {"a1": [{"quant_type": QuantType.QUInt16}]})
    assert _ort_fix(model, fixed) == fixed
    a = quantize(tiny, None, BASE.replace(tensor_overrides={"a1": [{"quant_type": "uint16"}]}), tmp_path / "a.onnx")
    b = quantize(tiny, None, OverridesFile(FIXED_A1).apply_to(BASE), tmp_path / "b.onnx")
    assert Path(a.model_path).read_bytes() == Path(b.model_path).read_bytes()


# ------------------------------------------------------------------------------------------- CLI
@pytest.fixture
def ofile(tiny: Path, tmp_path: Path) -> Path:
    return OverridesFile(FIXED_A1, model_sha256=file_sha256(tiny), base_config=BASE).save(tmp_path / "o.json")


def test_cli_config_must_agree_with_base_config(tiny: Path, tmp_path: Path, ofile: Path, run_cli) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(BASE.replace(num_samples=4, activation_symmetric=True).to_json())
    out = tmp_path / "q.onnx"
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", ofile, "-c", cfg)
    conflict = "num_samples: config says 4, overrides file says 8"
    assert_one_line_error(r, EXIT_USAGE, "disagree", conflict, "activation_symmetric")
    assert not out.exists()
    cfg.write_text(BASE.to_json())  # agreeing config is fine
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", ofile, "-c", cfg)
    assert r.code == EXIT_OK, r.stderr
    assert "tensor overrides: 4 tensor(s) from" in r.out


def test_cli_flags_apply_but_cannot_contradict(tiny: Path, tmp_path: Path, ofile: Path, run_cli) -> None:
    out = tmp_path / "q.onnx"
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", ofile, "--target", "cpu")
    assert_one_line_error(r, EXIT_USAGE, "conflicting", "target")
    assert not out.exists()
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", ofile, "--seed", "3", "--json")
    assert r.code == EXIT_OK, r.stderr
    d = json.loads(r.out)["config"]
    assert d["seed"] == 3 and d["target"] == "qnn" and d["num_samples"] == 8
    gap = {"quant_type": "uint16", "convert": {"quant_type": "uint8", "recv_nodes": ["flatten"]}}
    assert d["tensor_overrides"]["gap"] == [gap]
    # A flag may fill a setting the file left at its default, but this one changes what the boundaries mean:
    # the warning explains why ORT's fixer (re-run for qnn with int8 as the default) then rejects them.
    out2 = tmp_path / "q2.onnx"
    r = run_cli("quantize", "-f", tiny, "-o", out2, "--overrides", ofile, "--activation-type", "int8")
    assert r.code == EXIT_USAGE
    warning, error = r.stderr.strip().splitlines()
    assert warning.startswith("qdebug: warning: the overrides were fixed for activation_type='uint8'")
    assert error.startswith("qdebug: error: ONNX Runtime rejected the quantization config") and "gap" in error
    assert not out2.exists()


def test_cli_missing_overrides_file(tiny: Path, tmp_path: Path, run_cli) -> None:
    out = tmp_path / "q.onnx"
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", tmp_path / "nope.json")
    assert_one_line_error(r, EXIT_INPUT_FILE, "nope.json", "no such file")
    assert not out.exists()


def test_cli_invalid_file_writes_nothing(tiny: Path, tmp_path: Path, run_cli) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc({"a1": [{"scale": 0.1}], "c2": [{"quant_type": "QUInt3"}]})))
    out = tmp_path / "q.onnx"
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", bad)
    assert_one_line_error(r, EXIT_USAGE, str(bad), "2 problems", "a1:", "'QUInt3'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]  # no model, no calibration cache


def test_cli_model_problems_and_checksum_warning(tiny: Path, tmp_path: Path, run_cli) -> None:
    out = tmp_path / "q.onnx"
    unknown = OverridesFile({**FIXED_A1, "ghost": [{"quant_type": "QUInt16"}]}, model_sha256="0" * 64)
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", unknown.save(tmp_path / "u.json"))
    assert r.code == EXIT_USAGE
    warning, error = r.stderr.strip().splitlines()
    assert warning.startswith("qdebug: warning: the overrides were made for a different model file")
    assert "overridden tensors not in this model: 'ghost'" in warning
    assert (
        error.startswith(f"qdebug: error: {tmp_path / 'u.json'}: invalid tensor overrides (1 problem)")
        and "'ghost'" in error
    )
    assert not out.exists()

    other = OverridesFile(FIXED_A1, model_sha256="0" * 64)  # made for another file, but fits this model
    r = run_cli("quantize", "-f", tiny, "-o", out, "--overrides", other.save(tmp_path / "o2.json"))
    assert r.code == EXIT_OK, r.stderr
    assert r.stderr.startswith("qdebug: warning: the overrides were made for a different model file")
    assert "every overridden tensor exists in this model" in r.stderr
    assert out.is_file()


def test_build_names_the_overrides_file_when_it_does_not_fit_the_model(tiny: Path, tmp_path: Path, run_cli) -> None:
    """The model check sees the parsed file only: its error said 'invalid tensor overrides' without the file."""
    bad = OverridesFile({"ghost": [{"quant_type": "QUInt16"}]}).save(tmp_path / "ghost.json")
    r = run_cli(
        "build", "-f", tiny, "--target", "cpu", "--precision", "uint8", "--overrides", bad, "-o", tmp_path / "b"
    )
    assert r.code == EXIT_USAGE and r.stderr.strip().splitlines()[-1].startswith(f"qdebug: error: {bad}: "), r.stderr
    assert not (tmp_path / "b").exists()
