"""Atomic output: every file qdebug writes appears whole or not at all (temp file + rename)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx

from qdebug.errors import InputFileError


def _atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.replace(tmp_path, dest)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return dest


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write text atomically."""
    return _atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write bytes atomically."""
    return _atomic(path, lambda p: p.write_bytes(data))


def atomic_save_model(model: onnx.ModelProto, path: str | Path) -> Path:
    """Save an ONNX model atomically (inline weights; the 2 GB protobuf limit is reported clearly)."""
    if model.ByteSize() > 2**31 - 1:
        raise InputFileError(f"{path}: model is larger than 2 GB; external-data output is not supported yet")
    return atomic_write_bytes(path, model.SerializeToString())


def refuse_overwrite_input(output: str | Path, *inputs: str | Path) -> None:
    """Refuse to write over one of the user's input files."""
    out = Path(output).resolve()
    for i in inputs:
        if Path(i).resolve() == out:
            raise InputFileError(f"{output}: refusing to overwrite an input file; choose another output path")
