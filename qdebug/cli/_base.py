"""What every ``qdebug`` command shares: the :class:`Tool` base class and the argument groups.

One name per thing, in every command: ``--float-model/-f`` (the float ONNX model), ``--quant-model/-q`` (its QDQ
counterpart), ``--calib`` (calibration data), ``--data/-d`` (debug data), ``--output/-o``. Older spellings still
work for one release as hidden aliases that print a one-line notice (:class:`DeprecatedAlias`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TextIO

from qdebug.cli._preflight import Checks, Output
from qdebug.errors import EXIT_CODES, EXIT_GATE, InputFileError

#: The release in which the deprecated spellings disappear (said in every notice).
ALIASES_REMOVED_IN = "0.3"

EPILOG = "exit codes:\n" + "\n".join(f"  {k:>2}  {v}" for k, v in EXIT_CODES.items())


#: Control characters and every other character ``str.splitlines`` breaks on, escaped: a tensor name, a file
#: name or a JSON key may hold them, and a message must stay one line.
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(32), 127, 0x85]} | {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
_ESCAPES |= {0x2028: "\\u2028", 0x2029: "\\u2029"}


def one_line(text: str) -> str:
    """``text`` with its line breaks and control characters escaped (``\\n``, ``\\x1b``, ...)."""
    return text.translate(_ESCAPES)


def say(kind: str, message: str) -> None:
    """One ``qdebug: <kind>: <message>`` line on stderr, whatever the message holds."""
    print(f"qdebug: {kind}: {one_line(message)}", file=sys.stderr)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors ("qdebug debug: error: … (see qdebug debug --help)") instead of the usage
    block, so that a mistyped flag reads like every other qdebug error."""

    def error(self, message: str) -> NoReturn:
        """Print one line and exit with the usage exit code (argparse's own exit path, caught by ``main``)."""
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


class DeprecatedAlias(argparse.Action):
    """A hidden old spelling of an option: stores into the new option's ``dest`` and records a notice that
    ``main`` prints (one line on stderr) before running the command."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        setattr(namespace, self.dest, values)
        notes = list(getattr(namespace, "deprecations", None) or [])
        notes.append(f"{option} is deprecated and will be removed in {ALIASES_REMOVED_IN}: use {self.new}")
        namespace.deprecations = notes


def deprecated(parser: argparse.ArgumentParser | Any, *old: str, dest: str, new: str) -> None:
    """Register ``old`` spellings as hidden aliases of the option ``new`` (whose value lives in ``dest``)."""
    parser.add_argument(*old, dest=dest, action=DeprecatedAlias, new=new, default=argparse.SUPPRESS)


class Tool:
    """One ``qdebug`` subcommand (Polygraphy style): ``add_arguments`` builds its parser, ``run`` does the work
    and returns the exit code. Errors are raised, never printed: ``main`` is the one place they become messages.
    """

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str | None] = None
    #: ``dest`` → the option that must be given (checked after parsing, because an option and its deprecated
    #: alias share one ``dest`` and argparse's own ``required`` would reject the alias)
    required: ClassVar[dict[str, str]] = {}
    #: the input options that may name a folder (of ``.npz`` files); every other input is one file
    folder_inputs: ClassVar[frozenset[str]] = frozenset({"--calib", "--data", "--holdout"})

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare this command's options."""
        raise NotImplementedError

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Run the command; return its exit code."""
        raise NotImplementedError

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """The user's files this command reads, by option (never written: the output guard checks them)."""
        return {}

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """What this command writes, by option."""
        return {}

    def guard(self, args: argparse.Namespace) -> None:
        """The pre-flight, before any work (``main`` calls it after parsing): every input readable, every output
        checked against every input and every other output and probed for writing, then :meth:`preflight`; every
        problem named at once, in one line (:meth:`~qdebug.cli._preflight.Checks.raise_all`)."""
        checks = Checks(args)
        inputs = {flag: Path(v) for flag, v in self.inputs(args).items() if v}
        checks.inputs(inputs, self.folder_inputs)
        checks.outputs({flag: o for flag, o in self.outputs(args).items() if o.path}, inputs, self.name)
        try:
            self.preflight(args, checks)
        except OSError as exc:  # a path a check could not look at (a link loop, an overlong name): one line
            checks.add(InputFileError(f"{exc.filename or ''}: {exc.strerror or exc}"))
        checks.raise_all()
        for warning in checks.warnings:
            warn(warning)

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """This command's own checks before any work (labels, hold-out data, option combinations, what kind of file
        an input is), each problem added to ``checks`` rather than raised, so that all are said at once."""

    def new_folders(self, args: argparse.Namespace) -> list[Path]:
        """The folders above this command's outputs that do not exist yet, deepest first (writing an output creates
        them; a failed command removes those still empty: :func:`remove_empty`)."""
        folders: list[Path] = []
        for out in self.outputs(args).values():
            if not out.path:
                continue
            for parent in Path(out.path).absolute().parents:
                try:
                    if parent.exists():
                        break
                except OSError:  # a name the file system refuses: nothing will be created there
                    break
                if parent not in folders:
                    folders.append(parent)
        return sorted(folders, key=lambda p: len(p.parts), reverse=True)

    def notes(self, args: argparse.Namespace) -> list[str]:
        """One-line notices about how the arguments were read (e.g. an old meaning kept for compatibility)."""
        return []

    def check_required(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        """argparse's "required" check for options that have deprecated aliases."""
        missing = [opt for dest, opt in self.required.items() if getattr(args, dest, None) is None]
        if missing:
            parser.error(f"the following arguments are required: {', '.join(missing)}")


@contextlib.contextmanager
def staged_outputs(*paths: str | None) -> Iterator[dict[str, Path]]:
    """``with staged_outputs(a, b) as staged``: write output ``a`` to ``staged[a]`` (its name, in a new hidden
    folder beside it); leaving the block moves every output written into place, an error or a signal removes them
    all: a command that fails while writing its outputs leaves none of them rather than some (``None``: not asked)."""
    import shutil

    from qdebug._signals import signals_held
    from qdebug.io import new_temp_dir

    folders: list[Path] = []
    staged: dict[str, Path] = {}
    try:
        for path in filter(None, paths):
            dest = Path(path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with signals_held():  # a signal is raised once the folder is in the list the clean-up reads
                folders.append(new_temp_dir(dest.parent))
            staged[path] = folders[-1] / dest.name
        yield staged
        for path, tmp in staged.items():
            if tmp.exists():
                os.replace(tmp, path)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove each folder that exists and is empty (in the order given: deepest first); a folder the user has
    meanwhile put something in stays."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


# ---------------------------------------------------------------------------------------------- argument groups
def shape_arg(text: str) -> tuple[str, list[int]]:
    """``NAME:D0,D1,...`` → (name, dims)."""
    try:
        name, dims = text.rsplit(":", 1)
        return name, [int(d) for d in dims.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected NAME:D0,D1,..., got {text!r}") from exc


def finite_number(unit: str) -> Any:
    """An argparse type: a finite float (``nan`` makes a goal or a gate that can never be decided, ``inf`` one that
    can never be met); ``unit`` names what the number counts in the error."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a number of {unit}, got {value!r}") from exc
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected a finite number of {unit}, got {value!r}")
        return number

    parse.__name__ = f"number of {unit}"
    return parse


def positive_int(value: str) -> int:
    """An argparse type: an integer ≥ 1 (a count of rows or samples)."""
    try:
        number = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from exc
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def add_float_model(p: argparse.ArgumentParser, *old: str, help: str = "the float ONNX model") -> None:
    """``--float-model/-f`` (required), with ``old`` as deprecated aliases."""
    p.add_argument("--float-model", "-f", dest="float_model", default=None, help=f"{help} (required)")
    if old:
        deprecated(p, *old, dest="float_model", new="--float-model/-f")


def add_quant_model(p: argparse.ArgumentParser) -> None:
    """``--quant-model/-q`` (required)."""
    p.add_argument("--quant-model", "-q", dest="quant_model", default=None, help="the quantized (QDQ) model (required)")


def add_calib(
    p: argparse.ArgumentParser, *old: str, help: str = ".npz file or folder of them (default: synthetic)"
) -> None:
    """``--calib``: calibration data."""
    p.add_argument("--calib", dest="calib", default=None, help=f"calibration data: {help}")
    if old:
        deprecated(p, *old, dest="calib", new="--calib")


def add_output(p: argparse.ArgumentParser, help: str, *, required: bool = False) -> None:
    """``--output/-o``."""
    p.add_argument("--output", "-o", dest="output", default=None, help=help + (" (required)" if required else ""))


#: ``--color``'s choices (one of the global flags).
COLOR_CHOICES = ("auto", "always", "never")


def add_json(p: argparse.ArgumentParser, what: str) -> None:
    """Say that this command prints ``what`` as its ``--json`` document (the flag itself is one of the global flags,
    :func:`add_global_flags`); a command that says nothing prints the run's summary instead (``cli.run_summary``)."""
    p.set_defaults(json_doc=what)


def add_global_flags(p: argparse.ArgumentParser) -> None:
    """The flags every command takes, defined here once and added by ``build_parser`` after the command's own
    options: ``--color``, ``--json`` (the command's own document, or the run's summary) and ``--quiet``."""
    what = p.get_default("json_doc")
    g = p.add_argument_group("output (every command)")
    g.add_argument(
        "--color",
        choices=COLOR_CHOICES,
        default="auto",
        help="colour the tables by SQNR band: auto (on a terminal), always, never",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as JSON instead of tables"
        if what
        else "print a JSON summary of the run on stdout (command, exit code, files written); the text goes to stderr",
    )
    g.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing on stdout but --json's document (errors and warnings still go to stderr)",
    )


def add_input_shape(p: argparse.ArgumentParser, help: str) -> None:
    """``--input-shape NAME:D0,D1,...`` (repeatable)."""
    p.add_argument("--input-shape", type=shape_arg, action="append", default=[], help=help)


def add_region(p: argparse.ArgumentParser) -> None:
    """``--extract-inputs T1,T2 --extract-outputs T3``: only the region of the model between these tensors."""
    p.add_argument(
        "--extract-inputs",
        action="append",
        default=[],
        metavar="T1,T2",
        help="build only the region of the float model that starts at these tensors (comma-separated, "
        "repeatable; the data still feeds the original inputs: the float model computes the region's inputs)",
    )
    p.add_argument(
        "--extract-outputs",
        action="append",
        default=[],
        metavar="T3",
        help="... and ends at these tensors (with --extract-inputs; docs/deeploy.md, MiniLM)",
    )


def add_debug_inputs(p: argparse.ArgumentParser, capture_backends: tuple[Sequence[str], Sequence[str]]) -> None:
    """The models and debug data of ``debug`` and ``suggest``; ``capture_backends``: the ``--capture`` names shown
    (the default first) and those accepted."""
    shown, accepted = capture_backends
    add_float_model(p)
    add_quant_model(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--data", "-d", help="debug data: .npz file or folder of them")
    g.add_argument("--samples", type=int, help="number of synthetic samples (default 8)")
    p.add_argument("--max-samples", type=int, help="use at most this many samples of --data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distribution", choices=["uniform", "normal"], default="uniform")
    p.add_argument(
        "--capture",
        choices=list(accepted),
        default=shown[0],
        metavar="{" + ",".join(shown) + "}",
        help="how tensors are captured and reduced: " + ", ".join(shown) + f" (default {shown[0]}; docs/metrics.md)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="N",
        help="run up to N samples per inference call (checked on the first batch, sums stay per sample; 1: one "
        "sample per call; default: auto batches when the model's inputs have a batch axis)",
    )
    add_input_shape(p, "fix a dynamic input shape, NAME:D0,D1,... (repeatable)")
    p.add_argument("--ignore-key", action="append", default=[], help="npz arrays to ignore (e.g. labels)")
    add_scale_out(p)


def add_metric(p: argparse.ArgumentParser, what: str) -> None:
    """``--metric NAME|module:function`` and ``--label-key``: a task metric (docs/metrics.md, "Task metrics")."""
    p.add_argument(
        "--metric",
        metavar="NAME|MODULE:FUNCTION",
        help=f"{what}: a task metric against the float model — top1, cosine, sequence, top1_accuracy (labels), auto "
        "(picked from the float model's outputs; NAME@OUTPUT limits one to an output), or module:function, your "
        "function(float_outputs, quant_outputs[, label]) -> float per sample, imported with the current folder "
        "on the import path",
    )
    p.add_argument(
        "--label-key",
        default="label",
        help="with --metric: the label array of the .npz data (default 'label'; never read as a model input)",
    )


def task_metric(args: argparse.Namespace) -> Any:
    """``--metric`` loaded (:func:`~qdebug.task_metrics.load_metric`; ``auto`` kept as the word: it needs the float
    model), ``None`` when not given. A ``module:function`` is imported with the current folder on the import path,
    as ``python -m`` would (the console script's own path does not hold it)."""
    spec = getattr(args, "metric", None)
    if spec is None:
        return None
    from qdebug.task_metrics import AUTO, load_metric

    if spec.strip() == AUTO:
        return AUTO
    if ":" in spec and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load_metric(spec)


def add_scale_out(p: argparse.ArgumentParser) -> None:
    """``--workers`` / ``--allow-oversubscribe`` / ``--ray``: run the sample-parallel work on a Ray cluster
    (docs/scale.md)."""
    g = p.add_argument_group("scale-out on Ray (pip install 'qdebug[ray]'; docs/scale.md)")
    g.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="run on N Ray workers (alone: a local cluster on this machine, on 127.0.0.1 only, at most one worker "
        "per usable core)",
    )
    g.add_argument(
        "--allow-oversubscribe",
        action="store_true",
        help="with --workers N alone: allow more workers than usable cores (up to 4 per core)",
    )
    g.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on the existing Ray cluster at ADDRESS (HOST:PORT, ray://HOST:PORT; 'auto': RAY_ADDRESS); "
        "workers: its CPUs. qdebug and the cluster exchange pickled objects: use only a cluster you trust fully "
        "(whoever controls it can run code as you)",
    )


def cluster_spec(args: argparse.Namespace) -> Any:
    """The :class:`~qdebug.cluster.ClusterSpec` of ``--workers`` / ``--allow-oversubscribe`` / ``--ray`` (``None``:
    this process only), validated: the address's form, the workers' bound (a :class:`ConfigError`, exit 2)."""
    workers, address = getattr(args, "workers", None), getattr(args, "ray", None)
    oversubscribe = bool(getattr(args, "allow_oversubscribe", False))
    if oversubscribe and workers is None:
        from qdebug.errors import ConfigError

        raise ConfigError("--allow-oversubscribe needs --workers N (the workers of a local cluster)")
    if workers is None and address is None:
        return None
    from qdebug.cluster import ClusterSpec

    return ClusterSpec(workers=workers, address=address, allow_oversubscribe=oversubscribe)


class ProgressLine:
    """One progress line on a terminal (samples done / total, rate), rewritten in place; silent elsewhere, so that
    a script's stderr holds only qdebug's one-line messages."""

    def __init__(self, stream: TextIO, label: str = "samples", *, quiet: bool = False) -> None:
        self.stream, self.label = stream, label
        self.active = stream.isatty() and not quiet
        self.t0: float | None = None
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        """Show ``done`` of ``total``."""
        import time

        if not self.active:
            return
        now = time.perf_counter()
        self.t0 = now if self.t0 is None else self.t0
        rate = done / (now - self.t0) if now > self.t0 else 0.0
        self.stream.write(f"\r{self.label} {done}/{total} ({rate:.1f}/s)")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """End the line (if one was shown)."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def gate_help() -> str:
    """The help text of a quality gate option."""
    return f"exit {EXIT_GATE} if any model output's SQNR is below DB (or undefined)"


def warn(message: str) -> None:
    """A one-line warning on stderr (results go to ``out``, diagnostics to stderr)."""
    say("warning", message)
