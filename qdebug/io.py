"""Atomic output: every file qdebug writes appears whole or not at all (temp file + rename)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import onnx

from qdebug._signals import signals_held
from qdebug.errors import InputFileError


@contextmanager
def temp_dir(prefix: str | None = None, dir: str | Path | None = None) -> Iterator[str]:
    """``with temp_dir(...) as path``: :class:`tempfile.TemporaryDirectory`'s folder, made with
    :func:`signals_held` so that a signal arriving while it is made is raised where it is removed again."""
    made: tempfile.TemporaryDirectory[str] | None = None
    try:
        with signals_held():
            made = tempfile.TemporaryDirectory(prefix=prefix, dir=dir)
        yield made.name
    finally:
        if made is not None:
            made.cleanup()


def _atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_path: Path | None = None
    try:
        with signals_held():  # a signal is raised inside the try, once tmp_path is known
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
            os.close(fd)
            tmp_path = Path(tmp)
        write(tmp_path)
        os.replace(tmp_path, dest)
    except BaseException:
        if tmp_path is not None:
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


#: Longest file name most file systems take (bytes).
NAME_MAX = 255

#: The most bytes a temporary sibling's name adds to an output's name before the rename: build's staging folder
#: ``.<name>.building-<8 hex>`` (19); the atomic writers' ``.<name>.<8 random>.tmp`` / ``.onnx`` add less. An
#: output whose name leaves no room for it would fail after all the work, so the guard refuses it up front.
TEMP_NAME_EXTRA = 19

#: File name suffixes that ``onnx.load`` reads as a text format (JSON, textproto, ONNX text): a binary model written
#: under such a name could not be loaded back by name.
TEXT_MODEL_SUFFIXES = frozenset({".json", ".onnxjson", ".txtpb", ".textproto", ".prototxt", ".pbtxt", ".onnxtxt",
                                 ".onnxtext"})  # fmt: skip


def _same_file(a: Path, b: Path) -> bool:
    """The same file by real path, or by inode (hard links); False when either does not exist."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _name_problem(t: Path) -> str | None:
    size = len(os.fsencode(t.name))
    if size > NAME_MAX:
        return f"{t}: the file name is longer than {NAME_MAX} bytes"
    if size + TEMP_NAME_EXTRA > NAME_MAX:
        return (
            f"{t}: the file name is {size} bytes; at most {NAME_MAX - TEMP_NAME_EXTRA} leave room for the temporary "
            "name it is written under"
        )
    return None


def output_problems(
    output: Path,
    inputs: Mapping[str, Path],
    *,
    folder: bool = False,
    derived: Sequence[str] = (),
    model: bool = False,
) -> list[str]:
    """Why ``output`` (and the files derived from it by ``derived`` suffixes, e.g. ``.calib.json``) cannot be
    written without risk: it is one of ``inputs`` (by real path or hard link), a directory where a file is meant
    (or a file where a folder is meant), under a regular file, in a folder that cannot be written, too long (with
    room for its temporary name), or (``model``) named like a text format ONNX would misread."""
    problems = []
    targets = [output, *(output.with_suffix(s) for s in derived)]
    for t in targets:
        for role, path in inputs.items():
            if _same_file(t, path):
                problems.append(f"{t} is the {role} {path}: refusing to overwrite an input; choose another output")
        name_problem = _name_problem(t)
        if name_problem:
            problems.append(name_problem)
    if model and output.suffix.lower() in TEXT_MODEL_SUFFIXES:
        problems.append(f"{output}: a '{output.suffix}' name is read back as a text format, not a model; use .onnx")
    try:
        problems += _place_problems(output, folder)
    except OSError as exc:  # e.g. a folder name above it longer than the file system takes
        problems.append(f"{output}: {exc.strerror or exc}")
    return problems


def _place_problems(output: Path, folder: bool) -> list[str]:
    """A folder/file mix-up, a path under a regular file, or a folder that cannot be written."""
    problems = []
    if not folder and output.is_dir():
        problems.append(f"{output} is a folder; give a file path")
    if folder and output.exists() and not output.is_dir():
        problems.append(f"{output} is a file; give a new or empty folder")
    parent = next((p for p in output.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        problems.append(f"{output}: {parent} is a file, not a folder")
    elif parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        problems.append(f"{output}: cannot write in {parent}")
    return problems
