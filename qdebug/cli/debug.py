"""``qdebug debug``: per-tensor SQNR of a quantized model against its float parent."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import (
    ProgressLine,
    Tool,
    add_debug_inputs,
    add_json,
    add_metric,
    add_output,
    cluster_spec,
    finite_number,
    gate_help,
    positive_int,
    say,
    staged_outputs,
    task_metric,
)
from qdebug.cli._html import add_html, add_stats_samples, require_html, run_diagnostics, write_html
from qdebug.cli._preflight import Checks, Output, Unused
from qdebug.errors import EXIT_GATE, EXIT_OK
from qdebug.io import same_file
from qdebug.render.text import fmt_db, print_report, use_color

DEBUG_REQUIRED = {"float_model": "--float-model/-f", "quant_model": "--quant-model/-q"}


def capture_backends() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The capture backends ``--capture`` shows (the default first), and every name it accepts (former names of a
    backend included)."""
    from qdebug.capture import CAPTURE_PATHS, capture_choices

    return tuple(CAPTURE_PATHS), capture_choices()


def debug_inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """The files ``debug`` and ``suggest`` read."""
    return {"--float-model": args.float_model, "--quant-model": args.quant_model, "--data": args.data}


def debug_options(args: argparse.Namespace) -> Any:
    """The :class:`~qdebug.debugger.DebugOptions` of :func:`~qdebug.cli._base.add_debug_inputs`' options (validated:
    the pre-flight builds them once to ask their own rules)."""
    from qdebug.debugger import DebugOptions

    return DebugOptions(
        num_samples=args.samples if args.data is None else args.max_samples,
        seed=args.seed,
        distribution=args.distribution,
        input_shapes=dict(args.input_shape) or None,
        ignore_data_keys=tuple(args.ignore_key),
        capture=args.capture,
        batch=args.batch,
        cluster=cluster_spec(args),
        task_metric=task_metric(args),
        task_label_key=getattr(args, "label_key", "label"),
    )


def check_two_models(checks: Checks, float_model: str | None, quant_model: str | None) -> None:
    """The float and the quantized model are two files (by real path or hard link): one file given twice is a
    mistake that would be measured against itself."""

    readable = checks.readable("--float-model", float_model) and checks.readable("--quant-model", quant_model)
    if readable and same_file(str(float_model), str(quant_model)):
        checks.add(
            f"--float-model {float_model} and --quant-model {quant_model} are the same file: give the float model "
            "and its quantized (QDQ) counterpart"
        )


def check_debug_args(args: argparse.Namespace, checks: Checks) -> None:
    """The pre-flight of ``debug``, ``diagnose`` and ``suggest``: two models, counts that are counts, the data
    options that fit each other (docs/cli.md: an option with no effect is refused), :class:`DebugOptions`' rules."""
    check_two_models(checks, args.float_model, args.quant_model)
    counts = [(f, v) for f, v in (("--samples", args.samples), ("--max-samples", args.max_samples),
                                  ("--batch", args.batch)) if v is not None and v < 1]  # fmt: skip
    for flag, value in counts:
        checks.add(f"{flag} must be a positive integer, got {value}")
    synthetic = args.data is None
    checks.unused([
        Unused("max_samples", "--max-samples", not synthetic, "without --data (synthetic samples: --samples N)"),
        Unused("ignore_key", "--ignore-key", not synthetic, "without --data (synthetic samples hold no other arrays)"),
        Unused("seed", "--seed", synthetic, "with --data (it seeds the synthetic samples)"),
        Unused("distribution", "--distribution", synthetic, "with --data (it draws the synthetic samples)"),
        Unused("input_shape", "--input-shape", synthetic, "with --data (the samples' own shapes are used)"),
    ])  # fmt: skip
    if not counts:
        checks.run(debug_options, args)


def check_metric(args: argparse.Namespace, checks: Checks) -> None:
    """``--label-key`` only with ``--metric``; a metric on labels needs one labelled ``.npz`` as ``--data`` (the
    metric itself is loaded, and so checked, with the debug options)."""
    checks.unused([Unused("label_key", "--label-key", args.metric is not None, "without --metric (it names the "
                          "labels a task metric reads)")])  # fmt: skip
    metric = checks.run(task_metric, args) if args.metric is not None else None
    if getattr(metric, "needs_labels", False) and checks.readable("--data", args.data):
        from qdebug.task_measure import labels_for

        checks.run(labels_for, args.data, args.label_key, 0, True)
    elif getattr(metric, "needs_labels", False) and args.data is None:
        checks.add(f"--metric {args.metric} scores labels: give --data, a labelled .npz (array {args.label_key!r})")


def check_stats_samples(args: argparse.Namespace, checks: Checks, used: bool, why: str) -> None:
    """``--stats-samples``: a count, and refused where no diagnostics run (``used`` false)."""
    if args.stats_samples < 0:
        checks.add(f"--stats-samples must be 0 or a positive integer, got {args.stats_samples}")
    checks.unused([Unused("stats_samples", "--stats-samples", used, why)])


def run_debug(args: argparse.Namespace) -> Any:
    """``debug()`` with the options of :func:`~qdebug.cli._base.add_debug_inputs`."""
    from qdebug.debugger import debug

    opts = debug_options(args)
    if opts.cluster is None:
        return debug(args.float_model, args.quant_model, args.data, opts)
    import sys

    bar = ProgressLine(sys.stderr, quiet=args.quiet)  # many samples on many workers: say how far the job is
    try:
        return debug(args.float_model, args.quant_model, args.data, opts, progress=bar)
    finally:
        bar.close()


class Debug(Tool):
    """Per-tensor SQNR of a quantized model against its float parent."""

    name = "debug"
    help = "per-tensor SQNR of a quantized model against its float parent"
    required: ClassVar[dict[str, str]] = DEBUG_REQUIRED

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug debug``."""
        add_debug_inputs(parser, capture_backends())
        add_output(parser, "write the full report as JSON here")
        add_json(parser, "the report")
        parser.add_argument("--top", type=positive_int, default=10, help="rows in each worst-N table")
        parser.add_argument("--fail-below", type=finite_number("dB"), metavar="DB", help=gate_help())
        parser.add_argument(
            "--diagnose", action="store_true", help="also print the diagnostics: why, and the fix (docs/diagnostics.md)"
        )
        add_html(parser)
        add_stats_samples(parser)
        add_metric(parser, "also score the task")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """Both models and the data."""
        return debug_inputs(args)

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The report JSON and the HTML report."""
        return {"--output": Output(args.output), "--html": Output(args.html)}

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """The data options, and the options that only shape the tables (refused with ``--json``) or the
        diagnostics (refused without ``--diagnose``/``--html``)."""
        check_debug_args(args, checks)
        check_stats_samples(args, checks, bool(args.diagnose or args.html), "without --diagnose or --html (it sizes "
                            "the diagnostics' statistics pass)")  # fmt: skip
        checks.unused([
            Unused("diagnose", "--diagnose", not args.json, "with --json (it prints the diagnostics with the tables; "
                   "as JSON: qdebug diagnose --json)"),
            Unused("top", "--top", not args.json, "with --json (it sizes the printed tables)"),
        ])  # fmt: skip
        if args.html:
            checks.run(require_html)
        check_metric(args, checks)

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Debug, write the report and the HTML report (both or neither), print the tables (or JSON), apply the
        gate."""
        report = run_debug(args)
        diags = run_diagnostics(report, args) if args.diagnose or args.html else None
        with staged_outputs(args.output, args.html) as staged:
            if args.output:
                report.save(staged[args.output])
            if args.html:
                write_html(staged[args.html], report, diags)
        if args.json:
            print(report.to_json(), file=out)
        else:
            print_report(report, out, args.top, use_color(args.color, out))
            if args.diagnose and diags is not None:
                from qdebug.render.text import print_diagnostics

                print_diagnostics(diags, out, args.top, use_color(args.color, out))
            for what, path in (("report", args.output), ("HTML report", args.html)):
                if path:
                    print(f"\n{what} written to {path}", file=out)
        if args.fail_below is None:
            return EXIT_OK
        low = [
            o for o in report.model_outputs if o.cumulative_sqnr_db is None or o.cumulative_sqnr_db < args.fail_below
        ]
        if not low:
            return EXIT_OK
        names = ", ".join(f"{o.output_name} ({fmt_db(o.cumulative_sqnr_db, o.cumulative_status).strip()})" for o in low)
        say("FAIL", f"output SQNR below {args.fail_below} dB: {names}")
        return EXIT_GATE


__all__ = [
    "DEBUG_REQUIRED",
    "Debug",
    "capture_backends",
    "check_debug_args",
    "check_metric",
    "check_stats_samples",
    "check_two_models",
    "debug_inputs",
    "debug_options",
    "run_debug",
]
