"""QuantConfig: round-trips, validation that reports every problem, and the mapping to ORT's config."""

from __future__ import annotations

import json
from pathlib import Path

import builders
import pytest
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, StaticQuantConfig

from qdebug.config import (
    ConvertOverride,
    QuantConfig,
    TensorOverride,
    make_overrides,
    normalize_quant_type,
)
from qdebug.data import SyntheticData, as_ort_reader
from qdebug.errors import ConfigError, InputFileError
from qdebug.model_io import input_specs
from qdebug.targets.base import to_ort_config

OVERRIDES = {
    "r1": [{"quant_type": "uint8", "convert": {"quant_type": "uint16", "recv_nodes": ["conv2", "add1"]}}],
    "c2": [{"scale": 0.5, "zero_point": 3}],
    "w1": [{"axis": 0, "symmetric": True}, {"rmin": -1.0, "rmax": 2.0, "reduce_range": False}],
}


def _full_config(**kw) -> QuantConfig:
    base = dict(
        activation_type="QUInt16",
        weight_type="s8",
        per_channel=True,
        activation_symmetric=True,
        weight_symmetric=True,
        calibration_method="percentile",
        num_samples=5,
        seed=11,
        synthetic_distribution="normal",
        target="cpu",
        tensor_overrides=OVERRIDES,
    )
    base.update(kw)
    return QuantConfig(**base)


def test_round_trips_dict_and_json(tmp_path: Path) -> None:
    cfg = _full_config()
    assert cfg.activation_type == "uint16" and cfg.weight_type == "int8"  # normalised spellings
    d = cfg.to_dict()
    assert d["schema_version"] == 1
    assert d["tensor_overrides"]["r1"] == [
        {"quant_type": "uint8", "convert": {"quant_type": "uint16", "recv_nodes": ["add1", "conv2"]}}
    ]
    assert d["tensor_overrides"]["c2"] == [{"scale": 0.5, "zero_point": 3}]
    assert QuantConfig.from_dict(d) == cfg
    assert QuantConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json()) == json.loads(json.dumps(d))
    path = tmp_path / "cfg.json"
    path.write_text(cfg.to_json())
    assert QuantConfig.load(path) == cfg
    r1 = cfg.overrides_dict["r1"][0]
    assert r1.convert == ConvertOverride("uint16", ("add1", "conv2"))
    assert QuantConfig() == QuantConfig.from_dict(QuantConfig().to_dict())


def test_convert_without_recv_nodes_round_trips() -> None:
    cfg = QuantConfig(tensor_overrides={"t": {"convert": {"quant_type": "int16"}}})
    d = cfg.to_dict()
    assert d["tensor_overrides"]["t"] == [{"convert": {"quant_type": "int16"}}]
    assert QuantConfig.from_dict(d) == cfg
    assert cfg.ort_overrides()["t"][0]["convert"] == {"quant_type": QuantType.QInt16}


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        QuantConfig(
            activation_type="uint8",
            weight_type="uint8",
            weight_symmetric=False,
            calibration_method="median",
            synthetic_distribution="laplace",
            num_samples=0,
            seed=-1,
            target="deeploy",
            tensor_overrides={
                "a": [{"scale": -1.0, "zero_point": 0}],
                "b": [{"scale": 0.1}],
                "c": [{"rmin": 2.0, "rmax": 1.0}],
                "d": [],
            },
        )
    msg = str(info.value)
    for needle in (
        "calibration_method 'median'",
        "synthetic_distribution 'laplace'",
        "num_samples must be a positive integer or null, got 0",
        "seed must be a non-negative integer, got -1",
        "target 'deeploy' takes int8 activations and int8 weights",
        "target 'deeploy' needs symmetric weights",
        "a: scale must be a finite positive number, got -1.0",
        "b: 'scale' and 'zero_point' must be given together",
        "c: rmin 2.0 > rmax 1.0",
        "tensor 'd' has an empty override list",
    ):
        assert needle in msg, needle
    assert msg.count(";") >= 9


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"target": "qnn", "weight_type": "int16", "weight_symmetric": False}, "symmetric 16-bit weights"),
        ({"calibration_method": "entropy", "activation_symmetric": True}, "entropy"),
        ({"target": "gpu"}, "target 'gpu'"),
        ({"activation_type": "uint4"}, "unknown quantization type"),
        ({"tensor_overrides": {"t": [{"scale": 0.1, "zero_point": 0, "rmin": 0.0}]}}, "cannot be combined"),
        ({"tensor_overrides": {"t": [{"rmax": float("inf")}]}}, "rmax must be finite"),
    ],
)
def test_single_conflicts(kw: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        QuantConfig(**kw)


def test_unknown_keys_and_versions() -> None:
    with pytest.raises(ConfigError, match="unknown quantization config keys"):
        QuantConfig.from_dict({"activation_type": "uint8", "colour": "blue"})
    with pytest.raises(ConfigError, match="schema_version 2"):
        QuantConfig.from_dict({"schema_version": 2})
    with pytest.raises(ConfigError, match="unknown tensor-override keys"):
        TensorOverride.from_dict({"scael": 1.0})
    with pytest.raises(ConfigError, match="not valid JSON"):
        QuantConfig.from_json("{")
    with pytest.raises(InputFileError, match=r"nope\.json"):
        QuantConfig.load("/nonexistent/nope.json")


def test_quant_type_spellings() -> None:
    for spelling, name in [("uint8", "uint8"), ("QInt8", "int8"), ("u16", "uint16"), ("S16", "int16"), ("i8", "int8")]:
        assert normalize_quant_type(spelling) == name
    assert TensorOverride(quant_type="QUInt16").quant_type == "uint16"


def test_merged_flags() -> None:
    cfg = QuantConfig(activation_type="uint16", per_channel=True)
    assert cfg.merged(activation_type="QUInt16", weight_type="int8", seed=None) == cfg.replace(weight_type="int8")
    with pytest.raises(ConfigError) as info:
        cfg.merged(activation_type="int8", per_channel=False)
    assert "activation_type: config says 'uint16', command line says 'int8'" in str(info.value)
    assert "per_channel: config says True, command line says False" in str(info.value)
    # a default-valued setting may be changed by a flag
    assert QuantConfig().merged(activation_type="int8").activation_type == "int8"


def test_make_overrides_is_sorted_and_frozen() -> None:
    ov = make_overrides({"b": {"axis": 1}, "a": [TensorOverride(symmetric=True)]})
    assert [n for n, _ in ov] == ["a", "b"]
    assert ov[1][1] == (TensorOverride(axis=1),)
    cfg = QuantConfig(tensor_overrides=ov)
    with pytest.raises(AttributeError):
        cfg.per_channel = True  # type: ignore[misc]


@pytest.mark.parametrize("target", ["cpu", "qnn"])
def test_to_ort_config_fields(target: str) -> None:
    model = builders.tiny_convnet()
    reader = as_ort_reader(SyntheticData(input_specs(model), 2))
    cfg = _full_config(
        target=target, activation_type="uint16", weight_type="uint8", activation_symmetric=False,
        calibration_method="minmax",
    )  # fmt: skip
    ort_cfg = to_ort_config(cfg, model, reader)
    assert isinstance(ort_cfg, StaticQuantConfig)
    assert ort_cfg.activation_type == QuantType.QUInt16
    assert ort_cfg.weight_type == QuantType.QUInt8
    assert ort_cfg.per_channel is True
    assert ort_cfg.quant_format == QuantFormat.QDQ
    assert ort_cfg.calibrate_method == CalibrationMethod.MinMax
    assert ort_cfg.calibration_data_reader is reader
    extra = ort_cfg.extra_options
    assert extra["ActivationSymmetric"] is False
    assert extra["WeightSymmetric"] is True
    overrides = extra["TensorQuantOverrides"]
    assert set(overrides) == {"r1", "c2", "w1"}
    assert overrides["r1"] == [
        {"quant_type": QuantType.QUInt8, "convert": {"quant_type": QuantType.QUInt16, "recv_nodes": {"conv2", "add1"}}}
    ]
    assert overrides["c2"] == [{"scale": 0.5, "zero_point": 3}]
    assert overrides["w1"][1] == {"rmin": -1.0, "rmax": 2.0, "reduce_range": False}
    if target == "qnn":
        assert extra["UseQDQContribOps"] is True  # opset 17 + 16-bit types → com.microsoft Q/DQ


def test_to_ort_config_without_overrides() -> None:
    model = builders.tiny_convnet()
    reader = as_ort_reader(SyntheticData(input_specs(model), 2))
    ort_cfg = to_ort_config(QuantConfig(activation_type="int8", weight_type="int8"), model, reader)
    assert (ort_cfg.activation_type, ort_cfg.weight_type) == (QuantType.QInt8, QuantType.QInt8)
    assert ort_cfg.per_channel is False
    assert not ort_cfg.extra_options.get("TensorQuantOverrides")
