"""Running a compiled (EPContext) model on the QNN HTP in-process (the simulator on x86): :func:`qnn_session` checks
that the QNN provider really runs it (Python falls back to the CPU provider silently in some failure modes), and
:func:`run_compiled` runs it sample by sample.

``onnxruntime_qnn`` is imported only through :func:`qdebug._lazy.require` (the ``qnn`` extra).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qdebug._lazy import require
from qdebug.data import DataSource
from qdebug.errors import ConfigError, TargetError
from qdebug.targets.qnn_compile import load_compiled
from qdebug.targets.qnn_options import DEFAULT_OPTIONS, QNN_EP, QnnOptions

__all__ = ["qnn_session", "run_compiled"]

_REGISTER_LOCK = threading.Lock()


#: The HTP simulator's banner when it first loads (``# LIBNATIVE: No alternate configuration present ...``): says
#: nothing a user can act on.
_BANNER = "# LIBNATIVE:"


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what the native libraries write to file descriptor 1 to stderr instead, for a while.

    The HTP simulator prints a banner (``# LIBNATIVE: ...``) to stdout when it first loads; it must not
    end up in a CLI's JSON output, nor on the terminal: it is dropped, and every other line goes to stderr.
    """
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real stdout (e.g. some embedded interpreters): nothing to protect
        yield
        return
    with tempfile.TemporaryFile() as held:  # anonymous: nothing left behind however the session ends
        try:
            os.dup2(held.fileno(), 1)
            yield
        finally:
            with contextlib.suppress(Exception):
                ctypes.CDLL(None).fflush(None)  # C stdio buffers of the native libraries
            os.dup2(saved, 1)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            kept = [line for line in text.splitlines() if not line.lstrip().startswith(_BANNER)]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def qnn_session(path: str | Path, options: QnnOptions = DEFAULT_OPTIONS) -> Any:
    """An in-process ONNX Runtime session of a compiled model on the QNN provider (the HTP simulator on x86).

    Raises :class:`~qdebug.errors.TargetError` when QNN cannot load the model or the session would not
    run on QNN (Python falls back to the CPU provider silently in some failure modes).
    """
    require("onnxruntime_qnn")
    import onnxruntime as ort

    from qdebug.targets._qnn_worker import register_qnn

    with _REGISTER_LOCK:
        devices = register_qnn(ort)
    if not devices:
        raise TargetError("onnxruntime-qnn registered no QNN device")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_provider_for_devices(devices, options.provider_options())
    try:
        with _stdout_to_stderr():
            sess = ort.InferenceSession(str(path), so)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise TargetError(f"{path}: QNN could not load the compiled model: {exc}") from exc
    providers = list(sess.get_providers())
    if QNN_EP not in providers:
        # Python can fall back to the CPU provider silently; numbers from it would not be the HTP's.
        raise TargetError(f"{path}: the session runs on {providers}, not on {QNN_EP}")
    return sess


def run_compiled(
    compiled_model: str | Path,
    data: DataSource,
    output_names: Sequence[str] | None = None,
    options: QnnOptions = DEFAULT_OPTIONS,
) -> Iterator[dict[str, np.ndarray]]:
    """Run a compiled (EPContext) model on the HTP, one sample at a time, yielding its outputs by name.

    The model and the session are checked before the first sample (bad input raises here, not on
    iteration): :class:`~qdebug.errors.ModelError` for a model that is not compiled,
    :class:`~qdebug.errors.TargetError` when QNN cannot load it or the session does not run on QNN.
    """
    path = Path(compiled_model)
    m, _ = load_compiled(path)
    del m
    sess = qnn_session(path, options)
    available = [o.name for o in sess.get_outputs()]
    names = list(output_names) if output_names is not None else available
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ConfigError(f"unknown output name(s) {unknown}; the compiled model's outputs are {available}")
    return _run_samples(sess, names, data, path)


def _run_samples(sess: Any, names: list[str], data: DataSource, path: Path) -> Iterator[dict[str, np.ndarray]]:
    for i, sample in enumerate(data):
        try:
            values = sess.run(names, sample)
        except Exception as exc:
            raise TargetError(f"{path}: sample {i}: the HTP run failed: {exc}") from exc
        yield dict(zip(names, values, strict=True))
