"""The bad-input corpus: every kind of bad input a user can hand qdebug, through every command that reads it.

Each case is one input defect × one command, run in-process through ``qdebug.cli.main`` and checked for the same
things: the documented exit code, exactly one line on stderr (no traceback), the culprit (the file, tensor or flag)
named, every input byte-identical afterwards, and nothing left behind in the folder (no output, no temp file, no
``.calib.json``, no folder). Everything is refused before a model is compiled, so no QNN/Deeploy is needed.

The corpus is a table (:data:`CASES`) built from four lists: the defects of a model file, of a quantized model, of
data, of a JSON config or overrides file; the commands and option that read each; the output-guard cases (an output
that is an input, by path and by hard link) and the usage errors. See docs/testing.md.
"""

from __future__ import annotations

import io
import os
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import CliResult, tree_hashes
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from qdebug.config import QuantConfig
from qdebug.errors import EXIT_DATA, EXIT_INPUT_FILE, EXIT_MODEL, EXIT_USAGE

SHAPE = (1, 1, 6, 6)
X = np.random.default_rng(0).random((3, *SHAPE)).astype(np.float32)

#: A file maker: writes the bad input into the case's folder (given the good assets) and returns its path.
Maker = Callable[[Path], Path]


@dataclass(frozen=True)
class Case:
    """One corpus entry: ``argv`` with ``{placeholders}`` (``{bad}`` is what ``make`` wrote, ``{out}`` a folder that
    must not appear), the exit code, and the culprits the one-line message must name."""

    id: str
    argv: tuple[str, ...]
    code: int
    needles: tuple[str, ...]
    make: Maker | None = None


# ---------------------------------------------------------------------------------------------- the assets
def _float(d: Path) -> Path:
    return d / "f.onnx"


def _load_float(d: Path) -> onnx.ModelProto:
    return onnx.load(str(_float(d)))


def _load_quant(d: Path, name: str = "q.onnx") -> onnx.ModelProto:
    return onnx.load(str(d / name))


def _write(d: Path, name: str, data: bytes) -> Path:
    p = d / name
    p.write_bytes(data)
    return p


def _save(d: Path, name: str, m: onnx.ModelProto) -> Path:
    # SerializeToString, not onnx.save: onnx.save checks nothing, but be explicit that the bytes are what we built
    return _write(d, name, m.SerializeToString())


# ---------------------------------------------------------------------------------------------- model file defects
def _mutated(name: str, mutate: Callable[[onnx.ModelProto], None], quant: str | None = None) -> Maker:
    def make(d: Path) -> Path:
        m = _load_quant(d, quant) if quant else _load_float(d)
        mutate(m)
        return _save(d, name, m)

    return make


def _ir99(m: onnx.ModelProto) -> None:
    m.ir_version = 99


def _opset99(m: onnx.ModelProto) -> None:
    next(o for o in m.opset_import if o.domain in ("", "ai.onnx")).version = 99


def _custom_op(m: onnx.ModelProto) -> None:
    m.graph.node.append(helper.make_node("Frobnicate", [m.graph.input[0].name], ["extra"], domain="my.custom"))
    m.opset_import.append(helper.make_opsetid("my.custom", 1))


def _cycle(m: onnx.ModelProto) -> None:
    m.graph.node[0].input[0] = m.graph.node[-1].output[0]


def _two_writers(m: onnx.ModelProto) -> None:
    n = m.graph.node[0]
    m.graph.node.append(helper.make_node("Identity", [n.input[0]], [n.output[0]], name="second_writer"))


def _short_raw(m: onnx.ModelProto) -> None:
    t = max(m.graph.initializer, key=lambda t: len(t.raw_data))
    t.raw_data = t.raw_data[: len(t.raw_data) // 2]


def _unknown_op(m: onnx.ModelProto) -> None:
    m.graph.node[1].op_type = "NoSuchOp"


def _no_outputs(m: onnx.ModelProto) -> None:
    del m.graph.output[:]


def _dangling_input(m: onnx.ModelProto) -> None:
    m.graph.node[1].input[0] = "nothing_writes_this"


def _bad_elem_type(m: onnx.ModelProto) -> None:
    m.graph.initializer[0].data_type = 999


def _external_missing(d: Path) -> Path:
    folder = d / "ext"
    folder.mkdir()
    p = folder / "model.onnx"
    onnx.save(_load_float(d), str(p), save_as_external_data=True, location="weights.bin", size_threshold=0)
    (folder / "weights.bin").unlink()
    return p


def _truncated(d: Path) -> Path:
    data = _float(d).read_bytes()
    return _write(d, "truncated.onnx", data[: len(data) // 3])


def _random_bytes(d: Path) -> Path:
    return _write(d, "random.onnx", np.random.default_rng(1).bytes(3000))


def _text(d: Path) -> Path:
    return _write(d, "notes.onnx", b"this is not an ONNX model\n")


def _empty(d: Path) -> Path:
    return _write(d, "empty.onnx", b"")


def _missing(d: Path) -> Path:
    return d / "does_not_exist.onnx"


def _folder(d: Path) -> Path:
    p = d / "a_folder.onnx"
    p.mkdir()
    return p


def _npz_as_model(d: Path) -> Path:
    buf = io.BytesIO()
    np.savez(buf, x=X)
    return _write(d, "data_not_model.onnx", buf.getvalue())


def _quant_as_float(d: Path) -> Path:
    return _save(d, "already_quantized.onnx", _load_quant(d))


#: (id, maker, exit code, extra words the message must hold)
MODEL_FILE_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("random-bytes", _random_bytes, EXIT_INPUT_FILE, ()),
    ("text", _text, EXIT_INPUT_FILE, ()),
    ("empty-file", _empty, EXIT_INPUT_FILE, ()),
    ("missing", _missing, EXIT_INPUT_FILE, ()),
    ("a-folder", _folder, EXIT_INPUT_FILE, ()),
    ("truncated", _truncated, EXIT_INPUT_FILE, ()),
    ("npz-named-onnx", _npz_as_model, EXIT_INPUT_FILE, ()),
    ("external-data-missing", _external_missing, EXIT_INPUT_FILE, ("external data",)),
    (
        "non-utf8-node-name",
        lambda d: _write(d, "latin1_name.onnx", _float(d).read_bytes().replace(b"conv2", b"\xe9onv2")),
        EXIT_INPUT_FILE,
        ("node[2].name", "UTF-8"),
    ),
]
MODEL_GRAPH_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("ir-version-99", _mutated("ir99.onnx", _ir99), EXIT_MODEL, ("IR version",)),
    ("opset-99", _mutated("opset99.onnx", _opset99), EXIT_MODEL, ()),
    ("custom-domain-op", _mutated("custom.onnx", _custom_op), EXIT_MODEL, ("Frobnicate",)),
    ("unknown-op", _mutated("unknown_op.onnx", _unknown_op), EXIT_MODEL, ("NoSuchOp",)),
    ("cycle", _mutated("cycle.onnx", _cycle), EXIT_MODEL, ()),
    ("two-writers", _mutated("two_writers.onnx", _two_writers), EXIT_MODEL, ()),
    ("short-raw-data", _mutated("short_raw.onnx", _short_raw), EXIT_MODEL, ()),
    ("dangling-input", _mutated("dangling.onnx", _dangling_input), EXIT_MODEL, ()),
    ("bad-element-type", _mutated("elem999.onnx", _bad_elem_type), EXIT_MODEL, ()),
    ("no-graph-outputs", _mutated("no_outputs.onnx", _no_outputs), EXIT_MODEL, ("no outputs",)),
    ("already-quantized", _quant_as_float, EXIT_MODEL, ("already quantized",)),
    ("missing-non-utf8-name", lambda d: Path(os.fsdecode(bytes(d) + b"/\xff\xfe.onnx")), EXIT_INPUT_FILE, ()),
]

#: The commands that read a float model, with ``{bad}`` where it goes.
FLOAT_COMMANDS: dict[str, tuple[str, ...]] = {
    "quantize": ("quantize", "-f", "{bad}", "--samples", "2", "-o", "{out}/q.onnx"),
    "debug": ("debug", "-f", "{bad}", "-q", "{q}", "--samples", "2"),
    "suggest": ("suggest", "-f", "{bad}", "-q", "{q}", "--samples", "2"),
    "search": ("search", "-f", "{bad}", "--debug-samples", "2", "--goal-sqnr", "30", "-o", "{out}/o.json"),
    "build": ("build", "-f", "{bad}", "--target", "cpu", "--precision", "uint8", "-o", "{out}/b"),
}


# ---------------------------------------------------------------------------------------------- quantized model
def _zero_point_shape(m: onnx.ModelProto) -> None:
    zp = next(t for t in m.graph.initializer if t.name == "x_zero_point")
    v = numpy_helper.to_array(zp)
    zp.CopyFrom(numpy_helper.from_array(np.array([v, v], dtype=v.dtype), zp.name))


def _axis_out_of_range(m: onnx.ModelProto) -> None:
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute))
    next(a for a in dq.attribute if a.name == "axis").i = 5


def _undefined_dtype(m: onnx.ModelProto) -> None:
    m.graph.initializer[0].data_type = 0


def _no_qdq(m: onnx.ModelProto) -> None:
    m.CopyFrom(builders.tiny_convnet())


def _other_io(m: onnx.ModelProto) -> None:
    _, q, _ = builders.matmul_constant_weight()
    m.CopyFrom(q)


QUANT_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    *MODEL_FILE_DEFECTS[:6],
    ("ir-version-99", _mutated("q_ir99.onnx", _ir99, "q.onnx"), EXIT_MODEL, ("IR version",)),
    ("cycle", _mutated("q_cycle.onnx", _cycle, "q.onnx"), EXIT_MODEL, ("cycle",)),
    ("zero-point-shape", _mutated("q_zp.onnx", _zero_point_shape, "q.onnx"), EXIT_MODEL, ("x_zero_point",)),
    ("axis-out-of-range", _mutated("q_axis.onnx", _axis_out_of_range, "qpc.onnx"), EXIT_MODEL, ("axis",)),
    ("float-model-as-quant", _mutated("not_quantized.onnx", _no_qdq, "q.onnx"), EXIT_MODEL, ("no QuantizeLinear",)),
    ("other-inputs", _mutated("other_io.onnx", _other_io, "q.onnx"), EXIT_MODEL, ("do not correspond",)),
    ("other-graph", lambda d: d / "other.qdq.onnx", EXIT_MODEL, ("do not correspond",)),
    ("dynamic-quantization", lambda d: d / "dynamic.onnx", EXIT_MODEL, ("dynamically quantized",)),
    ("no-graph-outputs", _mutated("q_no_outputs.onnx", _no_outputs, "q.onnx"), EXIT_MODEL, ("no outputs",)),
    (
        "undefined-dtype-constant",
        _mutated("q_dtype0.onnx", _undefined_dtype, "q.onnx"),
        EXIT_MODEL,
        ("cannot be decoded",),
    ),
]
QUANT_COMMANDS: dict[str, tuple[str, ...]] = {
    "debug": ("debug", "-f", "{f}", "-q", "{bad}", "--samples", "2"),
    "suggest": ("suggest", "-f", "{f}", "-q", "{bad}", "--samples", "2"),
}


# ---------------------------------------------------------------------------------------------- data
def _npz(name: str, **arrays: np.ndarray) -> Maker:
    def make(d: Path) -> Path:
        p = d / name
        np.savez(p, **arrays)  # type: ignore[arg-type]
        return p

    return make


def _with_nan() -> np.ndarray:
    x = X.copy()
    x[1, 0, 0, 2, 2] = np.nan
    return x


def _zip_member(name: str, member: str, data: bytes) -> Maker:
    def make(d: Path) -> Path:
        p = d / name
        with zipfile.ZipFile(p, "w") as z:
            z.writestr(member, data)
        return p

    return make


def _huge_header() -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**13, 1, 6, 6)})
    return buf.getvalue() + b"\0" * 64


def _bare_npy(d: Path) -> Path:
    p = d / "bare.npz"
    with open(p, "wb") as fh:
        np.save(fh, X)
    return p


def _empty_folder(d: Path) -> Path:
    p = d / "no_npz_here"
    p.mkdir()
    (p / "readme.txt").write_text("no data\n")
    return p


def _folder_named(d: Path, name: str) -> Path:
    p = d / name
    p.mkdir()
    return p


def _patched_zip(name: str, local: tuple[int, bytes], central: tuple[int, bytes]) -> Maker:
    """A valid npz whose member headers say something zipfile cannot read (encrypted, deflate64)."""

    def make(d: Path) -> Path:
        data = bytearray(_npz_bytes_of(X))
        for sig, (offset, value) in ((b"PK\x03\x04", local), (b"PK\x01\x02", central)):
            at = data.index(sig) + offset
            data[at : at + len(value)] = value
        return _write(d, name, bytes(data))

    return make


def _npz_bytes_of(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=x)
    return buf.getvalue()


def _truncated_npz(d: Path) -> Path:
    buf = io.BytesIO()
    np.savez(buf, x=X)
    return _write(d, "truncated.npz", buf.getvalue()[:200])


DATA_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("missing-input", _npz("missing_input.npz", image=X), EXIT_DATA, ("'x'",)),
    ("float64", _npz("float64.npz", x=X.astype(np.float64)), EXIT_DATA, ("float64",)),
    ("wrong-shape", _npz("wrong_shape.npz", x=X[..., :5]), EXIT_DATA, ("'x'",)),
    ("wrong-rank", _npz("wrong_rank.npz", x=X[:, 0, 0]), EXIT_DATA, ("'x'",)),
    ("nan", _npz("nan.npz", x=_with_nan()), EXIT_DATA, ("NaN",)),
    ("object-array", _npz("pickled.npz", x=np.array([X[0], "text"], dtype=object)), EXIT_DATA, ("pickled",)),
    ("no-samples", _npz("empty.npz", x=X[:0]), EXIT_DATA, ("no samples",)),
    ("int-for-float", _npz("ints.npz", x=(X * 10).astype(np.int32)), EXIT_DATA, ("'x'",)),
    ("empty-folder", _empty_folder, EXIT_DATA, ("no .npz",)),
    ("missing-file", lambda d: d / "nope.npz", EXIT_INPUT_FILE, ()),
    ("random-bytes", lambda d: _write(d, "random.npz", np.random.default_rng(3).bytes(500)), EXIT_INPUT_FILE, ()),
    ("corrupt-zip", lambda d: _write(d, "corrupt.npz", b"PK\x03\x04" + bytes(200)), EXIT_INPUT_FILE, ()),
    ("truncated-zip", _truncated_npz, EXIT_INPUT_FILE, ()),
    ("bare-npy", _bare_npy, EXIT_INPUT_FILE, ()),
    ("member-not-array", _zip_member("not_array.npz", "x.npy", b"hello, not an array"), EXIT_INPUT_FILE, ()),
    ("huge-header", _zip_member("huge.npz", "x.npy", _huge_header()), EXIT_INPUT_FILE, ()),
    ("text-file", lambda d: _write(d, "notes.npz", b"a,b\n1,2\n"), EXIT_INPUT_FILE, ()),
    ("encrypted-member", _patched_zip("encrypted.npz", (6, b"\x01\x00"), (8, b"\x01\x00")), EXIT_INPUT_FILE, ()),
    ("deflate64-member", _patched_zip("deflate64.npz", (8, b"\x09\x00"), (10, b"\x09\x00")), EXIT_INPUT_FILE, ()),
    ("a-folder-named-npz", lambda d: _folder_named(d, "folder.npz"), EXIT_DATA, ()),
]
DATA_COMMANDS: dict[str, tuple[str, ...]] = {
    "quantize-calib": ("quantize", "-f", "{f}", "--calib", "{bad}", "-o", "{out}/q.onnx"),
    "debug-data": ("debug", "-f", "{f}", "-q", "{q}", "-d", "{bad}"),
    "suggest-data": ("suggest", "-f", "{f}", "-q", "{q}", "-d", "{bad}"),
    "search-calib": ("search", "-f", "{f}", "--calib", "{bad}", "--goal-sqnr", "30", "-o", "{out}/o.json"),
    "build-calib": ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib", "{bad}",
                    "-o", "{out}/b"),
    "search-data": ("search", "-f", "{f}", "--calib", "{calib}", "-d", "{bad}", "--goal-sqnr", "30",
                    "-o", "{out}/o.json"),
    "build-data": ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib", "{calib}",
                   "-d", "{bad}", "-o", "{out}/b"),
}  # fmt: skip

#: Calibration data the model cannot be quantized from (they fit the model, so only calibration can tell).
CALIB_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("overflow", _npz("big.npz", x=np.full((4, *SHAPE), 3e38, np.float32)), EXIT_DATA, ("non-finite",)),
    ("all-inf", _npz("inf.npz", x=np.full((4, *SHAPE), np.inf, np.float32)), EXIT_DATA, ()),
]
CALIB_COMMANDS = {k: v for k, v in DATA_COMMANDS.items() if k.endswith("-calib")}


# ---------------------------------------------------------------------------------------------- JSON files
def _json(name: str, data: bytes) -> Maker:
    return lambda d: _write(d, name, data)


CONFIG_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("list", _json("list.json", b"[1, 2]"), EXIT_USAGE, ("JSON object",)),
    ("string-for-bool", _json("bool.json", b'{"per_channel": "no"}'), EXIT_USAGE, ("per_channel",)),
    ("list-valued", _json("listval.json", b'{"activation_type": ["uint8"]}'), EXIT_USAGE, ("activation_type",)),
    ("bad-type-name", _json("type.json", b'{"activation_type": "uint7"}'), EXIT_USAGE, ("uint7",)),
    ("float-count", _json("float.json", b'{"num_samples": 2.5}'), EXIT_USAGE, ("num_samples",)),
    ("non-utf8", _json("latin1.json", b"\xff\xfe\x00{"), EXIT_INPUT_FILE, ("UTF-8",)),
    ("syntax-error", _json("syntax.json", b'{"activation_type": '), EXIT_USAGE, ("not valid JSON",)),
    ("missing", lambda d: d / "nope.json", EXIT_INPUT_FILE, ()),
]
CONFIG_COMMANDS: dict[str, tuple[str, ...]] = {
    "quantize": ("quantize", "-f", "{f}", "--samples", "2", "-c", "{bad}", "-o", "{out}/q.onnx"),
    # --config is the base of a promotion: without --promote-top it has no effect and is refused as such
    "suggest": ("suggest", "-f", "{f}", "-q", "{q}", "--samples", "2", "-c", "{bad}", "--promote-top", "1"),
    "search": ("search", "-f", "{f}", "-c", "{bad}", "--goal-sqnr", "30", "-o", "{out}/o.json"),
    "build": ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "-c", "{bad}", "-o", "{out}/b"),
}


def _overrides(tensor_quant_overrides: bytes) -> bytes:
    return b'{"schema_version": 1, "tensor_quant_overrides": ' + tensor_quant_overrides + b"}"


OVERRIDES_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("list", _json("o_list.json", b"[]"), EXIT_USAGE, ()),
    ("unknown-tensor", _json("o_unknown.json", _overrides(b'{"nope": [{"quant_type": "uint16"}]}')), EXIT_USAGE,
     ("nope",)),
    ("bad-quant-type", _json("o_type.json", _overrides(b'{"r1": [{"quant_type": "uint7"}]}')), EXIT_USAGE,
     ("uint7",)),
    ("entries-not-a-list", _json("o_dict.json", _overrides(b'{"r1": {"quant_type": "uint16"}}')), EXIT_USAGE,
     ("r1",)),
    ("overrides-not-object", _json("o_str.json", _overrides(b'"r1"')), EXIT_USAGE, ()),
    ("schema-version-2", _json("o_v2.json", b'{"schema_version": 2, "tensor_quant_overrides": {}}'), EXIT_USAGE,
     ("schema_version",)),
    ("newline-in-tensor-name", _json("o_newline.json", _overrides(b'{"a\\nb": null}')), EXIT_USAGE, ("a\\nb",)),
    ("no-overrides-key", _json("o_v1.json", b'{"schema_version": 1}'), EXIT_USAGE, ("tensor_quant_overrides",)),
    ("non-utf8", _json("o_latin1.json", b"\xff\xfe\x00{"), EXIT_INPUT_FILE, ()),
    ("syntax-error", _json("o_syntax.json", b"{"), EXIT_USAGE, ("not valid JSON",)),
    ("missing", lambda d: d / "o_nope.json", EXIT_INPUT_FILE, ()),
]  # fmt: skip
OVERRIDES_COMMANDS: dict[str, tuple[str, ...]] = {
    "quantize": ("quantize", "-f", "{f}", "--samples", "2", "--overrides", "{bad}", "-o", "{out}/q.onnx"),
    "build": ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--overrides", "{bad}",
              "-o", "{out}/b"),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- output = input
#: per command: the options that read a file (placeholder) and the output option with its suffix.
GUARD: dict[str, tuple[tuple[str, ...], dict[str, str], str]] = {
    "quantize": (("quantize", "--samples", "2"), {"-f": "f", "--calib": "calib", "-c": "cfg", "--overrides": "ovr"},
                 "-o"),
    "debug": (("debug",), {"-f": "f", "-q": "q", "-d": "calib"}, "-o"),
    "suggest": (("suggest", "--promote-top", "1"), {"-f": "f", "-q": "q", "-d": "calib", "-c": "cfg"},
                "--overrides-out"),
    "search": (("search", "--goal-sqnr", "30"), {"-f": "f", "--calib": "calib", "-d": "calib2", "-c": "cfg",
                                                  "--eval": "evalz"}, "-o"),
    "build": (("build", "--target", "cpu", "--precision", "uint8"), {"-f": "f", "--calib": "calib", "-d": "calib2",
                                                                      "-c": "cfg", "--overrides": "ovr"}, "-o"),
}  # fmt: skip


def _guard_cases() -> list[Case]:
    cases = []
    for cmd, (head, reads, out_flag) in GUARD.items():
        base = [*head]
        for flag, name in reads.items():
            base += [flag, "{" + name + "}"]
        for flag, name in reads.items():
            argv = (*base, out_flag, "{" + name + "}")
            cases.append(Case(f"{cmd}-output-is-{flag.lstrip('-')}", argv, EXIT_USAGE, ("{" + name + "}", "overwrite")))
            link = (*base, out_flag, "{dir}/hardlink_" + name)
            cases.append(Case(f"{cmd}-output-hardlinks-{flag.lstrip('-')}", link, EXIT_USAGE, ("overwrite",)))
        cases.append(Case(f"{cmd}-output-under-a-file", (*base, out_flag, "{calib}/x"), EXIT_USAGE, ("is a file",)))
        cases.append(Case(f"{cmd}-output-name-256", (*base, out_flag, "{dir}/" + "n" * 256), EXIT_USAGE, ("255",)))
        if cmd != "build":
            cases.append(Case(f"{cmd}-output-is-a-folder", (*base, out_flag, "{dir}"), EXIT_USAGE, ("is a folder",)))
    return cases


# ---------------------------------------------------------------------------------------------- usage
USAGE: list[tuple[str, tuple[str, ...], str]] = [
    ("no-command", (), "required"),
    ("unknown-command", ("frobnicate",), "frobnicate"),
    ("quantize-bogus-flag", ("quantize", "-f", "{f}", "-o", "{out}/q.onnx", "--bogus"), "--bogus"),
    ("quantize-no-output", ("quantize", "-f", "{f}"), "--output"),
    ("quantize-no-model", ("quantize", "-o", "{out}/q.onnx"), "--float-model"),
    ("quantize-bad-type", ("quantize", "-f", "{f}", "-o", "{out}/q.onnx", "--activation-type", "uint7"), "uint7"),
    ("quantize-samples-text", ("quantize", "-f", "{f}", "-o", "{out}/q.onnx", "--samples", "many"), "many"),
    ("quantize-samples-zero", ("quantize", "-f", "{f}", "-o", "{out}/q.onnx", "--samples", "0"), "samples"),
    ("quantize-bad-shape", ("quantize", "-f", "{f}", "-o", "{out}/q.onnx", "--input-shape", "x"), "NAME:D0"),
    ("quantize-bad-target", ("quantize", "-f", "{f}", "-o", "{out}/q.onnx", "--target", "tpu"), "tpu"),
    ("debug-bogus-flag", ("debug", "-f", "{f}", "-q", "{q}", "--bogus"), "--bogus"),
    ("debug-no-quant", ("debug", "-f", "{f}"), "--quant-model"),
    ("debug-bad-capture", ("debug", "-f", "{f}", "-q", "{q}", "--capture", "gpu"), "gpu"),
    ("debug-fail-below-nan", ("debug", "-f", "{f}", "-q", "{q}", "--fail-below", "nan"), "finite"),
    ("debug-fail-below-inf", ("debug", "-f", "{f}", "-q", "{q}", "--fail-below", "inf"), "finite"),
    ("debug-top-zero", ("debug", "-f", "{f}", "-q", "{q}", "--top", "0"), "positive"),
    ("debug-data-and-samples", ("debug", "-f", "{f}", "-q", "{q}", "-d", "{calib}", "--samples", "2"), "--samples"),
    ("debug-samples-negative", ("debug", "-f", "{f}", "-q", "{q}", "--samples", "-3"), "samples"),
    ("suggest-bogus-flag", ("suggest", "-f", "{f}", "-q", "{q}", "--bogus"), "--bogus"),
    ("suggest-promote-negative", ("suggest", "-f", "{f}", "-q", "{q}", "--promote-top", "-2"), "promote-top"),
    ("suggest-no-model", ("suggest", "-q", "{q}"), "--float-model"),
    ("search-no-goal", ("search", "-f", "{f}", "-o", "{out}/o.json"), "goal"),
    ("search-goal-nan", ("search", "-f", "{f}", "-o", "{out}/o.json", "--goal-sqnr", "nan"), "finite"),
    ("search-drop-inf", ("search", "-f", "{f}", "-o", "{out}/o.json", "--max-accuracy-drop", "inf"), "finite"),
    ("search-bad-strategy", ("search", "-f", "{f}", "-o", "{out}/o.json", "--goal-sqnr", "30", "--strategy", "x"),
     "strategy"),
    ("search-no-output", ("search", "-f", "{f}", "--goal-sqnr", "30"), "--output"),
    ("search-drop-without-eval", ("search", "-f", "{f}", "-o", "{out}/o.json", "--max-accuracy-drop", "1"), "--eval"),
    ("build-bogus-flag", ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "-o", "{out}/b", "--x"),
     "--x"),
    ("build-no-target", ("build", "-f", "{f}", "--precision", "uint8", "-o", "{out}/b"), "--target"),
    ("build-bad-precision", ("build", "-f", "{f}", "--target", "cpu", "--precision", "int3", "-o", "{out}/b"),
     "int3"),
    ("build-bad-target", ("build", "-f", "{f}", "--target", "tpu", "--precision", "uint8", "-o", "{out}/b"), "tpu"),
    ("build-debug-samples-zero", ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "-o", "{out}/b",
                                  "--debug-samples", "0"), "debug_samples"),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------- the table
def _cases() -> list[Case]:
    cases: list[Case] = []
    tables = [
        ("model", MODEL_FILE_DEFECTS + MODEL_GRAPH_DEFECTS, FLOAT_COMMANDS),
        ("quant", QUANT_DEFECTS, QUANT_COMMANDS),
        ("data", DATA_DEFECTS, DATA_COMMANDS),
        ("calib", CALIB_DEFECTS, CALIB_COMMANDS),
        ("config", CONFIG_DEFECTS, CONFIG_COMMANDS),
        ("overrides", OVERRIDES_DEFECTS, OVERRIDES_COMMANDS),
    ]
    for kind, defects, commands in tables:
        for defect, make, code, words in defects:
            for command, argv in commands.items():
                cases.append(Case(f"{kind}-{defect}-{command}", argv, code, ("{bad}", *words), make))
    cases += _guard_cases()
    cases += [Case(f"usage-{name}", argv, EXIT_USAGE, (needle,)) for name, argv, needle in USAGE]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory, tiny_float: Path, tiny_quant) -> Path:
    """The good files every case starts from (copied into each case's folder)."""
    d = tmp_path_factory.mktemp("corpus_assets")
    shutil.copy(tiny_float, d / "f.onnx")
    shutil.copy(tiny_quant("u8"), d / "q.onnx")
    shutil.copy(tiny_quant("s8_per_channel"), d / "qpc.onnx")
    np.savez(d / "calib.npz", x=X)
    np.savez(d / "calib2.npz", x=X[:2])
    np.savez(d / "evalz.npz", x=X, label=np.array([0, 1, 2]))
    (d / "cfg.json").write_text('{"activation_type": "uint8"}')
    other = d / "other_f.onnx"
    onnx.save(builders.other_convnet(), str(other))
    quantize(other, None, QuantConfig(num_samples=4), d / "other.qdq.onnx")
    other.unlink()
    (d / "other.qdq.calib.json").unlink()
    quantize_dynamic(str(d / "f.onnx"), str(d / "dynamic.onnx"), weight_type=QuantType.QUInt8)
    (d / "ovr.json").write_bytes(_overrides(b'{"r1": [{"quant_type": "uint8"}]}'))
    return d


from qdebug.quantizer import quantize  # noqa: E402  (after the fixtures it serves, with the other heavy import)


def _assert_one_line(r: CliResult, code: int, needles: list[str]) -> None:
    assert r.code == code, (r.code, r.stderr)
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr, r.stderr
    assert err and err.count("\n") == 0, err
    assert err.startswith("qdebug") and "error:" in err, err
    for n in needles:  # a name that is not UTF-8 is printed escaped
        assert n.encode("utf-8", "backslashreplace").decode() in err, (n, err)


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, assets: Path, tmp_path: Path, run_cli) -> None:
    d = tmp_path
    for p in assets.iterdir():
        shutil.copy(p, d / p.name)
    for name in ("f", "calib", "cfg", "ovr", "q", "calib2", "evalz"):
        src = d / ({"f": "f.onnx", "q": "q.onnx", "cfg": "cfg.json", "ovr": "ovr.json"}.get(name, f"{name}.npz"))
        os.link(src, d / f"hardlink_{name}")
    subs = {
        "f": str(d / "f.onnx"),
        "q": str(d / "q.onnx"),
        "calib": str(d / "calib.npz"),
        "calib2": str(d / "calib2.npz"),
        "evalz": str(d / "evalz.npz"),
        "cfg": str(d / "cfg.json"),
        "ovr": str(d / "ovr.json"),
        "dir": str(d),
        "out": str(d / "out"),
    }
    if case.make is not None:
        subs["bad"] = str(case.make(d))
    before, listing = tree_hashes(d), _listing(d)
    r = run_cli(*[a.format(**subs) for a in case.argv])
    _assert_one_line(r, case.code, [n.format(**subs) for n in case.needles])
    assert tree_hashes(d) == before  # every input byte-identical, no file written
    assert _listing(d) == listing  # no folder, temp file or partial output left behind


def test_the_corpus_is_large_and_distinct() -> None:
    """At least 150 distinct (defect × command) cases, every command covered."""
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) >= 150
    assert len({(c.argv, c.make) for c in CASES}) == len(CASES)
    for command in ("quantize", "debug", "suggest", "search", "build"):
        assert sum(1 for c in CASES if c.argv and c.argv[0] == command) >= 20, command
