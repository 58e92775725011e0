"""``qdebug report`` (a debug report → one shareable HTML file) and ``qdebug diagnose`` (why tensors are bad, and
the fix to try), plus the HTML writing ``debug --html`` and ``build --html`` share."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar, TextIO

from qdebug.cli._base import (
    Output,
    Tool,
    add_debug_inputs,
    add_float_model,
    add_json,
    add_output,
    add_quant_model,
    positive_int,
)
from qdebug.cli._html import (
    add_html,
    add_stats_samples,
    load_search_gains,
    require_html,
    run_diagnostics,
    write_html,
)
from qdebug.cli.debug import DEBUG_REQUIRED, capture_backends, debug_inputs, run_debug
from qdebug.errors import EXIT_OK


class Report(Tool):
    """A saved debug report as one self-contained HTML file."""

    name = "report"
    help = "turn a debug report (report.json) into one self-contained HTML file to share"
    description = (
        "Write one self-contained HTML file (no network access when opened) from a report written by "
        "'qdebug debug -o': verdict, outputs, diagnostics, suggestions, heatmaps, graph, worst tables. With both "
        "models the diagnostics include the weight, Q/DQ parameter and per-tensor statistics checks; with "
        "--manifest (a build's manifest.json) the target section is added; with --search (qdebug search --json) the "
        "gains it measured are shown beside the predicted ones."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug report``."""
        parser.add_argument("report", help="a debug report JSON (qdebug debug -o)")
        add_output(parser, "the HTML file to write", required=True)
        add_float_model(parser, help="the float model (optional: adds the model-based diagnostics)")
        add_quant_model(parser)
        parser.add_argument("--data", "-d", help="data for the per-tensor statistics (default: synthetic)")
        add_stats_samples(parser)
        parser.add_argument("--manifest", help="a build's manifest.json: adds the target section")
        parser.add_argument(
            "--search",
            metavar="JSON",
            help="a search result (qdebug search --json > search.json): its measured gains beside the predicted ones",
        )

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """The report, the models, the data and the manifest."""
        return {
            "report": args.report,
            "--float-model": args.float_model,
            "--quant-model": args.quant_model,
            "--data": args.data,
            "--manifest": args.manifest,
            "--search": args.search,
        }

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The HTML file."""
        return {"--output": Output(args.output)}

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Load, diagnose, render, write."""
        from qdebug.diagnose import diagnose
        from qdebug.errors import ConfigError
        from qdebug.report import DebugReport

        if args.output is None:
            raise ConfigError("--output/-o is required")
        if (args.float_model is None) != (args.quant_model is None):
            raise ConfigError("give both --float-model and --quant-model (or neither: report-only diagnostics)")
        require_html()
        gains = load_search_gains(args.search) if args.search else None
        report = DebugReport.load(args.report)
        diags = run_diagnostics(report, args) if args.float_model is not None else diagnose(report)
        manifest, out_dir = None, None
        if args.manifest:
            from qdebug.build import BuildManifest

            manifest, out_dir = BuildManifest.load(args.manifest), Path(args.manifest).parent
        path = write_html(args.output, report, diags, manifest=manifest, out_dir=out_dir, gains=gains)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {len(diags)} diagnostic(s))", file=out)
        return EXIT_OK


class Diagnose(Tool):
    """Why tensors are bad, with the evidence and the fix to try."""

    name = "diagnose"
    help = "why tensors lose precision (outliers, saturation, wasted range, ...) and the fix to try"
    description = (
        "Debug the model pair, then run the diagnostics of docs/diagnostics.md: outlier-dominated ranges, "
        "negative values under an unsigned scheme, wasted range, Concat/Add inputs on very different scales, "
        "per-tensor weights that need per-channel scales, saturation, Softmax/LayerNorm/Sigmoid precision "
        "cliffs, scales or zero points that cannot be right. Each names the tensor, the evidence and the fix."
    )
    required: ClassVar[dict[str, str]] = DEBUG_REQUIRED

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug diagnose``."""
        add_debug_inputs(parser, capture_backends())
        add_stats_samples(parser)
        add_output(parser, "write the diagnostics as JSON here")
        add_html(parser)
        add_json(parser, "the diagnostics")
        parser.add_argument("--top", type=positive_int, default=None, help="rows to print (default: all)")
        parser.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """Both models and the data."""
        return debug_inputs(args)

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The diagnostics JSON and the HTML report."""
        return {"--output": Output(args.output), "--html": Output(args.html)}

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Debug, diagnose, print (or JSON), write."""
        from qdebug.render.text import print_diagnostics, use_color

        if args.html:
            require_html()
        report = run_debug(args)
        diags = run_diagnostics(report, args)
        if args.output:
            diags.save(args.output)
        if args.html:
            write_html(args.html, report, diags)
        if args.json:
            print(diags.to_json(), file=out)
            return EXIT_OK
        print_diagnostics(diags, out, args.top, use_color(args.color, out))
        for what, path in (("diagnostics", args.output), ("HTML report", args.html)):
            if path:
                print(f"{what} written to {path}", file=out)
        return EXIT_OK


__all__ = ["Diagnose", "Report"]
