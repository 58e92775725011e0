"""Library noise stays off the user's terminal: the dashboard's Voila without its 'not trusted', TCP-encryption and
DeprecationWarning lines (every other line passes), the HTP simulator's LIBNATIVE banner dropped (anything else the
native libraries print on stdout still reaches stderr), and the CLI under ``python -W default`` free of warnings."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import builders
from conftest import save

from qdebug.cli.dashboard import forward_lines

REPO = Path(__file__).resolve().parents[1]

#: What Voila 0.5 and ipykernel 7 printed when `qdebug dashboard` served one page (the first two lines: traitlets'
#: DeprecationWarning about Voila's own command line).
VOILA_STDERR = """\
/x/site-packages/traitlets/traitlets.py:4066: DeprecationWarning: --tornado_settings={'websocket_max_message_size': 1} for dict-traits is deprecated in traitlets 5.0. You can pass --tornado_settings <key=value> ...
  warn(
[Voila] Using /tmp to store connection files
[Voila] Voil\u00e0 is running at:
http://127.0.0.1:8866/
[Voila] WARNING | Notebook dashboard.ipynb is not trusted
[Voila] Kernel started: de9c42cf
[IPKernelApp] WARNING | Kernel is running over TCP without encryption. All communication (including code and outputs) is sent in plain text and is susceptible to eavesdropping. Use IPC transport or launch with kernel manager-provisioned CurveZMQ keys
[Voila] ERROR | Uncaught exception GET /voila/render (127.0.0.1)
Traceback (most recent call last):
  File "/x/tornado/web.py", line 1, in _execute
ValueError: a real error
"""  # noqa: E501


def test_the_dashboard_drops_the_noise_and_keeps_every_other_line() -> None:
    out = io.StringIO()
    forward_lines(io.BytesIO(VOILA_STDERR.encode()), out)
    kept = out.getvalue().splitlines()
    assert kept == [
        "[Voila] Using /tmp to store connection files",
        "[Voila] Voil\u00e0 is running at:",
        "http://127.0.0.1:8866/",
        "[Voila] Kernel started: de9c42cf",
        "[Voila] ERROR | Uncaught exception GET /voila/render (127.0.0.1)",
        "Traceback (most recent call last):",
        '  File "/x/tornado/web.py", line 1, in _execute',  # a traceback's indented lines are not a warning's
        "ValueError: a real error",
    ]


def test_the_htp_banner_is_dropped_and_other_native_output_goes_to_stderr(capfd) -> None:
    from qdebug.targets.qnn_session import _stdout_to_stderr

    with _stdout_to_stderr():
        os.write(1, b" # LIBNATIVE: No alternate configuration present in libnative_tls.conf - using default\n")
        os.write(1, b"QnnDsp <E> a real native error\n")
    os.write(1, b"after\n")
    captured = capfd.readouterr()
    assert captured.out == "after\n"
    assert "LIBNATIVE" not in captured.err and "QnnDsp <E> a real native error" in captured.err


def test_the_cli_prints_no_library_warning(tmp_path: Path) -> None:
    """``qdebug --help`` and a quantize + debug run, with every warning shown (``-W default``): stderr holds no
    warning line (a warning qdebug says itself is one ``qdebug: warning:`` line)."""
    f = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = str(REPO)
    runs = [
        ["--help"],
        ["quantize", "-f", str(f), "-o", str(tmp_path / "q.onnx"), "--samples", "4", "--quiet"],
        ["debug", "-f", str(f), "-q", str(tmp_path / "q.onnx"), "--samples", "2", "--json"],
    ]
    for argv in runs:
        proc = subprocess.run(
            [sys.executable, "-W", "default", "-m", "qdebug", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, (argv, proc.stderr)
        noise = [line for line in proc.stderr.splitlines() if "Warning" in line or "warn(" in line]
        assert not noise, (argv, noise)


def test_quantizing_the_samples_says_nothing_on_stderr(tmp_path: Path, run_cli) -> None:
    """ORT's per-channel check on a norm's 1-D scale ("Axis 1 is out-of-range for weight ... with rank 1") is not
    relayed as a warning; another warning of ORT's quantizer still is."""
    import logging

    from qdebug.ort_view import quiet_ort
    from qdebug.samples import get_sample

    for name in ("digits_cnn", "digits_transformer"):
        sample = get_sample(name)
        r = run_cli("quantize", "-f", sample.path, "--calib", sample.calibration, "-o", tmp_path / f"{name}.onnx")
        assert r.code == 0 and r.stderr == "", (name, r.stderr)
    with quiet_ort() as held:
        logging.warning("Axis 1 is out-of-range for weight 'ln.weight' with rank 1")
        logging.warning("Axis 1 is out-of-range for weight 'conv.weight' with rank 4")
    assert held.notes() == [
        "ONNX Runtime's quantizer warned: Axis 1 is out-of-range for weight 'conv.weight' with rank 4"
    ]
