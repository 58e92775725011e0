"""``qdebug report`` (a debug report → one shareable HTML file) and ``qdebug diagnose`` (why tensors are bad, and
the fix to try), plus the HTML writing ``debug --html`` and ``build --html`` share."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import (
    Tool,
    add_debug_inputs,
    add_float_model,
    add_json,
    add_output,
    add_quant_model,
    positive_int,
    staged_outputs,
)
from qdebug.cli._html import (
    add_html,
    add_stats_samples,
    load_search_gains,
    require_html,
    run_diagnostics,
    write_html,
)
from qdebug.cli._preflight import Checks, Output, Unused, load_kind
from qdebug.cli.debug import (
    DEBUG_REQUIRED,
    capture_backends,
    check_debug_args,
    check_stats_samples,
    check_two_models,
    debug_inputs,
    run_debug,
)
from qdebug.errors import EXIT_OK
from qdebug.io import atomic_write_text


class Report(Tool):
    """A saved debug report as one self-contained HTML file."""

    name = "report"
    required: ClassVar[dict[str, str]] = {"output": "--output/-o"}
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

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """Each input the kind of file it should be, the report made from the models given, options that do
        something."""
        models = args.float_model is not None and args.quant_model is not None
        if (args.float_model is None) != (args.quant_model is None):
            checks.add("give both --float-model and --quant-model (or neither: report-only diagnostics)")
        check_two_models(checks, args.float_model, args.quant_model)
        why = "without --float-model and --quant-model (the statistics pass runs the float model)"
        check_stats_samples(args, checks, models, why)
        checks.unused([Unused("data", "--data", models, why)])
        checks.run(require_html)
        report = None
        if checks.readable("report", args.report):
            report = checks.run(load_report, args.report)
        if checks.readable("--search", args.search):
            checks.run(load_search_gains, args.search)
        if checks.readable("--manifest", args.manifest):
            checks.run(load_manifest, args.manifest)
        if report is not None and models and checks.readable("--float-model", args.float_model):
            checks.run(check_report_models, report, args)

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Load, diagnose, render, write."""
        from qdebug.diagnose import diagnose

        gains = load_search_gains(args.search) if args.search else None
        report = load_report(args.report)
        diags = run_diagnostics(report, args) if args.float_model is not None else diagnose(report)
        manifest, out_dir = None, None
        if args.manifest:
            manifest, out_dir = load_manifest(args.manifest), Path(args.manifest).parent
        path = write_html(args.output, report, diags, manifest=manifest, out_dir=out_dir, gains=gains)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {len(diags)} diagnostic(s))", file=out)
        return EXIT_OK


def load_report(path: str) -> Any:
    """The debug report at ``path``; anything else (a model, a JSON list, another tool's JSON) is one line naming
    it."""
    from qdebug.report import DebugReport

    return load_kind(DebugReport.load, path, "qdebug debug report", "write one with qdebug debug -o report.json")


def load_manifest(path: str) -> Any:
    """The build manifest at ``path``, or one line naming it."""
    from qdebug.build_manifest import BuildManifest

    return load_kind(BuildManifest.load, path, "qdebug build manifest", "give the manifest.json of a build folder")


def _missing(wanted: Any, have: set[str]) -> str | None:
    """The first few of ``wanted`` not in ``have``, quoted (``None``: none)."""
    missing = [t for t in wanted if t not in have]
    if not missing:
        return None
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return ", ".join(repr(t) for t in missing[:3]) + more


def check_report_models(report: Any, args: argparse.Namespace) -> None:
    """The report was made from the models given — a file whose checksum is the report's is; another must have every
    tensor the report measured (float model) and quantize, in the engine's own pairing, every tensor the report says
    was quantized (quantized model). Else one line naming the report and the model, instead of ONNX Runtime's
    "graph output does not exist" or diagnostics of tensors that are not there."""
    from qdebug.errors import ModelError
    from qdebug.model_io import file_sha256, load_model
    from qdebug.pairing import pair_models

    meta = report.meta

    def refuse(path: str, role: str, why: str) -> ModelError:
        made = meta.float_model if role == "float model" else meta.quant_model
        return ModelError(f"{args.report} was not made from {path} ({role}; it was made from {made}): {why}")

    f_same, q_same = (file_sha256(p) == h for p, h in ((args.float_model, meta.float_sha256),
                                                        (args.quant_model, meta.quant_sha256)))  # fmt: skip
    if f_same and q_same:
        return
    f = load_model(args.float_model, "float model")
    if not f_same:
        g = f.graph
        values = {n for node in g.node for n in node.output} | {v.name for v in (*g.input, *g.initializer)}
        missing = _missing([a.tensor_name for a in report.activations], values)
        if missing:
            raise refuse(args.float_model, "float model", f"it measured {missing}, which the model does not have")
    if q_same:
        return
    try:
        pairing = pair_models(f, load_model(args.quant_model, "quantized model"))
    except ModelError as exc:
        raise refuse(args.quant_model, "quantized model", exc.reason) from exc
    quantized = {a.tensor_name for a in pairing.activations if a.quantized}
    missing = _missing([a.tensor_name for a in report.activations if a.quantized], quantized)
    if missing:
        raise refuse(args.quant_model, "quantized model", f"it measured {missing} quantized, which the model does not")


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
        m = parser.add_argument_group("measure the remedies (docs/diagnostics.md#measure)")
        m.add_argument(
            "--measure", action="store_true",
            help="quantize each diagnosis' remedy (from the cached calibration where it can), debug it and rank the "
            "fixes by the gain measured at the worst output, beside the predicted gain",
        )  # fmt: skip
        m.add_argument(
            "--calib", help="with --measure: calibration data for the remedies that calibrate (default: --data)"
        )
        m.add_argument(
            "--measure-top", type=positive_int, default=8, metavar="N",
            help="with --measure: measure the remedies of N diagnoses, most severe first, the first of each remedy "
            "kind before a second of any (default 8)",
        )  # fmt: skip

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """Both models and the data (and --calib)."""
        return {**debug_inputs(args), "--calib": args.calib}

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The diagnostics JSON and the HTML report."""
        return {"--output": Output(args.output), "--html": Output(args.html)}

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """debug's data options; --top only sizes the printed table."""
        check_debug_args(args, checks)
        check_stats_samples(args, checks, True, "")
        checks.unused([
            Unused("top", "--top", not args.json, "with --json (it sizes the printed table)"),
            Unused("calib", "--calib", args.measure, "without --measure (it calibrates the remedies)"),
            Unused("measure_top", "--measure-top", args.measure, "without --measure"),
        ])  # fmt: skip
        if args.html:
            checks.run(require_html)

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Debug, diagnose, write (both outputs or neither), print (or JSON)."""
        from qdebug.render.text import print_diagnostics, use_color

        report = run_debug(args)
        diags = run_diagnostics(report, args)
        gains = _measure(args, diags) if args.measure else None
        doc = diags.to_dict()
        if gains is not None:
            doc["measured"] = gains.to_dict()
        with staged_outputs(args.output, args.html) as staged:
            if args.output:
                atomic_write_text(staged[args.output], json.dumps(doc, indent=2, allow_nan=False))
            if args.html:
                write_html(staged[args.html], report, diags)
        if args.json:
            print(json.dumps(doc, indent=2, allow_nan=False), file=out)
            return EXIT_OK
        print_diagnostics(diags, out, args.top, use_color(args.color, out))
        if gains is not None:
            print_measured(gains, out)
        for what, path in (("diagnostics", args.output), ("HTML report", args.html)):
            if path:
                print(f"{what} written to {path}", file=out)
        return EXIT_OK


def _measure(args: argparse.Namespace, diags: Any) -> Any:
    """Every diagnosis' remedy measured on a session whose base is the diagnosed model (``--measure``)."""
    from qdebug.cli.debug import debug_options
    from qdebug.mixed.diagnosis import measure_diagnostics, select_for_measure
    from qdebug.mixed.session import MixedPrecisionSession

    first = select_for_measure(diags, args.measure_top)
    with MixedPrecisionSession(
        args.float_model, args.calib or args.data, quant_model=args.quant_model, debug_data=args.data,
        debug_options=debug_options(args),
    ) as session:  # fmt: skip
        return measure_diagnostics(session, first)


def print_measured(gains: Any, out: TextIO) -> None:
    """The measured fixes, best measured gain first, with the predicted gain beside and the median error."""
    base = "?" if gains.base_output_sqnr_db is None else f"{gains.base_output_sqnr_db:.2f}"
    ceiling = "" if gains.ceiling_db is None else f"; all activations in 16 bits: {gains.ceiling_db:.2f} dB"
    print(f"\nFixes measured (gain at the worst output over the diagnosed model's {base} dB{ceiling}):", file=out)
    if not any(g.helps for g in gains.items):
        print("no remedy measured a gain above 0.1 dB: none is advised", file=out)
    for k, g in enumerate(gains.items, 1):
        pred = "—" if g.predicted_gain_db is None else f"{g.predicted_gain_db:+.2f}"
        got = (
            f"error: {g.error}" if g.error else f"{g.measured_gain_db:+.2f}" if g.measured_gain_db is not None else "?"
        )
        mark = "" if g.helps else "  (no gain: not advised)"
        print(f"{k:>3}. {g.remedy} for {g.tensor}: predicted {pred} dB, measured {got} dB{mark}", file=out)
        print(f"     {g.text}", file=out)
    err = gains.median_abs_error_db
    n = sum(1 for g in gains.items if g.predicted_gain_db is not None and g.measured_gain_db is not None)
    if err is not None:
        print(f"predicted vs measured: median |error| {err:.2f} dB over {n} remedies with an estimate", file=out)


__all__ = ["Diagnose", "Report", "check_report_models", "load_manifest", "load_report", "print_measured"]
