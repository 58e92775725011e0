"""The pre-flight every command runs before any work (:meth:`qdebug.cli._base.Tool.guard`): every input readable,
every output checked against every input *and every other output* and probed for writing, then the command's own
checks (labels, hold-out data, option combinations, what kind of file an input is); every problem found is said at
once, in one line.

Imports nothing heavy: the checks load what they need when they run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from qdebug.errors import ConfigError, InputFileError, QDebugError
from qdebug.io import same_file

T = TypeVar("T")

__all__ = [
    "Checks",
    "Output",
    "Unused",
    "check_promotion_type",
    "given_options",
    "load_kind",
    "output_clashes",
    "write_problem",
]


@dataclass(frozen=True)
class Output:
    """Something a command writes: a file (or a folder), and the files derived from it by suffix."""

    path: str | None
    folder: bool = False
    derived: tuple[str, ...] = ()
    #: a binary ONNX model (its name must not be one ``onnx.load`` reads as a text format)
    model: bool = False
    #: a folder the command writes whole (``build -o``: new or empty, renamed into place): no other output of the
    #: command may go inside it
    whole: bool = False

    def files(self) -> list[Path]:
        """The path and the files derived from it."""
        if not self.path:
            return []
        path = Path(self.path)
        return [path, *(path.with_suffix(s) for s in self.derived)]


@dataclass(frozen=True)
class Unused:
    """An option that does nothing unless ``needs`` holds: refused when given without it (docs/cli.md)."""

    dest: str
    flag: str
    needs: bool
    why: str


class _Unset(list[Any]):
    """The default of every option while :func:`given_options` reads the command line again (a list, so that an
    ``append`` option can copy it)."""


def given_options(
    top: argparse.ArgumentParser, sub: argparse.ArgumentParser, argv: Sequence[str] | None
) -> frozenset[str]:
    """The ``dest`` of every option of ``sub`` (a subcommand's parser) that the command line gives, even with its
    default value: argparse itself cannot tell ``--seed 0`` from no ``--seed``. ``argv`` parsed once before by
    ``top`` without error."""
    unset = _Unset()
    saved = [(a, a.default) for a in sub._actions if a.option_strings and a.default is not argparse.SUPPRESS]
    try:
        for action, _ in saved:
            action.default = unset
        ns, _ = top.parse_known_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    return frozenset(a.dest for a, _ in saved if getattr(ns, a.dest, unset) is not unset)


def _inside(path: Path, folder: Path) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
    except (OSError, ValueError):
        return False


def output_clashes(outputs: Mapping[str, Output], command: str) -> list[str]:
    """Every pair of one command's outputs (derived files included) that would land on the same file, and every
    output inside a folder the command writes whole: one would overwrite the other."""
    files = [(flag, path) for flag, out in outputs.items() for path in out.files()]
    problems = []
    for i, (flag_a, a) in enumerate(files):
        for flag_b, b in files[i + 1 :]:
            if same_file(a, b):
                problems.append(f"{flag_a} {a} and {flag_b} {b} are the same file: give each output its own path")
    for flag_f, out in outputs.items():
        if not (out.whole and out.path):
            continue
        for flag, path in files:
            if flag != flag_f and _inside(path, Path(out.path)):
                problems.append(
                    f"{flag} {path} is inside {flag_f} {out.path}, the folder {command} writes whole: put it elsewhere"
                )
    return problems


def special_file(path: Path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder — a named pipe, a socket, a device:
    an output written there would replace it (``/dev/null`` given to a root shell included). ``None`` otherwise."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, or a path the other checks name
        return None
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))  # fmt: skip
    kind = next((what for test, what in kinds if test(mode)), None)
    if kind is None:
        return None
    return f"{path} is {kind}; refusing to replace it: give the path of a file to write"


def write_problem(output: Path, folder: bool) -> str | None:
    """Whether a file can really be created where ``output`` goes (in the nearest folder above it that exists, or in
    it when it is an existing folder): a permission check says yes to root, on a read-only file system or in /proc.
    The probe is an unnamed temporary file: nothing is left behind, whatever happens."""
    import tempfile

    from qdebug._signals import signals_held

    where = output.parent
    try:
        where = output if folder and output.is_dir() else next(p for p in output.absolute().parents if p.exists())
        if not where.is_dir():
            return None  # under a file: the output guard says so
        with signals_held(), tempfile.TemporaryFile(dir=where):  # a named fallback goes before a signal is raised
            pass
    except (OSError, StopIteration, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        return f"{output}: cannot create a file in {where} ({reason})"
    return None


def load_kind(load: Callable[[str], T], path: str, kind: str, hint: str) -> T:
    """``load(path)`` — a loader of one of qdebug's JSON files (a debug report, a build manifest) — with every failure
    one :class:`~qdebug.errors.InputFileError` naming the file and what it should be: a loader's own error may not
    name the file (a schema check sees a dict), and a JSON list or another tool's JSON fails inside it as a
    TypeError or AttributeError."""
    try:
        return load(path)
    except QDebugError as exc:
        if str(path) in str(exc):
            raise
        detail = str(exc)
    except (AttributeError, TypeError):  # a JSON list or string where the loader reads an object's fields
        detail = f"its JSON is {_json_shape(path)}, not an object with the fields of one"
    except KeyError as exc:
        detail = f"it has no {exc}"
    except ValueError as exc:  # json.JSONDecodeError among them
        detail = str(exc)
    said = detail if detail.startswith(f"not a {kind}") else f"not a {kind} ({detail})"
    raise InputFileError(f"{path}: {said}; {hint}")


def _json_shape(path: str) -> str:
    """What the top level of a JSON file is, in words (Python's own error text names its internals)."""
    from qdebug.io import load_json

    try:
        doc = load_json(path)
    except (OSError, ValueError, QDebugError):
        return "not readable as JSON"
    kinds = {list: "a list", str: "a string", bool: "true or false", int: "a number", float: "a number"}
    if isinstance(doc, dict):
        return "an object of another shape"
    return "null" if doc is None else kinds.get(type(doc), type(doc).__name__)


def check_promotion_type(flag: str, to: str, target: str | None) -> None:
    """``to`` names a quantization type (and, with ``target``, one its activations can take):
    :class:`~qdebug.errors.ConfigError` naming ``flag`` otherwise."""
    from qdebug.config import normalize_quant_type

    try:
        name = normalize_quant_type(to)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {to}: {exc}") from exc
    if target is not None:
        from qdebug.targets.base import get_target

        allowed = get_target(target).activation_types
        if name not in allowed:
            takes = sorted(allowed)
            raise ConfigError(f"{flag} {to}: --target {target} cannot run activations as {name}; it takes {takes}")


class Checks:
    """What one command's pre-flight found: every problem (said together by :meth:`raise_all`) and the inputs that
    cannot be read (so that a later check does not say it again)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.problems: list[QDebugError] = []
        self.warnings: list[str] = []
        self.unreadable: set[str] = set()

    def add(self, problem: QDebugError | str) -> None:
        """One more problem (a bare string is a usage problem: exit 2)."""
        self.problems.append(ConfigError(problem) if isinstance(problem, str) else problem)

    def warn(self, warning: str) -> None:
        """A warning said once the pre-flight passes (one line; the command goes on)."""
        self.warnings.append(warning)

    def run(self, check: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``check(*args, **kwargs)``; a :class:`~qdebug.errors.QDebugError` it raises is recorded (``None``)."""
        try:
            return check(*args, **kwargs)
        except QDebugError as exc:
            self.add(exc)
            return None

    def readable(self, flag: str, value: str | None) -> bool:
        """``value`` was given and the input check found nothing wrong with it."""
        return value is not None and flag not in self.unreadable

    def given(self, dest: str) -> bool:
        """The command line gives the option whose ``dest`` this is (:func:`given_options`)."""
        given = getattr(self.args, "given", None)
        if given is not None:
            return dest in given
        parser = getattr(self.args, "parser", None)  # a namespace parsed without main: not at its default
        default = parser.get_default(dest) if parser is not None else None
        return getattr(self.args, dest, None) not in (default, None, False, [], ())

    def unused(self, rules: Iterable[Unused]) -> None:
        """Refuse every option given that does nothing with the others (one problem each)."""
        for rule in rules:
            if not rule.needs and self.given(rule.dest):
                self.add(f"{rule.flag} has no effect {rule.why}")

    def inputs(self, inputs: Mapping[str, Path], folders: Iterable[str]) -> None:
        """Every input a file (or, for an option in ``folders``, a folder) that can be read, from one ``stat``:
        missing, a FIFO or device, a link loop, an overlong name is exit 3, the option and the path named."""
        from qdebug.io import input_problem

        takes_folder = set(folders)
        for flag, path in inputs.items():
            try:
                problem = input_problem(path, folder=flag in takes_folder)
            except (OSError, ValueError) as exc:
                problem = str(exc)
            if problem is not None:
                self.unreadable.add(flag)
                self.add(InputFileError(f"{flag} {path}: {problem}"))

    def outputs(self, outputs: Mapping[str, Output], inputs: Mapping[str, Path], command: str) -> None:
        """Every output against every input (:func:`qdebug.io.output_problems`) and every other output
        (:func:`output_clashes`), then probed for writing (:func:`write_problem`)."""
        from qdebug.io import output_problems

        for flag, out in outputs.items():
            if not out.path:
                continue
            path = Path(out.path)
            try:
                found = output_problems(path, inputs, folder=out.folder, derived=out.derived, model=out.model)
            except (OSError, RuntimeError, ValueError) as exc:  # a link loop (RuntimeError before Python 3.13)
                found = [f"{path}: {getattr(exc, 'strerror', None) or exc}"]
            found += [special for f in out.files() if (special := special_file(f))]
            if not found and (probe := write_problem(path, out.folder)):
                found = [probe]
            for problem in found:
                self.add(f"{flag} {problem}" if not problem.startswith(f"{flag} ") else problem)
        for problem in output_clashes(outputs, command):
            self.add(problem)

    def raise_all(self) -> None:
        """Raise what was found: one problem as it is; several as one line, with the exit code of the first kind in
        :data:`qdebug.errors.EXIT_CODES`' order (a command line to fix comes before the files it names)."""
        if not self.problems:
            return
        if len(self.problems) == 1:
            raise self.problems[0]
        first = min(self.problems, key=lambda e: e.exit_code)
        error = QDebugError("; ".join(dict.fromkeys(str(p) for p in self.problems)))
        error.exit_code = first.exit_code
        raise error from first
