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
    import tempfile

    real = tempfile.mkstemp

    def mkstemp_then_signal(*a: Any, **k: Any) -> tuple[int, str]:
        made = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return made

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_then_signal)
    with pytest.raises(StoppedError):
        atomic_write_text(tmp_path / "out.json", "{}")
    assert list(tmp_path.iterdir()) == []
