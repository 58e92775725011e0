"""``qdebug search``: find a small 16-bit promotion set that meets a goal; write its overrides JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import (
    Tool,
    add_calib,
    add_float_model,
    add_json,
    add_output,
    add_scale_out,
    cluster_spec,
    finite_number,
    say,
    staged_outputs,
    task_metric,
)
from qdebug.cli._html import add_html, require_html, write_html
from qdebug.cli._preflight import Checks, Output, Unused, check_promotion_type
from qdebug.errors import EXIT_GATE, EXIT_OK
from qdebug.render.text import fmt_db, table

#: qdebug.mixed.search.STRATEGIES (not imported here: the CLI starts without loading ONNX/ORT; a test checks they agree)
STRATEGIES = ("prefix", "greedy", "measured", "efficient", "stepwise")
#: qdebug.mixed.candidates.Ranking
RANKINGS = ("gain", "efficiency")


class Search(Tool):
    """Search promotion sets by measuring them (calibration reused), stop at the goal, write the overrides."""

    name = "search"
    help = "find a small 16-bit promotion set that meets a goal; write its overrides JSON"
    required: ClassVar[dict[str, str]] = {"float_model": "--float-model/-f", "output": "--output/-o"}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug search``."""
        add_float_model(parser, "--model", "-m")
        add_calib(parser)
        parser.add_argument("--data", "-d", help="debug data (default: the calibration data)")
        parser.add_argument("--eval", help="labelled .npz for top-1 accuracy")
        parser.add_argument("--label-key", default="label", help="the label array of --eval (and of the data, for "
                            "a --metric on labels; default 'label')")  # fmt: skip
        parser.add_argument("--debug-samples", type=int, default=64, help="samples per debug pass (default 64)")
        _add_holdout(parser)
        parser.add_argument("--config", "-c", help="base QuantConfig JSON")
        _add_target(parser)
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
        goal.add_argument(
            "--goal-near-all16",
            type=finite_number("dB"),
            metavar="DB",
            help="within DB of the all-16-bit-activations model (measured first)",
        )
        _add_task(parser, goal)
        parser.add_argument(
            "--strategy",
            choices=list(STRATEGIES),
            default="prefix",
            help="measured: measure the top candidates alone, then joint prefixes of the measured ranking; "
            "efficient: find where the noise sits by demoting blocks from all-16-bit, rank by noise per 16-bit "
            "element; stepwise: that demotion sweep, then one candidate at a time, measured after each addition",
        )
        parser.add_argument(
            "--measure-top",
            type=int,
            default=None,
            metavar="K",
            help="measured: candidates measured alone (default 8); efficient, stepwise: demotion evaluations at most "
            "(default: the number of candidates)",
        )
        parser.add_argument(
            "--rank", choices=list(RANKINGS), default="gain", help="measured: rank by gain or by gain per element"
        )
        parser.add_argument(
            "--compile-points",
            metavar="SPEC",
            help="compile these Pareto points for --target and report partitions and CPU-fallback nodes: 'chosen', "
            "'front' or front indices (the table's # column) like 0,2; a point that splits the graph is marked",
        )
        parser.add_argument(
            "--target-samples",
            type=int,
            default=4,
            metavar="N",
            help="run each compiled point on the target (QNN: the HTP simulator) over the first N debug samples and "
            "report its output SQNR vs float beside the CPU's (default 4; 0: compile only)",
        )
        parser.add_argument(
            "--remedies",
            action="store_true",
            help="also measure per-channel weights, 16-bit worst weights, the other activation range mode and "
            "percentile ranges for the worst tensors",
        )
        parser.add_argument("--remedy-output", help="write the best measured remedy's overrides JSON here")
        _add_budget(parser)
        parser.add_argument("--to", default="uint16")
        parser.add_argument("--workdir", help="keep the evaluated models here (default: a temp folder)")
        add_scale_out(parser)  # greedy: a step's candidates at once; every debug pass sharded over the workers
        add_output(parser, "overrides JSON of the chosen point", required=True)
        add_html(parser, "the one-file HTML report of the search's base, its suggestions beside the measured gains")
        add_json(parser, "the search result")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """The float model, every data set and the base config."""
        return {
            "--float-model": args.float_model,
            "--calib": args.calib,
            "--data": args.data,
            "--eval": args.eval,
            "--config": args.config,
            "--holdout": args.holdout,
        }

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The overrides JSON (and the kept models' folder)."""
        return {
            "--output": Output(args.output),
            "--remedy-output": Output(args.remedy_output),
            "--workdir": Output(args.workdir, folder=True),
            "--html": Output(args.html),
        }

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """Goals, budgets, option combinations, the evaluation set and the held-out data, before any work."""
        found = len(checks.problems)
        _check_goal(args, checks)
        _check_budgets(args, checks)
        if len(checks.problems) == found:
            checks.run(_goal, args)  # the goal's own rules, on values the checks above let through
        _check_combinations(args, checks)
        _check_files(args, checks)

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Search, print the measured curve, write the chosen point's overrides (every output asked for that the
        outcome writes, or none when writing one fails)."""
        with staged_outputs(args.output, args.remedy_output, args.html) as staged:
            return self._run(args, out, staged)

    def _run(self, args: argparse.Namespace, out: TextIO, staged: dict[str, Any]) -> int:
        base, result, remedies, base_report = _search(args, staged)
        if args.json:
            doc = result.to_dict()
            if remedies is not None:
                doc["remedies"] = [r.to_dict() for r, _ in remedies]
            print(json.dumps(doc, indent=2, allow_nan=False), file=out)
        else:
            _print_curve(result, out)
            if remedies is not None:
                _print_remedies(remedies, out)
        if args.html:  # also when the goal was missed: what was measured is worth reading
            _write_html(staged[args.html], base_report, result, remedies)
            if not args.json:
                print(f"HTML report written to {args.html}", file=out)
        if not result.reached:
            # one line, as every refusal: the hint rides on it
            print("qdebug: FAIL: the goal was not reached; no overrides written (the search promotes activations "
                  "only: 'qdebug fix' also measures 16-bit and per-channel weights, ranges and PTQ libraries, and "
                  "says what caps the model)", file=sys.stderr)  # fmt: skip
            return EXIT_GATE
        _write(args, base, result, staged[args.output])
        if result.holdout is not None and not result.holdout.holds:
            say("warning", f"held out: {result.holdout.note}")
        if not args.json:
            print(f"overrides written to {args.output}", file=out)
        return EXIT_OK


def _add_budget(parser: argparse.ArgumentParser) -> None:
    """How far a search may go: evaluations, kept steps, candidates per step, the 16-bit share (stepwise)."""
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="evaluations (prefix; measured, efficient: of the prefixes) or kept steps (greedy, stepwise) at most "
        "(default 12)",
    )
    parser.add_argument(
        "--max-evaluations",
        type=int,
        default=None,
        metavar="N",
        help="stepwise: evaluations at most, the all-16-bit model's and the demotion sweep's included "
        "(default N + 2*ceil(log2 N) for N candidates)",
    )
    parser.add_argument(
        "--candidates-per-step",
        type=int,
        default=None,
        metavar="K",
        help="greedy, stepwise: candidates measured per step (default 4)",
    )
    parser.add_argument(
        "--max-cost-fraction",
        metavar="SHARE",
        type=finite_number("share"),
        help="stepwise: never keep a point with more than this share of activation elements in 16 bits (0-1]",
    )


def _add_task(parser: argparse.ArgumentParser, goal: Any) -> None:
    """--metric and --goal-task: a task metric scored on every measured point and the held-out check."""
    parser.add_argument(
        "--metric",
        metavar="NAME|MODULE:FUNCTION",
        help="score every measured point (and the held-out check) with a task metric against the float model: "
        "top1, cosine, sequence, top1_accuracy, auto, or module:function (docs/metrics.md, Task metrics)",
    )
    goal.add_argument(
        "--goal-task",
        type=finite_number("the task metric"),
        metavar="VALUE",
        help="the --metric score to reach, e.g. 0.99 (top-1 agreement; at most VALUE for a metric where lower "
        "is better)",
    )


def _add_holdout(parser: argparse.ArgumentParser) -> None:
    """--holdout-samples and --holdout: the choice measured again on samples the search never sees."""
    parser.add_argument(
        "--holdout-samples",
        type=int,
        metavar="K",
        help="measure the chosen point again on K samples the search never sees (the K of --data after the "
        "--debug-samples ones, or the first K of --holdout); a choice that misses the goal there moves to the next "
        "front point that holds, or is reported as not holding",
    )
    parser.add_argument("--holdout", metavar="DATA", help="held-out samples (.npz or folder; default: --data)")


def _add_target(parser: argparse.ArgumentParser) -> None:
    """--target and its fixes (searched by default: the model `qdebug build --target` quantizes)."""
    from qdebug.targets.base import target_names

    parser.add_argument(
        "--target",
        choices=list(target_names()),
        help="the target's recipe; its compatibility fixes (what `qdebug build --target` applies) run on the float "
        "model first and the fixed model is searched",
    )
    parser.add_argument(
        "--no-target-fixes",
        action="store_true",
        help="with --target: search (and compile) the float model as given, without the target's fixes",
    )


def _check_goal(args: argparse.Namespace, checks: Checks) -> None:
    """A goal, and goals that can be met."""
    goals = (args.goal_sqnr, args.max_accuracy_drop, args.goal_near_all16, args.goal_task)
    if all(g is None for g in goals):
        checks.add("search needs a goal: --goal-sqnr DB, --goal-near-all16 DB, --max-accuracy-drop POINTS and/or "
                   "--goal-task VALUE")  # fmt: skip
    if args.goal_task is not None and args.metric is None:
        checks.add("--goal-task needs a task metric (--metric)")
    if args.metric is not None:
        checks.run(task_metric, args)
    if args.max_accuracy_drop is not None and not 0 <= args.max_accuracy_drop < 100:
        checks.add(f"--max-accuracy-drop is in percentage points, 0 up to 100; got {args.max_accuracy_drop:g}")
    if args.max_accuracy_drop is not None and args.eval is None:
        checks.add("--max-accuracy-drop needs a labelled evaluation set (--eval)")
    if args.goal_near_all16 is not None and args.goal_near_all16 < 0:
        checks.add(
            f"--goal-near-all16 is a distance below the all-16-bit model, 0 dB or more; got {args.goal_near_all16:g}"
        )


#: The count options of a search and the least each takes.
_COUNTS = {"debug_samples": ("--debug-samples", 1), "max_steps": ("--max-steps", 1),
           "max_evaluations": ("--max-evaluations", 1), "candidates_per_step": ("--candidates-per-step", 1),
           "measure_top": ("--measure-top", 1), "holdout_samples": ("--holdout-samples", 1),
           "target_samples": ("--target-samples", 0)}  # fmt: skip


def _check_budgets(args: argparse.Namespace, checks: Checks) -> None:
    """Counts that are counts, a share that is a share, each budget with a strategy that reads it
    (:data:`qdebug.mixed.search.BUDGET_STRATEGIES`)."""
    from qdebug.mixed.search import BUDGET_STRATEGIES

    bad = [(flag, least, getattr(args, dest)) for dest, (flag, least) in _COUNTS.items()]
    bad = [(flag, least, v) for flag, least, v in bad if v is not None and v < least]
    for flag, least, value in bad:
        checks.add(f"{flag} must be {'a positive integer' if least else '0 or more'}, got {value}")
    share = args.max_cost_fraction
    if share is not None and not 0 < share <= 1:
        checks.add(f"--max-cost-fraction is a share of the activation elements in (0, 1], got {share:g}")
    readers = {**BUDGET_STRATEGIES, "rank": ("measured",)}
    checks.unused(
        Unused(dest, "--" + dest.replace("_", "-"), args.strategy in strategies,
               f"with --strategy {args.strategy} (it is read by --strategy {', '.join(strategies)})")
        for dest, strategies in readers.items()
    )  # fmt: skip


def _check_combinations(args: argparse.Namespace, checks: Checks) -> None:
    """Options that need another: the target's, the remedies', the evaluation set's, the hold-out's."""
    checked_goal = args.goal_sqnr is not None or args.goal_near_all16 is not None or args.goal_task is not None
    checks.unused([
        Unused("remedy_output", "--remedy-output", args.remedies, "without --remedies (no remedy is measured)"),
        Unused("compile_points", "--compile-points", bool(args.target), "without --target (e.g. --target qnn)"),
        Unused("no_target_fixes", "--no-target-fixes", bool(args.target), "without --target (no fixes are applied)"),
        Unused("target_samples", "--target-samples", bool(args.compile_points), "without --compile-points (no "
               "point is compiled to run)"),
        Unused("label_key", "--label-key", args.eval is not None or args.metric is not None, "without --eval or "
               "--metric (it names the label array of the evaluation set)"),
        Unused("holdout_samples", "--holdout-samples", checked_goal, "without an SQNR or task goal (--goal-sqnr, "
               "--goal-near-all16, --goal-task): the held-out check measures those; accuracy is measured on --eval"),
        Unused("holdout", "--holdout", checked_goal, "without an SQNR or task goal (--goal-sqnr, --goal-near-all16, "
               "--goal-task): the held-out check measures those; accuracy is measured on --eval"),
    ])  # fmt: skip
    spec = (args.compile_points or "chosen").replace(" ", "")
    if spec not in ("chosen", "front") and not all(x.isdigit() for x in spec.split(",")):
        checks.add(f"--compile-points takes 'chosen', 'front' or front indices like 0,2; got {spec!r}")
    checks.run(check_promotion_type, "--to", args.to, args.target)


def _check_files(args: argparse.Namespace, checks: Checks) -> None:
    """The config, the evaluation set as top-1 will read it, the held-out data as samples the search never sees."""
    from qdebug.config import QuantConfig
    from qdebug.model_io import input_specs, load_model

    if checks.readable("--config", args.config):
        checks.run(QuantConfig.load, args.config)
    if args.html:
        checks.run(require_html)
    needed = checks.readable("--eval", args.eval) or checks.readable("--holdout", args.holdout)
    if not (needed and checks.readable("--float-model", args.float_model)):
        return
    model = checks.run(load_model, args.float_model, "float model")
    if model is None:
        return
    if checks.readable("--eval", args.eval):
        from qdebug.evaluate import check_eval_set

        checks.run(check_eval_set, model, args.eval, args.label_key)
    readable = all(checks.readable(f, v) or v is None for f, v in (("--calib", args.calib), ("--data", args.data)))
    if checks.readable("--holdout", args.holdout) and readable:
        checks.run(_check_holdout, args, checks, input_specs(model))


def _check_holdout(args: argparse.Namespace, checks: Checks, specs: Any) -> None:
    """The held-out samples exist in the number asked for and are not samples the search reads, by content
    (:func:`qdebug.mixed.holdout.seen_holdout`): every one seen is refused, some seen a warning."""
    from qdebug.data import open_data
    from qdebug.errors import DataError
    from qdebug.mixed.holdout import seen_holdout

    ignore = (args.label_key,)
    count = len(open_data(args.holdout, specs, ignore=ignore))
    if args.holdout_samples is not None and count < args.holdout_samples:
        raise DataError(f"{args.holdout}: {count} samples, fewer than --holdout-samples {args.holdout_samples}")
    seen = {"--calib": (args.calib, None), "--data": (args.data, args.debug_samples)}
    found = seen_holdout(args.holdout, seen, specs, samples=args.holdout_samples, ignore=ignore)
    line = found.describe(args.holdout)
    if found.all_seen and line:
        checks.add(f"{line}: the search sees them, so they cannot check its choice; give samples it never sees, or "
                   "--holdout-samples K alone (the K samples of --data after the debug ones)")  # fmt: skip
    elif line:
        checks.warn(f"{line}: the held-out check is only as good as the rest")


def _goal(args: argparse.Namespace) -> Any:
    """The search goal of the options (the UI's search tab builds it through the same ``user_goal``)."""
    from qdebug.mixed.search import user_goal

    return user_goal(
        args.strategy,
        output_sqnr_db=args.goal_sqnr,
        max_accuracy_drop_points=args.max_accuracy_drop,
        near_all16_db=args.goal_near_all16,
        max_steps=args.max_steps,
        candidates_per_step=args.candidates_per_step,
        measure_top=args.measure_top,
        max_evaluations=args.max_evaluations,
        max_cost_fraction=args.max_cost_fraction,
        rank=args.rank,
        to=args.to,
        task_value=args.goal_task,
    )


def _debug_options(args: argparse.Namespace, ignore: tuple[str, ...]) -> Any:
    """The options of every debug pass of the search (and of the held-out check): the task metric scores each."""
    from qdebug.debugger import DebugOptions

    return DebugOptions(
        num_samples=args.debug_samples, ignore_data_keys=ignore, cluster=cluster_spec(args),
        task_metric=task_metric(args), task_label_key=args.label_key,
    )  # fmt: skip


def _search(args: argparse.Namespace, staged: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    from qdebug.config import QuantConfig
    from qdebug.mixed.session import MixedPrecisionSession

    base = (QuantConfig.load(args.config) if args.config else QuantConfig()).merged(target=args.target)
    goal = _goal(args)
    ignore = (args.label_key,)  # the label array named by --label-key is never a model input
    with MixedPrecisionSession(
        args.float_model,
        args.calib,
        base,
        debug_data=args.data or args.calib,
        eval_data=args.eval,
        label_key=args.label_key,
        debug_options=_debug_options(args, ignore),
        workdir=args.workdir,
        target_fixes=bool(args.target) and not args.no_target_fixes,
    ) as session:  # its temporary folder goes on success, failure and Ctrl-C (a --workdir is kept)
        session.hold_out(args.holdout_samples, args.holdout)  # before any work: a data set too short is said now
        if session.target_fixes is not None:
            say("note", session.target_fixes.describe())
        if args.compile_points:  # a model the target refuses is said now, not after the search
            from qdebug.mixed.target_cost import preflight

            for note in preflight(session, args.target)[1]:
                say("note", note)
        result = session.search(goal)
        if args.compile_points:
            from qdebug.mixed.target_cost import compile_points, pick_points

            picked = pick_points(result, args.compile_points)
            result = compile_points(session, result, picked, args.target, samples=args.target_samples)
        remedies = _remedies(session, staged.get(args.remedy_output)) if args.remedies else None
        return session.base_config, result, remedies, session.base.report  # the config after the target's fixes


def _write_html(path: str, report: Any, result: Any, remedies: list[tuple[Any, Any]] | None) -> None:
    """The HTML report of the search's base: report-only diagnostics, suggestions beside what the search measured."""
    from qdebug.diagnose import diagnose
    from qdebug.mixed.gains import MeasuredGains

    gains = MeasuredGains.from_search(result, [r for r, _ in remedies or ()])
    write_html(path, report, diagnose(report), gains=gains)


def _remedies(session: Any, remedy_output: Any) -> list[tuple[Any, Any]]:
    """Measure the remedies; write the best recommended one's overrides to ``remedy_output`` (if given). Each with
    its file or None."""
    from qdebug.mixed.remedies import measure_remedies, method_ranges, propose_remedies, remedy_overrides

    ranges = {"percentile": method_ranges(session, "percentile")}
    results = measure_remedies(
        session, propose_remedies(session.base_config, session.base.report, calibration_ranges=ranges)
    )
    out = [(r, remedy_overrides(r, session) if r.recommended else None) for r in results]
    best = max((x for x in out if x[1] is not None), key=lambda x: x[0].gain_db or 0.0, default=None)
    if remedy_output is not None and best is not None and best[1] is not None:
        best[1].save(remedy_output)
    return out


def _print_remedies(remedies: list[tuple[Any, Any]], out: TextIO) -> None:
    rows = [
        [
            str(r.remedy.kind),
            r.remedy.description,
            fmt_db(r.output_sqnr_db),
            "-" if r.gain_db is None else f"{r.gain_db:+.2f}",
            "yes" if r.recommended else ("error: " + r.error if r.error else "no"),
            r.remedy.note,
        ]
        for r, _ in remedies
    ]
    table(
        "Remedies (each measured; calibration ranges reused)",
        ["remedy", "what", "output SQNR", "gain dB", "recommended", "note"],
        rows,
        out,
    )


def _print_sensitivity(sens: Any, out: TextIO) -> None:
    demote = str(sens.mode) == "demote"
    rows = [
        [
            m.candidate.name,
            str(m.candidate.kind),
            str(len(m.candidate.tensors)),
            f"{m.predicted_gain_db:+.2f}",
            "-" if m.measured_gain_db is None else f"{m.measured_gain_db:+.2f}",
            f"{m.cost_fraction_16bit:.1%}",
            f"{sens.efficiency(m):.3g}",
            m.error or "",
        ]
        for m in sens.measured
    ]
    title = (
        "Candidates (and blocks of them) left in 8 bits alone in the all-16-bit model: the gain each carries"
        if demote
        else "Candidates promoted alone: predicted vs measured gain of the worst output"
    )
    cols = ["candidate", "kind", "tensors", "predicted dB", "measured dB", "16-bit elements", "noise/element", "error"]
    table(title, cols, rows, out)
    err, rho = sens.estimate_error_db(), sens.rank_agreement()
    print(
        f"median |predicted - measured| {fmt_db(err)}; rank agreement {'-' if rho is None else f'{rho:.2f}'} "
        + ("(the search ranks by noise per element)" if demote else "(the search ranks by the measured gain)"),
        file=out,
    )


def _print_points(title: str, points: Sequence[Any], columns: Sequence[str], out: TextIO, index: bool = False) -> None:
    """One table of search points (``index``: a first ``#`` column, what ``--compile-points`` refers to)."""
    from qdebug.render.search_table import point_rows

    table(title, [*(["#"] if index else []), *columns], point_rows(points, columns, index), out)


def _print_curve(result: Any, out: TextIO) -> None:
    from qdebug.render.search_table import CURVE_COLUMNS, front_columns, outcome_line, split_note

    if result.sensitivity is not None:
        _print_sensitivity(result.sensitivity, out)
    _print_points("Search curve (measured)", result.steps, CURVE_COLUMNS, out)
    front = result.pareto()
    _print_points("Pareto front (every point measured; cost: 16-bit elements)", front, front_columns(front), out,
                  index=True)  # fmt: skip
    note = split_note(front)
    if note:
        print(note, file=out)
    if result.target_fixes is not None:
        print(f"model: {result.target_fixes.describe()}", file=out)
    print(outcome_line(result), file=out)
    if result.holdout is not None:
        _print_holdout(result.holdout, out)


def _print_holdout(check: Any, out: TextIO) -> None:
    from qdebug.render.search_table import HOLDOUT_COLUMNS, holdout_rows

    title = f"Held out: the choice measured again on {check.samples} samples the search never saw"
    table(title, list(HOLDOUT_COLUMNS), holdout_rows(check), out)
    print(f"held out: {check.note} ({check.evaluations} debug passes, {check.seconds:.1f} s)", file=out)


def _write(args: argparse.Namespace, base: Any, result: Any, path: Any) -> None:
    from qdebug.mixed.overrides import OverridesFile
    from qdebug.model_io import file_sha256

    plan = result.plan
    fixes = result.target_fixes
    OverridesFile.from_config(
        plan.config if plan is not None else base,
        model_sha256=file_sha256(args.float_model),
        requested=plan.requested if plan is not None else (),
        note=f"qdebug search: {result.stop_reason}",
        # the tensors named are the fixed model's: say so, so `qdebug build` checks them after its own fixes
        target_fixes=(fixes.target, fixes.changed) if fixes is not None and fixes.changed else None,
    ).save(path)


__all__ = ["Search"]
