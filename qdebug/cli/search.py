"""``qdebug search``: find a small 16-bit promotion set that meets a goal; write its overrides JSON."""

from __future__ import annotations

import argparse
import sys
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import (
    Output,
    Tool,
    add_calib,
    add_float_model,
    add_json,
    add_output,
    add_scale_out,
    cluster_spec,
    finite_number,
)
from qdebug.errors import EXIT_GATE, EXIT_OK
from qdebug.render.text import fmt_db, table


class Search(Tool):
    """Search promotion sets by measuring them (calibration reused), stop at the goal, write the overrides."""

    name = "search"
    help = "find a small 16-bit promotion set that meets a goal; write its overrides JSON"
    required: ClassVar[dict[str, str]] = {"float_model": "--float-model/-f", "output": "--output/-o"}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug search``."""
        from qdebug.targets.base import target_names

        add_float_model(parser, "--model", "-m")
        add_calib(parser)
        parser.add_argument("--data", "-d", help="debug data (default: the calibration data)")
        parser.add_argument("--eval", help="labelled .npz for top-1 accuracy")
        parser.add_argument("--label-key", default="label")
        parser.add_argument("--debug-samples", type=int, default=64, help="samples per debug pass (default 64)")
        parser.add_argument("--config", "-c", help="base QuantConfig JSON")
        parser.add_argument("--target", choices=list(target_names()))
        goal = parser.add_argument_group("goal (at least one)")
        goal.add_argument(
            "--goal-sqnr", type=finite_number("dB"), metavar="DB", help="worst model output SQNR to reach"
        )
        goal.add_argument(
            "--max-accuracy-drop",
            type=finite_number("percentage points"),
            metavar="POINTS",
            help="top-1 drop vs float, in percentage points",
        )
        parser.add_argument("--strategy", choices=["prefix", "greedy"], default="prefix")
        parser.add_argument("--max-steps", type=int, default=12, help="evaluations (prefix) or steps (greedy) at most")
        parser.add_argument("--to", default="uint16")
        parser.add_argument("--workdir", help="keep the evaluated models here (default: a temp folder)")
        add_scale_out(parser)  # greedy: a step's candidates at once; every debug pass sharded over the workers
        add_output(parser, "overrides JSON of the chosen point", required=True)
        add_json(parser, "the search result")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """The float model, every data set and the base config."""
        return {
            "--float-model": args.float_model,
            "--calib": args.calib,
            "--data": args.data,
            "--eval": args.eval,
            "--config": args.config,
        }

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The overrides JSON (and the kept models' folder)."""
        return {"--output": Output(args.output), "--workdir": Output(args.workdir, folder=True)}

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Search, print the measured curve, write the chosen point's overrides."""
        from qdebug.errors import ConfigError
        from qdebug.io import refuse_overwrite_input

        if args.goal_sqnr is None and args.max_accuracy_drop is None:
            raise ConfigError("search needs a goal: --goal-sqnr DB and/or --max-accuracy-drop POINTS")
        if args.max_accuracy_drop is not None and args.eval is None:
            raise ConfigError("--max-accuracy-drop needs a labelled evaluation set (--eval)")
        refuse_overwrite_input(args.output, args.float_model)
        base, result = _search(args)
        if args.json:
            print(result.to_json(), file=out)
        else:
            _print_curve(result, out)
        if not result.reached:
            print("qdebug: FAIL: the goal was not reached; no overrides written", file=sys.stderr)
            return EXIT_GATE
        _write(args, base, result)
        if not args.json:
            print(f"overrides written to {args.output}", file=out)
        return EXIT_OK


def _search(args: argparse.Namespace) -> tuple[Any, Any]:
    from qdebug.config import QuantConfig
    from qdebug.debug import DebugOptions
    from qdebug.mixed.search import SearchGoal
    from qdebug.mixed.session import MixedPrecisionSession

    base = (QuantConfig.load(args.config) if args.config else QuantConfig()).merged(target=args.target)
    goal = SearchGoal(
        output_sqnr_db=args.goal_sqnr,
        max_accuracy_drop=None if args.max_accuracy_drop is None else args.max_accuracy_drop / 100.0,
        max_steps=args.max_steps,
        to=args.to,
        strategy=args.strategy,
    )
    ignore = (args.label_key,)  # the label array named by --label-key is never a model input
    with MixedPrecisionSession(
        args.float_model,
        args.calib,
        base,
        debug_data=args.data or args.calib,
        eval_data=args.eval,
        label_key=args.label_key,
        debug_options=DebugOptions(num_samples=args.debug_samples, ignore_data_keys=ignore, cluster=cluster_spec(args)),
        workdir=args.workdir,
    ) as session:  # its temporary folder goes on success, failure and Ctrl-C (a --workdir is kept)
        return base, session.search(goal)


def _print_curve(result: Any, out: TextIO) -> None:
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
    table(
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


def _write(args: argparse.Namespace, base: Any, result: Any) -> None:
    from qdebug.graph import file_sha256
    from qdebug.mixed.overrides import OverridesFile

    plan = result.plan
    OverridesFile.from_config(
        plan.config if plan is not None else base,
        model_sha256=file_sha256(args.float_model),
        requested=plan.requested if plan is not None else (),
        note=f"qdebug search: {result.stop_reason}",
    ).save(args.output)


__all__ = ["Search"]
