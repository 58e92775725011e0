"""The ``qdebug`` command line: ``main(argv) -> int``, one module per command (a :class:`~qdebug.cli._base.Tool`
each), shared argument groups in :mod:`qdebug.cli._base`. Errors become messages and exit codes in ``main`` only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import TextIO

from qdebug._signals import deferring
from qdebug._version import __version__
from qdebug.cli._base import EPILOG, ArgumentParser, Tool, add_global_flags, remove_empty, say
from qdebug.cli._preflight import given_options
from qdebug.cli.build import Build
from qdebug.cli.dashboard import Dashboard
from qdebug.cli.debug import Debug
from qdebug.cli.demo import Demo
from qdebug.cli.fix import Fix
from qdebug.cli.notebooks import Notebooks
from qdebug.cli.quantize import Quantize
from qdebug.cli.report import Diagnose, Report
from qdebug.cli.search import Search
from qdebug.cli.suggest import Suggest
from qdebug.errors import EXIT_INTERNAL, EXIT_USAGE, QDebugError
from qdebug.render.text import (
    GREEN,
    RED,
    RESET,
    YELLOW,
    fmt_db,
    print_build,
    print_compile_report,
    print_fixes,
    print_report,
)

#: Every subcommand, in the order ``--help`` lists them.
TOOLS: tuple[Tool, ...] = (
    Quantize(), Debug(), Diagnose(), Suggest(), Search(), Fix(), Build(), Report(), Demo(), Dashboard(), Notebooks(),
)  # fmt: skip

__all__ = [
    "GREEN",
    "RED",
    "RESET",
    "TOOLS",
    "YELLOW",
    "build_parser",
    "fmt_db",
    "main",
    "print_build",
    "print_compile_report",
    "print_fixes",
    "print_report",
    "run_summary",
]


def build_parser() -> ArgumentParser:
    """The argument parser with one subparser per :data:`TOOLS` entry (exposed for docs and tests)."""
    p = ArgumentParser(
        prog="qdebug",
        description="Find where a quantized ONNX model loses accuracy, and fix it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"qdebug {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = p.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for tool in TOOLS:
        sp = sub.add_parser(
            tool.name,
            help=tool.help,
            description=tool.description or tool.help,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        tool.add_arguments(sp)
        add_global_flags(sp)
        sp.set_defaults(tool=tool, parser=sp)
    return p


def _parse(argv: Sequence[str] | None) -> argparse.Namespace | int:
    """Parsed arguments, or the exit code argparse chose (--help, --version, a usage error)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's parser, so that the line points to 'qdebug <command> --help'
            args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.tool.check_required(args.parser, args)
    except SystemExit as exc:  # argparse exits on --help / --version / bad usage
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    args.given = given_options(parser, args.parser, argv)  # what the pre-flight's "has no effect" rules ask
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # a command that prints a command line to rerun
    for note in [*(getattr(args, "deprecations", None) or []), *args.tool.notes(args)]:
        say("note", note)
    return args


def _run(args: argparse.Namespace, out: TextIO) -> int:
    """Run the tool; when it fails (an error, Ctrl-C or a non-zero exit), remove the folders it created for its
    outputs that are still empty: a failed command leaves nothing behind. The global flags decide where its text
    goes: ``--quiet`` nowhere, ``--json`` on a command without a document of its own to stderr, with the run's
    summary (:func:`run_summary`) on ``out``."""
    created = args.tool.new_folders(args)
    summary = _summarized(args)
    document = args.json and not summary  # the command prints its own JSON document on out, --quiet or not
    text: TextIO = out if document else _Discard() if args.quiet else sys.stderr if summary else out
    code = 1
    try:
        code = int(args.tool.run(args, text))
    finally:
        if code != 0:
            remove_empty(created)
    if summary:
        print(json.dumps(run_summary(args, code)), file=out)
    return code


def _summarized(args: argparse.Namespace) -> bool:
    """``--json`` on a command that has no JSON document of its own: it prints the run's summary."""
    return bool(args.json) and getattr(args, "json_doc", None) is None


class _Discard(io.StringIO):
    """Where ``--quiet`` sends a command's text (not a terminal: nothing is coloured or redrawn for it)."""

    def write(self, s: str) -> int:
        """Drop ``s``."""
        return len(s)


def run_summary(args: argparse.Namespace, code: int, error: str | None = None) -> dict[str, object]:
    """What ``--json`` prints for a command that has no JSON document of its own: the command, its exit code, the
    files it wrote (each output and the files derived from it that exist; none after an error: a failed command
    writes all of its outputs or none) and the error, if any."""
    outputs = [] if error is not None else [f for o in args.tool.outputs(args).values() for f in o.files()]
    written = [str(f) for f in outputs if f.exists()]
    doc: dict[str, object] = {"schema_version": 1, "command": args.tool.name, "exit_code": code, "outputs": written}
    if error is not None:
        doc["error"] = error
    return doc


def _tolerate_file_names() -> None:
    """A file name that is not UTF-8 (held as surrogate escapes) reaches stdout as the bytes it is, like ``ls``
    prints it, and stderr escaped; outside Python's UTF-8 mode stdout is strict, and printing 'wrote <path>' raised
    UnicodeEncodeError after the work was done (exit 1), an error message naming such a file did too."""
    for stream, errors in ((sys.stdout, "surrogateescape"), (sys.stderr, "backslashreplace")):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):  # a stream that cannot change its error handler keeps its own
                reconfigure(errors=errors)


def _quiet_ort_logs() -> None:
    """ONNX Runtime's C++ warnings stay off the terminal: every error ORT has is raised too and becomes the one
    line qdebug prints (sessions qdebug builds itself already ask for fatal messages only)."""
    from qdebug.ort import set_ort_log_severity

    set_ort_log_severity(3)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a CI job's timeout), raised where Ctrl-C's KeyboardInterrupt would be: the same clean-up
    runs (temporary folders removed, no half-written output) instead of the process dying where it stands."""


class _Received:
    """The last signal the CLI's handlers raised for: Ray's blocking calls (``ray.get``, ``ray.wait``) turn whatever
    a handler raised into a plain KeyboardInterrupt, so the exit code follows the signal, not the exception's class."""

    signum: int | None = None


def _terminate() -> None:
    _Received.signum = signal.SIGTERM
    raise Terminated


def _interrupt() -> None:
    _Received.signum = signal.SIGINT
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` and Ctrl-C KeyboardInterrupt while the CLI runs, except while a temporary
    file or folder is being made (:func:`qdebug.io.signals_held`: then just after). Main thread only: elsewhere
    Python refuses handlers."""
    _Received.signum = None
    try:
        previous = signal.signal(signal.SIGTERM, deferring(_terminate))
    except ValueError:  # not the main thread (e.g. main() called from a worker): leave signals alone
        yield
        return
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:  # Python's own Ctrl-C, not an embedding program's
        signal.signal(signal.SIGINT, deferring(_interrupt))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI and return its exit code (never raises for user errors): the one place errors become
    one-line messages and exit codes (:mod:`qdebug.errors`)."""
    with _sigterm_as_interrupt():
        return _main(argv, out)


def _main(argv: Sequence[str] | None, out: TextIO | None) -> int:
    _tolerate_file_names()
    out = out or sys.stdout
    args: argparse.Namespace | int | None = None
    try:
        args = _parse(argv)
        if isinstance(args, int):
            return args
        args.tool.guard(args)  # the pre-flight: every input, output and option combination, before any work
        _quiet_ort_logs()
        return _run(args, out)
    except QDebugError as exc:
        parsed = args if isinstance(args, argparse.Namespace) else None
        if parsed is not None and parsed.debug:
            traceback.print_exc()
        say("error", str(exc))
        if parsed is not None and _summarized(parsed):  # the summary says the error too, as every run's does
            print(json.dumps(run_summary(parsed, exc.exit_code, str(exc))), file=out)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Terminated included
        if isinstance(exc, Terminated) or _Received.signum == signal.SIGTERM:
            print("qdebug: terminated", file=sys.stderr)
            return 143  # 128 + SIGTERM, what a shell reports for a process the signal killed
        print("qdebug: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        traceback.print_exc()
        say("internal error", f"{type(exc).__name__}: {exc}")
        return EXIT_INTERNAL
