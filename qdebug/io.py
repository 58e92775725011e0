"""The file layer: every file qdebug writes appears whole or not at all (a temporary sibling renamed over it), with
the mode a plain ``open``/``mkdir`` would give it; every file it reads is checked first (a regular file, or a folder
where one is taken), opened without blocking, and its JSON parsed with a bound on nesting."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from qdebug._signals import signals_held
from qdebug.errors import ConfigError, InputFileError

if TYPE_CHECKING:
    import onnx

#: Longest file name most file systems take (bytes).
NAME_MAX = 255

#: Prefix of every temporary sibling qdebug makes next to an output (``.qd-<8 hex>.tmp``, a staging folder
#: ``.qd-<8 hex>.part``, a lock ``.qd-<12 hex>.lock``): short, so that any legal output name can be written.
TEMP_PREFIX = ".qd-"

#: The deepest nesting a JSON input may have: qdebug's own files nest a handful of levels, and Python's parser and
#: every reader after it recurse once per level (50,000 levels ended in a RecursionError).
MAX_JSON_DEPTH = 64

#: File name suffixes that ``onnx.load`` reads as a text format (JSON, textproto, ONNX text): a binary model written
#: under such a name could not be loaded back by name.
TEXT_MODEL_SUFFIXES = frozenset({".json", ".onnxjson", ".txtpb", ".textproto", ".prototxt", ".pbtxt", ".onnxtxt",
                                 ".onnxtext"})  # fmt: skip


# ------------------------------------------------------------------------------------------------ writing
def _sibling(folder: Path, suffix: str, make: Callable[[Path], object]) -> Path:
    """A new short random name in ``folder``, made by ``make`` (which raises FileExistsError when it is taken)."""
    for _ in range(100):
        path = folder / f"{TEMP_PREFIX}{secrets.token_hex(4)}{suffix}"
        try:
            make(path)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(folder))


def _create_file(path: Path) -> None:
    # 0o666 as open() asks: the kernel applies the umask and the folder's default ACL (mkstemp's 0o600 hid them)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))


def new_temp_file(folder: str | Path, suffix: str = ".tmp") -> Path:
    """A new empty file ``.qd-<8 hex><suffix>`` in ``folder``, with the mode ``open(path, 'w')`` would give it
    (``0o666 & ~umask``): renamed over an output, it is that output. Make it inside :func:`signals_held` and a
    ``try`` that removes it."""
    return _sibling(Path(folder), suffix, _create_file)


def new_temp_dir(folder: str | Path, suffix: str = ".part") -> Path:
    """A new empty folder ``.qd-<8 hex><suffix>`` in ``folder``, with the mode ``mkdir`` would give it (``0o777 &
    ~umask``, not mkdtemp's 0o700): renamed over an output folder, it is that folder. Make it inside
    :func:`signals_held` and a ``try`` that removes it."""
    return _sibling(Path(folder), suffix, Path.mkdir)


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """``with atomic_path(dest) as tmp``: write ``tmp`` (a new file next to ``dest``, :func:`new_temp_file`); leaving
    the block renames it over ``dest``, an error or a signal removes it."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp: Path | None = None
    try:
        with signals_held():  # a signal is raised inside the try, once tmp is known
            tmp = new_temp_file(dest.parent, suffix)
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise


@contextmanager
def temp_dir(prefix: str | None = None, dir: str | Path | None = None) -> Iterator[str]:
    """``with temp_dir(...) as path``: :class:`tempfile.TemporaryDirectory`'s folder (private: 0o700, for work files,
    never renamed into an output), made with :func:`signals_held` so that a signal arriving while it is made is
    raised where it is removed again."""
    made: tempfile.TemporaryDirectory[str] | None = None
    try:
        with signals_held():
            made = tempfile.TemporaryDirectory(prefix=prefix, dir=dir)
        yield made.name
    finally:
        if made is not None:
            made.cleanup()


def _atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


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


def lock_path(output: str | Path) -> Path:
    """The lock file of ``output`` (:func:`output_lock`): ``.qd-<12 hex of its name>.lock`` beside it."""
    out = Path(output)
    return out.parent / f"{TEMP_PREFIX}{hashlib.sha256(os.fsencode(out.name)).hexdigest()[:12]}.lock"


@contextmanager
def output_lock(output: str | Path) -> Iterator[None]:
    """Hold ``output`` while the block writes it: another qdebug writing the same output meanwhile is refused with
    one line (:class:`ConfigError`, exit 2) instead of both racing to the final rename. The lock is an ``flock``
    on :func:`lock_path` (the kernel releases it when a process dies, so a crash leaves no stale lock), removed on
    leaving the block. The folder above ``output`` must exist."""
    out = Path(output)
    fd: int | None = None
    try:
        with signals_held():  # raised inside the try, where the lock is released again
            fd = _lock(lock_path(out), out)
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                lock_path(out).unlink()  # still locked: whoever opened this inode meanwhile will find it gone
            os.close(fd)


def _lock(lock: Path, out: Path) -> int:
    """An open descriptor of ``lock``, exclusively locked, holding this process's id."""
    import fcntl

    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            raise ConfigError(f"{out}: cannot create its lock file {lock}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            by = f"another qdebug (process {holder})" if holder.isdigit() else "another qdebug"
            raise ConfigError(
                f"{out} is being written by {by}; wait for it to finish or choose another output"
            ) from None
        if _same_inode(fd, lock):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # its holder removed it as this process locked it: lock the new one
    raise ConfigError(f"{out}: could not take its lock file {lock}")


def _same_inode(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


# ------------------------------------------------------------------------------------------------ reading
_SPECIAL_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _os_problem(path: Path, exc: OSError) -> str:
    """What an ``OSError`` from looking ``path`` up means, in words."""
    if exc.errno == errno.ELOOP:
        return "is a symbolic link loop (too many levels of symbolic links)"
    if exc.errno == errno.ENAMETOOLONG:
        size = len(os.fsencode(path.name))
        if size > NAME_MAX:
            return f"the file name is {size} bytes, longer than the {NAME_MAX} a file system takes"
        folder = max((len(os.fsencode(part)) for part in path.parent.parts), default=0)
        if folder > NAME_MAX:
            return f"a folder name in it is {folder} bytes, longer than the {NAME_MAX} a file system takes"
        return "the path is longer than the file system takes"
    if exc.errno == errno.ENOTDIR:
        return "a folder in the path is a file"
    return f"cannot read it ({exc.strerror or exc})"


def input_problem(path: str | Path, *, folder: bool = False, missing_ok: bool = False) -> str | None:
    """Why ``path`` cannot be read as an input, from one ``stat`` (nothing is opened): missing (unless
    ``missing_ok``), a symbolic link loop, a name too long, a folder (unless ``folder``), a named pipe, socket or
    device (opening a FIFO blocks until someone writes to it; a device never ends); ``None`` when it can be."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return None if missing_ok else "no such file"
    except OSError as exc:
        return _os_problem(p, exc)
    except ValueError:  # os.stat's word for a NUL byte, which no file name holds
        return "a file name cannot hold a NUL byte"
    if stat.S_ISREG(mode) or (folder and stat.S_ISDIR(mode)):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    kind = next((what for test, what in _SPECIAL_KINDS if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file"


def _named(path: Path, role: str | None, problem: str) -> str:
    return f"{role} {path}: {problem}" if role else f"{path}: {problem}"


def check_input(path: str | Path, role: str | None = None, *, folder: bool = False) -> Path:
    """``path``, or :class:`InputFileError` naming it (and its ``role``, e.g. ``"float model"``) when it cannot be
    read as an input (:func:`input_problem`)."""
    p = Path(path)
    problem = input_problem(p, folder=folder)
    if problem is not None:
        raise InputFileError(_named(p, role, problem))
    return p


def open_input(path: str | Path, role: str | None = None) -> BinaryIO:
    """A regular file opened for reading, or :class:`InputFileError` naming it. Checked before opening and again on
    the open file, which is opened without blocking: a FIFO put in its place meanwhile is refused, not waited on."""
    p = check_input(path, role)
    nonblock = getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(p, os.O_RDONLY | nonblock | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputFileError(_named(p, role, _os_problem(p, exc))) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputFileError(_named(p, role, "is not a regular file"))
        if nonblock:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_bytes(path: str | Path, role: str | None = None) -> bytes:
    """The bytes of an input file (:func:`open_input`); a read error is :class:`InputFileError` naming it."""
    with open_input(path, role) as fh:
        try:
            return fh.read()
        except OSError as exc:
            raise InputFileError(_named(Path(path), role, _os_problem(Path(path), exc))) from exc


def read_input_text(path: str | Path, role: str | None = None) -> str:
    """The UTF-8 text of an input file (:func:`read_input_bytes`); other bytes are :class:`InputFileError`."""
    data = read_input_bytes(path, role)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(_named(Path(path), role, "cannot read it: not UTF-8 text")) from exc


#: A JSON string or a bracket: what the nesting of a JSON text is counted on.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _too_deep(doc: Any) -> bool:
    """Whether a parsed document nests more than :data:`MAX_JSON_DEPTH` levels (walked with a stack, not recursion)."""
    stack = [(doc, 1)] if isinstance(doc, dict | list) else []
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return True
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return False


def _deep_position(text: str) -> int:
    """Where the text first opens a level deeper than :data:`MAX_JSON_DEPTH` (0 if it does not)."""
    depth = 0
    for m in _JSON_TOKENS.finditer(text):
        token = m.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return m.start()
        elif token in ("]", "}"):
            depth -= 1
    return 0


def parse_json(text: str) -> Any:
    """``json.loads``, with nesting deeper than :data:`MAX_JSON_DEPTH` refused as the ``json.JSONDecodeError`` every
    loader already turns into its one-line message (not a RecursionError here or in a reader after it)."""
    try:
        doc = json.loads(text)
        deep = _too_deep(doc)
    except RecursionError:
        deep = True
    if deep:
        raise json.JSONDecodeError(f"nested more than {MAX_JSON_DEPTH} levels deep", text, _deep_position(text))
    return doc


def load_json(path: str | Path, role: str | None = None) -> Any:
    """An input JSON file parsed (:func:`read_input_text`, :func:`parse_json`); malformed JSON raises
    ``json.JSONDecodeError`` for the caller to name in its own words."""
    return parse_json(read_input_text(path, role))


# ------------------------------------------------------------------------------------------------ the output guard
def refuse_overwrite_input(output: str | Path, *inputs: str | Path) -> None:
    """Refuse to write over one of the user's input files."""
    for i in inputs:
        if same_file(Path(output), Path(i)):
            raise InputFileError(f"{output}: refusing to overwrite an input file; choose another output path")


def same_file(a: str | Path, b: str | Path) -> bool:
    """The same file or folder by real path, or by inode (hard links); False when either does not exist or cannot be
    looked up (a symbolic link loop: RuntimeError before Python 3.13; an overlong or NUL name)."""
    a, b = Path(a), Path(b)
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except (OSError, RuntimeError, ValueError):
        return False


def _name_problem(t: Path) -> str | None:
    size = len(os.fsencode(t.name))
    if size > NAME_MAX:
        return f"{t}: the file name is longer than {NAME_MAX} bytes"
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
    (or a file where a folder is meant), under a regular file, in a folder that cannot be written, a symbolic link
    loop, a name longer than a file system takes, or (``model``) named like a text format ONNX would misread."""
    problems = []
    targets = [output, *(output.with_suffix(s) for s in derived)]
    for t in targets:
        for role, path in inputs.items():
            if same_file(t, path):
                problems.append(f"{t} is the {role} {path}: refusing to overwrite an input; choose another output")
        name_problem = _name_problem(t)
        if name_problem:
            problems.append(name_problem)
    if model and output.suffix.lower() in TEXT_MODEL_SUFFIXES:
        problems.append(f"{output}: a '{output.suffix}' name is read back as a text format, not a model; use .onnx")
    try:
        os.stat(output)
    except ValueError:
        return [*problems, f"{output}: a file name cannot hold a NUL byte"]
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENAMETOOLONG):  # where it would lie cannot be looked at
            named = exc.errno == errno.ENAMETOOLONG and _name_problem(output) is not None
            return problems if named else [*problems, f"{output}: {_os_problem(output, exc)}"]
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
