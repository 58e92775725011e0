"""``qdebug debug``: per-tensor SQNR of a quantized model against its float parent."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import (
    Output,
    ProgressLine,
    Tool,
    add_debug_inputs,
    add_json,
    add_output,
    cluster_spec,
    finite_number,
    gate_help,
    positive_int,
    say,
)
from qdebug.cli._html import add_html, add_stats_samples, require_html, run_diagnostics, write_html
from qdebug.errors import EXIT_GATE, EXIT_OK
from qdebug.render.text import fmt_db, print_report, use_color

DEBUG_REQUIRED = {"float_model": "--float-model/-f", "quant_model": "--quant-model/-q"}


def capture_backends() -> tuple[str, ...]:
    """The capture backends ``--capture`` offers (the default first)."""
    from qdebug.capture import CAPTURE_PATHS

    return tuple(CAPTURE_PATHS)


def debug_inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """The files ``debug`` and ``suggest`` read."""
    return {"--float-model": args.float_model, "--quant-model": args.quant_model, "--data": args.data}


def run_debug(args: argparse.Namespace) -> Any:
    """``debug()`` with the options of :func:`~qdebug.cli._base.add_debug_inputs`."""
    from qdebug.debug import DebugOptions, debug
    from qdebug.errors import ConfigError

    if args.samples is not None and args.samples < 1:
        raise ConfigError("--samples must be a positive integer")
    opts = DebugOptions(
        num_samples=args.samples if args.data is None else args.max_samples,
        seed=args.seed,
        distribution=args.distribution,
        input_shapes=dict(args.input_shape) or None,
        ignore_data_keys=tuple(args.ignore_key),
        capture=args.capture,
        batch=args.batch,
        cluster=cluster_spec(args),
    )
    if opts.cluster is None:
        return debug(args.float_model, args.quant_model, args.data, opts)
    import sys

    bar = ProgressLine(sys.stderr)  # many samples on many workers: say how far the job is
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
        parser.add_argument("--color", choices=["auto", "always", "never"], default="auto")
        parser.add_argument(
            "--diagnose", action="store_true", help="also print the diagnostics: why, and the fix (docs/diagnostics.md)"
        )
        add_html(parser)
        add_stats_samples(parser)

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """Both models and the data."""
        return debug_inputs(args)

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The report JSON and the HTML report."""
        return {"--output": Output(args.output), "--html": Output(args.html)}

    @staticmethod
    def _diagnostics(report: Any, args: argparse.Namespace, out: TextIO) -> Any:
        """The diagnostics when ``--diagnose`` or ``--html`` asks for them, and the HTML report written."""
        if not (args.diagnose or args.html):
            return None
        diags = run_diagnostics(report, args)
        if args.html:
            write_html(args.html, report, diags)
        return diags

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Debug, print the tables (or JSON), write the report, apply the gate."""
        if args.output:
            from qdebug.io import refuse_overwrite_input

            refuse_overwrite_input(args.output, args.float_model, args.quant_model)
        if args.html:
            require_html()
        report = run_debug(args)
        if args.output:
            report.save(args.output)
        diags = self._diagnostics(report, args, out)
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


__all__ = ["DEBUG_REQUIRED", "Debug", "capture_backends", "debug_inputs", "run_debug"]
