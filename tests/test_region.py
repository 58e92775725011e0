"""``qdebug build --extract-inputs/--extract-outputs`` (:mod:`qdebug.region`): only a region of the float model is
built; its data is computed by the float model from the user's data; bad tensor names are one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import host_device_host
from conftest import CliResult, assert_one_line_error

from qdebug.errors import EXIT_MODEL, EXIT_USAGE, ConfigError
from qdebug.region import Region, extract_region, parse_tensor_list, probe, region_data

N = 6


@pytest.fixture
def model_and_data(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    path = tmp_path / "hdh.onnx"
    onnx.save(host_device_host(), str(path))
    data = tmp_path / "data.npz"
    ids = rng.integers(0, 16, size=(N, 1, 4)).astype(np.int64)
    mask = rng.integers(0, 2, size=(N, 1, 4, 1)).astype(np.int64)
    np.savez(data, ids=ids, mask=mask, label=np.arange(N) % 32)  # argmax over y's 32 values
    return path, data


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(outputs, feeds)


def test_region_model_computes_the_original_tensors() -> None:
    m = host_device_host()
    region = Region(("h", "bias"), ("y",))
    rng = np.random.default_rng(1)
    samples = [
        {"ids": rng.integers(0, 16, (1, 4)).astype(np.int64), "mask": rng.integers(0, 2, (1, 4, 1)).astype(np.int64)}
        for _ in range(3)
    ]
    sub = extract_region(m, region, probe(m, samples[0], ("h", "bias", "y"), "m"), "m")
    assert [i.name for i in sub.graph.input] == ["h", "bias"]
    assert {n.op_type for n in sub.graph.node} == {"MatMul", "Add", "Relu"}  # no Gather, Cast, Unsqueeze
    data = region_data(m, samples, region, "m")
    assert data["h"].shape == (3, 1, 4, 8) and data["bias"].shape == (3, 1, 4, 1)
    for i, s in enumerate(samples):
        (want,) = _run(m, s, ["z"])
        (got,) = _run(sub, {"h": data["h"][i], "bias": data["bias"][i]}, ["y"])
        np.testing.assert_array_equal(got, want[0])


@pytest.mark.parametrize(
    ("region", "kind", "needle"),
    [
        (Region(("h", "nope"), ("y",)), "ModelError", "'nope'"),
        (Region(("h",), ("y",)), "ConfigError", "'mask'"),  # without 'bias' the region reads the input 'mask'
        (Region(("W1",), ("y",)), "ConfigError", "constant"),
        (Region(("h", "bias"), ("h",)), "ConfigError", "more than once"),
    ],
)
def test_bad_regions_are_named(region: Region, kind: str, needle: str) -> None:
    m = host_device_host()
    sample = {"ids": np.zeros((1, 4), np.int64), "mask": np.zeros((1, 4, 1), np.int64)}
    with pytest.raises(Exception) as info:
        names = [t for t in (*region.inputs, *region.outputs) if t in {"h", "bias", "y"}]
        extract_region(m, region, probe(m, sample, names, "m"), "m")
    assert type(info.value).__name__ == kind and needle in str(info.value) and "\n" not in str(info.value)


def test_parse_tensor_list() -> None:
    assert parse_tensor_list(["a,b", " c "]) == ("a", "b", "c")
    assert parse_tensor_list(None) == ()


def test_build_of_a_region(
    run_cli: Callable[..., CliResult], model_and_data: tuple[Path, Path], tmp_path: Path
) -> None:
    model, data = model_and_data
    before = model.read_bytes()
    out = tmp_path / "out"
    res = run_cli(
        "build", "-f", model, "--target", "cpu", "--precision", "int8", "--calib", data, "--eval", data, "-o", out,
        "--extract-inputs", "h,bias", "--extract-outputs", "y",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["region"] == {"inputs": ["h", "bias"], "outputs": ["y"]}
    built = onnx.load(str(out / manifest["files"]["float_model"]))
    assert [i.name for i in built.graph.input] == ["h", "bias"] and [o.name for o in built.graph.output] == ["y"]
    qdq = onnx.load(str(out / manifest["files"]["qdq_model"]))
    assert "Gather" not in {n.op_type for n in qdq.graph.node}
    assert manifest["accuracy"]["top1"]["num_samples"] == N  # the labels passed through with the region's data
    with np.load(out / manifest["files"]["region_eval_data"]) as z:
        assert sorted(z.files) == ["bias", "h", "label"]
    assert model.read_bytes() == before  # the user's model is never touched


def test_build_region_errors(
    run_cli: Callable[..., CliResult], model_and_data: tuple[Path, Path], tmp_path: Path
) -> None:
    model, data = model_and_data
    base = ("build", "-f", model, "--target", "cpu", "--precision", "int8", "--calib", data)
    res = run_cli(*base, "-o", tmp_path / "a", "--extract-inputs", "h,bias", "--extract-outputs", "missing_t")
    assert_one_line_error(res, EXIT_MODEL, "'missing_t'", "--extract-outputs")
    assert not (tmp_path / "a").exists()
    res = run_cli(*base, "-o", tmp_path / "b", "--extract-inputs", "h")
    assert_one_line_error(res, EXIT_USAGE, "--extract-outputs")
    with pytest.raises(ConfigError):
        from qdebug.build import BuildOptions

        BuildOptions("cpu", "int8", extract_outputs=("y",))
