"""The output guard of every command: an output that is one of the user's inputs (by path, symlink or hard link),
a folder where a file is meant, under a file, a symbolic link loop, or a name longer than a file system takes is
refused before any work — exit 2, the path named, every input byte-identical, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import builders
import numpy as np
import pytest
from conftest import assert_one_line_error, save, sha256

from qdebug.errors import EXIT_USAGE


@pytest.fixture
def files(tmp_path: Path, tiny_quant) -> dict[str, Path]:
    m = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).random((4, 1, 6, 6), dtype=np.float32))
    cfg = tmp_path / "c.json"
    cfg.write_text('{"activation_type": "uint8"}')
    q = tmp_path / "q.onnx"
    q.write_bytes(Path(tiny_quant("u8")).read_bytes())
    return {"m": m, "calib": calib, "cfg": cfg, "q": q}


CASES = [
    # the five: the user's own data/config overwritten by an output
    ("quantize-over-calib", ["quantize", "-f", "{m}", "--calib", "{calib}", "-o", "{calib}"], "{calib}"),
    ("debug-over-data", ["debug", "-f", "{m}", "-q", "{q}", "-d", "{calib}", "-o", "{calib}"], "{calib}"),
    ("suggest-over-config", ["suggest", "-f", "{m}", "-q", "{q}", "--samples", "2", "--config", "{cfg}",
                             "--promote-top", "1", "--overrides-out", "{cfg}"], "{cfg}"),
    ("search-over-calib", ["search", "-f", "{m}", "--calib", "{calib}", "--goal-sqnr", "30", "-o", "{calib}"],
     "{calib}"),
    ("quantize-over-overrides", ["quantize", "-f", "{m}", "--overrides", "{cfg}", "-o", "{cfg}"], "{cfg}"),
    # the derived calibration ranges would land on an input
    ("quantize-calib-json-over-config", ["quantize", "-f", "{m}", "--samples", "2", "-o", "{cfgstem}.onnx",
                                         "--config", "{cfgcalib}"], "calib.json"),
    ("build-into-a-file", ["build", "-f", "{m}", "--target", "cpu", "--precision", "uint8", "-o", "{calib}"],
     "is a file"),
    ("output-is-a-folder", ["quantize", "-f", "{m}", "--samples", "2", "-o", "{dir}"], "is a folder"),
    ("output-under-a-file", ["quantize", "-f", "{m}", "--samples", "2", "-o", "{calib}/q.onnx"], "is a file"),
    ("name-too-long", ["quantize", "-f", "{m}", "--samples", "2", "-o", "{long}"], "longer than 255"),
    # names the file system refuses (os.stat raised ENAMETOOLONG: exit 1); any name up to 255 bytes is written
    # (tests/test_io_files.py: the temporary sibling's name is short)
    ("debug-name-256", ["debug", "-f", "{m}", "-q", "{q}", "--samples", "2", "-o", "{n256}"], "longer than 255"),
    ("search-name-256", ["search", "-f", "{m}", "--goal-sqnr", "30", "-o", "{n256}"], "longer than 255"),
    ("build-name-256", ["build", "-f", "{m}", "--target", "cpu", "--precision", "uint8", "-o", "{n256}"],
     "longer than 255"),
    # an output that is a symbolic link loop, or under one (writing it raised ELOOP after the work)
    ("debug-output-link-loop", ["debug", "-f", "{m}", "-q", "{q}", "--samples", "2", "-o", "{loop}"],
     "symbolic link loop"),
    ("build-under-link-loop", ["build", "-f", "{m}", "--target", "cpu", "--precision", "uint8", "-o",
                               "{loop}/b"], "symbolic link loop"),
    ("folder-name-300", ["suggest", "-f", "{m}", "-q", "{q}", "--samples", "2", "--promote-top", "1",
                         "--overrides-out", "{n300}/o.json"], "a folder name in it is 300 bytes"),
    # a binary model under a name onnx.load reads as JSON: quantize wrote it, then crashed reading it back
    ("model-named-json", ["quantize", "-f", "{m}", "--samples", "2", "-o", "{dir}/q.json"], "use .onnx"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "argv", "needle"), CASES, ids=[c[0] for c in CASES])
def test_outputs_never_overwrite_inputs(
    run_cli, tmp_path: Path, files: dict[str, Path], name: str, argv: list[str], needle: str
) -> None:
    cfgcalib = tmp_path / "cfgq.calib.json"
    cfgcalib.write_text('{"activation_type": "uint8"}')
    subs = {
        **{k: str(v) for k, v in files.items()},
        "dir": str(tmp_path),
        "long": str(tmp_path / ("x" * 250 + ".onnx")),
        "n256": str(tmp_path / ("n" * 251 + ".json")),
        "loop": str(tmp_path / "loop"),
        "n300": str(tmp_path / ("d" * 300)),
        "cfgstem": str(tmp_path / "cfgq"),
        "cfgcalib": str(cfgcalib),
    }
    (tmp_path / "loop").symlink_to("loop")
    before = {p: sha256(p) for p in [*files.values(), cfgcalib]}
    listing = sorted(os.listdir(tmp_path))
    r = run_cli(*[a.format(**subs) for a in argv])
    assert_one_line_error(r, EXIT_USAGE, needle.format(**subs))
    assert {p: sha256(p) for p in before} == before
    assert sorted(os.listdir(tmp_path)) == listing  # nothing written, no temp file left


def test_a_hard_link_to_an_input_is_the_input(run_cli, tmp_path: Path, files: dict[str, Path]) -> None:
    link = tmp_path / "linked.npz"
    os.link(files["calib"], link)
    before = sha256(files["calib"])
    r = run_cli("quantize", "-f", files["m"], "--calib", files["calib"], "-o", link)
    assert_one_line_error(r, EXIT_USAGE, "refusing to overwrite an input")
    assert sha256(files["calib"]) == before


def test_a_good_output_still_works(run_cli, tmp_path: Path, files: dict[str, Path]) -> None:
    r = run_cli("quantize", "-f", files["m"], "--calib", files["calib"], "-o", tmp_path / "out" / "q.onnx")
    assert r.code == 0, r.stderr
    assert (tmp_path / "out" / "q.onnx").is_file() and (tmp_path / "out" / "q.calib.json").is_file()


def test_qdq_parameters_that_cannot_be_right_are_named(run_cli, tmp_path: Path, tiny_float: Path, tiny_quant) -> None:
    import onnx
    from onnx import numpy_helper

    q = onnx.load(str(tiny_quant("u8")))
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and "r1" in n.input[0])
    init = next(t for t in q.graph.initializer if t.name == dq.input[1])
    init.CopyFrom(numpy_helper.from_array(np.array(0.0, np.float32), init.name))
    bad = save(q, tmp_path / "bad.qdq.onnx")
    from qdebug.debugger import DebugOptions, debug

    rep = debug(tiny_float, bad, None, DebugOptions(num_samples=2))
    named = [w for w in rep.meta.warnings if "finite and positive" in w]
    assert len(named) == 1 and named[0].startswith("r1") and "scale 0" in named[0], rep.meta.warnings
    r = run_cli("debug", "-f", tiny_float, "-q", bad, "--samples", "2")
    assert r.code == 0 and "warning: r1" in r.out and "finite and positive" in r.out
    pytest.importorskip("ipywidgets")
    from widgets.app import DebuggerApp

    assert "r1: scale 0" in DebuggerApp._notes_html(rep)


@pytest.mark.parametrize("case", ["ir99", "custom-op"])
def test_a_model_ort_refuses_is_one_line_naming_the_file(run_cli, tmp_path: Path, case: str) -> None:
    import onnx
    from onnx import helper

    m = builders.tiny_convnet()
    if case == "ir99":
        m.ir_version = 99  # newer than ONNX Runtime supports
    else:
        m.graph.node.append(helper.make_node("Frobnicate", ["x"], ["y2"], domain="my.custom"))
        m.opset_import.append(helper.make_opsetid("my.custom", 1))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    before = sha256(path)
    r = run_cli("quantize", "-f", path, "-o", tmp_path / "q.onnx", "--samples", "2")
    assert_one_line_error(r, 4, str(path), "ONNX Runtime cannot load it")
    assert "qdebug-quant-" not in r.stderr and "onnxruntime_src" not in r.stderr  # no temp file, no C++ location
    assert sha256(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize(
    ("content", "code", "needle"),
    [
        (b"[1, 2]", EXIT_USAGE, "must be a JSON object"),
        (b'{"per_channel": "no"}', EXIT_USAGE, "per_channel must be true or false"),
        (b'{"activation_type": ["uint8"]}', EXIT_USAGE, "activation_type must be a type name"),
        (b'{"num_samples": 2.5}', EXIT_USAGE, "num_samples must be an integer or null"),
        (b"\xff\xfe\x00{", 3, "not UTF-8"),
    ],
)
def test_config_json_of_the_wrong_shape_is_one_line(
    run_cli, tmp_path: Path, files: dict[str, Path], content: bytes, code: int, needle: str
) -> None:
    cfg = tmp_path / "bad.json"
    cfg.write_bytes(content)
    r = run_cli("quantize", "-f", files["m"], "--samples", "2", "-c", cfg, "-o", tmp_path / "out.onnx")
    assert_one_line_error(r, code, str(cfg), needle)
    assert not (tmp_path / "out.onnx").exists() and cfg.read_bytes() == content


def test_calibration_data_that_overflows_is_a_data_error_and_leaves_nothing(
    run_cli, tmp_path: Path, files: dict[str, Path]
) -> None:
    big = tmp_path / "big.npz"
    np.savez(big, x=np.full((4, 1, 6, 6), 3e38, np.float32))
    listing = sorted(os.listdir(tmp_path))
    r = run_cli("quantize", "-f", files["m"], "--calib", big, "-o", tmp_path / "out.onnx")
    assert_one_line_error(r, 5, "non-finite or empty range")
    assert sorted(os.listdir(tmp_path)) == listing  # no model, no .calib.json, no temp file


def test_two_unrelated_models_sharing_only_their_io_names_are_refused(run_cli, tmp_path: Path) -> None:
    from conftest import SAMPLE_MODELS

    q = tmp_path / "t.qdq.onnx"
    assert run_cli("quantize", "-f", SAMPLE_MODELS / "digits_transformer.onnx", "--samples", "2", "-o", q).code == 0
    r = run_cli("debug", "-f", SAMPLE_MODELS / "digits_cnn.onnx", "-q", q, "--samples", "2")
    assert_one_line_error(r, 4, "do not correspond", "'input'", "'logits'", "digits_cnn.onnx")


def test_search_removes_its_temporary_folder(run_cli, tmp_path: Path, files: dict[str, Path], monkeypatch) -> None:
    import tempfile

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    base = ["search", "-f", files["m"], "--calib", files["calib"], "--debug-samples", "2", "--max-steps", "2"]
    failed = run_cli(*base, "--goal-sqnr", "500", "-o", tmp_path / "o.json")  # cannot be reached: exit 10
    assert failed.code == 10, failed.stderr
    reached = run_cli(*base, "--goal-sqnr", "-100", "-o", tmp_path / "o2.json")
    assert reached.code == 0, reached.stderr
    assert [p.name for p in tmp.iterdir() if p.name.startswith("qdebug-mixed-")] == []


@pytest.mark.parametrize("case", ["huge-header", "not-an-array"])
def test_malformed_npz_members_are_one_line(run_cli, tmp_path: Path, files: dict[str, Path], case: str) -> None:
    import io
    import zipfile

    bad = tmp_path / f"{case}.npz"
    with zipfile.ZipFile(bad, "w") as z:
        if case == "huge-header":  # a header that claims 10^13 samples
            buf = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                buf, {"descr": "<f4", "fortran_order": False, "shape": (10**13, 1, 6, 6)}
            )
            z.writestr("x.npy", buf.getvalue() + b"\0" * 64)
        else:
            z.writestr("x.npy", b"hello, I am not an array")
    r = run_cli("quantize", "-f", files["m"], "--calib", bad, "-o", tmp_path / "out.onnx")
    assert_one_line_error(r, 3, str(bad))
    assert not (tmp_path / "out.onnx").exists()


def test_paths_that_are_not_utf8_work(run_cli, tmp_path: Path, files: dict[str, Path]) -> None:
    import sys

    if sys.platform == "darwin":  # pragma: no cover - macOS file systems refuse such names
        pytest.skip("the file system takes UTF-8 names only")
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/\xff.onnx"))
    odd.write_bytes(files["m"].read_bytes())
    out = Path(os.fsdecode(bytes(tmp_path) + b"/\xff.q.onnx"))
    r = run_cli("quantize", "-f", odd, "--samples", "2", "-o", out)
    assert r.code == 0, r.stderr
    r = run_cli("debug", "-f", odd, "-q", out, "--samples", "2", "-o", tmp_path / "r.json")
    assert r.code == 0, r.stderr
    # every other command, with its outputs in a non-UTF-8 folder too (build's CPU check handed ORT the path:
    # exit 7 and a four-line pybind11 message)
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/\xfe"))
    folder.mkdir()
    for argv in (
        ["suggest", "-f", odd, "-q", out, "--samples", "2", "--promote-top", "1", "--overrides-out", folder / "o.json"],
        ["search", "-f", odd, "--calib", files["calib"], "--debug-samples", "2", "--goal-sqnr", "-100",
         "-o", folder / "s.json"],
        ["build", "-f", odd, "--target", "cpu", "--precision", "uint8", "--calib", files["calib"], "-o", folder / "b"],
    ):  # fmt: skip
        r = run_cli(*argv)
        assert r.code == 0, (argv[0], r.stderr)


def test_a_non_finite_constant_stays_out_of_quantization(run_cli, tmp_path: Path) -> None:
    """A graph that feeds a -inf constant into Max: quantizing the constant gave it an infinite scale (output
    SQNR -20 dB, exit 0). Its reader stays in float, quantize says so, and the model is sound."""
    import onnx

    from qdebug.debugger import DebugOptions, debug
    from qdebug.qdq_values import qdq_parameter_problems

    m = builders.max_with_neg_inf()
    for n in m.graph.node:
        n.name = ""  # unnamed nodes (as many exporters write them) are excluded too
    f = save(m, tmp_path / "f.onnx")
    q = tmp_path / "q.onnx"
    r = run_cli("quantize", "-f", f, "--samples", "8", "-o", q)
    assert r.code == 0, r.stderr
    assert "stay in float" in r.stderr and "ninf" in r.stderr
    assert qdq_parameter_problems(onnx.load(str(q))) == []
    rep = debug(f, q, None, DebugOptions(num_samples=4))
    assert rep.min_output_sqnr_db is not None and rep.min_output_sqnr_db > 20
