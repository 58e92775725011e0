"""Bad input: the right error class and a message naming the file/tensor, through the Python API and
the CLI (documented exit code, one-line message, no traceback), and the inputs are never modified.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import assert_one_line_error, save, sha256, tree_hashes
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import (
    EXIT_DATA,
    EXIT_INPUT_FILE,
    EXIT_MODEL,
    EXIT_USAGE,
    DataError,
    InputFileError,
    ModelError,
    QDebugError,
)
from qdebug.quantizer import quantize

SHAPE = (1, 1, 6, 6)


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self._it = iter([{"x": rng.random(SHAPE).astype(np.float32)} for _ in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


@dataclass
class Env:
    root: Path
    float_model: Path
    quant_model: Path


@pytest.fixture
def env(tmp_path: Path, tiny_float: Path, tiny_quant) -> Iterator[Env]:
    """A float/quant pair copied into a fresh folder; every file in it must be unchanged afterwards."""
    f = Path(shutil.copy(tiny_float, tmp_path / "float.onnx"))
    q = Path(shutil.copy(tiny_quant("u8"), tmp_path / "quant.onnx"))
    shared_before = {p: sha256(p) for p in (tiny_float, tiny_quant("u8"))}
    e = Env(tmp_path, f, q)
    yield e
    assert {p: sha256(p) for p in shared_before} == shared_before


def _check(
    env: Env,
    run_cli,
    make: Callable[[Env], tuple[Path, Path, Path | None]],
    exc_type: type[QDebugError],
    code: int,
    needles: Callable[[Path, Path, Path | None], list[str]],
) -> None:
    """Make the bad input, then assert API error, CLI error, and untouched inputs."""
    float_model, quant_model, data = make(env)
    before = tree_hashes(env.root)
    with pytest.raises(exc_type) as info:
        debug(float_model, quant_model, data, DebugOptions(num_samples=2))
    for n in needles(float_model, quant_model, data):
        assert n in str(info.value), (n, str(info.value))
    assert "\n" not in str(info.value)
    argv = ["debug", "-f", float_model, "-q", quant_model]
    argv += ["--data", data] if data is not None else ["--samples", "2"]
    result = run_cli(*argv)
    assert_one_line_error(result, code, *needles(float_model, quant_model, data))
    assert result.out == ""
    assert tree_hashes(env.root) == before


# ------------------------------------------------------------------ unreadable model files
def _random_bytes(e: Env) -> Path:
    p = e.root / "random.onnx"
    p.write_bytes(np.random.default_rng(1).bytes(4096))
    return p


def _text(e: Env) -> Path:
    p = e.root / "notes.onnx"
    p.write_text("this is not an ONNX model\njust text\n", encoding="utf-8")
    return p


def _missing(e: Env) -> Path:
    return e.root / "does_not_exist.onnx"


def _directory(e: Env) -> Path:
    p = e.root / "a_folder.onnx"
    p.mkdir()
    return p


@pytest.mark.parametrize("role", ["quant", "float"])
@pytest.mark.parametrize("bad", [_random_bytes, _text, _missing, _directory], ids=lambda f: f.__name__[1:])
def test_unreadable_model_file(env: Env, run_cli, bad, role: str) -> None:
    def make(e: Env) -> tuple[Path, Path, None]:
        p = bad(e)
        return (e.float_model, p, None) if role == "quant" else (p, e.quant_model, None)

    def needles(f: Path, q: Path, _: None) -> list[str]:
        return [str(q if role == "quant" else f)]

    _check(env, run_cli, make, InputFileError, EXIT_INPUT_FILE, needles)


# ------------------------------------------------------------------ models of the wrong kind
def _qoperator(e: Env) -> tuple[Path, Path, None]:
    p = e.root / "qop.onnx"
    quantize_static(str(e.float_model), str(p), _Reader(), quant_format=QuantFormat.QOperator)
    assert "QLinearConv" in {n.op_type for n in onnx.load(str(p)).graph.node}
    return e.float_model, p, None


def _dynamic(e: Env) -> tuple[Path, Path, None]:
    p = e.root / "dyn.onnx"
    quantize_dynamic(str(e.float_model), str(p), weight_type=QuantType.QUInt8)
    return e.float_model, p, None


def _float_as_quant(e: Env) -> tuple[Path, Path, None]:
    # a copy: one file given as both is refused by the CLI's pre-flight before any model is read (test_preflight.py)
    return e.float_model, Path(shutil.copy(e.float_model, e.root / "float_copy.onnx")), None


def _quant_as_float(e: Env) -> tuple[Path, Path, None]:
    return Path(shutil.copy(e.quant_model, e.root / "quant_copy.onnx")), e.quant_model, None


def _swapped(e: Env) -> tuple[Path, Path, None]:
    return e.quant_model, e.float_model, None


def _other_inputs(e: Env) -> tuple[Path, Path, None]:
    _, q, _ = builders.matmul_constant_weight()
    return e.float_model, save(q, e.root / "other_inputs.qdq.onnx"), None


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (_qoperator, ["QOperator"]),
        (_dynamic, ["dynamically quantized"]),
        (_float_as_quant, ["no QuantizeLinear"]),
        (_quant_as_float, ["already quantized"]),
        (_swapped, ["look swapped", "other way round"]),
        (_other_inputs, ["do not correspond"]),
    ],
    ids=lambda v: v.__name__[1:] if callable(v) else "",
)
def test_wrong_kind_of_model(env: Env, run_cli, make, words: list[str]) -> None:
    def needles(f: Path, q: Path, _: None) -> list[str]:
        return [*words, str(f), str(q)]

    _check(env, run_cli, make, ModelError, EXIT_MODEL, needles)


def test_quantized_model_of_a_different_graph(env: Env, run_cli) -> None:
    def make(e: Env) -> tuple[Path, Path, None]:
        other = save(builders.other_convnet(), e.root / "other.onnx")
        q = e.root / "other.qdq.onnx"
        quantize(other, None, QuantConfig(num_samples=4), q)
        return e.float_model, q, None

    _check(env, run_cli, make, ModelError, EXIT_MODEL, lambda f, q, d: ["'y'", "do not correspond"])


# ------------------------------------------------------------------ bad data
X = np.random.default_rng(0).random((3, *SHAPE)).astype(np.float32)


def _npz(name: str, **arrays: np.ndarray) -> Callable[[Env], tuple[Path, Path, Path]]:
    def make(e: Env) -> tuple[Path, Path, Path]:
        p = e.root / name
        np.savez(p, **arrays)
        return e.float_model, e.quant_model, p

    make.__name__ = name
    return make


def _with_nan() -> np.ndarray:
    x = X.copy()
    x[1, 0, 0, 2, 2] = np.nan
    return x


def _empty_folder(e: Env) -> tuple[Path, Path, Path]:
    p = e.root / "no_npz_here"
    p.mkdir()
    (p / "readme.txt").write_text("no data\n")
    return e.float_model, e.quant_model, p


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (_npz("missing_input.npz", image=X), ["missing input", "'x'", "'image'"]),
        (_npz("extra_input.npz", x=X, extra=X), ["unknown array", "'extra'"]),
        (_npz("float64.npz", x=X.astype(np.float64)), ["'x'", "float64", "float32"]),
        (_npz("wrong_shape.npz", x=X[..., :5]), ["'x'", "[1, 1, 6, 5]"]),
        (_npz("nan.npz", x=_with_nan()), ["'x'", "NaN", "sample 1"]),
        (_npz("pickled.npz", x=np.array([X[0], "text"], dtype=object)), ["pickled"]),
        (_npz("empty.npz", x=X[:0]), ["no samples"]),
        (_empty_folder, ["no .npz files"]),
    ],
    ids=lambda v: getattr(v, "__name__", "").lstrip("_") if callable(v) else "",
)
def test_bad_data(env: Env, run_cli, make, words: list[str]) -> None:
    def needles(f: Path, q: Path, d: Path | None) -> list[str]:
        return [str(d), *words]

    _check(env, run_cli, make, DataError, EXIT_DATA, needles)


def test_data_file_of_the_wrong_format(env: Env, run_cli) -> None:
    def make(e: Env) -> tuple[Path, Path, Path]:
        return e.float_model, e.quant_model, _text(e)

    _check(env, run_cli, make, InputFileError, EXIT_INPUT_FILE, lambda f, q, d: [str(d)])


def test_missing_data_file(env: Env, run_cli) -> None:
    def make(e: Env) -> tuple[Path, Path, Path]:
        return e.float_model, e.quant_model, e.root / "nope.npz"

    _check(env, run_cli, make, InputFileError, EXIT_INPUT_FILE, lambda f, q, d: [str(d), "no such file"])


def _corrupt_zip(p: Path) -> None:
    p.write_bytes(b"PK\x03\x04" + np.random.default_rng(2).bytes(200))


def _random_npz(p: Path) -> None:
    p.write_bytes(np.random.default_rng(3).bytes(500))


def _bare_npy(p: Path) -> None:
    with open(p, "wb") as fh:
        np.save(fh, X)  # a single .npy array under an .npz name


@pytest.mark.parametrize("write", [_corrupt_zip, _random_npz, _bare_npy], ids=lambda f: f.__name__[1:])
def test_corrupt_npz(env: Env, run_cli, write) -> None:
    def make(e: Env) -> tuple[Path, Path, Path]:
        p = e.root / "corrupt.npz"
        write(p)
        return e.float_model, e.quant_model, p

    _check(env, run_cli, make, InputFileError, EXIT_INPUT_FILE, lambda f, q, d: [str(d)])


# ------------------------------------------------------------------ dynamic shapes and external data
def test_dynamic_batch_uses_documented_defaults_and_input_shape(tmp_path: Path, run_cli) -> None:
    fp = save(builders.tiny_convnet(batch="N"), tmp_path / "dyn.onnx")
    qp = tmp_path / "dyn.qdq.onnx"
    quantize(fp, None, QuantConfig(num_samples=4), qp)
    before = tree_hashes(tmp_path)
    report = debug(fp, qp, None, DebugOptions(num_samples=2))
    assert report.activation("x").elements == 1 * 1 * 6 * 6  # batch 'N' → 1
    assert report.activation("y").elements == 3
    report = debug(fp, qp, None, DebugOptions(num_samples=2, input_shapes={"x": (3, 1, 6, 6)}))
    assert report.activation("x").elements == 3 * 36
    assert report.activation("y").elements == 9
    result = run_cli("debug", "-f", fp, "-q", qp, "--samples", "2", "--input-shape", "x:2,1,6,6", "--json")
    assert result.code == 0, result.stderr
    d = json.loads(result.out)
    assert next(a for a in d["activations"] if a["tensor_name"] == "x")["elements"] == 72
    bad = run_cli("debug", "-f", fp, "-q", qp, "--samples", "2", "--input-shape", "x:2,3,6,6")
    assert_one_line_error(bad, EXIT_DATA, "'x'", "[2, 3, 6, 6]")
    assert tree_hashes(tmp_path) == before


def _save_external(model: onnx.ModelProto, folder: Path) -> Path:
    folder.mkdir()
    p = folder / "model.onnx"
    onnx.save(model, str(p), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)  # fmt: skip
    assert (folder / "weights.bin").stat().st_size > 0
    assert not onnx.load(str(p), load_external_data=False).graph.initializer[0].raw_data
    return p


def test_external_data_model_loads_and_debugs(tmp_path: Path, tiny_float: Path, tiny_quant) -> None:
    ext = _save_external(builders.tiny_convnet(), tmp_path / "ext")
    before = tree_hashes(tmp_path)
    qpath = tiny_quant("u8")
    report = debug(ext, qpath, None, DebugOptions(num_samples=3))
    inline = debug(tiny_float, qpath, None, DebugOptions(num_samples=3))
    assert len(report.weights) == 6
    assert [w.weight_sqnr_db for w in report.weights] == [w.weight_sqnr_db for w in inline.weights]
    assert report.output("y").cumulative_sqnr_db == inline.output("y").cumulative_sqnr_db
    # and it can be quantized from its external-data form
    qp = tmp_path / "ext.qdq.onnx"
    quantize(ext, None, QuantConfig(num_samples=4), qp)
    assert debug(ext, qp, None, DebugOptions(num_samples=2)).output("y").cumulative_status == "ok"
    qp.unlink()
    qp.with_suffix(".calib.json").unlink()
    assert tree_hashes(tmp_path) == before


def test_missing_external_data_file(tmp_path: Path, tiny_quant, run_cli) -> None:
    ext = _save_external(builders.tiny_convnet(), tmp_path / "ext")
    (tmp_path / "ext" / "weights.bin").unlink()
    before = tree_hashes(tmp_path)
    with pytest.raises(InputFileError) as info:
        debug(ext, tiny_quant("u8"), None, DebugOptions(num_samples=2))
    assert str(ext) in str(info.value) and "external data" in str(info.value)
    result = run_cli("debug", "-f", ext, "-q", tiny_quant("u8"), "--samples", "2")
    assert_one_line_error(result, EXIT_INPUT_FILE, str(ext), "external data")
    assert tree_hashes(tmp_path) == before


# ------------------------------------------------------------------ quantize never overwrites its input
def test_quantize_refuses_to_overwrite_its_input(tmp_path: Path, tiny_float: Path, run_cli) -> None:
    fp = Path(shutil.copy(tiny_float, tmp_path / "model.onnx"))
    before = tree_hashes(tmp_path)
    with pytest.raises(InputFileError) as info:
        quantize(fp, None, QuantConfig(num_samples=2), fp)
    assert str(fp) in str(info.value) and "overwrite" in str(info.value)
    # the same file reached through another spelling of its path
    with pytest.raises(InputFileError):
        quantize(fp, None, QuantConfig(num_samples=2), tmp_path / "." / "model.onnx")
    # The CLI's output guard refuses it before any work, as a usage error (tests/test_output_guard.py).
    result = run_cli("quantize", "-f", fp, "-o", fp, "--samples", "2")
    assert_one_line_error(result, EXIT_USAGE, str(fp), "overwrite")
    assert tree_hashes(tmp_path) == before


def test_quantize_refuses_an_already_quantized_model(tmp_path: Path, tiny_quant, run_cli) -> None:
    qp = Path(shutil.copy(tiny_quant("u8"), tmp_path / "q.onnx"))
    before = tree_hashes(tmp_path)
    with pytest.raises(ModelError, match="already quantized"):
        quantize(qp, None, QuantConfig(num_samples=2), tmp_path / "again.onnx")
    result = run_cli("quantize", "-f", qp, "-o", tmp_path / "again.onnx")
    assert_one_line_error(result, EXIT_MODEL, str(qp), "already quantized")
    assert tree_hashes(tmp_path) == before


def test_debug_refuses_to_write_its_report_over_an_input(env: Env, run_cli) -> None:
    before = tree_hashes(env.root)
    result = run_cli("debug", "-f", env.float_model, "-q", env.quant_model, "--samples", "2", "-o", env.quant_model)
    assert_one_line_error(result, EXIT_USAGE, "overwrite")  # the output guard, before any work
    assert tree_hashes(env.root) == before


# ------------------------------------------------------------------ a QDQ model that loads but cannot run
def _zero_point_shape(m: onnx.ModelProto) -> None:
    """The activation zero point of 'x' gets two elements while its scale keeps one (ORT checks at run time)."""
    zp = next(t for t in m.graph.initializer if t.name == "x_zero_point")
    value = onnx.numpy_helper.to_array(zp)
    zp.CopyFrom(onnx.numpy_helper.from_array(np.array([value, value], dtype=value.dtype), zp.name))


def _axis_out_of_range(m: onnx.ModelProto) -> None:
    """A per-channel DequantizeLinear whose axis is past the weight's rank."""
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute))
    next(a for a in dq.attribute if a.name == "axis").i = 5


@pytest.mark.parametrize("command", ["debug", "suggest"])
@pytest.mark.parametrize(
    ("config", "mutate", "needle"),
    [("u8", _zero_point_shape, "x_zero_point"), ("s8_per_channel", _axis_out_of_range, "axis 5")],
    ids=["zero-point-shape", "axis-out-of-range"],
)
def test_a_qdq_model_that_fails_at_run_time_is_a_model_error_naming_it(
    tmp_path: Path, tiny_float: Path, tiny_quant, run_cli, command: str, config: str, mutate, needle: str
) -> None:
    """It used to be exit 5 ("data"), ORT's coloured log lines on stderr, and no file named."""
    q = onnx.load(str(tiny_quant(config)))
    mutate(q)
    bad = save(q, tmp_path / "bad.qdq.onnx")
    before = tree_hashes(tmp_path)
    r = run_cli(command, "-f", tiny_float, "-q", bad, "--samples", "2")
    assert_one_line_error(r, EXIT_MODEL, str(bad), "(quantized model)", "float model runs on", needle)
    assert "onnxruntime_src" not in r.stderr and "[E:onnxruntime" not in r.stderr
    assert str(tiny_float) not in r.stderr  # the float model is not at fault
    assert tree_hashes(tmp_path) == before


def _ir_too_new(m: onnx.ModelProto) -> None:
    m.ir_version = 99


def _cycle(m: onnx.ModelProto) -> None:
    m.graph.node[0].input[0] = m.graph.node[-1].output[0]  # the first node reads the last one's output


@pytest.mark.parametrize("role", ["float", "quant"])
@pytest.mark.parametrize(("mutate", "needle"), [(_ir_too_new, "IR version"), (_cycle, "cycle")], ids=["ir99", "cycle"])
def test_debug_names_the_one_model_at_fault(
    tmp_path: Path, tiny_float: Path, tiny_quant, run_cli, role: str, mutate, needle: str
) -> None:
    """Both graphs are often named 'main_graph': the message names the file, not the graph."""
    m = onnx.load(str(tiny_float if role == "float" else tiny_quant("u8")))
    mutate(m)
    bad = save(m, tmp_path / f"bad.{role}.onnx")
    f, q = (bad, tiny_quant("u8")) if role == "float" else (tiny_float, bad)
    r = run_cli("debug", "-f", f, "-q", q, "--samples", "2")
    what = "(float model)" if role == "float" else "(quantized model)"
    assert_one_line_error(r, EXIT_MODEL, f"{bad} {what}", needle)
    assert str(q if role == "float" else f) not in r.stderr


def test_ort_log_lines_are_silenced_on_the_real_stderr(tmp_path: Path, tiny_float: Path, tiny_quant) -> None:
    """ORT logs to file descriptor 2 from C++ (capsys cannot see it): a real process, whose whole stderr is one line."""
    import subprocess
    import sys

    q = onnx.load(str(tiny_quant("u8")))
    _zero_point_shape(q)
    bad = save(q, tmp_path / "bad.qdq.onnx")
    argv = [sys.executable, "-m", "qdebug.cli", "debug", "-f", str(tiny_float), "-q", str(bad), "--samples", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == EXIT_MODEL
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("qdebug: error: "), proc.stderr


@pytest.mark.parametrize(
    ("mutate", "needle"), [(_ir_too_new, "IR version"), (_cycle, "not acyclic")], ids=["ir99", "cycle"]
)
def test_build_names_the_users_file_when_ort_refuses_the_model(tmp_path: Path, run_cli, mutate, needle: str) -> None:
    """It named the copy in its hidden staging folder ('out/.qd-….part/m.float.onnx') and left 'out/' behind."""
    m = builders.tiny_convnet()
    mutate(m)
    bad = save(m, tmp_path / "m.onnx")
    before = tree_hashes(tmp_path)
    r = run_cli("build", "-f", bad, "--target", "cpu", "--precision", "uint8", "-o", tmp_path / "out" / "b")
    assert_one_line_error(r, EXIT_MODEL, f"{bad}: ONNX Runtime cannot load it", needle)
    assert ".qd-" not in r.stderr
    assert tree_hashes(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("command", ["quantize", "build"])
def test_a_failed_command_removes_the_folders_it_created(tmp_path: Path, tiny_float: Path, run_cli, command) -> None:
    """Calibration data that overflow fail after the output's folders were made: none of them stays behind."""
    big = tmp_path / "big.npz"
    np.savez(big, x=np.full((4, *SHAPE), 3e38, np.float32))
    before = tree_hashes(tmp_path)
    if command == "quantize":
        argv = ["quantize", "-f", tiny_float, "--calib", big, "-o", tmp_path / "new" / "sub" / "q.onnx"]
    else:
        argv = ["build", "-f", tiny_float, "--target", "cpu", "--precision", "uint8", "--calib", big,
                "-o", tmp_path / "new" / "sub" / "b"]  # fmt: skip
    r = run_cli(*argv)
    assert_one_line_error(r, EXIT_DATA, str(tiny_float))
    assert tree_hashes(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["big.npz"]


@pytest.mark.parametrize("command", ["quantize", "debug", "build"])
def test_a_model_without_graph_outputs_is_refused(tmp_path: Path, tiny_quant, run_cli, command: str) -> None:
    """ORT loads it; quantize and debug then exited 0 with nothing computed, build failed in the CPU check (exit 7)."""
    m = builders.tiny_convnet()
    del m.graph.output[:]
    bad = save(m, tmp_path / "no_outputs.onnx")
    before = tree_hashes(tmp_path)
    argv = {
        "quantize": ["quantize", "-f", bad, "--samples", "2", "-o", tmp_path / "q.onnx"],
        "debug": ["debug", "-f", bad, "-q", tiny_quant("u8"), "--samples", "2"],
        "build": ["build", "-f", bad, "--target", "cpu", "--precision", "uint8", "-o", tmp_path / "b"],
    }[command]
    assert_one_line_error(run_cli(*argv), EXIT_MODEL, str(bad), "no outputs")
    assert tree_hashes(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["no_outputs.onnx"]


def test_suggest_checks_its_config_even_without_promote_top(tmp_path: Path, tiny_float: Path, tiny_quant, run_cli):
    """--config is only used by --promote-top; a broken one was silently ignored (exit 0)."""
    cfg = tmp_path / "c.json"
    cfg.write_text('{"per_channel": "no"}')
    r = run_cli("suggest", "-f", tiny_float, "-q", tiny_quant("u8"), "--samples", "2", "-c", cfg)
    assert_one_line_error(r, EXIT_USAGE, str(cfg), "per_channel")


def test_a_non_utf8_output_name_prints_on_a_strict_stdout(tmp_path: Path, tiny_float: Path) -> None:
    """Outside Python's UTF-8 mode (e.g. LANG=en_US.UTF-8) stdout is strict: 'wrote <path>' raised
    UnicodeEncodeError after the model was written (exit 1); an error naming such a file failed the same way."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "PYTHONUTF8": "0"}
    out = os.fsdecode(bytes(tmp_path) + b"/\xfeq.onnx")
    argv = [sys.executable, "-m", "qdebug.cli", "quantize", "-f", str(tiny_float), "--samples", "2", "-o", out]
    proc = subprocess.run(argv, capture_output=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert bytes(tmp_path) + b"/\xfeq.onnx" in proc.stdout  # the name as the bytes it is, like ls prints it
    missing = os.fsdecode(bytes(tmp_path) + b"/\xff.onnx")
    argv = [sys.executable, "-m", "qdebug.cli", "quantize", "-f", missing, "--samples", "2", "-o", str(tmp_path / "x")]
    proc = subprocess.run(argv, capture_output=True, env=env, check=False)
    assert proc.returncode == EXIT_INPUT_FILE and proc.stderr.count(b"\n") == 1, proc.stderr
    assert b"\\udcff.onnx: no such file" in proc.stderr


def test_data_the_float_model_cannot_run_on_name_the_data(tmp_path: Path, run_cli) -> None:
    """A Reshape to a fixed [1, 36] under a dynamic batch: the shape the user picked is valid for the input, but the
    float model cannot run on it. A data error naming the data, the sample and the float model (it named none)."""
    from onnx import TensorProto, helper

    shape = onnx.numpy_helper.from_array(np.array([1, 36], np.int64), "shape")
    w = onnx.numpy_helper.from_array(np.full((36, 2), 0.1, np.float32), "w")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [shape, w],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    f = save(m, tmp_path / "f.onnx")
    q = tmp_path / "q.onnx"
    quantize(f, None, QuantConfig(num_samples=2), q)
    before = tree_hashes(tmp_path)
    r = run_cli("debug", "-f", f, "-q", q, "--samples", "2", "--input-shape", "x:2,1,6,6")
    assert_one_line_error(r, EXIT_DATA, "synthetic uniform", "sample 0", "float model cannot run")
    assert tree_hashes(tmp_path) == before


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("[ONNXRuntimeError] : 1 : FAIL : Load model from /tmp/x.onnx failed:bad model", "bad model"),
        ("/onnxruntime_src/a.cc:12 void f(const T&, int) the reason (x)", "the reason (x)"),
        (
            "Status Message: /onnxruntime_src/q.cc:79 void g(int, h(int)) axis (5) out of range",
            "Status Message: axis (5)",
        ),
        ("/onnxruntime_src/a.cc:12 no signature here", "no signature here"),
    ],
)
def test_ort_message_keeps_the_reason_without_the_cpp_location(raw: str, clean: str) -> None:
    from qdebug.ort import ort_message

    assert ort_message(RuntimeError(raw)).startswith(clean)
    assert "onnxruntime_src" not in ort_message(RuntimeError(raw))
