"""Data readers: npz layouts, folders, synthetic determinism, caps, and one sample feeding both models."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import builders
import numpy as np
import pytest
from conftest import save

from qdebug.data import (
    DEFAULT_BATCH_DIM,
    DEFAULT_OTHER_DIM,
    ArrayData,
    Limited,
    NpzData,
    NpzFolderData,
    Sample,
    SyntheticData,
    as_ort_reader,
    open_data,
    resolve_shapes,
)
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import DataError
from qdebug.model_io import InputSpec

SPEC = InputSpec("x", (1, 1, 6, 6), np.dtype(np.float32))
DYN = InputSpec("x", ("N", 1, 6, 6), np.dtype(np.float32))


def _arr(n: int, seed: int = 0, shape: tuple[int, ...] = (1, 1, 6, 6)) -> np.ndarray:
    return np.random.default_rng(seed).random((n, *shape)).astype(np.float32)


def test_npz_canonical_form(tmp_path: Path) -> None:
    a = _arr(5)
    np.savez(tmp_path / "d.npz", x=a)
    src = NpzData(tmp_path / "d.npz", [SPEC])
    samples = list(src)
    assert len(src) == len(samples) == 5
    for i, s in enumerate(samples):
        assert list(s) == ["x"]
        assert s["x"].shape == (1, 1, 6, 6) and s["x"].dtype == np.float32
        np.testing.assert_array_equal(s["x"], a[i])
        assert s["x"].flags["C_CONTIGUOUS"]
    assert list(src) and len(list(src)) == 5  # re-iterable


@pytest.mark.parametrize("spec", [SPEC, DYN], ids=["batch1", "dynamic_batch"])
def test_npz_batch1_split_form(tmp_path: Path, spec: InputSpec) -> None:
    a = _arr(4, shape=(1, 6, 6))  # N rows along the batch axis: (4, 1, 6, 6)
    np.savez(tmp_path / "d.npz", x=a)
    samples = list(NpzData(tmp_path / "d.npz", [spec]))
    assert len(samples) == 4
    for i, s in enumerate(samples):
        assert s["x"].shape == (1, 1, 6, 6)
        np.testing.assert_array_equal(s["x"], a[i : i + 1])


def test_npz_ignored_keys_and_multiple_inputs(tmp_path: Path) -> None:
    specs = [SPEC, InputSpec("ids", (1, 3), np.dtype(np.int64))]
    ids = np.arange(9, dtype=np.int64).reshape(3, 1, 3)
    np.savez(tmp_path / "d.npz", x=_arr(3), ids=ids, label=np.arange(3))
    with pytest.raises(DataError, match="'label'"):
        NpzData(tmp_path / "d.npz", specs)
    samples = list(NpzData(tmp_path / "d.npz", specs, ignore=("label",)))
    assert [s["ids"].tolist() for s in samples] == [[[0, 1, 2]], [[3, 4, 5]], [[6, 7, 8]]]
    np.savez(tmp_path / "uneven.npz", x=_arr(3), ids=ids[:2])
    with pytest.raises(DataError, match="different numbers of samples"):
        NpzData(tmp_path / "uneven.npz", specs)


def test_npz_folder_order_and_count(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    parts = {"b.npz": _arr(2, seed=2), "a.npz": _arr(3, seed=1), "c.npz": _arr(1, seed=3)}
    for name, a in parts.items():
        np.savez(folder / name, x=a)
    (folder / "notes.txt").write_text("ignored")
    src = NpzFolderData(folder, [SPEC])
    assert [f.name for f in src.files] == ["a.npz", "b.npz", "c.npz"]
    assert len(src) == 6
    expected = np.concatenate([parts["a.npz"], parts["b.npz"], parts["c.npz"]])
    got = np.stack([s["x"] for s in src])
    np.testing.assert_array_equal(got, expected)
    assert "3 files, 6 samples" in src.description
    # open_data recognises a folder, and num_samples caps it (across file boundaries)
    capped = open_data(folder, [SPEC], num_samples=4)
    assert len(capped) == 4
    np.testing.assert_array_equal(np.stack([s["x"] for s in capped]), expected[:4])


def test_npz_folder_validates_every_file_up_front(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    np.savez(folder / "a.npz", x=_arr(2))
    np.savez(folder / "b.npz", x=_arr(2).astype(np.float64))
    with pytest.raises(DataError, match=r"b\.npz.*float64"):
        NpzFolderData(folder, [SPEC])


def test_array_data_mapping() -> None:
    a = _arr(3)
    src = open_data({"x": a}, [SPEC])
    assert isinstance(src, ArrayData) and len(src) == 3
    np.testing.assert_array_equal(np.stack([s["x"] for s in src]), a)
    with pytest.raises(DataError, match="'y'"):
        ArrayData({"x": a, "y": a}, [SPEC])


def test_synthetic_sample_i_does_not_depend_on_n() -> None:
    specs = [
        SPEC,
        InputSpec("ids", (2, 5), np.dtype(np.int64)),
        InputSpec("small", (7,), np.dtype(np.uint8)),
        InputSpec("mask", (3,), np.dtype(np.bool_)),
    ]
    few, many = SyntheticData(specs, 3, seed=5), SyntheticData(specs, 50, seed=5)
    few_list, many_list = list(few), list(many)
    assert len(few_list) == 3 and len(many_list) == 50
    for i in range(3):
        for k in few_list[i]:
            np.testing.assert_array_equal(few_list[i][k], many_list[i][k])
            np.testing.assert_array_equal(few.sample(i)[k], few_list[i][k])
    assert not np.array_equal(many_list[0]["x"], many_list[1]["x"])
    for s in many_list:
        assert s["x"].dtype == np.float32 and s["x"].shape == (1, 1, 6, 6)
        assert s["x"].min() >= 0.0 and s["x"].max() < 1.0
        assert s["ids"].dtype == np.int64 and s["ids"].min() >= 0 and s["ids"].max() < 16
        assert s["small"].dtype == np.uint8 and s["small"].max() < 16
        assert s["mask"].dtype == np.bool_
    ids = np.concatenate([s["ids"].ravel() for s in many_list])
    assert set(ids.tolist()) == set(range(16))  # the whole documented range is used
    other_seed = SyntheticData(specs, 3, seed=6).sample(0)
    assert not np.array_equal(other_seed["x"], few.sample(0)["x"])
    assert not np.array_equal(other_seed["ids"], few.sample(0)["ids"])


def test_synthetic_normal_and_int_high() -> None:
    s = SyntheticData([InputSpec("x", (4000,), np.dtype(np.float32))], 1, distribution="normal").sample(0)["x"]
    assert s.min() < -2 and s.max() > 2 and abs(float(s.mean())) < 0.1 and abs(float(s.std()) - 1) < 0.1
    i8 = SyntheticData([InputSpec("t", (1000,), np.dtype(np.int8))], 1, int_high=1000).sample(0)["t"]
    assert i8.min() >= 0 and i8.max() <= 127
    with pytest.raises(DataError, match="distribution"):
        SyntheticData([SPEC], 1, distribution="laplace")
    with pytest.raises(DataError, match="at least one sample"):
        SyntheticData([SPEC], 0)


def test_dynamic_dims_use_documented_defaults() -> None:
    specs = [InputSpec("x", ("N", 3, None, "W"), np.dtype(np.float32)), InputSpec("t", ("B", 5), np.dtype(np.int64))]
    shapes = resolve_shapes(specs)
    assert shapes == {"x": (DEFAULT_BATCH_DIM, 3, DEFAULT_OTHER_DIM, DEFAULT_OTHER_DIM), "t": (1, 5)}
    assert (DEFAULT_BATCH_DIM, DEFAULT_OTHER_DIM) == (1, 32)
    assert resolve_shapes(specs, {"x": [2, 3, 4, 5]})["x"] == (2, 3, 4, 5)
    assert SyntheticData(specs, 1).sample(0)["x"].shape == (1, 3, 32, 32)
    with pytest.raises(DataError, match="unknown input"):
        resolve_shapes(specs, {"nope": [1]})
    with pytest.raises(DataError, match="does not fit"):
        resolve_shapes(specs, {"x": [2, 4, 4, 5]})
    with pytest.raises(DataError, match="non-positive"):
        resolve_shapes(specs, {"x": [0, 3, 4, 5]})


def test_limited_caps_a_source() -> None:
    src = SyntheticData([SPEC], 10, seed=1)
    lim = Limited(src, 4)
    got = list(lim)
    assert len(lim) == len(got) == 4
    for i, s in enumerate(got):
        np.testing.assert_array_equal(s["x"], src.sample(i)["x"])
    assert len(Limited(src, 100)) == 10 and len(list(Limited(src, 100))) == 10
    assert isinstance(open_data(None, [SPEC], num_samples=3), SyntheticData)
    assert len(open_data(None, [SPEC])) == 8  # documented default
    capped = open_data({"x": _arr(6)}, [SPEC], num_samples=2)
    assert isinstance(capped, Limited) and len(capped) == 2
    assert not isinstance(open_data({"x": _arr(6)}, [SPEC], num_samples=6), Limited)


def test_ort_reader_protocol() -> None:
    src = SyntheticData([SPEC], 5, seed=2)
    reader = as_ort_reader(src)
    from onnxruntime.quantization import CalibrationDataReader

    assert isinstance(reader, CalibrationDataReader)
    first = [reader.get_next() for _ in range(6)]
    assert first[-1] is None and all(s is not None for s in first[:5])
    np.testing.assert_array_equal(first[2]["x"], src.sample(2)["x"])
    reader.rewind()
    np.testing.assert_array_equal(reader.get_next()["x"], src.sample(0)["x"])
    reader.set_range(1, 3)
    got = [s["x"] for s in reader]
    assert len(got) == 2
    np.testing.assert_array_equal(got[0], src.sample(1)["x"])


class _FreshEveryTime:
    """A data source that draws *new* integer-valued samples each time it is iterated."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.iterations = 0
        self.description = "fresh random integers"

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Sample]:
        self.iterations += 1
        rng = np.random.default_rng(self.iterations)
        for _ in range(self.n):
            yield {"x": rng.integers(0, 200, (1, 8)).astype(np.float32)}


def test_the_same_samples_feed_both_models(tmp_path: Path) -> None:
    # Integer inputs pass the scale-1 Q/DQ of this model exactly, so float and quant agree bit for bit
    # *only if* each sample reaches both models; a second pass over the source would draw new numbers.
    f, q = builders.exact_grid()
    source = _FreshEveryTime(5)
    report = debug(save(f, tmp_path / "f.onnx"), save(q, tmp_path / "q.onnx"), source)
    assert source.iterations == 1
    assert report.meta.num_samples == 5
    assert report.output("r").cumulative_sqnr_db == math.inf
    assert report.activation("x").cumulative_sqnr_db == math.inf
    assert report.per_sample.values.shape == (5, 2)


def test_empty_custom_source_is_rejected(tmp_path: Path) -> None:
    f, q = builders.exact_grid()
    with pytest.raises(DataError, match="no samples"):
        debug(save(f, tmp_path / "f.onnx"), save(q, tmp_path / "q.onnx"), _FreshEveryTime(0))


def test_num_samples_caps_debug_data(tmp_path: Path, tiny_float: Path, tiny_quant) -> None:
    np.savez(tmp_path / "d.npz", x=_arr(7))
    report = debug(tiny_float, tiny_quant("u8"), tmp_path / "d.npz", DebugOptions(num_samples=3))
    assert report.meta.num_samples == 3 and report.per_sample.values.shape[0] == 3
    assert "first 3" in report.meta.data
    report = debug(tiny_float, tiny_quant("u8"), tmp_path / "d.npz")
    assert report.meta.num_samples == 7


def test_npz_folder_holds_one_file_in_memory_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples are copies: a sample still in use (a capture reads ahead across a file boundary) does not keep its
    whole file alive, so a file's arrays are gone before the next file is read."""
    import weakref

    from qdebug import data

    folder = tmp_path / "data"
    folder.mkdir()
    for k in range(3):
        np.savez(folder / f"{k}.npz", x=_arr(4, seed=k))
    src = NpzFolderData(folder, [SPEC])
    read, alive_at_read = [], []
    real = data._read_npz

    def tracked(*args: object) -> dict[str, np.ndarray]:
        alive_at_read.append(sum(r() is not None for r in read))
        arrays = real(*args)  # type: ignore[arg-type]
        read.extend(weakref.ref(a) for a in arrays.values())
        return arrays

    monkeypatch.setattr(data, "_read_npz", tracked)
    held = []
    for sample in src:
        held = [*held[-2:], sample]  # the current sample and two read ahead stay alive
    assert alive_at_read == [0, 0, 0]
    np.testing.assert_array_equal(held[-1]["x"], _arr(4, seed=2)[-1])
