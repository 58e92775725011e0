"""What the mixed-precision loop costs: re-quantizing from cached calibration, one promotion step, and the
automatic search against a one-tensor-at-a-time sensitivity sweep.

For each model (uint8 activations and weights, MinMax) the script measures, in this process:

(a) **re-quantize vs first quantize** — ``qdebug.quantizer`` from scratch (calibration + QDQ insertion, each
    timed by ``quantize`` itself) against ``MixedPrecisionSession.requantize`` (QDQ insertion from the cached
    calibration ranges), for the base config and for a 4-tensor promotion;
(b) **one promotion step** — ``session.promote`` (ORT's fixer), ``session.requantize`` and ``qdebug.debugger`` for
    the top 1, 4 and 16 tensors of the base report's ranking (``qdebug.mixed.suggest.analyse``);
(c) **search vs sweep** — first the ceiling (all activations in 16 bits, and every promotable tensor promoted),
    then a goal between the base and that ceiling (base + 2 dB when it fits), then
    * the prefix search (``qdebug.mixed.search``, strategy ``prefix``) to that goal, and
    * a sensitivity sweep: promote each promotable tensor alone and measure the output SQNR (one evaluation
      per tensor), then measure growing prefixes of the sweep's best-first ranking (doubling, then bisection —
      the prefix search's own schedule) until the goal is met.

Every evaluation is a real re-quantization and debug pass; nothing is estimated. Times are the best of
``--repeats`` rounds for (a) and (b) (background load only ever adds time) and single runs for (c).
This is a measurement report, not a test.

Usage::

    .venv/bin/python benchmarks/bench_mixed.py [--models a,b] [--repeats 3] [--debug-samples 32]
                                               [--gain-db 2] [--no-sweep] [--markdown PATH]
    .venv/bin/python benchmarks/bench_mixed.py --corpus ppocr-cls,minilm-l3 --debug-samples 8 \
                                               [--calib-samples 8] [--measure-top 6] [--docs docs/mixed_precision.md]

``--corpus`` runs the measured search on real models instead (``bench_mixed_corpus.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SAMPLE_MODELS = REPO / "sample_models"
ALL_MODELS = ("digits_cnn", "digits_transformer", "synthetic_convnet")
STEP_SIZES = (1, 4, 16)
SYNTHETIC_CALIB_SAMPLES = 32
DEBUG_SEED = 1  # synthetic debug samples differ from the calibration samples (seed 0)


@dataclass
class Subject:
    """One model under test: its float file, data and the shared session."""

    name: str
    float_path: Path
    calib: Path | None
    calib_desc: str
    debug_desc: str
    session: Any  # qdebug.mixed.session.MixedPrecisionSession (imported lazily: the module docstring loads fast)


@dataclass
class Tables:
    """The rows of each report table, as strings."""

    requantize: list[list[str]] = field(default_factory=list)
    steps: list[list[str]] = field(default_factory=list)
    ceiling: list[list[str]] = field(default_factory=list)
    search: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _load_convnet_builder() -> Callable[[int], Any]:
    """``build_synthetic_convnet`` from ``sample_models/synthetic_convnet.py`` (imported by file path)."""
    path = SAMPLE_MODELS / "synthetic_convnet.py"
    spec = importlib.util.spec_from_file_location("_bench_mixed_synthetic_convnet", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    builder: Callable[[int], Any] = module.build_synthetic_convnet
    return builder


def prepare(name: str, work: Path, debug_samples: int) -> Subject:
    """Locate or build the float model and open a session on it (nothing quantized yet)."""
    import onnx

    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.session import MixedPrecisionSession

    if name == "synthetic_convnet":
        float_path = work / "synthetic_convnet.onnx"
        onnx.save_model(_load_convnet_builder()(0), str(float_path))
        cfg = QuantConfig(num_samples=SYNTHETIC_CALIB_SAMPLES, seed=0)
        opts = DebugOptions(num_samples=debug_samples, seed=DEBUG_SEED)
        session = MixedPrecisionSession(float_path, None, cfg, debug_options=opts, workdir=work / name)
        return Subject(
            name,
            float_path,
            None,
            f"{SYNTHETIC_CALIB_SAMPLES} synthetic (seed 0)",
            f"{debug_samples} synthetic (seed {DEBUG_SEED})",
            session,
        )
    float_path = SAMPLE_MODELS / f"{name}.onnx"
    calib = SAMPLE_MODELS / "digits_calib.npz"
    evaluation = SAMPLE_MODELS / "digits_eval.npz"
    cfg = QuantConfig(num_samples=128)  # the whole calibration file
    opts = DebugOptions(num_samples=debug_samples, ignore_data_keys=("label",))
    session = MixedPrecisionSession(
        float_path, calib, cfg, debug_data=evaluation, debug_options=opts, workdir=work / name
    )
    return Subject(name, float_path, calib, "128 (digits_calib.npz)", f"{debug_samples} (digits_eval.npz)", session)


def _ranking(subject: Subject) -> list[str]:
    """Every promotable tensor of the base report, best estimated output gain first."""
    from qdebug.mixed.suggest import analyse

    return [s.tensor_name for s in analyse(subject.session.base.report)]


def _fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


# --------------------------------------------------------------------------------------------- (a)


def bench_requantize(subject: Subject, repeats: int, work: Path) -> list[str]:
    """First quantize (calibration + QDQ) vs re-quantize from the cached ranges; best of ``repeats``."""
    from qdebug.quantizer import quantize

    s = subject.session
    # Untimed warm-up: the first call in a process also imports ORT's quantization modules.
    quantize(subject.float_path, subject.calib, s.base_config, work / f"{subject.name}.warmup.qdq.onnx")
    firsts = []
    for r in range(repeats):
        t0 = time.perf_counter()
        q = quantize(subject.float_path, subject.calib, s.base_config, work / f"{subject.name}.first{r}.qdq.onnx")
        firsts.append((time.perf_counter() - t0, q.calibration_seconds, q.qdq_seconds))
    first = min(firsts)
    s.base  # noqa: B018 - quantize + debug the base once (untimed here) so that the cache exists
    plan = s.promote(_ranking(subject)[:4])
    same, mixed = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        s.requantize(s.base_config, name=f"rq_same{r}")
        same.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        s.requantize(plan.config, name=f"rq_mixed{r}")
        mixed.append(time.perf_counter() - t0)
    rq = min(same)
    return [
        subject.name,
        subject.calib_desc,
        _fmt(first[0]),
        _fmt(first[1]),
        _fmt(first[2]),
        _fmt(first[0] - first[1] - first[2]),
        _fmt(rq),
        _fmt(min(mixed)),
        f"{first[0] / rq:.1f}×",
    ]


# --------------------------------------------------------------------------------------------- (b)


def bench_steps(subject: Subject, sizes: Sequence[int], repeats: int) -> tuple[list[list[str]], list[str]]:
    """promote + requantize + debug for the top ``n`` tensors of the ranking; best of ``repeats`` per part."""
    from qdebug.debugger import debug
    from qdebug.mixed.compare import compare

    s = subject.session
    order = _ranking(subject)
    rows, notes = [], []
    for n in sizes:
        k = min(n, len(order))
        if k < n:
            notes.append(f"{subject.name}: only {len(order)} promotable tensors; the '{n}' row promotes all of them")
        parts: dict[str, list[float]] = {"promote": [], "requantize": [], "debug": [], "total": []}
        out_db: float | None = None
        region = 0
        for r in range(repeats):
            t0 = time.perf_counter()
            plan = s.promote(order[:k])
            t1 = time.perf_counter()
            q = s.requantize(plan.config, name=f"step{k}_{r}")
            t2 = time.perf_counter()
            report = debug(s.float_path, q.model_path, s.debug_data, s.debug_options)
            compare(s.base.report, report)
            t3 = time.perf_counter()
            for key, v in (("promote", t1 - t0), ("requantize", t2 - t1), ("debug", t3 - t2), ("total", t3 - t0)):
                parts[key].append(v)
            out_db, region = report.min_output_sqnr_db, len(plan.promoted)
        rows.append(
            [
                subject.name,
                str(k),
                str(region),
                *(_fmt(min(parts[key]), 3) for key in ("promote", "requantize", "debug", "total")),
                _fmt(s.base.output_sqnr_db),
                _fmt(out_db),
            ]
        )
    return rows, notes


# --------------------------------------------------------------------------------------------- (c)


@dataclass(frozen=True)
class PrefixRun:
    """Growing prefixes of a ranking measured until the goal (``needed`` is None when even all miss it)."""

    needed: int | None
    evaluations: int
    seconds: float
    sqnr_db: float | None
    cost_fraction_16bit: float | None


def prefix_to_goal(session: Any, order: Sequence[str], goal_db: float, tag: str) -> PrefixRun:
    """The prefix search's schedule (1, 2, 4, … then bisection) on an arbitrary ranking."""
    from qdebug.mixed.search_base import smallest_passing_prefix
    from qdebug.mixed.session import sixteen_bit_cost

    t0 = time.perf_counter()
    measured: dict[int, tuple[float | None, float]] = {}

    def meets(n: int) -> bool:
        ev = session.evaluate(session.promote(order[:n]), name=f"{tag}{n}")
        measured[n] = (ev.output_sqnr_db, sixteen_bit_cost(ev.report)[0])
        return ev.output_sqnr_db is not None and ev.output_sqnr_db >= goal_db

    lo, hi = smallest_passing_prefix(len(order), meets)
    if hi is None:
        return PrefixRun(None, len(measured), time.perf_counter() - t0, *measured.get(lo, (None, None)))
    return PrefixRun(hi, len(measured), time.perf_counter() - t0, *measured[hi])


def bench_search(subject: Subject, gain_db: float, sweep: bool) -> tuple[list[str], list[list[str]]]:
    """The ceiling, the goal, the prefix search and (optionally) the sensitivity sweep."""
    from qdebug.errors import ConfigError
    from qdebug.mixed.search import SearchGoal, search

    s = subject.session
    base_db = s.base.output_sqnr_db
    order = _ranking(subject)
    all16 = s.evaluate(s.base_config.replace(activation_type="uint16"), name="all16").output_sqnr_db
    every = s.evaluate(s.promote(order), name="every").output_sqnr_db
    reachable = min(v for v in (all16, every) if v is not None)
    goal = base_db + min(gain_db, 0.5 * (reachable - base_db))
    ceiling_row = [
        subject.name,
        str(len(order)),
        _fmt(base_db),
        _fmt(all16),
        _fmt(every),
        f"{_fmt(goal)} (base + {_fmt(goal - base_db)})",
    ]

    rows: list[list[str]] = []
    start = s.requantizations
    res = search(s, SearchGoal(output_sqnr_db=goal, max_steps=64))
    if s.requantizations - start != res.requantizations:  # the search's own count must match the session's
        raise RuntimeError(
            f"search reported {res.requantizations} re-quantizations, the session counted {s.requantizations - start}"
        )
    rows.append(
        [
            subject.name,
            _fmt(goal),
            "prefix search (estimated ranking)",
            str(res.requantizations),
            _fmt(res.seconds, 1),
            str(len(res.final.promoted)) if res.reached else f"not reached ({res.stop_reason})",
            _fmt(res.final.output_sqnr_db),
            _fmt(res.final.cost_fraction_16bit * 100, 0) + " %",
        ]
    )
    if not sweep:
        return ceiling_row, rows

    t0 = time.perf_counter()
    single: list[tuple[float, int, str]] = []
    failed = 0
    for i, t in enumerate(order):
        try:
            ev = s.evaluate(s.promote([t]), name=f"sweep{i}")
        except ConfigError:
            failed += 1
            continue
        db = ev.output_sqnr_db if ev.output_sqnr_db is not None else -math.inf
        single.append((db, i, t))
    sweep_s = time.perf_counter() - t0
    best_first = [t for _, _, t in sorted(single, key=lambda x: (-x[0], x[1]))]
    best_single = max((db for db, _, _ in single), default=None)
    rows.append(
        [
            subject.name,
            _fmt(goal),
            "sensitivity sweep (one tensor at a time)",
            str(len(single) + failed),
            _fmt(sweep_s, 1),
            "—",
            f"best single: {_fmt(best_single)}",
            "—",
        ]
    )
    run = prefix_to_goal(s, best_first, goal, "sweepprefix")
    rows.append(
        [
            subject.name,
            _fmt(goal),
            "sweep, then prefixes of its measured ranking",
            f"{len(single) + failed} + {run.evaluations} = {len(single) + failed + run.evaluations}",
            _fmt(sweep_s + run.seconds, 1),
            str(run.needed) if run.needed is not None else "not reached",
            _fmt(run.sqnr_db),
            "—" if run.cost_fraction_16bit is None else _fmt(run.cost_fraction_16bit * 100, 0) + " %",
        ]
    )
    return ceiling_row, rows


# --------------------------------------------------------------------------------------------- report


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render(tables: Tables, subjects: Sequence[Subject], repeats: int) -> str:
    """The Markdown report."""
    from importlib.metadata import version

    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    out = [
        "# Mixed precision: re-quantize, promotion step, search vs sweep",
        "",
        f"- machine: {os.cpu_count()} logical cores, {platform.system()} {platform.machine()}; "
        f"load average (1/5/15 min) at report time {load}",
        f"- versions: Python {platform.python_version()}, onnxruntime {version('onnxruntime')}, "
        f"onnx {version('onnx')}, qdebug {version('qdebug')}",
        "- config: uint8 activations and weights, MinMax, per-tensor, target cpu; promotions to uint16",
        "- data: " + "; ".join(f"{s.name}: calibration {s.calib_desc}, debug {s.debug_desc}" for s in subjects),
        f"- (a) and (b): best of {repeats} rounds; (c): one run",
        "",
        "## (a) First quantize vs re-quantize from the cached calibration",
        "",
        *_table(
            [
                "model",
                "calibration samples",
                "first quantize (s)",
                "of which calibration (s)",
                "of which QDQ insertion (s)",
                "of which the rest: load, data, ORT config (s)",
                "re-quantize, same config (s)",
                "re-quantize, 4 promoted (s)",
                "first ÷ re-quantize",
            ],
            tables.requantize,
        ),
        "",
        "## (b) One promotion step: promote (ORT fixer) + re-quantize + debug",
        "",
        *_table(
            [
                "model",
                "tensors requested",
                "tensors in 16 bits (with region)",
                "promote (s)",
                "re-quantize (s)",
                "debug + compare (s)",
                "step (s)",
                "base output SQNR (dB)",
                "output SQNR (dB)",
            ],
            tables.steps,
        ),
        "",
        "## (c) Ceiling and goal",
        "",
        *_table(
            [
                "model",
                "promotable tensors",
                "base (dB)",
                "all activations 16-bit (dB)",
                "every promotable tensor promoted (dB)",
                "goal (dB)",
            ],
            tables.ceiling,
        ),
        "",
        "## (c) Prefix search vs sensitivity sweep, to the same goal",
        "",
        *_table(
            [
                "model",
                "goal (dB)",
                "method",
                "evaluations (re-quantize + debug)",
                "seconds",
                "tensors to goal",
                "output SQNR (dB)",
                "16-bit share of activation elements",
            ],
            tables.search,
        ),
    ]
    if tables.notes:
        out += ["", "Notes:", "", *(f"- {n}" for n in tables.notes)]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", default=",".join(ALL_MODELS), help=f"comma-separated subset of {ALL_MODELS}")
    parser.add_argument("--repeats", type=int, default=3, help="rounds for (a) and (b); the best is reported")
    parser.add_argument("--debug-samples", type=int, default=32, help="samples per debug pass")
    parser.add_argument("--gain-db", type=float, default=2.0, help="goal = base + this (capped at half the ceiling)")
    parser.add_argument("--sizes", default=",".join(map(str, STEP_SIZES)), help="tensors per promotion step in (b)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the sensitivity sweep in (c)")
    parser.add_argument("--markdown", type=Path, help="also write the report here (atomically)")
    parser.add_argument(
        "--corpus", help="comma-separated real-model corpus names: run bench_mixed_corpus.py on them instead"
    )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_mixed_corpus

    bench_mixed_corpus.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.corpus:
        return bench_mixed_corpus.run([m.strip() for m in args.corpus.split(",") if m.strip()], args)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in ALL_MODELS]
    if unknown or args.repeats < 1 or args.debug_samples < 1:
        parser.error(f"unknown models {unknown}" if unknown else "--repeats and --debug-samples must be positive")
    sizes = [int(v) for v in args.sizes.split(",")]

    tables = Tables()
    subjects = []
    with tempfile.TemporaryDirectory(prefix="qdebug-bench-mixed-") as tmp:
        work = Path(tmp)
        for name in models:
            t0 = time.perf_counter()
            subject = prepare(name, work, args.debug_samples)
            subjects.append(subject)
            tables.requantize.append(bench_requantize(subject, args.repeats, work))
            rows, notes = bench_steps(subject, sizes, args.repeats)
            tables.steps += rows
            tables.notes += notes
            ceiling, search_rows = bench_search(subject, args.gain_db, not args.no_sweep)
            tables.ceiling.append(ceiling)
            tables.search += search_rows
            print(f"[{name}: {time.perf_counter() - t0:.0f} s]", file=sys.stderr)
    report = render(tables, subjects, args.repeats)
    print(report)
    if args.markdown is not None:
        from qdebug.io import atomic_write_text

        atomic_write_text(args.markdown, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
