"""Property-based fuzzing of what users hand qdebug: ONNX model bytes and fields, ``.npz`` bytes and arrays, config
and overrides JSON (hypothesis). Whatever the input, ``main(argv)``:

* returns an exit code from the documented set, never 1 (an internal error is a bug);
* prints no traceback, and on failure exactly one ``qdebug: error:`` line (besides ``qdebug: warning:``/``note:``
  lines, which explain a result or an error);
* leaves every input byte-identical, and on failure leaves nothing behind (no output, temp file, ``.calib.json``).

The example budget is fixed and derandomized (the same examples on every run, no example database), so the whole
file stays within about a minute on two cores. A crash found here gets fixed at its root and pinned with
``@example``. See docs/testing.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import builders
import numpy as np
import onnx
import pytest
from conftest import tree_hashes
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qdebug.errors import EXIT_CODES, EXIT_INTERNAL

#: Exit codes a bad input may produce (every documented one but the internal error).
ALLOWED = set(EXIT_CODES) - {EXIT_INTERNAL}

SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}

SHAPE = (1, 1, 6, 6)
GOOD_X = np.random.default_rng(0).random((2, *SHAPE)).astype(np.float32)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_float: Path, tiny_quant) -> Path:
    """The good files the mutations start from (never modified: each example works on copies)."""
    d = tmp_path_factory.mktemp("fuzz_base")
    shutil.copy(tiny_float, d / "f.onnx")
    shutil.copy(tiny_quant("u8"), d / "q.onnx")
    np.savez(d / "calib.npz", x=GOOD_X)
    return d


@contextlib.contextmanager
def _workspace(base: Path) -> Iterator[Path]:
    """A fresh folder holding copies of the good files, removed afterwards (one per example)."""
    d = Path(tempfile.mkdtemp(prefix="fuzz-", dir=base.parent))
    try:
        for p in base.iterdir():
            shutil.copy(p, d / p.name)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _run(argv: list[str | Path], folder: Path, outputs: tuple[str, ...]) -> int:
    """Run the CLI in-process and check the invariants; ``outputs`` are the names a success may add to ``folder``."""
    from qdebug.cli import main

    before = tree_hashes(folder)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv], out=io.StringIO())
    text = err.getvalue()
    assert code in ALLOWED, (code, text)
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    errors = [line for line in lines if not line.startswith(("qdebug: warning:", "qdebug: note:"))]
    if code == 0:
        assert errors == [], text
    else:
        assert len(errors) == 1 and errors[0].startswith("qdebug"), text
    after = tree_hashes(folder)
    assert {k: v for k, v in after.items() if k in before} == before  # every input byte-identical
    added = {Path(k).parts[0] for k in set(after) - set(before)}
    assert added <= set(outputs) if code == 0 else added == set(), (code, added, text)
    if code != 0:  # no folder either
        assert sorted(p.name for p in folder.iterdir()) == sorted({Path(k).parts[0] for k in before}), text
    return code


# ---------------------------------------------------------------------------------------------- (a) ONNX models
FLOAT_BYTES = builders.tiny_convnet().SerializeToString()


def _mutate_bytes(raw: bytes, draw: Any) -> bytes:
    """``raw`` (a model's proto bytes) truncated, with bytes flipped, or with one field changed."""
    kind = draw(st.sampled_from(["truncate", "flip", "field", "field", "field"]))
    if kind == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if kind == "flip":
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    m = onnx.ModelProto()
    m.ParseFromString(raw)
    _mutate_field(m, draw)
    return m.SerializeToString()


@st.composite
def mutated_model_bytes(draw: st.DrawFn) -> bytes:
    """The float model's proto bytes, mutated."""
    return _mutate_bytes(FLOAT_BYTES, draw)


def _mutate_field(m: onnx.ModelProto, draw: Any) -> None:
    g = m.graph
    what = draw(
        st.sampled_from(
            ["ir", "opset", "dim", "input_type", "init_type", "drop_init", "rename", "drop_node", "dup_node",
             "init_dims", "attr", "output_name"]
        )
    )  # fmt: skip
    if what == "ir":
        m.ir_version = draw(st.integers(-3, 40))
    elif what == "opset":
        m.opset_import[0].version = draw(st.integers(-1, 40))
    elif what == "dim":
        dim = g.input[0].type.tensor_type.shape.dim[draw(st.integers(0, 3))]
        if draw(st.booleans()):
            dim.dim_value = draw(st.integers(-2, 10**6))
        else:
            dim.dim_param = draw(st.text(max_size=5))
    elif what == "input_type":
        g.input[0].type.tensor_type.elem_type = draw(st.integers(0, 25))
    elif what == "init_type":
        g.initializer[draw(st.integers(0, len(g.initializer) - 1))].data_type = draw(st.integers(0, 25))
    elif what == "drop_init":
        del g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
    elif what == "rename":
        node = g.node[draw(st.integers(0, len(g.node) - 1))]
        names = node.input if draw(st.booleans()) or not node.output else node.output
        names[draw(st.integers(0, len(names) - 1))] = draw(st.text(max_size=8))
    elif what == "drop_node":
        del g.node[draw(st.integers(0, len(g.node) - 1))]
    elif what == "dup_node":
        g.node.append(g.node[draw(st.integers(0, len(g.node) - 1))])
    elif what == "init_dims":
        t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
        t.dims[:] = draw(st.lists(st.integers(-1, 9), max_size=4))
    elif what == "attr":
        attrs = [a for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.INTS]  # e.g. Conv's pads
        if attrs:
            attrs[draw(st.integers(0, len(attrs) - 1))].ints[:] = draw(st.lists(st.integers(-3, 9), max_size=5))
    else:
        g.output[0].name = draw(st.text(max_size=6))


@settings(max_examples=250, **SETTINGS)
@given(data=mutated_model_bytes(), command=st.sampled_from(["quantize", "debug"]))
@example(data=FLOAT_BYTES[:100], command="quantize")
# found by this test: a node name that is not UTF-8 came back from the proto parser as bytes (exit 1, TypeError)
@example(data=FLOAT_BYTES.replace(b"conv2", b"\x80onv2"), command="debug")
@example(data=FLOAT_BYTES.replace(b"conv2", b"\x80onv2"), command="quantize")
def test_fuzz_model(base: Path, data: bytes, command: str) -> None:
    with _workspace(base) as d:
        bad = d / "bad.onnx"
        bad.write_bytes(data)
        if command == "quantize":
            argv: list[str | Path] = ["quantize", "-f", bad, "--samples", "2", "-o", d / "out.onnx"]
            code = _run(argv, d, ("out.onnx", "out.calib.json"))
        else:
            code = _run(["debug", "-f", bad, "-q", d / "q.onnx", "--samples", "2"], d, ())
        event(f"{command} exit {code}")


@settings(max_examples=100, **SETTINGS)
@given(data=st.data())
def test_fuzz_quantized_model(base: Path, data: st.DataObject) -> None:
    """The same mutations on the QDQ model (debug's -q)."""
    with _workspace(base) as d:
        bad = d / "bad.qdq.onnx"
        bad.write_bytes(_mutate_bytes((d / "q.onnx").read_bytes(), data.draw))
        event(f"exit {_run(['debug', '-f', d / 'f.onnx', '-q', bad, '--samples', '2'], d, ())}")


def test_a_quantized_constant_of_undefined_type_is_a_model_error(base: Path) -> None:
    """Found by test_fuzz_quantized_model: an initializer of element type 0 (UNDEFINED) in the QDQ model made onnx's
    decoder raise TypeError while pairing (exit 1)."""
    with _workspace(base) as d:
        q = onnx.load(str(d / "q.onnx"))
        q.graph.initializer[0].data_type = 0
        bad = d / "bad.qdq.onnx"
        bad.write_bytes(q.SerializeToString())
        assert _run(["debug", "-f", d / "f.onnx", "-q", bad, "--samples", "2"], d, ()) == 4


# ---------------------------------------------------------------------------------------------- (b) .npz data
def _npz_bytes(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


GOOD_NPZ = _npz_bytes(x=GOOD_X)

dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.bool_])
arrays = hnp.arrays(dtype=dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=6))


@st.composite
def mutated_npz(draw: st.DrawFn) -> bytes:
    """Valid npz bytes truncated or flipped, a zip with odd members, or well-formed arrays of the wrong kind."""
    kind = draw(st.sampled_from(["truncate", "flip", "member", "arrays", "arrays", "object"]))
    if kind == "truncate":
        return GOOD_NPZ[: draw(st.integers(0, len(GOOD_NPZ) - 1))]
    if kind == "flip":
        data = bytearray(GOOD_NPZ)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "member":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(draw(st.sampled_from(["x.npy", "x", "y.npy", "x.npy/"])), draw(st.binary(max_size=200)))
        return buf.getvalue()
    if kind == "object":
        return _npz_bytes(x=np.array([draw(st.text(max_size=3)), 1], dtype=object))
    names = draw(st.lists(st.sampled_from(["x", "y", "label", "x.npy"]), min_size=1, max_size=3, unique=True))
    return _npz_bytes(**{n: draw(arrays) for n in names})


@settings(max_examples=250, **SETTINGS)
@given(data=mutated_npz(), command=st.sampled_from(["quantize", "debug"]))
@example(data=_npz_bytes(x=GOOD_X.astype(np.float64)), command="debug")
def test_fuzz_npz(base: Path, data: bytes, command: str) -> None:
    with _workspace(base) as d:
        bad = d / "bad.npz"
        bad.write_bytes(data)
        if command == "quantize":
            argv: list[str | Path] = ["quantize", "-f", d / "f.onnx", "--calib", bad, "-o", d / "out.onnx"]
            code = _run(argv, d, ("out.onnx", "out.calib.json"))
        else:
            code = _run(["debug", "-f", d / "f.onnx", "-q", d / "q.onnx", "-d", bad], d, ())
        event(f"{command} exit {code}")


# ---------------------------------------------------------------------------------------------- (c) JSON
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
CONFIG_KEYS = ["activation_type", "weight_type", "per_channel", "activation_symmetric", "weight_symmetric",
               "calibration_method", "num_samples", "seed", "synthetic_distribution", "target",
               "tensor_overrides"]  # fmt: skip
GOOD_VALUES: dict[str, Any] = {"activation_type": "uint8", "weight_type": "int8", "per_channel": True,
                               "calibration_method": "minmax", "num_samples": 2, "target": "cpu"}  # fmt: skip


@st.composite
def config_json(draw: st.DrawFn) -> bytes:
    """A config object whose keys get random JSON values (or good ones), or any JSON document, or broken text."""
    kind = draw(st.sampled_from(["object", "object", "object", "any", "text"]))
    if kind == "text":
        return draw(st.binary(max_size=40))
    if kind == "any":
        return json.dumps(draw(json_values)).encode()
    keys = draw(st.lists(st.sampled_from([*CONFIG_KEYS, "bogus"]), max_size=4, unique=True))
    doc = {k: draw(st.just(GOOD_VALUES[k]) if k in GOOD_VALUES and draw(st.booleans()) else json_values) for k in keys}
    return json.dumps(doc).encode()


OVERRIDE_KEYS = ["quant_type", "scale", "zero_point", "symmetric", "reduce_range", "rmax", "rmin", "axis",
                 "convert", "bogus"]  # fmt: skip


@st.composite
def overrides_json(draw: st.DrawFn) -> bytes:
    """An overrides file with random values at every level: the envelope, the tensor map, the entries, convert."""
    level = draw(st.sampled_from(["envelope", "tensors", "entry", "entry", "convert"]))
    tensor = draw(st.sampled_from(["r1", "c1", "x", "w1", "nope"]))
    entry: Any = {"quant_type": "QUInt16"}
    if level == "entry":
        entry = {k: draw(json_values) for k in draw(st.lists(st.sampled_from(OVERRIDE_KEYS), max_size=3, unique=True))}
    elif level == "convert":
        entry = {"quant_type": "QUInt8", "convert": draw(json_values | st.just({"quant_type": "QUInt16",
                                                                                "recv_nodes": ["conv2"]}))}  # fmt: skip
    tensors: Any = {tensor: [entry]} if level != "tensors" else draw(json_values)
    doc: Any = {"schema_version": 1, "tensor_quant_overrides": tensors}
    if level == "envelope":
        doc = {k: draw(json_values) for k in draw(st.lists(st.sampled_from(
            ["schema_version", "tensor_quant_overrides", "model_sha256", "base_config", "requested", "note"]),
            max_size=4, unique=True))}  # fmt: skip
    return json.dumps(doc).encode()


#: How each command reads a config (``{cfg}``) and what a success may write into the folder.
CONFIG_COMMANDS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "quantize": (["quantize", "-f", "{f}", "--calib", "{calib}", "-c", "{cfg}", "-o", "{d}/out.onnx"],
                 ("out.onnx", "out.calib.json")),
    "suggest": (["suggest", "-f", "{f}", "-q", "{q}", "--samples", "2", "-c", "{cfg}", "--promote-top", "1"], ()),
    "build": (["build", "-f", "{f}", "--calib", "{calib}", "--target", "cpu", "--precision", "uint8", "-c", "{cfg}",
               "--debug-samples", "2", "-o", "{d}/b"], ("b",)),
}  # fmt: skip


@settings(max_examples=200, **SETTINGS)
@given(data=config_json(), command=st.sampled_from(list(CONFIG_COMMANDS)))
@example(data=b'{"per_channel": "no"}', command="quantize")
def test_fuzz_config_json(base: Path, data: bytes, command: str) -> None:
    with _workspace(base) as d:
        cfg = d / "cfg.json"
        cfg.write_bytes(data)
        argv, outputs = CONFIG_COMMANDS[command]
        subs = {"f": d / "f.onnx", "q": d / "q.onnx", "calib": d / "calib.npz", "cfg": cfg, "d": d}
        event(f"{command} exit {_run([a.format(**subs) for a in argv], d, outputs)}")  # --hypothesis-show-statistics


@settings(max_examples=200, **SETTINGS)
@given(data=overrides_json())
# found by this test: a tensor name holding a carriage return split the error over two lines
@example(data=b'{"schema_version": 1, "tensor_quant_overrides": {"\\r": null}}')
def test_fuzz_overrides_json(base: Path, data: bytes) -> None:
    with _workspace(base) as d:
        ovr = d / "o.json"
        ovr.write_bytes(data)
        argv: list[str | Path] = ["quantize", "-f", d / "f.onnx", "--calib", d / "calib.npz", "--overrides", ovr]
        event(f"exit {_run([*argv, '-o', d / 'out.onnx'], d, ('out.onnx', 'out.calib.json'))}")
