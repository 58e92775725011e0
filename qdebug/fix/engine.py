"""``fix``: a float model (and the user's QDQ model, if any) + data → a fixed QDQ model, measured.

Three stages, every candidate quantized from one calibration and measured on the same debug samples
(:class:`~qdebug.fix.probe.OutputProbe`: the model outputs only):

1. **8-bit recipe** — coordinate ascent over whole-model choices with no 16-bit share: per-channel weights, the
   weight type, the calibration method's ranges (as per-tensor ``rmin``/``rmax`` overrides), a float fallback for
   sentinel constants (an attention mask's −FLT_MAX), and the field's PTQ libraries (:mod:`qdebug.ptq`), each
   measured and kept only when it measures better.
2. **Ceilings** — the chosen recipe with every weight and activation in 16 bits (W16A16), activations only (A16W8)
   and weights only (W16A8): what bit width can buy at all, and which kind holds the error. A goal above W16A16 is
   refused before any 16-bit search.
3. **16-bit share** — weights and activations in contiguous blocks of the graph; each block measured in 16 bits
   alone (its noise reduction), the best reductions per element chosen within the budget and measured together
   (interactions measured, not assumed), blocks split in two where a finer choice is needed.

The choice is measured again on held-out samples no stage saw.

The stages live in rooms of their own over the fix's state (:mod:`qdebug.fix.state`): the 8-bit recipe and the PTQ
libraries in :mod:`qdebug.fix.eight_bit`, the ceilings and the 16-bit share in :mod:`qdebug.fix.sixteen_bit`; this
module splits the data, runs the stages in order, checks the choice on the held-out samples and says what capped it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from qdebug.config import QuantConfig
from qdebug.data import DataSource, Window, open_data
from qdebug.errors import DataError, QDebugError
from qdebug.fix.eight_bit import library_stage, recipe_stage, with_ranges
from qdebug.fix.probe import Measure, OutputProbe
from qdebug.fix.result import FixResult, Stage, Step, Trial
from qdebug.fix.sixteen_bit import debug_pass, goal_of, measure_ceilings, select_leaves, sixteen_bit_stage
from qdebug.fix.state import MIN_GAIN_DB, FixOptions, FixState, ProgressFn, better, try_config
from qdebug.mixed.promote import activation_tensors
from qdebug.model_io import input_specs, load_model
from qdebug.pairing import check_not_swapped


def _split(source: DataSource, opts: FixOptions, notes: list[str]) -> tuple[DataSource, DataSource, DataSource | None]:
    """(calibration, debug, held-out) windows of the data. Held-out samples are the last ones and seen by no stage;
    the debug samples every candidate is measured on come after the calibration ones when the data has room for
    them (as many calibration samples left as debug samples; a choice measured on the samples it was calibrated on
    flatters ranges that clip unseen values), else they are the first calibration samples (a note says so)."""
    n = len(source)
    hold = opts.holdout_samples if opts.holdout_samples is not None else min(24, n // 4)
    rest = n - hold
    if rest < 1:
        raise DataError(f"{source.description}: {n} sample(s) leave none to calibrate on after {hold} held out")
    held = Window(source, rest, n) if hold else None
    k = min(opts.debug_samples, rest)
    if rest >= 2 * k:
        return Window(source, 0, rest - k), Window(source, rest - k, rest), held
    notes.append(f"{rest} sample(s) before the held-out ones: candidates are measured on {k} of the calibration "
                 f"samples (give ≥ {2 * k + hold} samples for a separate debug set)")  # fmt: skip
    return Window(source, 0, rest), Window(source, 0, k), held


def _db_gain(a: Trial | None, b: Trial | None) -> float | None:
    if a is None or b is None or a.db is None or b.db is None:
        return None
    return round(a.db - b.db, 2)


def _caps(st: FixState, best8: Trial, chosen: Trial, ceilings: dict[str, Trial], goal_db: float | None) -> list[str]:
    """Sentences naming what keeps the fix from its goal, from what was measured (empty when it was reached)."""

    def fmt(db: float | None) -> str:
        return "not measured" if db is None else f"{db:.1f} dB"

    if goal_db is None or (chosen.db is not None and chosen.db >= goal_db):
        return []
    out = []
    top, a16, w16 = (ceilings.get(k) for k in ("W16A16", "A16W8", "W16A8"))
    if top is not None and top.db is not None and best8.db is not None and top.db - best8.db < 1.0:
        out.append(f"bit width is not what limits this model: W16A16 measures {top.db:.1f} dB against {best8.db:.1f} "
                   "dB in 8 bits (calibration ranges from too few samples, or ops ORT leaves in float)")  # fmt: skip
    gw, ga, both = _db_gain(w16, best8), _db_gain(a16, best8), _db_gain(top, best8)
    if gw is not None and ga is not None and both is not None and max(gw, ga) < 0.5 * both:
        out.append(f"the error needs weights and activations in 16 bits together: all weights gain {gw:+.1f} dB, all "
                   f"activations {ga:+.1f} dB, both {both:+.1f} dB")  # fmt: skip
    elif gw is not None and ga is not None and max(gw, ga) > 1.0:
        kind, other = ("weights", "activations") if gw > ga else ("activations", "weights")
        out.append(f"the {kind} hold most of the error: all {kind} in 16 bits gain {max(gw, ga):+.1f} dB, all {other} "
                   f"{min(gw, ga):+.1f} dB")  # fmt: skip
    total = sum(st.act_elements.values()) + sum(st.weight_elements.values()) or 1
    kept = {u for lf in select_leaves(st.leaves, st.opts.budget_16bit * total) for u in lf.block.units}
    rest = sorted((lf for lf in st.leaves if (lf.reduction or 0) > 0 and not set(lf.block.units) <= kept),
                  key=lambda lf: lf.reduction or 0.0, reverse=True)[:3]  # fmt: skip
    if rest and st.opts.budget_16bit < 1.0:
        names = "; ".join(f"{lf.block.label()} ({100 * lf.block.elements / total:.1f} % of elements)" for lf in rest)
        out.append(f"within the budget of {100 * st.opts.budget_16bit:.0f} % 16-bit elements the best measured "
                   f"choice is {fmt(chosen.db)}; the blocks measured to hold the most error beyond it: {names} — a "
                   "larger --budget buys them")  # fmt: skip
    if st.stopped:
        out.append(f"the 16-bit search stopped at its time budget ({st.opts.max_pass_equivalents:g} debug passes, "
                   "--max-passes) before it could refine further")  # fmt: skip
    elif len(st.trials) >= st.opts.max_trials:
        out.append(f"the search stopped at --max-trials {st.opts.max_trials} candidates")
    if not out:
        out.append(f"no measured choice reached {goal_db:.1f} dB within {len(st.trials)} candidates")
    return out


def _steps(recipe_steps: list[Step], best8: Trial, chosen: Trial) -> tuple[Step, ...]:
    steps = list(recipe_steps)
    if chosen is not best8:
        steps.append(Step(chosen.description, _db_gain(chosen, best8), chosen.share_16bit))
    return tuple(steps)


def _holdout_note(st: FixState, holdout: dict[str, Measure]) -> None:
    """Say when the choice does not hold on the held-out samples (chosen on a few debug samples, it can be noise)."""
    base, fixed = holdout.get("base"), holdout.get("fixed")
    if base is None or fixed is None or base.worst_db is None or fixed.worst_db is None:
        return
    if fixed.worst_db < base.worst_db - MIN_GAIN_DB:
        st.notes.append(f"on the {fixed.samples} held-out samples the fixed model measures {fixed.worst_db:.1f} dB "
                        f"against {base.worst_db:.1f} dB for the start: the choice made on the debug samples does "
                        "not hold there — give more, representative data (--debug-samples, more samples)")  # fmt: skip


def _target_notes(st: FixState, chosen: Trial, model: Path) -> None:
    """What the chosen point's remedies cost on the target (16-bit weights, nodes kept in float), and what the target
    computes differently in its QDQ model ``model``, in the target's words."""
    from qdebug.target_registry import lookup

    cfg = chosen.config
    if cfg is None:
        return
    target = lookup(cfg.target)
    wide_weights = cfg.weight_type.endswith("16") or any(
        (es[0].quant_type or "").endswith("16") and name in st.weight_elements for name, es in cfg.tensor_overrides
    )
    if wide_weights and target.sixteen_bit_weights_note():
        st.notes.append(f"16-bit weights on {cfg.target}: {target.sixteen_bit_weights_note()}")
    if cfg.nodes_to_exclude:
        st.notes.append(f"{len(cfg.nodes_to_exclude)} node(s) kept in float on {cfg.target}: "
                        f"{target.float_fallback_note()}")  # fmt: skip
    if model.is_file():
        st.notes.extend(target.qdq_notes(load_model(model, "QDQ model")))


def _holdout(st: FixState, trials: dict[str, Trial | None], paths: dict[str, Path]) -> dict[str, Measure]:
    """The named trials measured again on the held-out samples."""
    if not st.holdout_samples:
        return {}
    probe = OutputProbe(st.float_proto, st.holdout_samples, metric=st.probe.metric, labels=st.holdout_labels)
    out: dict[str, Measure] = {}
    done: dict[str, Measure] = {}  # the fixed model is often the best 8-bit one: measured once
    for key, t in trials.items():
        if t is None or t.measure is None:
            continue
        if t.name not in done:
            st.say(f"held-out check: {key}")
            done[t.name] = probe.measure(paths.get(t.name, st.work / f"{t.name}.qdq.onnx"))
        out[key] = done[t.name]
    return out


def _start(st: FixState, quant_model: Path | None) -> tuple[Trial, Trial, dict[str, Path]]:
    """(the base the user starts from, the 8-bit recipe stage's starting point, model files not in the work folder).

    Without a QDQ model both are ORT's default recipe for the target (it calibrates); with one, the base is that
    model as given, and the recipe stage starts from the better of its recipe (settings and ranges read back from
    its Q/DQ parameters, :mod:`qdebug.mixed.given`) and ORT's default."""
    o = st.opts
    default = QuantConfig(target=o.target, activation_type=o.activation_type, weight_type=o.weight_type)
    ort = try_config(st, "ort_default", Stage.BASE, "ONNX Runtime's default recipe for the target", default)
    if ort.measure is None:
        raise QDebugError(f"{st.float_path}: ONNX Runtime's default quantization failed: {ort.error}")
    if quant_model is None:
        return ort, ort, {}
    from qdebug.mixed.given import read_recipe

    t0 = time.perf_counter()
    given = Trial("given", Stage.BASE, f"your model {quant_model.name}", st.probe.measure(quant_model), 0.0,
                  round(time.perf_counter() - t0, 3))  # fmt: skip
    st.trials.append(given)
    recipe = read_recipe(quant_model, o.target)
    weights = activation_tensors(st.float_proto)[1]
    cfg = with_ranges(recipe.config, dict(recipe.ranges), weights)
    again = try_config(st, "given_recipe", Stage.BASE, "your model's recipe, re-quantized", cfg)
    return given, (again if better(again, ort) else ort), {"given": quant_model}


def _labels(data: Any, metric: Any, key: str, n: int) -> Any:
    """The data's labels when the task metric reads them (``None`` otherwise)."""
    if metric is None or not getattr(metric, "needs_labels", False):
        return None
    from qdebug.task_measure import labels_for

    return labels_for(data, key, n, True)


def _window(labels: Any, window: DataSource) -> Sequence[Any] | None:
    """The labels of a :class:`~qdebug.data.Window`'s samples."""
    if labels is None or not isinstance(window, Window):
        return None
    return list(labels[window.start : window.stop])


def fix(
    float_model: str | Path,
    data: Any,
    options: FixOptions | None = None,
    *,
    quant_model: str | Path | None = None,
    workdir: str | Path | None = None,
    progress: ProgressFn | None = None,
) -> FixResult:
    """Find and measure a fixed QDQ model of ``float_model`` (see the module's docstring for the stages).

    ``data``: an ``.npz``, a folder of them or a mapping of arrays (its last samples are held out, see
    :class:`FixOptions`). ``quant_model``: the user's QDQ model, the "before". ``workdir`` keeps every candidate
    model (default: a temporary folder, removed unless the caller copies :attr:`FixResult.model_path` first — use
    :func:`fix_to` to write the outputs)."""
    opts = options or FixOptions()
    t0 = time.perf_counter()
    float_path = Path(float_model)
    proto = load_model(float_path, "float model")
    if quant_model is not None:
        check_not_swapped(proto, quant_model)  # before quantizing a QDQ model as if it were the float one
    metric = None
    if opts.metric is not None:
        from qdebug.task_metrics import load_metric

        metric = load_metric(opts.metric, proto)
    ignore = (opts.label_key,) if metric is not None else ()  # a metric's labels are never a model input
    source = open_data(data, input_specs(proto), seed=opts.seed, ignore=ignore)
    notes: list[str] = []
    calib, debug_src, held = _split(source, opts, notes)
    debug_set, held_set = list(debug_src), [] if held is None else list(held)
    labels = _labels(data, metric, opts.label_key, len(source))
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="qdebug-fix-"))
    probe = OutputProbe(proto, debug_set, metric=metric, labels=_window(labels, debug_src))
    st = FixState(float_path, proto, calib, held_set, probe, work, opts, progress, notes=notes)
    st.debug_source = debug_src
    st.holdout_labels = None if held is None else _window(labels, held)
    base, start, paths = _start(st, None if quant_model is None else Path(quant_model))
    best8, steps = recipe_stage(st, start)
    ceilings = measure_ceilings(st, best8)
    units, pass_s = debug_pass(st, best8)
    st.pass_s = pass_s
    st.trials = [replace(t, share_16bit=st.share(t.config)) if t.config is not None else t for t in st.trials]
    ceilings = {k: st.trials[[t.name for t in st.trials].index(v.name)] for k, v in ceilings.items()}
    goal_db = goal_of(st, best8, ceilings)
    library = library_stage(st, best8) if opts.libraries != () else best8
    chosen8 = library if better(library, best8) else best8
    if chosen8 is not best8:
        steps.append(Step(chosen8.description, _db_gain(chosen8, best8), 0.0))
    chosen = chosen8
    if opts.budget_16bit > 0 and goal_db is not None and (chosen8.db is None or chosen8.db < goal_db):
        sixteen = sixteen_bit_stage(st, best8, units, goal_db)
        chosen = sixteen if better(sixteen, chosen8) else chosen8
    for t in (best8, chosen8):
        if t.library_recipe is not None:
            paths[t.name] = st.work / f"{t.name}.qdq.onnx"
    _target_notes(st, chosen, paths.get(chosen.name, st.work / f"{chosen.name}.qdq.onnx"))
    search_s = time.perf_counter() - st.t0 - pass_s
    holdout = _holdout(st, {"base": base, "best_8bit": chosen8, "fixed": chosen}, paths)
    _holdout_note(st, holdout)
    model = paths.get(chosen.name, st.work / f"{chosen.name}.qdq.onnx")
    return FixResult(
        float_model=str(float_path), target=opts.target, goal_db=goal_db, budget_16bit=opts.budget_16bit,
        trials=tuple(st.trials), base=base.name, best_8bit=chosen8.name, chosen=chosen.name,
        steps=_steps(steps, chosen8, chosen), holdout=holdout,
        caps=tuple(_caps(st, chosen8, chosen, ceilings, goal_db)), model_path=str(model),
        seconds=round(time.perf_counter() - t0, 2), debug_pass_seconds=round(pass_s, 3), notes=tuple(st.notes),
        search_seconds=round(search_s, 2),
        metric=None if metric is None else metric.name,
        ceilings={k: v.db for k, v in ceilings.items()},
    )  # fmt: skip


__all__ = ["FixOptions", "fix"]
