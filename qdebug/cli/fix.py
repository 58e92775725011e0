"""``qdebug fix``: a float model (+ your QDQ model) + data → a fixed QDQ model, its recipe, the held-out check and
the HTML report of what each remedy bought."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TextIO

from qdebug.cli._base import (
    ProgressLine,
    Tool,
    add_float_model,
    add_json,
    add_metric,
    add_output,
    finite_number,
    positive_int,
    say,
)
from qdebug.cli._html import add_html
from qdebug.cli._preflight import Checks, Output, Unused
from qdebug.errors import EXIT_GATE, EXIT_OK

if TYPE_CHECKING:
    from qdebug.fix import FixResult

#: What ``-o fixed.onnx`` writes beside the model: the recipe (overrides JSON ``quantize --overrides`` applies)
#: and the fix's measurements.
RECIPE_SUFFIX, RESULT_SUFFIX = ".recipe.json", ".fix.json"


def _fraction(value: str) -> float:
    """An argparse type: a share between 0 and 1, or a percentage ("10%")."""
    text = value.strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 0.1 or 10%, got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (0 % and 100 %), got {value!r}")
    return number


class Fix(Tool):
    """Measured remedies that make a quantized model good again."""

    name = "fix"
    help = "find and measure remedies, write a fixed QDQ model and its recipe"
    required: ClassVar[dict[str, str]] = {"float_model": "--float-model/-f", "data": "--data/-d",
                                          "output": "--output/-o"}  # fmt: skip

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug fix``."""
        from qdebug.config import QUANT_TYPES
        from qdebug.targets.base import target_names

        add_float_model(parser)
        parser.add_argument("--quant-model", "-q", dest="quant_model", default=None,
                            help="your QDQ model: the 'before' (its recipe is one starting point)")  # fmt: skip
        parser.add_argument("--data", "-d", dest="data", default=None, help="an .npz or a folder of them: "
                            "calibration, debug and (its last samples) held-out data (required)")  # fmt: skip
        add_output(parser, f"the fixed QDQ model; its recipe ({RECIPE_SUFFIX}) and measurements ({RESULT_SUFFIX}) "
                   "are written beside it", required=True)  # fmt: skip
        add_html(parser, "also write the HTML report of the fix (before/after, what each remedy bought)")
        parser.add_argument("--budget", type=_fraction, default=0.10, metavar="SHARE",
                            help="largest share of weight + activation elements in 16 bits: 0.1 or 10%% "
                            "(default), 0 for none, 1 for no limit")  # fmt: skip
        parser.add_argument("--goal", type=finite_number("dB"), default=None, metavar="DB",
                            help="worst output SQNR to reach (default: 80%% of the way from the best 8-bit recipe "
                            "to every weight and activation in 16 bits); exit 10 when not reached")  # fmt: skip
        parser.add_argument("--target", choices=list(target_names()), default="cpu",
                            help="the target whose rules every candidate follows (default cpu)")  # fmt: skip
        parser.add_argument("--activation-type", choices=list(QUANT_TYPES), default="uint8",
                            help="the 8-bit activation type the fix starts from (default uint8)")  # fmt: skip
        parser.add_argument("--weight-type", choices=list(QUANT_TYPES), default="int8",
                            help="the weight type the fix starts from (default int8)")  # fmt: skip
        parser.add_argument("--holdout", type=int, default=None, metavar="N",
                            help="held-out samples: the data's last N (default: a quarter, at most 24; 0: none)",
                            )  # fmt: skip
        parser.add_argument("--debug-samples", type=positive_int, default=8, metavar="N",
                            help="samples every candidate is measured on (default 8)")  # fmt: skip
        parser.add_argument("--max-trials", type=positive_int, default=40, metavar="N",
                            help="candidates to measure at most (default 40)")  # fmt: skip
        parser.add_argument("--max-passes", type=finite_number("debug passes"), default=20.0, metavar="N",
                            help="stop the 16-bit search after the time of N debug passes (default 20)")  # fmt: skip
        parser.add_argument("--library", action="append", default=None, metavar="RECIPE",
                            help="a PTQ library recipe to measure (repeatable; e.g. nncf-transformer, quark-a8w8: "
                            "docs/ptq.md); default: NNCF's default and transformer recipes when its environment "
                            "exists (the first --library nncf-... creates it)")  # fmt: skip
        parser.add_argument("--no-library", action="store_true", help="measure no PTQ library recipe")
        add_metric(parser, "also score the task on every candidate and the held-out check")
        add_json(parser, "the fix result")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """The float model, your QDQ model and the data."""
        return {"--float-model": args.float_model, "--quant-model": args.quant_model, "--data": args.data}

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The fixed model with its recipe and result beside it, and the HTML report."""
        return {
            "--output": Output(args.output, derived=(RECIPE_SUFFIX, RESULT_SUFFIX), model=True),
            "--html": Output(args.html),
        }

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """Counts, the PTQ recipes' names and the options that contradict each other."""
        if args.holdout is not None and args.holdout < 0:
            checks.add(f"--holdout must be 0 or more, got {args.holdout}")
        if not args.max_passes > 0:
            checks.add(f"--max-passes must be more than 0, got {args.max_passes:g}")
        if args.no_library and args.library:
            checks.add("--no-library and --library contradict each other")
        for name in args.library or []:
            from qdebug.ptq import get_recipe

            checks.run(get_recipe, name)
        checks.unused([Unused("label_key", "--label-key", args.metric is not None, "without --metric (it names the "
                              "labels a task metric reads)")])  # fmt: skip

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Fix, write the model, its recipe, the result and the HTML report (all or none), print the summary."""
        import sys

        from qdebug.cli._base import task_metric
        from qdebug.fix import FixOptions, fix
        from qdebug.io import temp_dir
        from qdebug.render.fix import fix_lines

        libraries = () if args.no_library else (tuple(args.library) if args.library else None)
        opts = FixOptions(
            target=args.target, activation_type=args.activation_type, weight_type=args.weight_type,
            budget_16bit=args.budget, goal_db=args.goal, holdout_samples=args.holdout,
            debug_samples=args.debug_samples, max_trials=args.max_trials, libraries=libraries,
            max_pass_equivalents=args.max_passes,
            metric=task_metric(args), label_key=args.label_key,
        )  # fmt: skip
        bar = _Progress(sys.stderr, quiet=args.quiet)
        with temp_dir(prefix="qdebug-fix-") as work:
            try:
                result = fix(args.float_model, args.data, opts, quant_model=args.quant_model, workdir=work,
                             progress=bar)  # fmt: skip
            finally:
                bar.close()
            write_fix(result, args.float_model, args.output, args.html)
        result = result.with_model_path(args.output)
        if args.json:
            print(result.to_json(), file=out)
        else:
            print(f"fixed model written to {args.output}", file=out)
            for line in fix_lines(result):
                print(line, file=out)
        if args.goal is not None and not result.reached:
            say("error", f"the goal {args.goal:g} dB was not reached: {'; '.join(result.caps)}")
            return EXIT_GATE
        return EXIT_OK


class _Progress(ProgressLine):
    """The fix's progress on a terminal: candidates measured of the most it will measure, what it measures now,
    and an estimate of the time left (``ProgressLine``'s terminal handling: silent when stderr is not one)."""

    def __call__(self, done: int, total: int, message: str = "") -> None:
        import shutil
        import time

        if not self.active:
            return
        now = time.perf_counter()
        self.t0 = now if self.t0 is None else self.t0
        eta = f", ≤ {(now - self.t0) / done * (total - done):.0f} s left" if done else ""
        line = f"[{done}/{total}{eta}] {message}"
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self.stream.write("\r" + line[:width].ljust(width))
        self.stream.flush()
        self.shown = True


def write_fix(
    result: FixResult, float_model: str | Path, output: str | Path, html: str | Path | None = None
) -> dict[str, Path]:
    """The fixed model at ``output``, its recipe and the result JSON beside it, and the HTML report at ``html``, all
    or none (what ``qdebug fix -o OUTPUT --html HTML`` writes; the dashboard's Fix tab saves through it too).
    Returns ``{"model", "recipe", "result"[, "html"]}`` → path."""
    from qdebug.cli._base import staged_outputs
    from qdebug.fix.recipe import recipe_json
    from qdebug.render.fix import fix_html

    model = Path(output)
    recipe, measured = model.with_suffix(RECIPE_SUFFIX), model.with_suffix(RESULT_SUFFIX)
    report = None if html is None else str(html)
    with staged_outputs(str(model), str(recipe), str(measured), report) as staged:
        staged[str(model)].write_bytes(Path(str(result.model_path)).read_bytes())
        staged[str(recipe)].write_text(recipe_json(result, float_model))
        staged[str(measured)].write_text(result.with_model_path(str(model)).to_json())
        if report is not None:
            staged[report].write_text(fix_html(result), encoding="utf-8")
    return {"model": model, "recipe": recipe, "result": measured} | ({} if html is None else {"html": Path(html)})


__all__ = ["RECIPE_SUFFIX", "RESULT_SUFFIX", "Fix", "write_fix"]
