"""The file layer (qdebug/io.py): outputs get the mode a plain ``open``/``mkdir`` gives (the umask), written under
a short temporary name so that any legal name works; inputs that are not regular files (a FIFO, a socket, a device, a
folder), symbolic link loops and overlong names, and deeply nested JSON are one line naming the file and the option;
two builds of one folder at once are one success and one line. Real commands on tiny real models throughout."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import builders
import numpy as np
import pytest
from conftest import CliResult, assert_one_line_error, save, tree_hashes

from qdebug import io
from qdebug.config import QuantConfig
from qdebug.errors import EXIT_INPUT_FILE, EXIT_USAGE, InputFileError
from qdebug.mixed.overrides import OverridesFile
from qdebug.model_io import file_sha256, load_model
from qdebug.report import DebugReport

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def files(tmp_path: Path, tiny_quant: Callable[[str], Path]) -> dict[str, Path]:
    """A float model, its QDQ model, calibration data, a debug report and a build manifest, all in ``tmp_path/in``."""
    src = tmp_path / "in"
    src.mkdir()
    m = save(builders.tiny_convnet(), src / "m.onnx")
    q = src / "q.onnx"
    q.write_bytes(tiny_quant("u8").read_bytes())
    calib = src / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).random((4, 1, 6, 6), dtype=np.float32))
    return {"m": m, "q": q, "calib": calib}


def _modes(root: Path) -> dict[str, int]:
    """The permission bits of ``root`` and of everything under it, by path relative to ``root``'s parent."""
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.stat().st_mode) for p in paths}


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process's umask set for the test (and put back after it)."""
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


# ------------------------------------------------------------------------------------------------ 1. the umask
def test_every_output_gets_the_mode_open_and_mkdir_give(
    run_cli: Callable[..., CliResult], tmp_path: Path, files: dict[str, Path], umask: int
) -> None:
    """Every file 0o666 & ~umask, every folder 0o777 & ~umask: the model and its calibration ranges, the report JSON
    and HTML, a whole build folder (staged, then renamed) and the notebooks. Before: every file 0600 (mkstemp; ORT's
    calibration cache too) and a staged folder 0700 (mkdtemp)."""
    out = tmp_path / "out"
    out.mkdir()
    runs = [
        ("quantize", "-f", files["m"], "--calib", files["calib"], "-o", out / "q.onnx"),
        ("debug", "-f", files["m"], "-q", files["q"], "--samples", "2", "-o", out / "r.json", "--html", out / "r.html"),
        ("build", "-f", files["m"], "--target", "cpu", "--precision", "uint8", "-o", out / "b"),
        ("notebooks", out / "nb"),
    ]
    for argv in runs:
        r = run_cli(*argv)
        assert r.code == 0, (argv[0], r.stderr)
    modes = _modes(out)
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
    expected = {p: dir_mode if (out.parent / p).is_dir() else file_mode for p in modes}
    assert modes == expected
    assert {"out/q.onnx", "out/q.calib.json", "out/r.html", "out/b/manifest.json", "out/nb/quickstart.ipynb"} <= set(
        modes
    )
    assert not [p for p in out.rglob(".qd-*")]  # no temporary sibling or lock left


def test_the_atomic_writers_and_staging_folders_follow_the_umask(tmp_path: Path, umask: int) -> None:
    """The library level: ``atomic_write_*``, :func:`io.new_temp_dir` and a Deeploy export folder (a temp folder
    renamed into place: it was 0700)."""
    import onnx

    from qdebug.targets.deeploy_export import _write_export

    io.atomic_write_text(tmp_path / "a.json", "{}")
    io.atomic_write_bytes(tmp_path / "b.bin", b"x")
    staged = io.new_temp_dir(tmp_path)
    _write_export(tmp_path / "export", onnx.ModelProto(), {}, {})
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(staged.stat().st_mode) == 0o777 & ~umask
    assert _modes(tmp_path / "export") == {
        "export": 0o777 & ~umask,
        **{f"export/{n}": 0o666 & ~umask for n in ("network.onnx", "inputs.npz", "outputs.npz")},
    }


# ------------------------------------------------------------------------------------------------ 2. short temp names
def test_the_temporary_sibling_has_a_short_name(tmp_path: Path) -> None:
    long_name = tmp_path / ("n" * 255)
    with io.atomic_path(long_name) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(io.TEMP_PREFIX) and len(tmp.name) <= 16
        tmp.write_text("whole")
    assert long_name.read_text() == "whole" and sorted(p.name for p in tmp_path.iterdir()) == [long_name.name]


def test_any_legal_output_name_is_written(
    run_cli: Callable[..., CliResult], tmp_path: Path, files: dict[str, Path]
) -> None:
    """A 255-byte ``-o`` for debug (a file) and build (a folder), and for quantize the longest name whose derived
    ``.calib.json`` is legal (249 bytes). Before: refused, the temporary name needed 19 bytes more."""
    out = tmp_path / "out"
    out.mkdir()
    report = out / ("r" * 250 + ".json")
    model = out / ("q" * 244 + ".onnx")
    folder = out / ("b" * 255)
    assert len(report.name) == 255 and len(model.with_suffix(".calib.json").name) == 255
    r = run_cli("debug", "-f", files["m"], "-q", files["q"], "--samples", "2", "-o", report)
    assert r.code == 0, r.stderr
    r = run_cli("quantize", "-f", files["m"], "--samples", "2", "-o", model)
    assert r.code == 0, r.stderr
    r = run_cli("build", "-f", files["m"], "--target", "cpu", "--precision", "uint8", "-o", folder)
    assert r.code == 0, r.stderr
    assert json.loads(report.read_text())["schema_version"]
    assert (folder / "manifest.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [report.name, model.name, model.with_suffix(".calib.json").name, folder.name]
    )


# ------------------------------------------------------------------------------------------------ 3. not regular files
def _special(kind: str, where: Path, stack: list[socket.socket]) -> Path:
    """A named pipe, a socket, a folder or a character device (``/dev/null``: named, never opened)."""
    if kind == "device":
        return Path(os.devnull)
    path = where / f"special.{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        stack.append(s)
    return path


#: The words each kind of file is refused with.
KIND_WORDS = {"fifo": "a named pipe (FIFO)", "socket": "a socket", "device": "a character device", "folder": "a folder"}

#: Every option that reads a file, with a command line around it (``{bad}``: the file under test).
ROLE_ARGV = {
    "--float-model": ["quantize", "-f", "{bad}", "--samples", "2", "-o", "{out}/q.onnx"],
    "--quant-model": ["debug", "-f", "{m}", "-q", "{bad}", "--samples", "2"],
    "--calib": ["quantize", "-f", "{m}", "--calib", "{bad}", "-o", "{out}/q.onnx"],
    "--data": ["debug", "-f", "{m}", "-q", "{q}", "-d", "{bad}"],
    "--config": ["quantize", "-f", "{m}", "--samples", "2", "--config", "{bad}", "-o", "{out}/q.onnx"],
    "--overrides": ["quantize", "-f", "{m}", "--samples", "2", "--overrides", "{bad}", "-o", "{out}/q.onnx"],
    "report": ["report", "{bad}", "-o", "{out}/r.html"],
    "--search": ["report", "{report}", "--search", "{bad}", "-o", "{out}/r.html"],
    "--manifest": ["report", "{report}", "--manifest", "{bad}", "-o", "{out}/r.html"],
    "build --float-model": ["build", "-f", "{bad}", "--target", "cpu", "--precision", "uint8", "-o", "{out}/b"],
}  # fmt: skip


@pytest.fixture
def report_json(tmp_path: Path, files: dict[str, Path]) -> Path:
    from qdebug.debugger import DebugOptions, debug

    path = tmp_path / "in" / "r.json"
    debug(files["m"], files["q"], None, DebugOptions(num_samples=2)).save(path)
    return path


def _argv(role: str, bad: Path, files: dict[str, Path], out: Path, report: Path) -> list[str]:
    subs = {"bad": str(bad), "out": str(out), "report": str(report), **{k: str(v) for k, v in files.items()}}
    return [a.format(**subs) for a in ROLE_ARGV[role]]


#: Every option × every kind, but a folder as data: that is a folder of .npz files (the next test).
NOT_FILES = [(r, k) for r in ROLE_ARGV for k in KIND_WORDS if not (k == "folder" and r in ("--calib", "--data"))]


@pytest.mark.parametrize(("role", "kind"), NOT_FILES, ids=[f"{r}-{k}" for r, k in NOT_FILES])
def test_an_input_that_is_not_a_regular_file_is_one_line_naming_it_and_its_option(
    run_cli: Callable[..., CliResult],
    tmp_path: Path,
    files: dict[str, Path],
    report_json: Path,
    role: str,
    kind: str,
) -> None:
    """Before: a FIFO as the float model hung (open blocks until a writer comes), a folder or a device as a config,
    overrides or report was a traceback or read forever. Now refused before it is opened: exit 3, one line naming the
    option and the file. A folder stays good data (``--calib``/``--data``: a folder of .npz files)."""
    out = tmp_path / "out"
    sockets: list[socket.socket] = []
    bad = _special(kind, tmp_path, sockets)
    before = tree_hashes(tmp_path / "in")
    try:
        r = run_cli(*_argv(role, bad, files, out, report_json))
    finally:
        for s in sockets:
            s.close()
    flag = role.rsplit(maxsplit=1)[-1]
    assert_one_line_error(r, EXIT_INPUT_FILE, f"{flag} {bad}: is {KIND_WORDS[kind]}")
    assert tree_hashes(tmp_path / "in") == before and not out.exists()


def test_a_data_folder_still_works_and_a_fifo_inside_it_is_named(
    run_cli: Callable[..., CliResult], tmp_path: Path, files: dict[str, Path]
) -> None:
    folder = tmp_path / "in" / "calib"
    folder.mkdir()
    (folder / "a.npz").write_bytes(files["calib"].read_bytes())
    r = run_cli("quantize", "-f", files["m"], "--calib", folder, "-o", tmp_path / "q.onnx")
    assert r.code == 0, r.stderr
    os.mkfifo(folder / "b.npz")
    r = run_cli("quantize", "-f", files["m"], "--calib", folder, "-o", tmp_path / "q2.onnx")
    assert_one_line_error(r, EXIT_INPUT_FILE, f"{folder / 'b.npz'}: is a named pipe (FIFO)")
    assert not (tmp_path / "q2.onnx").exists()


def test_a_fifo_as_the_float_model_does_not_hang_a_real_process(tmp_path: Path, files: dict[str, Path]) -> None:
    fifo = tmp_path / "f.onnx"
    os.mkfifo(fifo)
    argv = [sys.executable, "-m", "qdebug", "quantize", "-f", str(fifo), "--samples", "2", "-o", str(tmp_path / "q")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert proc.returncode == EXIT_INPUT_FILE, proc.stderr
    assert proc.stderr.count("\n") == 1 and "named pipe (FIFO)" in proc.stderr


@pytest.mark.parametrize(
    "load", [load_model, QuantConfig.load, DebugReport.load, OverridesFile.load, file_sha256],
    ids=["load_model", "QuantConfig.load", "DebugReport.load", "OverridesFile.load", "file_sha256"],
)  # fmt: skip
def test_every_loader_refuses_a_fifo_without_waiting_on_it(tmp_path: Path, load: Callable[[Path], object]) -> None:
    """The library's loaders go through :func:`io.open_input` too (no CLI guard in front of them)."""
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="named pipe"):
        load(fifo)


def test_a_fifo_put_in_place_after_the_check_is_refused_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second line of defence: the file is opened without blocking and checked again once open."""
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    monkeypatch.setattr(io, "input_problem", lambda *a, **k: None)  # as if it had been a file when looked at
    raised: list[BaseException] = []

    def open_it() -> None:
        try:
            io.open_input(fifo, "float model").close()
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)

    t = threading.Thread(target=open_it)
    t.start()
    t.join(30)
    blocked = t.is_alive()
    if blocked:  # a writer unblocks the reader, so that a failure does not hang the suite
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join()
    assert not blocked
    assert len(raised) == 1 and isinstance(raised[0], InputFileError) and "not a regular file" in str(raised[0])


# ------------------------------------------------------------------------------------------------ 4. loops, long names
LOOP_ARGV = {
    "quantize": ["quantize", "-f", "{bad}", "--samples", "2", "-o", "{out}/q.onnx"],
    "debug": ["debug", "-f", "{m}", "-q", "{bad}", "--samples", "2"],
    "search": ["search", "-f", "{bad}", "--goal-sqnr", "30", "-o", "{out}/s.json"],
    "build": ["build", "-f", "{bad}", "--target", "cpu", "--precision", "uint8", "-o", "{out}/b"],
    "report": ["report", "{bad}", "-o", "{out}/r.html"],
}


@pytest.mark.parametrize("case", ["link-loop", "name-300"])
@pytest.mark.parametrize("command", list(LOOP_ARGV))
def test_a_link_loop_or_an_overlong_name_as_input_is_one_line(
    run_cli: Callable[..., CliResult], tmp_path: Path, files: dict[str, Path], command: str, case: str
) -> None:
    """Before: RuntimeError "Symlink loop" / OSError ENAMETOOLONG tracebacks (exit 1)."""
    if case == "link-loop":
        bad = tmp_path / "loop.onnx"
        bad.symlink_to(bad.name)
        needle = "is a symbolic link loop"
    else:
        bad = tmp_path / ("n" * 295 + ".onnx")
        needle = "the file name is 300 bytes, longer than the 255"
    subs = {"bad": str(bad), "out": str(tmp_path / "out"), **{k: str(v) for k, v in files.items()}}
    r = run_cli(*[a.format(**subs) for a in LOOP_ARGV[command]])
    assert_one_line_error(r, EXIT_INPUT_FILE, str(bad), needle)
    assert not (tmp_path / "out").exists()


def test_the_helpers_name_loops_and_long_names(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    assert io.input_problem(loop) == "is a symbolic link loop (too many levels of symbolic links)"
    assert io.input_problem(tmp_path / ("d" * 300) / "x.onnx") is not None
    assert "a folder name in it is 300 bytes" in io.input_problem(tmp_path / ("d" * 300) / "x.onnx")  # type: ignore[operator]
    assert io.input_problem(tmp_path / "missing", missing_ok=True) is None
    assert io.output_problems(loop, {}) == [f"{loop}: is a symbolic link loop (too many levels of symbolic links)"]
    assert any("symbolic link loop" in p for p in io.output_problems(loop / "x.json", {}))


# ------------------------------------------------------------------------------------------------ 5. deep JSON
def _deep(levels: int, inner: str = "1") -> str:
    return "[" * levels + inner + "]" * levels


def test_parse_json_bounds_nesting_not_strings() -> None:
    assert io.parse_json(_deep(io.MAX_JSON_DEPTH)) is not None
    assert io.parse_json(json.dumps({"a": "[" * 10_000})) == {"a": "[" * 10_000}  # brackets in a string are text
    for levels in (io.MAX_JSON_DEPTH + 1, 50_000):
        with pytest.raises(json.JSONDecodeError, match=f"nested more than {io.MAX_JSON_DEPTH} levels deep") as e:
            io.parse_json('{"x": ' + _deep(levels) + "}")
        assert e.value.pos == 5 + io.MAX_JSON_DEPTH  # where the first level too many opens


#: Every JSON input, with a command line around it.
DEEP_ARGV = {
    "--config": ["quantize", "-f", "{m}", "--samples", "2", "--config", "{json}", "-o", "{out}/q.onnx"],
    "--overrides": ["quantize", "-f", "{m}", "--samples", "2", "--overrides", "{json}", "-o", "{out}/q.onnx"],
    "build --config": ["build", "-f", "{m}", "--target", "cpu", "--precision", "uint8", "--config", "{json}", "-o",
                       "{out}/b"],
    "report": ["report", "{json}", "-o", "{out}/r.html"],
    "--search": ["report", "{report}", "--search", "{json}", "-o", "{out}/r.html"],
    "--manifest": ["report", "{report}", "--manifest", "{json}", "-o", "{out}/r.html"],
}  # fmt: skip


@pytest.mark.parametrize("role", list(DEEP_ARGV))
def test_deeply_nested_json_is_malformed_json_for_its_reader(
    run_cli: Callable[..., CliResult], tmp_path: Path, files: dict[str, Path], report_json: Path, role: str
) -> None:
    """50,000 levels: before, a RecursionError traceback (exit 1). Now what its reader says of malformed JSON (the
    same exit code as for a truncated ``{``), in one line naming the file."""
    codes = []
    for name, text in (("broken.json", "{"), ("deep.json", '{"a": ' + _deep(50_000) + "}")):
        path = tmp_path / "in" / name
        path.write_text(text)
        subs = {"json": str(path), "out": str(tmp_path / "out"), "report": str(report_json)}
        r = run_cli(*[a.format(**subs, **{k: str(v) for k, v in files.items()}) for a in DEEP_ARGV[role]])
        codes.append(r.code)
        assert r.code in (EXIT_USAGE, EXIT_INPUT_FILE), r.stderr
        assert_one_line_error(r, r.code, str(path))
    assert codes[0] == codes[1]
    assert "nested more than 64 levels deep" in r.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ 6. two builds at once
def _build_argv(model: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "qdebug", "build", "-f", str(model), "--target", "cpu", "--precision", "uint8",
            "-o", str(out)]  # fmt: skip


def test_two_builds_of_one_folder_at_once_one_succeeds_the_other_is_one_line(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    """Two real processes started together. Before: the second one's rename over the first's finished folder raised
    OSError (Directory not empty), a traceback. Now the second is refused in one line (exit 2): while the first
    holds the folder's lock ("being written by another qdebug"), or once it is done ("exists and is not an empty
    folder"); the folder holds one whole build and no lock or staging folder is left."""
    out = tmp_path / "out"
    procs = [
        subprocess.Popen(
            _build_argv(files["m"], out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        for _ in range(2)
    ]
    results = [(p.communicate(timeout=300)[1], p.returncode)[::-1] for p in procs]
    assert sorted(code for code, _ in results) == [0, EXIT_USAGE], results
    err = next(e for code, e in results if code == EXIT_USAGE)
    assert err.count("\n") == 1 and err.startswith("qdebug: error: ") and "Traceback" not in err, err
    assert "is being written by another qdebug" in err or "exists and is not an empty folder" in err, err
    assert (out / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def test_a_build_while_another_holds_the_folder_is_refused_and_leaves_nothing(
    run_cli: Callable[..., CliResult], tmp_path: Path, files: dict[str, Path]
) -> None:
    out = tmp_path / "out"
    with io.output_lock(out):
        assert io.lock_path(out).read_text().strip() == str(os.getpid())
        r = run_cli("build", "-f", files["m"], "--target", "cpu", "--precision", "uint8", "-o", out)
        assert_one_line_error(r, EXIT_USAGE, f"{out} is being written by another qdebug (process {os.getpid()})")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # the lock went with its holder
    r = run_cli("build", "-f", files["m"], "--target", "cpu", "--precision", "uint8", "-o", out)
    assert r.code == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def test_a_failed_build_leaves_no_lock(
    run_cli: Callable[..., CliResult], tmp_path: Path, files: dict[str, Path]
) -> None:
    big = tmp_path / "in" / "big.npz"
    np.savez(big, x=np.full((4, 1, 6, 6), 3e38, np.float32))  # calibration overflows: fails after staging
    r = run_cli("build", "-f", files["m"], "--target", "cpu", "--precision", "uint8", "--calib", big,
                "-o", tmp_path / "out")  # fmt: skip
    assert r.code != 0 and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
