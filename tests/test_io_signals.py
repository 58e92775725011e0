"""A signal that stops qdebug while a temporary file or folder is being made leaves nothing behind (qdebug.io)."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from qdebug._signals import deferring, signals_held
from qdebug.io import atomic_write_text, temp_dir


class StoppedError(Exception):
    """What the CLI's SIGTERM handler raises (Terminated), here."""


@pytest.fixture
def raising_sigterm() -> Any:
    def stop() -> None:
        raise StoppedError

    previous = signal.signal(signal.SIGTERM, deferring(stop))  # as the CLI installs its handlers
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_held_signal_is_handled_once_released(raising_sigterm: None) -> None:
    reached = []
    with pytest.raises(StoppedError), signals_held():
        os.kill(os.getpid(), signal.SIGTERM)
        reached.append("after the signal, still held")
    assert reached == ["after the signal, still held"]


def test_a_signal_while_a_temp_dir_is_made_leaves_no_folder(
    raising_sigterm: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal arrives inside ``mkdtemp`` (the worst moment: before the finalizer that would remove it exists);
    it is handled once the TemporaryDirectory is whole, and dropping it removes the folder."""
    import tempfile

    real = tempfile.mkdtemp

    def mkdtemp_then_signal(*a: Any, **k: Any) -> str:
        made = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return made

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_signal)
    with pytest.raises(StoppedError), temp_dir(prefix="qdebug-test-", dir=tmp_path):
        pytest.fail("the with block must not start")
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_a_signal_while_an_output_is_written_leaves_no_temp_file(
    raising_sigterm: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal arrives just after the temporary sibling was created, before the writer knows its name."""
    from qdebug import io

    real = io._create_file

    def create_then_signal(path: Path) -> None:
        real(path)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(io, "_create_file", create_then_signal)
    with pytest.raises(StoppedError):
        atomic_write_text(tmp_path / "out.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_a_signal_while_a_staging_folder_or_lock_is_made_leaves_nothing(
    raising_sigterm: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for build's staging folder (made by :func:`new_temp_dir` under ``signals_held``) and its lock."""
    from qdebug import io

    real_lock = io._lock

    def lock_then_signal(lock: Path, out: Path) -> int:
        fd = real_lock(lock, out)
        os.kill(os.getpid(), signal.SIGTERM)
        return fd

    monkeypatch.setattr(io, "_lock", lock_then_signal)
    with pytest.raises(StoppedError), io.output_lock(tmp_path / "out"):
        pytest.fail("the with block must not start")
    assert list(tmp_path.iterdir()) == []

    import builders
    from conftest import save

    from qdebug import build as build_module
    from qdebug.build import BuildOptions, build

    model = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    real_dir = io.new_temp_dir

    def dir_then_signal(folder: Path) -> Path:
        made = real_dir(folder)
        os.kill(os.getpid(), signal.SIGTERM)
        return made

    monkeypatch.setattr(build_module, "new_temp_dir", dir_then_signal)
    with pytest.raises(StoppedError):
        build(model, tmp_path / "out", BuildOptions(device="cpu", precision="uint8"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
