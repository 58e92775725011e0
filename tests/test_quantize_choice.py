"""``quantize``'s default measures the other weight recipes the same calibration ranges give (per-channel, int8) on
check samples and writes whichever is better by more than the margin, whatever the given recipe's SQNR; a recipe the
user wrote down is followed exactly. Real tiny models built here, run by ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig
from qdebug.data import SyntheticData, open_data
from qdebug.model_io import input_specs
from qdebug.quantize_choice import CHOICE_MARGIN_DB, check_samples
from qdebug.quantizer import QuantizeResult, quantize


def _conv(weights: np.ndarray, group: int) -> onnx.ModelProto:
    """One Conv over a [1, C, 8, 8] input with the given weights (opset 13, an IR ONNX Runtime loads)."""
    c_out = weights.shape[0]
    c_in = weights.shape[1] * group
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], name="conv", group=group, pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, 8, 8])],
        [numpy_helper.from_array(weights.astype(np.float32), "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _wide_channels(tmp_path: Path) -> tuple[Path, Path]:
    """A depthwise Conv whose output channels' weights differ by two orders of magnitude (~100 vs ~0.6; the large
    channel's input is silent, as a dead channel's is): per-tensor weights give channel 1 a grid 100× too coarse, yet
    the output keeps ~11 dB — above the old 10 dB rule — while per-channel weights keep ~50 dB."""
    rng = np.random.default_rng(0)
    w = np.empty((2, 1, 3, 3))
    w[0] = 100.0 * rng.uniform(-1, 1, (1, 3, 3))
    w[1] = rng.uniform(0.2, 1.0, (1, 3, 3))
    path = tmp_path / "wide.onnx"
    onnx.save(_conv(w, group=2), path)
    x = rng.uniform(0, 1, (8, 1, 2, 8, 8)).astype(np.float32)
    x[:, :, 0] = 0.0
    data = tmp_path / "calib.npz"
    np.savez(data, x=x)
    return path, data


def _dq_axes(path: str) -> set[str]:
    return {a.name for n in onnx.load(path).graph.node if n.op_type == "DequantizeLinear" for a in n.attribute}


def test_per_channel_is_written_when_it_measures_better_above_10_db(tmp_path: Path) -> None:
    path, data = _wide_channels(tmp_path)
    result = quantize(path, data, QuantConfig(), tmp_path / "q.onnx")
    choice = result.choice
    assert choice is not None and choice.switched and result.config.per_channel
    given = choice.trials[0]
    assert (given.label, given.per_channel, given.weight_type) == ("per-tensor uint8", False, "uint8")
    assert given.worst_db is not None and 10.0 < given.worst_db < 20.0  # the old rule would have kept it
    best = choice.written
    assert best.worst_db is not None and best.worst_db > given.worst_db + 20.0 and best.worst_output == "y"
    assert result.output_sqnr_db == best.output_sqnr_db and result.config.weight_type == best.weight_type
    assert [t.label for t in choice.trials][:2] == ["per-tensor uint8", "per-channel uint8"]
    assert {t.weight_type for t in choice.trials} == {"uint8", "int8"}  # int8 weights measured too
    assert "axis" in _dq_axes(result.model_path)  # the file written really has per-channel weights
    assert choice.summary().startswith(f"{best.label} weights: {best.worst_db:.1f} dB vs {given.worst_db:.1f} dB ")
    assert choice.summary().endswith(f"→ written {best.label} (better by more than {CHOICE_MARGIN_DB:g} dB)")
    assert result.warnings == ()  # a choice, not a warning
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.npz", "q.calib.json", "q.onnx", "wide.onnx"]
    # the record travels in the JSON and reads back the same
    again = QuantizeResult.from_dict(json.loads(result.to_json()))
    assert again == result and json.loads(result.to_json())["choice"]["summary"] == choice.summary()


def test_per_tensor_is_kept_when_nothing_measures_better(tmp_path: Path) -> None:
    """One output channel: per-channel weights are the per-tensor ones; int8 weights, symmetric, halve the grid of
    these positive weights. Nothing is better by the margin: the given recipe is written, byte for byte."""
    w = np.random.default_rng(1).uniform(0.2, 1.0, (1, 2, 3, 3))
    path = tmp_path / "m.onnx"
    onnx.save(_conv(w, group=1), path)
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.random.default_rng(2).uniform(0, 1, (8, 1, 2, 8, 8)).astype(np.float32))
    result = quantize(path, data, QuantConfig(), tmp_path / "q.onnx")
    choice = result.choice
    assert choice is not None and not choice.switched and not result.config.per_channel
    assert result.config.weight_type == "uint8" and len(choice.trials) == 3
    others = [t.worst_db for t in choice.trials[1:]]
    assert all(db is not None and db <= choice.trials[0].worst_db + CHOICE_MARGIN_DB for db in others)
    assert "→ kept per-tensor uint8 (no alternative better by more than 0.1 dB)" in choice.summary()
    plain = quantize(path, data, QuantConfig(), tmp_path / "plain.onnx", check=False)
    assert Path(result.model_path).read_bytes() == Path(plain.model_path).read_bytes()


def test_a_recipe_to_follow_exactly_is_followed(tmp_path: Path) -> None:
    """``per_channel_fallback=False`` (a config or overrides file, weight flags on the command line): per-tensor
    weights are written although per-channel ones would measure better; nothing else is measured."""
    path, data = _wide_channels(tmp_path)
    result = quantize(path, data, QuantConfig(), tmp_path / "q.onnx", per_channel_fallback=False)
    assert result.choice is None and not result.config.per_channel and "axis" not in _dq_axes(result.model_path)
    assert result.output_sqnr_db["y"] is not None and result.output_sqnr_db["y"] < 20.0
    off = quantize(path, data, QuantConfig(), tmp_path / "off.onnx", check=False)
    assert off.choice is None and off.output_sqnr_db == {} and off.checked_on == ""


def test_check_samples_prefer_samples_calibration_did_not_see(tmp_path: Path) -> None:
    path, data = _wide_channels(tmp_path)  # 8 samples
    specs = input_specs(onnx.load(path))
    source, what, fresh = check_samples(open_data(data, specs, num_samples=4))
    assert (len(source), fresh) == (4, 4) and what == f"{data} (8 samples), samples 5-8 (not calibrated on)"
    source, what, fresh = check_samples(open_data(data, specs, num_samples=6))
    assert (len(source), fresh) == (4, 2) and what == "2 sample(s) not calibrated on and 2 calibration sample(s)"
    first = next(iter(open_data(data, specs)))
    assert np.array_equal(list(source)[2]["x"], first["x"])  # topped up with the first calibration sample
    source, what, fresh = check_samples(open_data(data, specs))
    assert (len(source), fresh) == (4, 0) and what == "the first 4 calibration sample(s) (the data has no others)"
    synthetic = SyntheticData(specs, 32, seed=3)
    source, what, fresh = check_samples(synthetic)
    assert fresh == 4 and np.array_equal(next(iter(source))["x"], synthetic.sample(32)["x"])
    # quantize says which it used
    result = quantize(path, data, QuantConfig(num_samples=4), tmp_path / "q.onnx")
    assert result.checked_on.endswith("samples 5-8 (not calibrated on)") and result.checked_samples == 4


def test_the_cli_says_what_it_chose_and_explicit_weight_flags_are_followed(tmp_path: Path, run_cli) -> None:
    path, data = _wide_channels(tmp_path)
    r = run_cli("quantize", "-f", path, "--calib", data, "-o", tmp_path / "q.onnx", "--samples", "4")
    assert r.code == 0 and r.stderr == ""
    lines = r.out.splitlines()
    assert lines[4].startswith("  outputs vs float on 4 check sample(s): worst 'y' ")
    assert lines[5] == f"  check samples: {data} (8 samples), samples 5-8 (not calibrated on)"
    assert lines[6].startswith("  per-channel ") and " dB per-tensor uint8" in lines[6]
    assert "(worst output) on 4 check sample(s) → written per-channel" in lines[6]
    for flags in (["--weight-type", "uint8"], ["--no-weight-symmetric"]):
        r = run_cli("quantize", "-f", path, "--calib", data, "-o", tmp_path / "p.onnx", *flags, "--json")
        result = json.loads(r.out)
        assert r.code == 0 and result["choice"] is None and result["config"]["per_channel"] is False
