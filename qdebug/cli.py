"""The ``qdebug`` command line: ``main(argv) -> int``; errors become messages and exit codes here only."""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

from qdebug._version import __version__
from qdebug.errors import EXIT_CODES, EXIT_GATE, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, QDebugError

GREEN, YELLOW, RED, DIM, RESET = "\033[32m", "\033[33m", "\033[31m", "\033[2m", "\033[0m"


def _shape_arg(text: str) -> tuple[str, list[int]]:
    try:
        name, dims = text.rsplit(":", 1)
        return name, [int(d) for d in dims.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected NAME:D0,D1,..., got {text!r}") from exc


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    epilog = "exit codes:\n" + "\n".join(f"  {k:>2}  {v}" for k, v in EXIT_CODES.items())
    p = argparse.ArgumentParser(
        prog="qdebug",
        description="Find where a quantized ONNX model loses accuracy, and fix it.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"qdebug {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser(
        "quantize",
        help="quantize a float model to QDQ",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("--model", "-m", required=True, help="float ONNX model")
    q.add_argument("--data", "-d", help=".npz file or folder of them (default: synthetic)")
    q.add_argument("--output", "-o", required=True, help="where to write the QDQ model")
    q.add_argument("--config", "-c", help="QuantConfig JSON; flags below must not contradict it")
    q.add_argument(
        "--overrides",
        help="tensor overrides JSON (ORT TensorQuantOverrides, docs/overrides.md), checked against --model; "
        "its base_config is the config unless --config is given (then both must agree)",
    )
    q.add_argument("--activation-type", choices=["uint8", "int8", "uint16", "int16"])
    q.add_argument("--weight-type", choices=["uint8", "int8", "uint16", "int16"])
    q.add_argument("--per-channel", action="store_true", default=None)
    q.add_argument("--activation-symmetric", action="store_true", default=None)
    q.add_argument("--weight-symmetric", action=argparse.BooleanOptionalAction, default=None)
    q.add_argument("--calibration-method", choices=["minmax", "entropy", "percentile"])
    q.add_argument("--samples", type=int, dest="num_samples", help="number of calibration samples")
    q.add_argument("--seed", type=int)
    q.add_argument("--distribution", dest="synthetic_distribution", choices=["uniform", "normal"])
    q.add_argument("--target", choices=["cpu", "qnn", "deeploy"])
    q.add_argument(
        "--input-shape",
        type=_shape_arg,
        action="append",
        default=[],
        help="fix a dynamic input shape for synthetic calibration data, NAME:D0,D1,... (repeatable)",
    )
    q.add_argument("--json", action="store_true", help="print the result as JSON")

    d = sub.add_parser(
        "debug",
        help="per-tensor SQNR of a quantized model against its float parent",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_debug_inputs(d)
    d.add_argument("--output", "-o", help="write the full report as JSON here")
    d.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    d.add_argument("--top", type=int, default=10, help="rows in each worst-N table")
    d.add_argument(
        "--fail-below",
        type=float,
        metavar="DB",
        help=f"exit {EXIT_GATE} if any model output's SQNR is below DB (or undefined)",
    )
    d.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    sg = sub.add_parser(
        "suggest",
        help="rank tensors to promote to 16 bits; optionally write the fixed overrides JSON",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_debug_inputs(sg)
    sg.add_argument("--top", type=int, default=10, help="suggestions to list")
    sg.add_argument("--all", action="store_true", help="list every promotable tensor with its role")
    sg.add_argument("--promote-top", type=int, metavar="K", help="promote the top K suggestions (fixer applied)")
    sg.add_argument("--to", default="uint16", help="type to promote to (default uint16)")
    sg.add_argument("--config", "-c", help="base QuantConfig JSON (default: inferred from the quantized model)")
    sg.add_argument("--overrides-out", help="write the promotion as overrides JSON here (needs --promote-top)")
    sg.add_argument("--json", action="store_true", help="print suggestions (and the plan) as JSON")

    se = sub.add_parser(
        "search",
        help="find a small 16-bit promotion set that meets a goal; write its overrides JSON",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    se.add_argument("--model", "-m", required=True, help="float ONNX model")
    se.add_argument("--calib", help="calibration .npz / folder (default: synthetic)")
    se.add_argument("--data", "-d", help="debug data (default: the calibration data)")
    se.add_argument("--eval", help="labelled .npz for top-1 accuracy")
    se.add_argument("--label-key", default="label")
    se.add_argument("--debug-samples", type=int, default=64, help="samples per debug pass (default 64)")
    se.add_argument("--config", "-c", help="base QuantConfig JSON")
    se.add_argument("--target", choices=["cpu", "qnn", "deeploy"])
    goal = se.add_argument_group("goal (at least one)")
    goal.add_argument("--goal-sqnr", type=float, metavar="DB", help="worst model output SQNR to reach")
    goal.add_argument(
        "--max-accuracy-drop", type=float, metavar="POINTS", help="top-1 drop vs float, in percentage points"
    )
    se.add_argument("--strategy", choices=["prefix", "greedy"], default="prefix")
    se.add_argument("--max-steps", type=int, default=12, help="evaluations (prefix) or steps (greedy) at most")
    se.add_argument("--to", default="uint16")
    se.add_argument("--workdir", help="keep the evaluated models here (default: a temp folder)")
    se.add_argument("--output", "-o", required=True, help="overrides JSON of the chosen point")
    se.add_argument("--json", action="store_true", help="print the search result as JSON")
    _add_build_parser(sub, epilog)
    return p


def _add_build_parser(sub: Any, epilog: str) -> None:
    b = sub.add_parser(
        "build",
        help="fix, quantize and compile a float ONNX model for a device (QNN HTP, ORT CPU, Deeploy); write out/",
        description="Quantize and compile a float ONNX model for --device at --precision. Writes into the new "
        "folder -o: the (fixed) float model, the QDQ model, the compiled model, manifest.json and report.json "
        "(docs/qnn.md). Nothing is written when the build fails.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("--onnx", required=True, help="the float ONNX model")
    b.add_argument("--device", required=True, choices=["qnn", "cpu", "deeploy"])
    b.add_argument(
        "--precision",
        required=True,
        choices=["uint8", "uint16", "int8", "fp16"],
        help="qnn: uint8 (u8/u8), uint16 (u16 act, u8 weights), int8 (u8 act, s8 symmetric weights), fp16 "
        "(needs --soc); cpu: uint8, uint16, int8 (u8 act, s8 weights); deeploy: int8 only (s8 act, s8 symmetric "
        "weights; writes deeploy/ with network.onnx and Network.c/.h for Generic and Siracusa)",
    )
    b.add_argument("--data", "-d", help="calibration .npz or folder (default: synthetic); also the debug samples")
    b.add_argument("--eval", help="labelled .npz: top-1 of the float, QDQ and compiled models; debug samples")
    b.add_argument("--label-key", default="label", help="label array in --eval (ignored in --data)")
    b.add_argument("--overrides", help="tensor overrides JSON (docs/overrides.md) for the float model")
    b.add_argument("--config", "-c", help="QuantConfig JSON; --device/--precision must not contradict it")
    b.add_argument("--soc", help="QNN SoC, e.g. SM8650 (default: the provider's, HTP v68)")
    b.add_argument(
        "--input-shape",
        type=_shape_arg,
        action="append",
        default=[],
        help="fix a dynamic input shape, NAME:D0,D1,... (repeatable; default: the first data sample's)",
    )
    b.add_argument("--fail-on-fallback", action="store_true", help="fail (exit 7) if any node falls back to CPU")
    b.add_argument("--debug-samples", type=int, default=32, help="samples for debug and the simulator (32)")
    b.add_argument(
        "--skip-fix",
        action="append",
        default=[],
        metavar="NAME",
        help="do not apply a QNN fix (repeatable): static_shapes, batchnorm_folding, gelu_fusion, "
        "layernorm_gamma_unsigned",
    )
    b.add_argument("--no-tensor-probe", action="store_true", help="skip the per-tensor HTP vs CPU comparison")
    b.add_argument(
        "--no-snap-scales",
        action="store_true",
        help="deeploy: keep the calibrated scales instead of snapping each requantization to mul/2^k for Deeploy's "
        "int32 RequantShift (the integer network then matches the QDQ model less often; docs/deeploy.md)",
    )
    b.add_argument(
        "--snap-grid",
        choices=("tie_free", "fine"),
        default="tie_free",
        help="deeploy: the snapping grid: tie_free (default; coarse requantization shifts, no exact value near a "
        "rounding half, output scales move up to a few %%) or fine (largest shifts, scale changes <= ~1e-3)",
    )
    b.add_argument("--output", "-o", required=True, help="output folder (must be new or empty)")
    b.add_argument("--json", action="store_true", help="print the manifest as JSON instead of tables")


def _add_debug_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--float-model", "-f", required=True)
    p.add_argument("--quant-model", "-q", required=True)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--data", "-d", help=".npz file or folder of them")
    g.add_argument("--samples", type=int, help="number of synthetic samples (default 8)")
    p.add_argument("--max-samples", type=int, help="use at most this many samples of --data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distribution", choices=["uniform", "normal"], default="uniform")
    p.add_argument(
        "--capture",
        choices=["graph", "numpy"],
        default="graph",
        help="reduce tensors in one merged ONNX Runtime graph (default) or fetch them and reduce in numpy",
    )
    p.add_argument(
        "--input-shape",
        type=_shape_arg,
        action="append",
        default=[],
        help="fix a dynamic input shape, NAME:D0,D1,... (repeatable)",
    )
    p.add_argument("--ignore-key", action="append", default=[], help="npz arrays to ignore (e.g. labels)")


def _use_color(mode: str, stream: TextIO) -> bool:
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def fmt_db(v: float | None, status: str = "ok", color: bool = False) -> str:
    """A dB value for a table: coloured > 40 green, 20–40 yellow, < 20 red; degenerate cases spelled out."""
    if v is None:
        text, c = status, RED
    elif math.isinf(v):
        text, c = "inf", GREEN
    else:
        text = f"{v:7.2f}"
        c = GREEN if v > 40 else YELLOW if v >= 20 else RED
    return f"{c}{text}{RESET}" if color else text


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    import re

    strip = re.compile(r"\033\[[0-9;]*m")
    widths = [len(h) for h in header]
    for r in rows:
        widths = [max(w, len(strip.sub("", c))) for w, c in zip(widths, r, strict=True)]
    print(f"\n{title}", file=out)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print("  ".join(c + " " * (w - len(strip.sub("", c))) for c, w in zip(r, widths, strict=True)), file=out)
    if not rows:
        print("(none)", file=out)


def _summary_line(name: str, s: Any) -> str:
    if s.count == 0:
        body = "no finite values"
    else:
        body = f"count {s.count}  mean {s.mean:.2f}  std {s.std:.2f}  min {s.min:.2f}  max {s.max:.2f} dB"
    extra = []
    if s.infinite:
        extra.append(f"{s.infinite} identical (inf)")
    if s.undefined:
        extra.append(f"{s.undefined} undefined")
    return f"{name}: {body}" + (f"  [{', '.join(extra)}]" if extra else "")


def print_report(report: Any, out: TextIO, top: int = 10, color: bool = False) -> None:
    """The four tables of ``qdebug debug``, each followed by its one-line summary."""
    m = report.meta
    print(f"float: {m.float_model}\nquant: {m.quant_model}\ndata:  {m.data}", file=out)
    rows = [
        [
            o.output_name,
            fmt_db(o.cumulative_sqnr_db, o.cumulative_status, color),
            f"{o.max_abs_error:.4g}" if o.max_abs_error is not None else "-",
            "" if o.worst_sample is None else str(o.worst_sample),
        ]
        for o in report.model_outputs
    ]
    _table("Model outputs (quantized vs float)", ["output", "SQNR dB", "max |err|", "worst sample"], rows, out)
    print(_summary_line("outputs", report.summary.output), file=out)

    rows = [
        [
            a.tensor_name,
            a.producer_op,
            a.quant_type or "-",
            fmt_db(a.local_sqnr_db, a.local_status, color),
            fmt_db(a.cumulative_sqnr_db, a.cumulative_status, color),
        ]
        for a in report.worst("local", top)
    ]
    _table(
        f"Worst {top} local SQNR (this tensor's own rounding)",
        ["tensor", "op", "type", "local", "cumulative"],
        rows,
        out,
    )
    print(_summary_line("local", report.summary.local), file=out)

    rows = [
        [
            a.tensor_name,
            a.producer_op,
            a.quant_type or "float",
            fmt_db(a.cumulative_sqnr_db, a.cumulative_status, color),
            fmt_db(a.local_sqnr_db, a.local_status, color) if a.quantized else "-",
        ]
        for a in report.worst("cumulative", top)
    ]
    _table(
        f"Worst {top} cumulative SQNR (damage so far)",
        ["tensor", "op", "type", "cumulative", "local"],
        rows,
        out,
    )
    print(_summary_line("cumulative", report.summary.cumulative), file=out)

    rows = [
        [
            w.weight_name,
            w.consumer_op,
            w.kind,
            w.quant_type,
            str(w.channels),
            fmt_db(w.weight_sqnr_db, w.weight_status, color),
        ]
        for w in report.worst("weight", top)
    ]
    _table(f"Worst {top} weight SQNR", ["weight", "used by", "kind", "type", "channels", "SQNR dB"], rows, out)
    print(_summary_line("weight", report.summary.weight), file=out)
    flagged = [a.tensor_name for a in report.activations if a.flagged]
    if flagged:
        print(f"\n{len(flagged)} tensor(s) hold NaN/Inf: {', '.join(flagged[:5])}", file=out)
    for w in m.warnings:
        print(f"warning: {w}", file=out)


def _cmd_quantize(args: argparse.Namespace, out: TextIO) -> int:
    from qdebug.config import QuantConfig
    from qdebug.quantize import quantize

    ofile = None
    model_warnings: list[str] = []
    if args.overrides:
        from qdebug.graph import file_sha256, load_model
        from qdebug.mixed.overrides import OverridesError, OverridesFile, check_against_model

        ofile = OverridesFile.load(args.overrides)
        model = load_model(args.model, "float model")
        try:
            model_warnings = check_against_model(ofile, model, file_sha256(args.model))
        except OverridesError as exc:
            model_warnings = exc.warnings  # e.g. "made for another model file": it explains the error
            raise
        finally:
            for w in model_warnings:
                print(f"qdebug: warning: {w}", file=sys.stderr)
    config = QuantConfig.load(args.config) if args.config else None
    base = ofile.resolve_base(config) if ofile is not None else config or QuantConfig()
    flags = {
        k: getattr(args, k)
        for k in (
            "activation_type",
            "weight_type",
            "per_channel",
            "activation_symmetric",
            "weight_symmetric",
            "calibration_method",
            "num_samples",
            "seed",
            "synthetic_distribution",
            "target",
        )
    }
    cfg = base.merged(**flags)
    if ofile is not None:
        cfg = ofile.apply_to(cfg)  # validated before anything is written
        for w in ofile.drift(cfg):
            print(f"qdebug: warning: {w}", file=sys.stderr)
    result = quantize(args.model, args.data, cfg, args.output, input_shapes=dict(args.input_shape) or None)
    if args.json:
        print(result.to_json(), file=out)
    else:
        print(
            f"wrote {result.model_path}\n"
            f"  nodes quantized {result.nodes_quantized}/{result.nodes_total} ({result.qdq_nodes} Q/DQ nodes)\n"
            f"  calibration {result.calibration_seconds:.3f} s on {result.num_calibration_samples} samples, "
            f"QDQ insertion {result.qdq_seconds:.3f} s\n"
            f"  calibration ranges: {result.calibration_cache}",
            file=out,
        )
        if ofile is not None:
            print(f"  tensor overrides: {len(ofile.overrides)} tensor(s) from {args.overrides}", file=out)
    return EXIT_OK


def _run_debug(args: argparse.Namespace) -> Any:
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
    )
    return debug(args.float_model, args.quant_model, args.data, opts)


def _cmd_debug(args: argparse.Namespace, out: TextIO) -> int:
    report = _run_debug(args)
    if args.output:
        from qdebug.io import refuse_overwrite_input

        refuse_overwrite_input(args.output, args.float_model, args.quant_model)
        report.save(args.output)
    if args.json:
        print(report.to_json(), file=out)
    else:
        print_report(report, out, args.top, _use_color(args.color, out))
        if args.output:
            print(f"\nreport written to {args.output}", file=out)
    if args.fail_below is not None:
        low = [
            o for o in report.model_outputs if o.cumulative_sqnr_db is None or o.cumulative_sqnr_db < args.fail_below
        ]
        if low:
            names = ", ".join(
                f"{o.output_name} ({fmt_db(o.cumulative_sqnr_db, o.cumulative_status).strip()})" for o in low
            )
            print(f"qdebug: FAIL: output SQNR below {args.fail_below} dB: {names}", file=sys.stderr)
            return EXIT_GATE
    return EXIT_OK


def _inferred_base(report: Any, config_path: str | None) -> Any:
    """The base config: --config, else the quantized model's dominant activation type."""
    from collections import Counter

    from qdebug.config import QuantConfig

    if config_path:
        return QuantConfig.load(config_path)
    types = Counter(a.quant_type for a in report.activations if a.quantized and a.quant_type)
    act = types.most_common(1)[0][0] if types else "uint8"
    return QuantConfig(activation_type=act)


def _cmd_suggest(args: argparse.Namespace, out: TextIO) -> int:
    import json

    from qdebug.errors import ConfigError
    from qdebug.mixed.suggest import analyse, suggest

    if args.overrides_out and not args.promote_top:
        raise ConfigError("--overrides-out needs --promote-top K (how many suggestions to promote)")
    if args.promote_top is not None and args.promote_top < 1:
        raise ConfigError("--promote-top must be a positive integer")
    report = _run_debug(args)
    items = analyse(report) if args.all else suggest(report, None if args.promote_top else args.top)
    shown = items if args.all else items[: max(args.top, args.promote_top or 0)]
    plan = None
    if args.promote_top:
        from qdebug.mixed.promote import promote

        chosen = [s.tensor_name for s in suggest(report, args.promote_top)]
        if not chosen:
            raise ConfigError("no originator to promote: the report has no promotion candidate")
        plan = promote(args.float_model, chosen, args.to, config=_inferred_base(report, args.config))
    if args.json:
        doc: dict[str, Any] = {"schema_version": 1, "suggestions": [s.to_dict() for s in shown]}
        if plan is not None:
            doc["plan"] = plan.to_dict()
        print(json.dumps(doc, indent=2, allow_nan=False), file=out)
    else:
        rows = [
            [
                str(s.rank),
                s.tensor_name,
                s.producer_op,
                s.role,
                fmt_db(s.local_sqnr_db),
                fmt_db(s.cumulative_sqnr_db),
                f"{s.estimated_output_gain_db:.2f}",
            ]
            for s in shown
        ]
        _table(
            "Promotion candidates (estimated gains; measure with qdebug search or quantize --overrides)",
            ["#", "tensor", "op", "role", "local", "cumulative", "est. output gain dB"],
            rows,
            out,
        )
        for s in shown:
            print(f"{s.rank:>3}. {s.reason}", file=out)
        if plan is not None:
            print("\n" + plan.describe(), file=out)
    if plan is not None and args.overrides_out:
        from qdebug.graph import file_sha256
        from qdebug.io import refuse_overwrite_input
        from qdebug.mixed.overrides import OverridesFile

        refuse_overwrite_input(args.overrides_out, args.float_model, args.quant_model)
        OverridesFile.from_config(
            plan.config, model_sha256=file_sha256(args.float_model), requested=plan.requested, note="qdebug suggest"
        ).save(args.overrides_out)
        if not args.json:
            print(f"\noverrides written to {args.overrides_out}", file=out)
    return EXIT_OK


def _cmd_search(args: argparse.Namespace, out: TextIO) -> int:
    from qdebug.config import QuantConfig
    from qdebug.debug import DebugOptions
    from qdebug.errors import ConfigError
    from qdebug.graph import file_sha256
    from qdebug.io import refuse_overwrite_input
    from qdebug.mixed.overrides import OverridesFile
    from qdebug.mixed.search import SearchGoal
    from qdebug.mixed.session import MixedPrecisionSession

    if args.goal_sqnr is None and args.max_accuracy_drop is None:
        raise ConfigError("search needs a goal: --goal-sqnr DB and/or --max-accuracy-drop POINTS")
    if args.max_accuracy_drop is not None and args.eval is None:
        raise ConfigError("--max-accuracy-drop needs a labelled evaluation set (--eval)")
    refuse_overwrite_input(args.output, args.model)
    base = (QuantConfig.load(args.config) if args.config else QuantConfig()).merged(target=args.target)
    goal = SearchGoal(
        output_sqnr_db=args.goal_sqnr,
        max_accuracy_drop=None if args.max_accuracy_drop is None else args.max_accuracy_drop / 100.0,
        max_steps=args.max_steps,
        to=args.to,
        strategy=args.strategy,
    )
    ignore = (args.label_key,)  # the label array named by --label-key is never a model input
    session = MixedPrecisionSession(
        args.model,
        args.calib,
        base,
        debug_data=args.data or args.calib,
        eval_data=args.eval,
        label_key=args.label_key,
        debug_options=DebugOptions(num_samples=args.debug_samples, ignore_data_keys=ignore),
        workdir=args.workdir,
    )
    result = session.search(goal)
    if args.json:
        print(result.to_json(), file=out)
    else:
        rows = [
            [
                str(p.step),
                str(len(p.promoted)),
                f"{p.cost_fraction_16bit:.1%}",
                str(p.num_16bit_tensors),
                fmt_db(p.output_sqnr_db),
                "-" if p.accuracy is None else f"{p.accuracy:.2%}",
                "<-" if p.chosen else "",
            ]
            for p in result.steps
        ]
        _table(
            "Search curve (measured)",
            ["step", "promoted", "16-bit elements", "16-bit tensors", "output SQNR", "top-1", "chosen"],
            rows,
            out,
        )
        fa = "" if result.float_accuracy is None else f", float top-1 {result.float_accuracy:.2%}"
        print(
            f"{'reached' if result.reached else 'NOT reached'}: {result.stop_reason}; "
            f"{result.requantizations} re-quantizations (calibration reused) in {result.seconds:.1f} s{fa}",
            file=out,
        )
    if not result.reached:
        print("qdebug: FAIL: the goal was not reached; no overrides written", file=sys.stderr)
        return EXIT_GATE
    plan = result.plan
    cfg = plan.config if plan is not None else base
    OverridesFile.from_config(
        cfg,
        model_sha256=file_sha256(args.model),
        requested=plan.requested if plan is not None else (),
        note=f"qdebug search: {result.stop_reason}",
    ).save(args.output)
    if not args.json:
        print(f"overrides written to {args.output}", file=out)
    return EXIT_OK


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def print_fixes(fixes: Sequence[Any], out: TextIO) -> None:
    """The QNN fixes table of ``qdebug build``."""
    if fixes:
        rows = [[f.name, "yes" if f.changed else "no", f.detail] for f in fixes]
        _table("Compatibility fixes (applied before quantizing)", ["fix", "changed", "what"], rows, out)


def print_compile_report(rep: Any, out: TextIO, folder: Any = None) -> None:
    """The compile report of ``qdebug build``: partitions, CPU fallback by op type with reasons, size, time."""
    if rep.target == "deeploy":
        state = "OK" if rep.ok else "FAILED"
        print(f"\nDeeploy code generation {state}: {rep.device}, {rep.accelerator_nodes} integer nodes, "
              f"{rep.compile_seconds:.2f} s", file=out)  # fmt: skip
    elif rep.target == "cpu":
        state = "OK" if rep.ok else "FAILED"
        print(
            f"\nCPU check {state}: {rep.device}, {rep.accelerator_nodes} nodes, {rep.compile_seconds:.2f} s", file=out
        )
    else:
        state = "OK" if rep.ok else "FAILED"
        print(f"\nCompile report (QNN {rep.device}): {state}", file=out)
        print(
            f"  EPContext partitions {rep.accelerator_partitions}, nodes on the HTP {rep.accelerator_nodes}, "
            f"CPU fallback {rep.cpu_nodes} node(s), graph-I/O Q/DQ on CPU by design {rep.graph_io_qdq_on_cpu}",
            file=out,
        )
        print(f"  context {_kib(rep.context_bytes)}, compile {rep.compile_seconds:.2f} s", file=out)
        import re

        groups: dict[tuple[str, str], int] = {}
        for f in rep.fallback:
            if not f.by_design:  # one row per op type and reason: node names would make one row per node
                key = (f.op_type, re.sub(r"node `[^`]*`", "node `…`", f.reason))
                groups[key] = groups.get(key, 0) + f.nodes
        if groups:
            rows = [[op, str(n), reason] for (op, reason), n in sorted(groups.items())]
            _table("CPU fallback by op type (the backend's reason)", ["op", "nodes", "reason"], rows, out)
        if rep.log_path:  # relative to the output folder in a manifest
            print(f"  log: {rep.log_path if folder is None else os.path.join(folder, rep.log_path)}", file=out)
    for w in rep.warnings:
        print(f"  warning: {w}", file=out)
    if rep.error:
        print(f"  error: {rep.error}", file=out)


def print_build(result: Any, out: TextIO) -> None:
    """Everything ``qdebug build`` prints after a successful build."""
    m = result.manifest
    print_fixes(m.fixes, out)
    q = m.quantization
    if q is not None:
        print(
            f"\nquantized {q.nodes_quantized}/{q.nodes_total} nodes ({q.qdq_nodes} Q/DQ) with "
            f"{m.config.activation_type} activations and {m.config.weight_type} weights; calibration "
            f"{q.calibration_seconds:.2f} s on {q.num_calibration_samples} samples, "
            f"QDQ insertion {q.qdq_seconds:.2f} s",
            file=out,
        )
    print_compile_report(m.compile, out, result.out_dir)
    if m.deeploy is not None:
        e = m.deeploy["export"]
        snap = m.deeploy.get("snap") or {}
        if snap.get("enabled"):
            print(
                f"  scales snapped to Deeploy's int32 RequantShift ({snap.get('grid', 'fine')} grid): "
                f"{len(snap['snapped'])} requantization(s), "
                f"largest relative scale change {snap['max_rel_change']:.2e}",
                file=out,
            )
        elif snap:
            print("  scales not snapped (--no-snap-scales)", file=out)
        print(
            f"  integer network vs CPU QDQ on {e['num_samples']} samples: {e['equal_fraction']:.2%} of output "
            f"elements equal, max {e['max_lsb_diff']} LSB",
            file=out,
        )
        for plat, c in m.deeploy["codegen"].items():
            what = (
                f"{', '.join(c['files'])} (integer only: {c['integer_only']})" if c["ok"] else f"failed: {c['error']}"
            )
            print(f"  {plat}: {what}", file=out)
    acc = m.target_accuracy
    cpu = {o.output_name: o for o in m.cpu_qdq_vs_float}
    names = list(cpu) or ([o.output_name for o in acc.outputs] if acc else [])
    if names:
        by_t = {o.output_name: o for o in acc.outputs} if acc is not None else {}
        rows = []
        for n in names:
            c = cpu.get(n)
            t = by_t.get(n)
            rows.append(
                [
                    n,
                    fmt_db(c.sqnr_db, c.status) if c else "-",
                    fmt_db(t.target_vs_float_db) if t else "-",
                    fmt_db(t.target_vs_cpu_db) if t and t.target_vs_cpu_db is not None else "-",
                ]
            )
        where = f"HTP simulator, {acc.device}" if acc is not None else "no target run"
        _table(
            f"Output SQNR (dB) on {m.num_debug_samples} samples ({where})",
            ["output", "CPU-QDQ vs float", "target vs float", "target vs CPU-QDQ"],
            rows,
            out,
        )
    if acc is not None:
        if acc.tensors:
            differ = sum(1 for t in acc.tensors if t.max_lsb > acc.lsb_threshold)
            first = acc.first_divergent or "none"
            print(
                f"per tensor: {len(acc.tensors)} quantized activations compared, {differ} differ by more than "
                f"{acc.lsb_threshold} LSB on the HTP; first: {first}",
                file=out,
            )
        print(f"simulator: {acc.seconds_per_sample * 1000:.1f} ms per sample", file=out)
        for note in acc.notes:
            print(f"note: {note}", file=out)
    if m.top1 is not None:
        t1 = m.top1

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v:.2%}"

        print(
            f"top-1 on {t1.num_samples} samples: float {pct(t1.float_model)}, QDQ (CPU) {pct(t1.qdq_model)}, "
            f"compiled ({m.device}) {pct(t1.compiled_model)}",
            file=out,
        )
    for w in m.warnings:
        print(f"warning: {w}", file=out)
    files = ", ".join(dict.fromkeys(m.files.values()))
    print(f"\nwrote {result.out_dir}/: {files} ({m.timings.get('total_s', 0.0):.1f} s)", file=out)


def _cmd_build(args: argparse.Namespace, out: TextIO) -> int:
    from qdebug.build import BuildError, BuildOptions, build

    options = BuildOptions(
        device=args.device,
        precision=args.precision,
        soc=args.soc,
        fail_on_fallback=args.fail_on_fallback,
        debug_samples=args.debug_samples,
        input_shapes=dict(args.input_shape) or None,
        label_key=args.label_key,
        skip_fixes=tuple(args.skip_fix),
        probe_tensors=not args.no_tensor_probe,
        snap_scales=not args.no_snap_scales,
        snap_grid=args.snap_grid,
    )
    progress = None if args.json else (lambda msg: print(f"... {msg}", file=out, flush=True))
    try:
        result = build(
            args.onnx,
            args.output,
            options,
            data=args.data,
            eval_data=args.eval,
            config=args.config,
            overrides=args.overrides,
            progress=progress,
        )
    except BuildError as exc:
        if not args.json:  # what was learned before the failure; the one-line error follows on stderr
            print_fixes(exc.fixes, out)
            if exc.compile_report is not None:
                print_compile_report(exc.compile_report, out)
        raise
    if args.json:
        print(result.manifest.to_json(), file=out, end="")
    else:
        print_build(result, out)
    return EXIT_OK


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI and return its exit code (never raises for user errors)."""
    out = out or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help / bad usage
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command == "quantize":
            return _cmd_quantize(args, out)
        if args.command == "debug":
            return _cmd_debug(args, out)
        if args.command == "suggest":
            return _cmd_suggest(args, out)
        if args.command == "search":
            return _cmd_search(args, out)
        if args.command == "build":
            return _cmd_build(args, out)
        parser.error(f"unknown command {args.command}")
    except QDebugError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"qdebug: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("qdebug: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        traceback.print_exc()
        print(f"qdebug: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_USAGE


def console_main() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
