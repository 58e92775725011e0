"""qdebug sends nothing anywhere and leaves nothing behind on its own behalf: ONNX Runtime's usage telemetry (its
Linux wheels record events for upload and write a session file into TMPDIR and a device id under ~/.cache on
import) is off unless the user turned it on (``ORT_DISABLE_TELEMETRY=0``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SAMPLE_MODELS


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment without any telemetry choice, with HOME and TMPDIR of the test's own."""
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")}
    (tmp / "home").mkdir()
    (tmp / "tmp").mkdir()
    return {**env, "HOME": str(tmp / "home"), "TMPDIR": str(tmp / "tmp"), **extra}


def _left(tmp: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in [*(tmp / "home").rglob("*"), *(tmp / "tmp").rglob("*")])


def test_a_qdebug_command_leaves_no_telemetry_behind(tmp_path: Path) -> None:
    """A real ``qdebug quantize`` writes its output and nothing else: no ``.ses`` file, no ``~/.cache/Microsoft``;
    the same environment importing ONNX Runtime alone (the control) shows what the opt-out prevents, when the
    installed ONNX Runtime records telemetry at all."""
    control = tmp_path / "control"
    control.mkdir()
    subprocess.run([sys.executable, "-c", "import onnxruntime"], env=_env(control), check=True, timeout=120)
    run = tmp_path / "run"
    run.mkdir()
    out = tmp_path / "m.qdq.onnx"
    argv = ["-m", "qdebug", "quantize", "-f", str(SAMPLE_MODELS / "digits_cnn.onnx"), "--calib",
            str(SAMPLE_MODELS / "digits_calib.npz"), "-o", str(out)]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, *argv], check=False, env=_env(run), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    assert _left(run) == []
    if _left(control):  # this ONNX Runtime records telemetry: the control must show the very files qdebug avoids
        assert any(name.endswith(".ses") or "Microsoft" in name for name in _left(control)), _left(control)


def test_the_user_can_turn_onnx_runtime_telemetry_back_on(tmp_path: Path) -> None:
    """``import qdebug`` sets the opt-out only as a default: a user's own ``ORT_DISABLE_TELEMETRY`` is kept, for
    this process and the workers it starts."""
    code = "import os, qdebug; print(os.environ['ORT_DISABLE_TELEMETRY'])"
    for given, seen in ((None, "1"), ("0", "0")):
        (tmp_path / f"{given}").mkdir()
        env = _env(tmp_path / f"{given}", **({"ORT_DISABLE_TELEMETRY": given} if given else {}))
        proc = subprocess.run(
            [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.stdout.strip() == seen, proc.stderr
