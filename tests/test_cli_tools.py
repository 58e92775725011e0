"""The CLI's shape: one Tool per command, the same option names everywhere, deprecated spellings that still work
with a one-line notice, and one-line usage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import builders
import pytest
from conftest import save

from qdebug.cli import TOOLS, build_parser
from qdebug.errors import EXIT_OK, EXIT_USAGE

REPO = Path(__file__).resolve().parents[1]


def test_one_tool_per_command_with_the_shared_names() -> None:
    assert [t.name for t in TOOLS] == [
        "quantize",
        "debug",
        "diagnose",
        "suggest",
        "search",
        "fix",
        "build",
        "report",
        "demo",
        "dashboard",
        "notebooks",
    ]
    p = build_parser()
    for argv in (
        ["quantize", "-f", "m", "--calib", "c.npz", "-o", "q"],
        ["debug", "-f", "m", "-q", "q", "-d", "d.npz", "-o", "r.json"],
        ["suggest", "-f", "m", "-q", "q", "-d", "d.npz"],
        ["search", "-f", "m", "--calib", "c.npz", "-d", "d.npz", "-o", "o.json", "--goal-sqnr", "30"],
        ["build", "-f", "m", "--target", "cpu", "--precision", "int8", "--calib", "c.npz", "-d", "d.npz", "-o", "o"],
        ["diagnose", "-f", "m", "-q", "q", "-d", "d.npz", "-o", "d.json"],
        ["report", "r.json", "-o", "r.html", "-f", "m", "-q", "q"],
    ):
        args = p.parse_args(argv)
        assert args.float_model == "m", argv


@pytest.mark.parametrize(
    ("argv", "old", "new"),
    [
        (["quantize", "-m", "{m}", "-o", "{out}/q.onnx", "--samples", "2"], "-m", "--float-model/-f"),
        (["quantize", "--model", "{m}", "-o", "{out}/q.onnx", "--samples", "2"], "--model", "--float-model/-f"),
        (["quantize", "-f", "{m}", "--data", "{calib}", "-o", "{out}/q.onnx"], "--data", "--calib"),
        (["build", "--onnx", "{m}", "--target", "cpu", "--precision", "uint8", "-o", "{out}/b"], "--onnx", "-f"),
        (["build", "-f", "{m}", "--device", "cpu", "--precision", "uint8", "-o", "{out}/b"], "--device", "--target"),
    ],
)
def test_old_spellings_still_work_with_one_notice(run_cli, tmp_path: Path, argv: list[str], old: str, new: str) -> None:
    import numpy as np

    m = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).random((4, 1, 6, 6), dtype=np.float32))
    r = run_cli(*[a.format(m=m, out=tmp_path, calib=calib) for a in argv])
    assert r.code == EXIT_OK, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("qdebug: note:")]
    assert len(notes) == 1 and old in notes[0] and new in notes[0] and "removed in" in notes[0], r.stderr


def test_build_data_without_calib_keeps_its_old_meaning(run_cli, tmp_path: Path) -> None:
    import numpy as np

    m = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    data = tmp_path / "d.npz"
    np.savez(data, x=np.random.default_rng(0).random((4, 1, 6, 6), dtype=np.float32))
    r = run_cli("build", "-f", m, "--target", "cpu", "--precision", "uint8", "-d", data, "-o", tmp_path / "b",
                "--json")  # fmt: skip
    assert r.code == EXIT_OK, r.stderr
    assert "also calibrates on it" in r.stderr
    import json

    roles = {i["role"] for i in json.loads(r.out)["inputs"]}
    assert {"data", "debug_data"} <= roles


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["debug", "-q", "q.onnx"], "--float-model/-f"),
        (["quantize", "-f", "m.onnx"], "--output/-o"),
        (["build", "-f", "m.onnx", "-o", "o"], "--target"),
        (["debug", "-f", "a", "-q", "b", "--fail-below", "nan"], "finite"),
        (["debug", "-f", "a", "-q", "b", "--fail-below", "inf"], "finite"),
        (["debug", "-f", "a", "-q", "b", "--top", "-1"], "positive integer"),
        (["suggest", "-f", "a", "-q", "b", "--top", "0"], "positive integer"),
        # a goal of nan can never be met: search ran every step and exited 10
        (["search", "-f", "a", "-o", "o.json", "--goal-sqnr", "nan"], "finite"),
        (["search", "-f", "a", "-o", "o.json", "--goal-sqnr", "inf"], "finite"),
        (["search", "-f", "a", "-o", "o.json", "--max-accuracy-drop", "nan"], "finite"),
        (["debug", "-f", "a", "-q", "b", "--capture", "gpu"], "invalid choice"),
        (["nope"], "invalid choice"),
        (["debug", "-f", "a", "-q", "b", "--bogus"], "qdebug debug: error: unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_are_one_line(run_cli, argv: list[str], needle: str) -> None:
    r = run_cli(*argv)
    assert r.code == EXIT_USAGE
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "--help" in lines[0], r.stderr


def test_python_dash_m() -> None:
    argv = [sys.executable, "-m", "qdebug.cli", "--version"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
    assert out.returncode == 0 and out.stdout.startswith("qdebug ")


def test_import_qdebug_is_light_and_ctrl_c_at_start_up_is_one_line() -> None:
    import signal
    import time

    code = (
        "import sys, qdebug; print('onnxruntime' in sys.modules, 'numpy' in sys.modules, qdebug.QuantConfig.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split()[:2] == ["False", "False"] and "QuantConfig" in out.stdout
    script = (
        "import sys; from qdebug._entry import console_main; sys.argv = ['qdebug', '--version']; "
        "print('ready', flush=True); console_main()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    # Wait for the interpreter to be up (a fixed sleep lost the race on a loaded machine: SIGINT arrived before
    # Python installed its handler), then interrupt inside the CLI's imports (numpy, onnx, onnxruntime), or after.
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode in (0, 130), (proc.returncode, err)
    if proc.returncode == 130:
        assert err.strip() == "qdebug: interrupted"


#: Sends this process a Ctrl-C when numpy's C code imports ``datetime`` (deterministic: the sleep above only lands
#: there by chance; there numpy turned the KeyboardInterrupt into an ImportError and a traceback).
_CTRL_C_INSIDE_NUMPY = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own Ctrl-C, even if the runner ignores SIGINT
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
class Kick:
    def find_spec(self, name, path=None, target=None):
        if name in ("datetime", "_datetime") and "numpy" in sys.modules:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Kick())
from qdebug._entry import console_main
sys.argv = ["qdebug", "--version"]
console_main()
"""


def test_ctrl_c_inside_a_c_extensions_import_is_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CTRL_C_INSIDE_NUMPY], capture_output=True, text=True, cwd=REPO, check=False, timeout=120
    )
    assert (proc.returncode, proc.stderr.strip()) == (130, "qdebug: interrupted"), proc.stderr[-1500:]


def test_sigterm_mid_search_cleans_up_like_ctrl_c(tmp_path: Path) -> None:
    """``kill`` (a CI job's timeout) during a search: the temporary working folder goes, no output is half-written,
    one line says so, exit 143."""
    import os
    import signal
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "o.json"
    argv = [sys.executable, "-m", "qdebug.cli", "search", "-f", str(REPO / "sample_models" / "digits_cnn.onnx"),
            "--calib", str(REPO / "sample_models" / "digits_calib.npz"), "--goal-sqnr", "1000", "--strategy", "greedy",
            "--max-steps", "50", "-o", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)})
    deadline = time.monotonic() + 120
    while not any(p.name.startswith("qdebug-mixed-") for p in tmp.iterdir()):  # the search's folder exists: busy
        assert proc.poll() is None and time.monotonic() < deadline, "the search ended before it could be stopped"
        time.sleep(0.05)
    time.sleep(1.0)  # into the base quantization or the search
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == "qdebug: terminated" and "Traceback" not in err, err
    assert not out.exists()
    assert [p.name for p in tmp.iterdir() if p.name.startswith("qdebug")] == []


def test_working_folders_go_with_the_process_without_close(tmp_path: Path) -> None:
    """A notebook never calls close(): the folders a QuantDebugger and a MixedPrecisionSession made for themselves are
    removed when they are collected or the interpreter exits; a folder the caller gave stays."""
    import os

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    kept = tmp_path / "kept"
    script = (
        "from qdebug.mixed.session import MixedPrecisionSession\n"
        "from widgets.session import QuantDebugger\n"
        f"m = r'{REPO / 'sample_models' / 'digits_cnn.onnx'}'\n"
        "dbg = QuantDebugger(m)\n"
        "s = MixedPrecisionSession(m)\n"
        f"given = QuantDebugger(m, workdir=r'{kept}')\n"
        "import tempfile, pathlib\n"
        "tmp = pathlib.Path(tempfile.gettempdir())\n"
        "print(sorted(p.name.split('-')[1] for p in tmp.iterdir() if p.name.startswith('qdebug-')))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert "'mixed'" in out.stdout and "'ui'" in out.stdout  # both existed while the process ran
    assert [p.name for p in tmp.iterdir() if p.name.startswith("qdebug")] == []
    assert kept.is_dir() and any(kept.iterdir())
