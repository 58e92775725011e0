"""``qdebug build``: fix, quantize and compile a float ONNX model for a target; write a build folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import (
    Tool,
    add_calib,
    add_float_model,
    add_input_shape,
    add_json,
    add_output,
    add_region,
    deprecated,
    staged_outputs,
)
from qdebug.cli._html import add_html, add_stats_samples, require_html, run_diagnostics, write_html
from qdebug.cli._preflight import Checks, Output, Unused
from qdebug.cli.debug import check_stats_samples
from qdebug.errors import EXIT_OK
from qdebug.render.text import print_build, print_compile_report, print_fixes

DATA_COMPAT_NOTE = (
    "--data without --calib also calibrates on it, as in qdebug 0.1; pass --calib for calibration data "
    "(--data is the debug data)"
)


def _precision_help() -> str:
    from qdebug.targets.base import get_target, target_names

    parts = []
    for name in target_names():
        t = get_target(name)
        parts.append(
            f"{name}: " + ", ".join(f"{p.name} ({p.help})" if p.help else p.name for p in t.precisions.values())
        )
    return "; ".join(parts)


class Build(Tool):
    """Quantize and compile for a target; the build folder appears whole or not at all."""

    name = "build"
    help = "fix, quantize and compile a float ONNX model for a target (QNN HTP, ORT CPU, Deeploy); write out/"
    description = (
        "Quantize and compile a float ONNX model for --target at --precision. Writes into the new folder -o: the "
        "(fixed) float model, the QDQ model, the compiled model, manifest.json and report.json (docs/qnn.md). "
        "Nothing is written when the build fails."
    )
    required: ClassVar[dict[str, str]] = {
        "float_model": "--float-model/-f",
        "target": "--target",
        "precision": "--precision",
        "output": "--output/-o",
    }

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug build``."""
        from qdebug.targets.base import get_target, target_names

        add_float_model(parser, "--onnx")
        parser.add_argument("--target", choices=list(target_names()), default=None, help="the target (required)")
        deprecated(parser, "--device", dest="target", new="--target")
        precisions = sorted({p for t in target_names() for p in get_target(t).precisions})
        parser.add_argument("--precision", choices=precisions, default=None, help=_precision_help() + " (required)")
        add_calib(parser)
        parser.add_argument(
            "--data",
            "-d",
            help="debug data: the samples of debug and the target check (default: --eval, else the calibration data)",
        )
        parser.add_argument("--eval", help="labelled .npz: top-1 of the float, QDQ and compiled models")
        parser.add_argument("--label-key", default="label", help="label array in --eval (ignored in the other data)")
        parser.add_argument("--overrides", help="tensor overrides JSON (docs/overrides.md) for the float model")
        parser.add_argument("--config", "-c", help="QuantConfig JSON; --target/--precision must not contradict it")
        parser.add_argument("--soc", help="QNN SoC, e.g. SM8650 (default: the provider's, HTP v68)")
        add_input_shape(parser, "fix a dynamic input shape, NAME:D0,D1,... (repeatable; default: the first sample's)")
        parser.add_argument("--fail-on-fallback", action="store_true", help="fail (exit 7) if any node falls back")
        parser.add_argument("--debug-samples", type=int, default=32, help="samples for debug and the target check")
        parser.add_argument(
            "--skip-fix",
            action="append",
            default=[],
            metavar="NAME",
            help="do not apply a compatibility fix (repeatable; the target's fixes are listed in "
            "docs/qnn.md and docs/deeploy.md)",
        )
        parser.add_argument("--no-tensor-probe", action="store_true", help="skip the per-tensor HTP vs CPU comparison")
        parser.add_argument(
            "--probe-samples",
            type=int,
            default=4,
            metavar="N",
            help="qnn: run the per-tensor probe on the first N debug samples (default 4; the outputs are compared "
            "on all of them; a probe run costs more than the compiled model's on the simulator)",
        )
        parser.add_argument(
            "--bisect",
            choices=("auto", "always", "never"),
            default="auto",
            help="qnn: locate the divergence by compiling prefix subgraphs (auto: when the probe changed the HTP "
            "graph and something diverges; docs/qnn.md)",
        )
        rem = parser.add_mutually_exclusive_group()
        rem.add_argument(
            "--remedies",
            action="store_true",
            help="qnn: after the build, locate a divergence (--bisect auto) and try the remedies on it (16-bit "
            "region, per-channel weights, other SoCs, fp16 region; each a compile and a simulator run); off by "
            "default: the summary says what was skipped",
        )
        rem.add_argument(
            "--time-budget",
            type=float,
            metavar="SECONDS",
            help="qnn: the remedies (and auto bisection) run only while the whole build stays within SECONDS: each "
            "step is estimated from this build's compile + simulator time and skipped, with a line, if it won't fit",
        )
        rem.add_argument("--no-remedies", action="store_true", help="the default (kept for older scripts)")
        parser.add_argument(
            "--no-snap-scales",
            action="store_true",
            help="deeploy: keep the calibrated scales instead of snapping each requantization to "
            "mul/2^k for Deeploy's int32 RequantShift (docs/deeploy.md)",
        )
        parser.add_argument(
            "--snap-grid",
            choices=("tie_free", "fine"),
            default="tie_free",
            help="deeploy: the snapping grid: tie_free (default) or fine (docs/deeploy.md)",
        )
        add_region(parser)
        add_output(parser, "output folder (must be new or empty)", required=True)
        add_html(parser)
        add_stats_samples(parser)
        add_json(parser, "the manifest")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """The float model, every data set, the config and the overrides."""
        return {
            "--float-model": args.float_model,
            "--calib": args.calib,
            "--data": args.data,
            "--eval": args.eval,
            "--config": args.config,
            "--overrides": args.overrides,
        }

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The build folder."""
        return {"--output": Output(args.output, folder=True, whole=True), "--html": Output(args.html)}

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """The build options (the target's own rules), the config and overrides files, the evaluation set as every
        label-reading step will see it (:func:`qdebug.build.check_eval_data`), --stats-samples only with --html."""
        from qdebug.config import QuantConfig
        from qdebug.mixed.overrides import OverridesFile
        from qdebug.model_io import load_model

        options = checks.run(build_options, args) if _check_target_options(args, checks) else None
        checks.unused([Unused("label_key", "--label-key", args.eval is not None, "without --eval (it names the label "
                              "array of the evaluation set)")])  # fmt: skip
        check_stats_samples(args, checks, bool(args.html), "without --html (it sizes the diagnostics' statistics pass)")
        if args.html:
            checks.run(require_html)
        if checks.readable("--config", args.config):
            checks.run(QuantConfig.load, args.config)
        if checks.readable("--overrides", args.overrides):
            checks.run(OverridesFile.load, args.overrides)
        model_given = checks.readable("--float-model", args.float_model)
        if options is not None and model_given and checks.readable("--eval", args.eval):
            from qdebug.build_inputs import check_eval_data

            model = checks.run(load_model, args.float_model, "float model")
            if model is not None:
                checks.run(check_eval_data, model, args.eval, options)

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Build; on a target failure print what was learned before the one-line error."""
        from qdebug.build import BuildError, build

        calib, data = args.calib, args.data
        if calib is None and data is not None:
            calib = data  # the 0.1 meaning of build --data (see DATA_COMPAT_NOTE, printed by main)
        options = build_options(args)
        existed = Path(args.output).is_dir()  # new or empty (the guard and build check it)
        progress = _progress(args, out)
        try:
            result = build(
                args.float_model,
                args.output,
                options,
                data=calib,
                eval_data=args.eval,
                debug_data=data,
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
        if args.html:
            _with_html(result, args, existed)
        if args.json:
            print(result.manifest.to_json(), file=out, end="")
        else:
            print_build(result, out)
            _print_skipped(result.manifest.skipped, args, out)
            if args.html:
                print(f"HTML report written to {args.html}", file=out)
        return EXIT_OK

    def notes(self, args: argparse.Namespace) -> list[str]:
        """The compatibility note for the old meaning of --data."""
        return [DATA_COMPAT_NOTE] if args.calib is None and args.data is not None else []


#: The options only some targets take: option ``dest`` → the build option of :attr:`Target.options` it sets.
TARGET_OPTIONS = {"soc": "soc", "fail_on_fallback": "fail_on_fallback", "skip_fix": "skip_fixes",
                  "no_tensor_probe": "probe_tensors", "bisect": "bisect", "remedies": "remedies",
                  "no_remedies": "remedies", "time_budget": "time_budget_s",
                  "probe_samples": "probe_samples",
                  "no_snap_scales": "snap_scales", "snap_grid": "snap_scales"}  # fmt: skip


def _check_target_options(args: argparse.Namespace, checks: Checks) -> bool:
    """Every option given (even at its default value, which :class:`BuildOptions` cannot tell from none) that the
    target does not take, refused; ``True`` when there is none."""
    from qdebug.targets.base import get_target, target_names

    if args.target not in target_names():
        return True  # argparse refused it, or the required check did
    takes = get_target(args.target).options
    unused = []
    for dest, option in TARGET_OPTIONS.items():
        takers = [n for n in target_names() if option in get_target(n).options]
        why = f"with --target {args.target} (it applies to --target {', '.join(takers)})"
        unused.append(Unused(dest, "--" + dest.replace("_", "-"), option in takes, why))
    found = len(checks.problems)
    checks.unused(unused)
    return len(checks.problems) == found


def build_options(args: argparse.Namespace) -> Any:
    """The :class:`~qdebug.targets.base.BuildOptions` of the options (validated: every problem, the target's own
    rules among them, in one :class:`~qdebug.errors.ConfigError`)."""
    from qdebug.build import BuildOptions
    from qdebug.region import parse_tensor_list

    return BuildOptions(
        device=args.target,
        precision=args.precision,
        soc=args.soc,
        fail_on_fallback=args.fail_on_fallback,
        debug_samples=args.debug_samples,
        input_shapes=dict(args.input_shape) or None,
        label_key=args.label_key,
        skip_fixes=tuple(args.skip_fix),
        probe_tensors=not args.no_tensor_probe,
        probe_samples=args.probe_samples,
        bisect=args.bisect,
        remedies=args.remedies,
        time_budget_s=args.time_budget,
        snap_scales=not args.no_snap_scales,
        snap_grid=args.snap_grid,
        extract_inputs=parse_tensor_list(args.extract_inputs),
        extract_outputs=parse_tensor_list(args.extract_outputs),
    )


def _progress(args: argparse.Namespace, out: TextIO) -> Any:
    """Where the build's progress lines go: stderr on a terminal; else ``out`` as lines of the text output (a script's
    stderr holds only the one-line messages); nowhere with ``--quiet``, or ``--json`` off a terminal."""
    import sys
    import time

    from qdebug.build_progress import clock

    start = time.monotonic()
    if getattr(args, "quiet", False):
        return None
    if sys.stderr.isatty():
        return lambda msg: print(f"[{clock(time.monotonic() - start)}] {msg}", file=sys.stderr, flush=True)
    if args.json:
        return None
    return lambda msg: print(f"... [{clock(time.monotonic() - start)}] {msg}", file=out, flush=True)


def rerun_command(argv: list[str], output: str) -> str:
    """The command line that runs the build again with the remedies, into ``<output>-remedies`` (this one's folder
    is taken): ``argv`` without ``--no-remedies``/``--time-budget``/``-o``, plus ``--remedies -o …``."""
    import shlex

    keep: list[str] = []
    skip_next = False
    for a in argv:
        if skip_next:
            skip_next = False
            continue
        if a in ("--time-budget", "-o", "--output"):
            skip_next = True
            continue
        if a == "--no-remedies" or a.startswith(("--time-budget=", "--output=")) or (a.startswith("-o") and a != "-o"):
            continue
        keep.append(a)
    return shlex.join(["qdebug", *keep, "--remedies", "-o", f"{output.rstrip('/')}-remedies"])


def _print_skipped(skipped: Any, args: argparse.Namespace, out: TextIO) -> None:
    """One line per step the build skipped, then the command that runs them."""
    import sys

    if not skipped:
        return
    for line in skipped:
        print(f"skipped: {line}", file=out)
    argv = getattr(args, "argv", None) or sys.argv[1:]
    print(f"to run them: {rerun_command(list(argv), args.output)}", file=out)


def _with_html(result: Any, args: argparse.Namespace, existed: bool) -> None:
    """The HTML report of the build — or, when it cannot be written, the build folder emptied again (removed, or
    left empty when it was an empty folder before): a build asked for both leaves both or neither."""
    import shutil

    try:
        with staged_outputs(args.html) as staged:
            _html(result, args, staged[args.html])
    except BaseException:
        shutil.rmtree(result.out_dir, ignore_errors=True)
        if existed:
            Path(result.out_dir).mkdir(exist_ok=True)
        raise


def _html(result: Any, args: argparse.Namespace, path: Any) -> None:
    """The HTML report of the build: its debug report, the diagnostics on the built QDQ model, the target."""
    from qdebug.diagnose import diagnose

    report = result.report
    if report is None:
        from qdebug.errors import ConfigError

        raise ConfigError("--html: this build has no debug report (no QDQ model to debug)")
    files = result.manifest.files
    if "qdq_model" in files:
        ns = argparse.Namespace(**{**vars(args), "float_model": str(result.path("float_model"))})
        ns.quant_model = str(result.path("qdq_model"))
        ns.data = args.data or args.calib
        diags = run_diagnostics(report, ns)
    else:
        diags = diagnose(report)
    write_html(path, report, diags, manifest=result.manifest, out_dir=result.out_dir)


__all__ = ["Build", "build_options"]
