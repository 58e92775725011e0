"""Mixed precision on the real-model corpus: does the ``measured`` search reach near-16-bit accuracy cheaply?

For each cached corpus model (``~/.cache/qdebug/realmodels`` or ``$QDEBUG_CORPUS_DIR``; see
``benchmarks/realmodels/README.md``), with U8S8 per-tensor MinMax (the gauntlet's recipe) calibrated on
``--calib-samples`` of ``calib.npz`` and debugged on ``--debug-samples`` of ``eval.npz``:

* base: the 8-bit model's worst output SQNR, and the seconds of one plain debug pass of it;
* all-16: every activation in uint16 (the ceiling; measured by the search itself, goal = all-16 − ``--near``);
* the search (``--strategy``, default ``efficient``: ``qdebug.mixed.search_measured.efficient_search``, blocks
  demoted from all-16 to find where the noise sits, then joint prefixes of the ranking by noise per 16-bit element;
  ``measured``: the top ``--measure-top`` candidates promoted alone, then joint prefixes of the measured ranking);
* the best point measured within ``--budget`` of the activation elements (10 %): the search's own, and the longest
  prefix of its ranking that fits the budget, measured once more (not counted in the search's evaluations);
* ``--stepwise-greedy WIDTH`` (with ``--greedy-budgets``): the step-by-step measured greedy of
  ``bench_mixed_stepwise.py`` at each budget, and with ``--heldout N`` its points measured again on the N evaluation
  samples after the debug set; ``--fix-for TARGET`` searches the model after that target's compatibility fixes;
* the chosen point's SQNR and 16-bit cost, the evaluations and the wall time, the cost per evaluation as a multiple
  of one debug pass, the whole measured Pareto front, and predicted vs measured gain of the singles.

Every number is measured; nothing is estimated. One run per model (no repeats): the machine is shared, so the
seconds are upper bounds. Run by ``bench_mixed.py --corpus NAMES`` or directly::

    .venv/bin/python benchmarks/bench_mixed_corpus.py --models ppocr-cls,minilm-l3 [--calib-samples 8]
        [--debug-samples 8] [--measure-top 6] [--near 0.5] [--docs docs/mixed_precision.md] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _mark(args: argparse.Namespace, what: str) -> str:
    """The HTML comment that delimits a section in the docs (one per recipe and table)."""
    recipe = (
        args.weight_type
        if getattr(args, "strategy", "measured") == "measured"
        else f"{args.weight_type}-{args.strategy}"
    )
    return f"<!-- bench_mixed_corpus:{recipe}:{what} -->"


def corpus_dir() -> Path:
    """Where the corpus is cached."""
    return Path(os.environ.get("QDEBUG_CORPUS_DIR", Path.home() / ".cache" / "qdebug" / "realmodels"))


def _fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def run_model(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Base, one timed debug pass, then the measured search to all-16 − near; a JSON-ready row."""
    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions, debug
    from qdebug.mixed.search import SearchGoal
    from qdebug.mixed.session import MixedPrecisionSession

    folder = corpus_dir() / name
    cfg = QuantConfig(num_samples=args.calib_samples, weight_type=args.weight_type)
    opts = DebugOptions(num_samples=args.debug_samples)
    t_all = time.perf_counter()
    model = _fixed_for(folder, name, work, args.fix_for) if args.fix_for else folder / f"{name}.onnx"
    with MixedPrecisionSession(
        model, folder / "calib.npz", cfg, debug_data=folder / "eval.npz", debug_options=opts, workdir=work / name,
    ) as s:  # fmt: skip
        base = s.base
        t0 = time.perf_counter()
        debug(s.float_path, base.quantization.model_path, s.debug_data, s.debug_options)
        debug_s = time.perf_counter() - t0
        goal = SearchGoal(
            near_all16_db=args.near,
            strategy=args.strategy,
            measure_top=args.measure_top,
            max_steps=args.max_steps,
            rank=args.rank,
        )
        r = s.search(goal)
        at_budget = best_at_budget(s, r, args.budget)
        greedy = [greedy_at_budget(s, r, b) for b in args.greedy_budgets]
        stepwise = _stepwise(s, r, args)
    wall = time.perf_counter() - t_all
    heldout = _held_out(model, folder, cfg, args, stepwise, work / f"{name}-heldout") if args.heldout else None
    final = r.final
    sens = r.sensitivity
    return {
        "model": name if not args.fix_for else f"{name} ({args.fix_for}-fixed)",
        "stepwise_greedy": stepwise,
        "heldout": heldout,
        "base_db": base.output_sqnr_db,
        "all16_db": r.ceiling_db,
        "chosen_db": final.output_sqnr_db,
        "chosen_cost": final.cost_fraction_16bit,
        "chosen_label": final.label,
        "reached": r.reached,
        "stop_reason": r.stop_reason,
        "evaluations": r.evaluations,
        "search_s": r.seconds,
        "wall_s": wall,
        "debug_s": debug_s,
        "per_eval_over_debug": (r.seconds / r.evaluations / debug_s) if r.evaluations and debug_s else None,
        "pareto": [(p.label, p.cost_fraction_16bit, p.output_sqnr_db) for p in r.pareto()],
        "singles": [
            (m.candidate.name, str(m.candidate.kind), m.predicted_gain_db, m.measured_gain_db)
            for m in (sens.measured if sens is not None else ())
        ],
        "at_budget": at_budget,
        "greedy_at_budget": [g for g in greedy if g is not None],
        "strategy": args.strategy,
        "carriers": _carriers(sens),
        "model_min_cost": _model_min_cost(
            sens, base.output_sqnr_db, None if r.ceiling_db is None else r.ceiling_db - args.near, r.ceiling_db
        ),
        "estimate_error_db": None if sens is None else sens.estimate_error_db(),
        "rank_agreement": None if sens is None else sens.rank_agreement(),
    }


def best_at_budget(session: Any, r: Any, budget: float) -> dict[str, Any] | None:
    """The best point the search's measured ranking offers at most ``budget`` of the activation elements in 16 bits:
    the measured point of the result if one is within the budget and better, else the longest prefix of the ranking
    whose candidates' elements fit, measured here (one evaluation; not counted in the search's evaluations)."""
    from qdebug.mixed.evaluation import sixteen_bit_cost

    sens = r.sensitivity
    inside = [p for p in (*r.steps, *r.evaluated) if p.cost_fraction_16bit <= budget and p.output_sqnr_db is not None]
    best = max(inside, key=lambda p: p.output_sqnr_db, default=None)
    row: dict[str, Any] = {"budget": budget, "search_best_db": None if best is None else best.output_sqnr_db,
                           "search_best_cost": None if best is None else best.cost_fraction_16bit}  # fmt: skip
    if sens is None or not sens.measured:
        return row
    share = {m.candidate.name: m.cost_fraction_16bit for m in sens.measured}
    order = sens.ranking("efficiency")
    n, used = 0, 0.0
    for c in order:
        if c.name not in share or used + share[c.name] > budget:
            break
        used += share[c.name]
        n += 1
    if n == 0:
        return row
    tensors = tuple(dict.fromkeys(t for c in order[:n] for t in c.tensors))
    ev = session.evaluate(session.promote(tensors), name="at_budget")
    row.update(prefix=n, prefix_db=ev.output_sqnr_db, prefix_cost=sixteen_bit_cost(ev.report)[0])
    return row


def _fixed_for(folder: Path, name: str, work: Path, target: str) -> Path:
    """The corpus model after ``target``'s compatibility fixes (what ``qdebug build --target`` quantizes), written to
    ``work``; searched with the same CPU recipe as the model as given, so the two rows differ by the fixes only."""
    from qdebug.io import atomic_save_model
    from qdebug.mixed.target_fixes import apply_target_fixes
    from qdebug.model_io import load_model

    model, _, fixes = apply_target_fixes(
        load_model(folder / f"{name}.onnx", "model"), target, None, folder / "calib.npz"
    )
    print(f"[{name}: {fixes.describe()}]", file=sys.stderr, flush=True)
    return atomic_save_model(model, work / f"{name}.{target}-fixed.onnx")


def _stepwise(session: Any, r: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The step-by-step measured greedy at each ``--greedy-budgets`` (``--stepwise-greedy WIDTH``; 0: not run)."""
    if not args.stepwise_greedy:
        return []
    from bench_mixed_stepwise import stepwise_row

    from qdebug.mixed.stepwise import Measurements

    memo = Measurements(session)
    goal = None if r.ceiling_db is None else r.ceiling_db - args.near
    rows = [stepwise_row(memo, r, b, goal, args.stepwise_greedy, args.stepwise_max_evals)
            for b in args.greedy_budgets]  # fmt: skip
    return [x for x in rows if x is not None]


def _held_out(
    model: Path, folder: Path, cfg: Any, args: argparse.Namespace, rows: list[dict[str, Any]], work: Path
) -> dict[str, Any] | None:
    """The step-by-step greedy's points measured on the ``--heldout`` evaluation samples after the debug set (same
    model, same calibration): not counted in the wall time above."""
    import numpy as np
    from bench_mixed_stepwise import held_out

    from qdebug.debugger import DebugOptions
    from qdebug.mixed.session import MixedPrecisionSession

    # after the debug samples of eval.npz, or after the calibration samples of calib.npz (``--heldout-from calib``)
    skip = args.calib_samples if args.heldout_from == "calib" else args.debug_samples
    lo, hi = skip, skip + args.heldout
    with np.load(folder / f"{args.heldout_from}.npz") as z:
        data = {k: z[k][lo:hi] for k in z.files}
    n = min(len(v) for v in data.values())
    if n == 0:
        return None
    opts = DebugOptions(num_samples=n)
    with MixedPrecisionSession(
        model, folder / "calib.npz", cfg, debug_data=data, debug_options=opts, workdir=work
    ) as s:
        return {"samples": n, "source": f"{args.heldout_from}.npz[{lo}:{lo + n}]", **held_out(s, rows)}


def greedy_at_budget(session: Any, r: Any, budget: float) -> dict[str, Any] | None:
    """The greedy fill of ``budget`` by measured noise per element: the demotion sweep's candidates in that order,
    each taken if its element share still fits (unlike the ranking prefix, one that does not fit is skipped, not the
    end), promoted together and measured once (not counted in the search's evaluations)."""
    from qdebug.mixed.evaluation import sixteen_bit_cost

    sens = r.sensitivity
    if sens is None or str(sens.mode) != "demote" or not sens.measured:
        return None
    share = {m.candidate.name: m.cost_fraction_16bit for m in sens.measured}
    moved = {m.candidate.name: sens.noise_moved(m) for m in sens.measured}
    picked, used = [], 0.0
    for c in sens.ranking("efficiency"):
        if c.name in share and moved[c.name] > 0 and used + share[c.name] <= budget:
            picked.append(c)
            used += share[c.name]
    if not picked:
        return None
    tensors = tuple(dict.fromkeys(t for c in picked for t in c.tensors))
    ev = session.evaluate(session.promote(tensors), name=f"greedy{round(budget * 1000)}")
    return {"budget": budget, "candidates": len(picked), "db": ev.output_sqnr_db,
            "cost": sixteen_bit_cost(ev.report)[0], "predicted_cost": used}  # fmt: skip


def _model_min_cost(sens: Any, base_db: float | None, goal_db: float | None, ceiling_db: float | None) -> float | None:
    """The fewest activation elements (share) that meet ``goal_db`` under the additive model of the measured noises
    (fractional knapsack: leaves taken by noise per element, the last one in part). ``None`` without a demotion
    sweep or a goal."""
    from qdebug.mixed.candidates import noise_power

    if sens is None or str(sens.mode) != "demote" or goal_db is None:
        return None
    n_base, n_goal, n_ceil = noise_power(base_db), noise_power(goal_db), noise_power(ceiling_db)
    if n_base is None or n_goal is None or n_ceil is None or n_base <= n_ceil:
        return None
    leaves = sorted(sens.measured, key=lambda m: -sens.efficiency(m))
    total = sum(sens.noise_moved(m) for m in leaves) or 1.0
    scale = (n_base - n_ceil) / total
    need, cost = n_base - n_goal, 0.0
    for m in leaves:
        moved = scale * sens.noise_moved(m)
        if moved <= 0:
            break
        if moved >= need:
            return cost + m.cost_fraction_16bit * need / moved
        need -= moved
        cost += m.cost_fraction_16bit
    return None


def _carriers(sens: Any, k: int = 12) -> list[tuple[str, str, int, float, float | None, float]]:
    """The ``k`` candidates that carry the most measured noise: (name, kind, tensors, element share, gain dB,
    share of the measured noise)."""
    if sens is None:
        return []
    total = sum(sens.noise_moved(m) for m in sens.measured) or 1.0
    top = sorted(sens.measured, key=lambda m: -sens.noise_moved(m))[:k]
    return [
        (m.candidate.name, str(m.candidate.kind), len(m.candidate.tensors), m.cost_fraction_16bit,
         m.measured_gain_db, sens.noise_moved(m) / total)
        for m in top
    ]  # fmt: skip


def run_remedies(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The same base, then every remedy of ``qdebug.mixed.remedies`` measured (percentile ranges: one calibration)."""
    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.remedies import measure_remedies, method_ranges, propose_remedies
    from qdebug.mixed.session import MixedPrecisionSession

    folder = corpus_dir() / name
    cfg = QuantConfig(num_samples=args.calib_samples, weight_type=args.weight_type)
    t_all = time.perf_counter()
    with MixedPrecisionSession(
        folder / f"{name}.onnx", folder / "calib.npz", cfg, debug_data=folder / "eval.npz",
        debug_options=DebugOptions(num_samples=args.debug_samples), workdir=work / f"{name}-remedies",
    ) as s:  # fmt: skip
        base_db = s.base.output_sqnr_db
        ranges = {"percentile": method_ranges(s, "percentile")}
        results = measure_remedies(s, propose_remedies(s.base_config, s.base.report, calibration_ranges=ranges))
    return {
        "model": name,
        "base_db": base_db,
        "remedies": [(r.remedy.description, r.output_sqnr_db, r.gain_db, r.error) for r in results],
        "wall_s": time.perf_counter() - t_all,
    }


def render_remedies(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    """The remedies section (its own markers)."""
    out = [
        _mark(args, "remedies-begin"),
        f"Measured by `benchmarks/bench_mixed.py --corpus {','.join(r['model'] for r in rows)} --remedies-only "
        f"--weight-type {args.weight_type} "
        f"--calib-samples {args.calib_samples} --debug-samples {args.debug_samples}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (same recipe and sample counts as above):",
        "",
        "| model | base dB | remedy | measured dB | gain dB | wall s (all remedies) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for desc, db, gain, err in r["remedies"]:
            what = f"{_fmt(db)}" if err is None else f"error: {err[:80]}"
            out.append(
                f"| {r['model']} | {_fmt(r['base_db'])} | {desc} | {what} | {_fmt(gain)} | {_fmt(r['wall_s'], 0)} |"
            )
    out.append(_mark(args, "remedies-end"))
    return "\n".join(out) + "\n"


def render(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    """The Markdown section (between the markers, so that it can replace itself in the docs)."""
    from importlib.metadata import version

    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    out = [
        _mark(args, "begin"),
        f"Measured by `benchmarks/bench_mixed.py --corpus {','.join(r['model'] for r in rows)}"
        f" --strategy {args.strategy} --weight-type {args.weight_type} --calib-samples "
        f"{args.calib_samples} --debug-samples {args.debug_samples} --measure-top {args.measure_top} --near {args.near}"
        f" --max-steps {args.max_steps}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{os.cpu_count()} cores shared with other jobs (load average {load} at the end), {platform.system()}, "
        f"onnxruntime {version('onnxruntime')}. uint8 activations, {args.weight_type} per-tensor weights, MinMax; "
        f"**{args.calib_samples} calibration / "
        f"{args.debug_samples} debug samples only** (the machine is shared): small-sample figures, one run each.",
        "",
        "| model | base dB | all-16 dB | chosen point dB | chosen cost (16-bit elements) | goal reached | "
        f"evaluations | search s | wall s | s per evaluation ÷ one debug pass | best measured ≤ {args.budget:.0%} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['model']} | {_fmt(r['base_db'])} | {_fmt(r['all16_db'])} | {_fmt(r['chosen_db'])} | "
            f"{_fmt(100 * r['chosen_cost'], 1)} % | {'yes' if r['reached'] else 'no: ' + r['stop_reason']} | "
            f"{r['evaluations']} | {_fmt(r['search_s'], 0)} | {_fmt(r['wall_s'], 0)} | "
            f"{_fmt(r['per_eval_over_debug'], 1)}× | {_budget_cell(r)} |"
        )
    out += ["", "Pareto fronts (every point measured; cost = share of activation elements in 16 bits):", ""]
    for r in rows:
        pts = ", ".join(f"{label} {_fmt(100 * c, 1)} % → {_fmt(db)} dB" for label, c, db in r["pareto"])
        out.append(f"- **{r['model']}**: {pts}")
    out += [
        "",
        "Where the noise sits (the candidates or blocks carrying the most measured output noise: element share, "
        "gain dB, share of the measured noise):",
        "",
    ]
    for r in rows:
        pts = "; ".join(
            f"{n} ({k}, {t} tensors) {_fmt(100 * c, 1)} %, {_fmt(g)} dB, {_fmt(100 * sh, 0)} %"
            for n, k, t, c, g, sh in r.get("carriers", ())
        )
        out.append(f"- **{r['model']}**: {pts}")
    out += ["", "Predicted vs measured gain of the candidates measured alone (dB):", ""]
    for r in rows:
        pts = ", ".join(f"{n} ({k}) {_fmt(p)} vs {_fmt(m)}" for n, k, p, m in r["singles"])
        out.append(
            f"- **{r['model']}** (median |error| {_fmt(r['estimate_error_db'])} dB, "
            f"rank agreement {_fmt(r['rank_agreement'])}): {pts}"
        )
    out.append(_mark(args, "end"))
    return "\n".join(out) + "\n"


def _budget_cell(r: dict[str, Any]) -> str:
    b = r.get("at_budget")
    if not b:
        return "n/a"
    cell = f"search: {_fmt(b['search_best_db'])} dB at {_fmt(100 * (b['search_best_cost'] or 0), 1)} %"
    if r.get("model_min_cost") is not None:
        cell += f"; additive model needs {_fmt(100 * r['model_min_cost'], 1)} % for the goal"
    if "prefix_db" in b:
        cell += f"; ranking prefix {b['prefix']}: {_fmt(b['prefix_db'])} dB at {_fmt(100 * b['prefix_cost'], 1)} %"
    for g in r.get("greedy_at_budget", ()):
        cell += (
            f"; greedy fill of {_fmt(100 * g['budget'], 0)} % ({g['candidates']} candidates): {_fmt(g['db'])} dB at "
            f"{_fmt(100 * g['cost'], 1)} %"
        )
    held = {p["budget"]: p for p in (r.get("heldout") or {}).get("points", ())}
    for g in r.get("stepwise_greedy", ()):
        cell += (
            f"; step-by-step greedy at {_fmt(100 * g['budget'], 0)} % ({g['candidates']} candidates, "
            f"{g['evaluations']} evaluations, {_fmt(g['seconds'], 0)} s): {_fmt(g['db'])} dB at "
            f"{_fmt(100 * g['cost'], 1)} %"
        )
        if g["budget"] in held:
            h = r["heldout"]
            cell += (
                f" (on {h['samples']} held-out samples {h.get('source', '')}: {_fmt(held[g['budget']]['db'])} dB, "
                f"base {_fmt(h['base_db'])}, "
                f"all-16 {_fmt(h['all16_db'])})"
            )
    return cell


def write_docs(path: Path, section: str) -> None:
    """Replace the marked section of ``path`` (or append it)."""
    from qdebug.io import atomic_write_text

    text = path.read_text(encoding="utf-8")
    begin, end = section.split("\n", 1)[0], section.rstrip("\n").rsplit("\n", 1)[-1]
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(path, text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The corpus options (shared with ``bench_mixed.py --corpus``)."""
    parser.add_argument("--calib-samples", type=int, default=8)
    parser.add_argument(
        "--weight-type", default="int8", help="int8 (the gauntlet's U8S8, default) or uint8 (qdebug's default)"
    )
    parser.add_argument(
        "--measure-top", type=int, default=None, help="candidates measured one at a time (default: 8 / all)"
    )
    parser.add_argument("--strategy", default="efficient", help="search strategy (default efficient)")
    parser.add_argument("--rank", default="gain", help="measured strategy: gain or efficiency")
    parser.add_argument("--budget", type=float, default=0.10, help="element share for the best-at-budget probe")
    parser.add_argument(
        "--greedy-budgets",
        type=lambda v: [float(x) for x in v.split(",") if x.strip()],
        default=[],
        help="comma-separated element shares (e.g. 0.10,0.15): each filled greedily by measured noise per element "
        "(efficient strategy) and measured once",
    )
    parser.add_argument(
        "--stepwise-greedy",
        type=int,
        default=0,
        metavar="WIDTH",
        help="also the measured step-by-step greedy at each --greedy-budgets: WIDTH candidates tried per step "
        "(benchmarks/bench_mixed_stepwise.py; 0: off)",
    )
    parser.add_argument("--stepwise-max-evals", type=int, default=60, help="evaluations per stepwise greedy at most")
    parser.add_argument("--fix-for", help="search the model after this target's compatibility fixes (e.g. qnn)")
    parser.add_argument(
        "--heldout", type=int, default=0, metavar="N",
        help="measure the step-by-step greedy's points again on the N evaluation samples after the debug set",
    )  # fmt: skip
    parser.add_argument(
        "--heldout-from", choices=("eval", "calib"), default="eval",
        help="--heldout samples: after the debug samples of eval.npz, or after the calibration samples of calib.npz",
    )  # fmt: skip
    parser.add_argument("--near", type=float, default=0.5, help="goal: within this many dB of all-16")
    parser.add_argument("--max-steps", type=int, default=16, help="joint prefixes measured at most")
    parser.add_argument("--docs", type=Path, help="replace the table section in this Markdown file")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--remedies-only", action="store_true", help="measure the remedies instead of searching")


def run(models: Sequence[str], args: argparse.Namespace) -> int:
    """Run every model, print the section, write it where asked."""
    missing = [m for m in models if not (corpus_dir() / m / f"{m}.onnx").is_file()]
    if missing:
        print(f"not cached (run benchmarks/realmodels/fetch.py and data.py): {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="qdebug-bench-mixed-corpus-") as tmp:
        for m in models:
            rows.append((run_remedies if args.remedies_only else run_model)(m, Path(tmp), args))
            print(f"[{m}: {rows[-1]['wall_s']:.0f} s]", file=sys.stderr, flush=True)
            if args.json is not None:  # after each model: a long run that is stopped keeps what it measured
                args.json.write_text(json.dumps(rows, indent=2, default=str), encoding="utf-8")
    section = (render_remedies if args.remedies_only else render)(rows, args)
    print(section)
    if args.docs is not None:
        write_docs(args.docs, section)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", required=True, help="comma-separated corpus model names")
    parser.add_argument("--debug-samples", type=int, default=8)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run([m.strip() for m in args.models.split(",") if m.strip()], args)


if __name__ == "__main__":
    sys.exit(main())
