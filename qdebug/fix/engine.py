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
"""

from __future__ import annotations

import functools
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.config import CALIBRATION_METHODS, QuantConfig, make_overrides, normalize_quant_type
from qdebug.data import DataSource, Window, open_data
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError, DataError, QDebugError
from qdebug.fix.probe import Measure, OutputProbe
from qdebug.fix.result import FixResult, Stage, Step, Trial
from qdebug.fix.space import (
    Block,
    Unit,
    initial_blocks,
    sixteen_bit_elements,
    sixteen_bit_type,
    units_of,
    with_sixteen_bit,
)
from qdebug.mixed.promote import activation_tensors
from qdebug.model_io import input_specs, load_model
from qdebug.quantizer import quantize

ProgressFn = Callable[[int, int, str], None]

#: Blocks per kind before the first split: enough to tell the graph's regions apart, few enough to measure.
BLOCKS_PER_KIND = 4
#: The 16-bit search's time is never cut below this: on a small model a debug pass takes a fraction of a second,
#: and a budget of passes alone would stop it after a handful of candidates.
MIN_SEARCH_SECONDS = 30.0
#: A gain smaller than this is the noise of a few debug samples, not a remedy.
MIN_GAIN_DB = 0.1


@dataclass(frozen=True)
class FixOptions:
    """How a fix searches. ``budget_16bit``: the largest share of weight + activation elements it may put in 16
    bits (0: none, 1: no limit). ``goal_db``: the worst output SQNR to reach on the debug samples (``None``: close
    ``gap_fraction`` of the gap between the best 8-bit recipe and the W16A16 ceiling). ``holdout_samples``: the last
    samples of the data, seen by no stage (``None``: a quarter of the data, at most 24). ``libraries``: the PTQ
    recipes of :mod:`qdebug.ptq` to measure (``None``: every one whose environment exists; ``()``: none).
    ``metric``: a task metric (:func:`qdebug.task_metrics.load_metric` spec) measured beside the SQNR."""

    target: str = "cpu"
    activation_type: str = "uint8"
    weight_type: str = "int8"
    budget_16bit: float = 0.10
    goal_db: float | None = None
    gap_fraction: float = 0.8
    holdout_samples: int | None = None
    debug_samples: int = 8
    max_trials: int = 40
    max_pass_equivalents: float = 20.0
    calibration_methods: tuple[str, ...] = ("percentile", "entropy")
    libraries: tuple[str, ...] | None = None
    metric: Any = None
    label_key: str = "label"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 <= self.budget_16bit <= 1.0:
            problems.append(f"budget_16bit must be between 0 and 1, got {self.budget_16bit}")
        if not 0.0 < self.gap_fraction <= 1.0:
            problems.append(f"gap_fraction must be in (0, 1], got {self.gap_fraction}")
        if self.goal_db is not None and not math.isfinite(self.goal_db):
            problems.append(f"goal_db must be finite, got {self.goal_db}")
        if self.debug_samples < 1 or self.max_trials < 4:
            problems.append("debug_samples must be ≥ 1 and max_trials ≥ 4")
        if not self.max_pass_equivalents > 0:
            problems.append(f"max_pass_equivalents must be > 0, got {self.max_pass_equivalents}")
        if self.holdout_samples is not None and self.holdout_samples < 0:
            problems.append(f"holdout_samples must be ≥ 0, got {self.holdout_samples}")
        unknown = [m for m in self.calibration_methods if m not in CALIBRATION_METHODS or m == "minmax"]
        if unknown:
            problems.append(f"calibration_methods: {unknown} (choose from percentile, entropy)")
        if problems:
            raise ConfigError("invalid fix options: " + "; ".join(problems))
        object.__setattr__(self, "activation_type", normalize_quant_type(self.activation_type))
        object.__setattr__(self, "weight_type", normalize_quant_type(self.weight_type))


@dataclass
class _Leaf:
    """A block of the 16-bit search with its measured noise reduction (``None`` until measured)."""

    block: Block
    reduction: float | None = None


@dataclass
class _State:
    """The fix's working state: data splits, probes, trials so far."""

    float_path: Path
    float_proto: onnx.ModelProto
    calib: DataSource
    holdout_samples: list[Any]
    probe: OutputProbe
    work: Path
    opts: FixOptions
    progress: ProgressFn | None
    trials: list[Trial] = field(default_factory=list)
    cache: str | None = None
    notes: list[str] = field(default_factory=list)
    leaves: list[_Leaf] = field(default_factory=list)
    debug_source: DataSource | None = None
    t0: float = field(default_factory=time.perf_counter)
    pass_s: float | None = None
    stage_t0: float | None = None
    #: the 16-bit search stopped at its time budget
    stopped: bool = False
    holdout_labels: Sequence[Any] | None = None
    act_elements: dict[str, int] = field(default_factory=dict)
    weight_elements: dict[str, int] = field(default_factory=dict)

    def room(self, trials: int = 1) -> bool:
        """Whether ``trials`` more candidates fit: under ``max_trials``, and the 16-bit search so far under
        ``max_pass_equivalents`` debug passes (the stages before it are bounded by their own few candidates; a slow
        PTQ library must not leave the 16-bit search no time)."""
        if len(self.trials) + trials > self.opts.max_trials:
            return False
        if self.pass_s is None or self.stage_t0 is None:
            return True
        allowed = max(self.opts.max_pass_equivalents * self.pass_s, MIN_SEARCH_SECONDS)
        if time.perf_counter() - self.stage_t0 < allowed:
            return True
        self.stopped = True
        return False

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(len(self.trials), self.opts.max_trials, message)

    def share(self, config: QuantConfig) -> float:
        """The share of weight + activation elements ``config`` holds in 16 bits (0 before the debug pass)."""
        acts, ws = self.act_elements, self.weight_elements
        total = sum(acts.values()) + sum(ws.values())
        if not total:
            return 0.0
        wide = sum(acts.values()) if config.activation_type.endswith("16") else sixteen_bit_elements(config, acts)
        wide += sum(ws.values()) if config.weight_type.endswith("16") else sixteen_bit_elements(config, ws)
        return round(min(1.0, wide / total), 4)


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


def _quantize(st: _State, config: QuantConfig, tag: str) -> Path:
    """``config`` quantized from the one calibration (the first call calibrates)."""
    out = st.work / f"{tag}.qdq.onnx"
    q = quantize(st.float_path, st.calib, config, out, calibration_cache=st.cache, check=False)
    st.cache = st.cache or q.calibration_cache
    return Path(q.model_path)


def _try(st: _State, name: str, stage: Stage, description: str, config: QuantConfig) -> Trial:
    """Quantize ``config`` and measure it on the debug samples; a failure is recorded, not raised."""
    st.say(f"{name}: {description}")
    t0 = time.perf_counter()
    try:
        m: Measure | None = st.probe.measure(_quantize(st, config, name))
        error = None
    except QDebugError as exc:
        m, error = None, str(exc)
    trial = Trial(name, stage, description, m, st.share(config), round(time.perf_counter() - t0, 3), config, error)
    st.trials.append(trial)
    return trial


def _better(a: Trial, b: Trial | None) -> bool:
    """``a`` measures better than ``b`` by more than the noise of the debug samples."""
    if a.db is None:
        return False
    return b is None or b.db is None or a.db > b.db + MIN_GAIN_DB


def _method_ranges(st: _State, method: str) -> dict[str, tuple[float, float]]:
    """Every calibrated tensor's ``(rmin, rmax)`` under ``method`` (one more calibration pass of the same samples)."""
    import contextlib
    import io

    from onnxruntime.quantization.calibrate import load_tensors_data

    cfg = QuantConfig(target=st.opts.target, calibration_method=method, activation_type=st.opts.activation_type,
                      weight_type=st.opts.weight_type)  # fmt: skip
    out = st.work / f"calibrate_{method}.qdq.onnx"
    with contextlib.redirect_stdout(io.StringIO()):  # ORT's histogram calibrators print their settings
        q = quantize(st.float_path, st.calib, cfg, out, check=False)
    data = load_tensors_data(q.calibration_cache)
    return {name: (_scalar(td.range_value[0]), _scalar(td.range_value[1])) for name, td in data.data.items()}


def _scalar(v: Any) -> float:
    """A calibrated bound as a float (ORT stores some as 1-element arrays)."""
    return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])


def _with_ranges(config: QuantConfig, ranges: dict[str, tuple[float, float]], weights: set[str]) -> QuantConfig:
    """``config`` with ``ranges`` as every activation's ``rmin``/``rmax`` (other override keys kept)."""
    merged: dict[str, Any] = {n: [e.to_dict() for e in es] for n, es in config.tensor_overrides}
    for name, (lo, hi) in ranges.items():
        if name in weights or not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            continue
        first = merged.get(name, [{}])[0]
        merged[name] = [{**first, "rmin": min(lo, 0.0), "rmax": max(hi, 0.0)}]
    return config.replace(tensor_overrides=make_overrides(merged))


@dataclass(frozen=True)
class _Axis:
    """One whole-model choice of the 8-bit recipe: its name and its alternatives (label → config change)."""

    name: str
    choices: tuple[tuple[str, Callable[[QuantConfig], QuantConfig]], ...]


def _axes(st: _State, base: QuantConfig) -> list[_Axis]:
    """The recipe's choices worth measuring on this model and target."""
    _, weights = activation_tensors(st.float_proto)
    conv = _conv_weight_axes(st.float_proto, weights)
    choices: list[tuple[str, Callable[[QuantConfig], QuantConfig]]] = [
        ("per-channel weights", lambda c: c.replace(per_channel=True)),
        ("asymmetric per-channel uint8 weights", lambda c: c.replace(per_channel=True, weight_type="uint8")),
    ]
    if conv:  # per layer: ORT's per-channel axis for MatMul/Gemm weights can measure worse than one scale
        choices.append((f"per-channel weights for the {len(conv)} Conv layer(s) only, per-tensor elsewhere",
                        functools.partial(_per_channel_only, axes=conv)))  # fmt: skip
    axes = [_Axis("weights", tuple(choices))]
    calib: list[tuple[str, Callable[[QuantConfig], QuantConfig]]] = []
    for method in st.opts.calibration_methods:
        try:
            ranges = _method_ranges(st, method)
        except QDebugError as exc:
            st.notes.append(f"{method} calibration failed: {exc}")
            continue
        calib.append((f"{method} ranges", functools.partial(_with_ranges, ranges=ranges, weights=weights)))
    if calib:
        axes.append(_Axis("calibration", tuple(calib)))
    nodes = _sentinel_nodes(st)
    if nodes:
        axes.append(_Axis("sentinel", (
            (f"mask path in float ({len(nodes)} node(s))",
             lambda c: c.replace(nodes_to_exclude=tuple(sorted({*c.nodes_to_exclude, *nodes})))),
        )))  # fmt: skip
    return axes


def _conv_weight_axes(model: onnx.ModelProto, weights: set[str]) -> dict[str, int]:
    """Each Conv / ConvTranspose weight and its output-channel axis."""
    out = {}
    for n in model.graph.node:
        if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1 and n.input[1] in weights:
            out[n.input[1]] = 0 if n.op_type == "Conv" else 1
    return out


def _per_channel_only(config: QuantConfig, axes: dict[str, int]) -> QuantConfig:
    """``config`` with per-tensor weights but for the weights in ``axes``, per-channel along theirs (overrides)."""
    merged: dict[str, Any] = {n: [e.to_dict() for e in es] for n, es in config.tensor_overrides}
    for name, axis in axes.items():
        first = merged.get(name, [{}])[0]
        merged[name] = [{**first, "axis": axis}]
    return config.replace(per_channel=False, tensor_overrides=make_overrides(merged))


def _sentinel_nodes(st: _State) -> tuple[str, ...]:
    """Nodes to keep in float so a sentinel constant (−FLT_MAX mask) never shares a grid with real values."""
    from qdebug.sentinel import find_sentinels

    found = find_sentinels(st.float_proto)
    return tuple(sorted({n for s in found for n in s.float_nodes}))


def _recipe_stage(st: _State, start: Trial) -> tuple[Trial, list[Step]]:
    """Coordinate ascent over :func:`_axes`: each alternative measured against the current best, kept if better."""
    assert start.config is not None
    best, steps = start, []
    for axis in _axes(st, start.config):
        for label, change in axis.choices:
            cur = best.config
            assert cur is not None
            try:
                cfg = change(cur)
            except ConfigError as exc:  # the target cannot run it
                st.notes.append(f"{label}: not possible here ({exc})")
                continue
            if cfg == cur:
                continue
            t = _try(st, f"recipe{len(st.trials)}", Stage.RECIPE, label, cfg)
            if _better(t, best):
                gain = None if t.db is None or best.db is None else round(t.db - best.db, 2)
                steps.append(Step(label, gain, 0.0))
                best = t
    return best, steps


def _ceilings(st: _State, best: Trial) -> dict[str, Trial]:
    """W16A16, A16W8 and W16A8 of the chosen 8-bit recipe: what bit width can buy, and which kind holds the error."""
    cfg = best.config
    assert cfg is not None
    a16, w16 = sixteen_bit_type(cfg.activation_type), "int16"
    plans = {
        "W16A16": ("every weight and activation in 16 bits", {"activation_type": a16, "weight_type": w16}),
        "A16W8": ("every activation in 16 bits", {"activation_type": a16}),
        "W16A8": ("every weight in 16 bits", {"weight_type": w16}),
    }
    out = {}
    for name, (desc, change) in plans.items():
        try:
            wide = cfg.replace(**change)
        except ConfigError as exc:
            st.notes.append(f"{name} ceiling: not possible on target {cfg.target!r} ({exc})")
            continue
        out[name] = _try(st, name, Stage.CEILING, desc, wide)
    return out


def _debug_pass(st: _State, best: Trial) -> tuple[tuple[Unit, ...], float]:
    """One full debug pass of the chosen 8-bit recipe: every tensor's element count (the 16-bit share's unit) and
    its place in the graph; returns the 16-bit search's units and the pass's seconds."""
    st.say("debug pass of the best 8-bit recipe (every tensor)")
    t0 = time.perf_counter()
    path = st.work / f"{best.name}.qdq.onnx"
    report = debug(st.float_path, path, st.debug_source, DebugOptions(seed=st.opts.seed))
    seconds = time.perf_counter() - t0
    st.act_elements = {a.tensor_name: a.elements for a in report.activations if a.quantized}
    st.weight_elements = {w.weight_name: w.elements for w in report.weights if w.kind == "weight"}
    return units_of(report), seconds


def _goal(st: _State, best: Trial, ceilings: dict[str, Trial]) -> float | None:
    """The goal on the debug samples; a goal above the W16A16 ceiling is refused with the measured reason."""
    top = ceilings.get("W16A16")
    ceiling = None if top is None else top.db
    if st.opts.goal_db is not None:
        if ceiling is not None and st.opts.goal_db > ceiling + MIN_GAIN_DB:
            a16 = ceilings.get("A16W8")
            raise ConfigError(
                f"goal {st.opts.goal_db:.1f} dB is above what every weight and activation in 16 bits measures on "
                f"these samples (W16A16 {ceiling:.1f} dB"
                + (f", A16W8 {a16.db:.1f} dB" if a16 is not None and a16.db is not None else "")
                + "): no 16-bit share reaches it — the rest is not bit width (calibration ranges that clip unseen "
                "values, ops ORT leaves in float); lower the goal or give more calibration data"
            )
        return st.opts.goal_db
    if ceiling is None or best.db is None:
        return None
    return round(best.db + st.opts.gap_fraction * max(0.0, ceiling - best.db), 2)


def _select(leaves: Sequence[_Leaf], budget: float) -> list[_Leaf]:
    """The measured leaves that cost most noise in 8 bits per element, as many as fit the budget together."""
    ranked = sorted(
        (lf for lf in leaves if lf.reduction is not None and lf.reduction > 0 and lf.block.elements > 0),
        key=lambda lf: (lf.reduction or 0.0) / lf.block.elements,
        reverse=True,
    )
    out, used = [], 0
    for lf in ranked:
        if used + lf.block.elements <= budget:
            out.append(lf)
            used += lf.block.elements
    return out


def _to_split(leaves: Sequence[_Leaf], budget: float) -> _Leaf | None:
    """The leaf worth splitting: the most noise among blocks too big for the budget, else among any block of
    several tensors (a finer choice may keep the same noise out for fewer elements)."""
    splittable = [lf for lf in leaves if (lf.reduction or 0.0) > 0 and len(lf.block.units) > 1]
    too_big = [lf for lf in splittable if lf.block.elements > budget]
    pool = too_big or splittable
    return max(pool, key=lambda lf: lf.reduction or 0.0) if pool else None


@dataclass
class _Search:
    """The 16-bit search: every unit in 16 bits (``full``), each leaf's noise when it alone goes back to 8 bits
    (``_Leaf.reduction``: what keeping it in 16 bits is worth), the best measured point within budget."""

    start: Trial
    full: Trial
    units: tuple[Unit, ...]
    goal_noise: float
    budget: float
    leaves: list[_Leaf]
    best: Trial
    tried: set[frozenset[Unit]] = field(default_factory=set)
    #: the leaves of the best measured choice (what a choice that meets the goal is shrunk from)
    best_leaves: list[_Leaf] = field(default_factory=list)

    def met(self, t: Trial) -> bool:
        return t.measure is not None and t.measure.noise <= self.goal_noise

    def predicted(self, keep: Sequence[_Leaf]) -> float:
        """Noise with only ``keep`` in 16 bits: the all-16 noise plus every other leaf's measured share. Near the
        all-16 point the shares add (small noises from independent roundings); far from it they do not, which is
        why a choice is always measured before it is kept."""
        kept = {id(lf) for lf in keep}
        base = self.full.measure.noise if self.full.measure is not None else math.inf
        return base + sum(lf.reduction or 0.0 for lf in self.leaves if id(lf) not in kept)


def _sixteen(st: _State, s: _Search, units: Iterable[Unit], acts: set[str], name: str, what: str) -> Trial | None:
    assert s.start.config is not None
    try:
        cfg = with_sixteen_bit(s.start.config, st.float_proto, sorted(units, key=lambda u: u.order), acts=acts)
    except ConfigError as exc:
        st.notes.append(f"{what}: {exc}")
        return None
    return _try(st, f"{name}{len(st.trials)}", Stage.SIXTEEN_BIT, what, cfg)


def _measure_block(st: _State, s: _Search, leaf: _Leaf, acts: set[str]) -> None:
    """Every unit in 16 bits but this block's: the noise the block costs in 8 bits."""
    mine = set(leaf.block.units)
    t = _sixteen(st, s, [u for u in s.units if u not in mine], acts, "demote", f"8-bit {leaf.block.label()}, "
                 "the rest in 16 bits")  # fmt: skip
    full = s.full.measure.noise if s.full.measure is not None else math.inf
    leaf.reduction = 0.0 if t is None or t.measure is None else max(0.0, t.measure.noise - full)


def _within_budget(st: _State, s: _Search, chosen: list[_Leaf], acts: set[str]) -> tuple[list[_Leaf], Any]:
    """``chosen`` (best per element first) trimmed from its end until the config it makes — with the conversions
    ORT's fixer adds around promoted tensors — holds at most the budget's share in 16 bits: (leaves, config)."""
    assert s.start.config is not None
    keep = list(chosen)
    while keep:
        units = sorted({u for lf in keep for u in lf.block.units}, key=lambda u: u.order)
        try:
            cfg = with_sixteen_bit(s.start.config, st.float_proto, units, acts=acts)
        except ConfigError as exc:
            st.notes.append(f"16-bit choice of {len(keep)} block(s): {exc}")
            return [], None
        if st.share(cfg) <= st.opts.budget_16bit + 1e-9:
            return keep, cfg
        keep.pop()
    return [], None


def _measure_union(st: _State, s: _Search, chosen: list[_Leaf], acts: set[str]) -> Trial | None:
    """The chosen blocks together in 16 bits, the rest in 8 (the choice measured, interactions included)."""
    keep, cfg = _within_budget(st, s, chosen, acts)
    units = frozenset(u for lf in keep for u in lf.block.units)
    if units in s.tried or not units or cfg is None:
        return None
    s.tried.add(units)
    what = f"16-bit: {len(keep)} block(s), {len(units)} tensors"
    t = _try(st, f"choice{len(st.trials)}", Stage.SIXTEEN_BIT, what, cfg)
    noise = s.predicted(keep)
    if 0 < noise < math.inf:
        t = replace(t, predicted_db=round(-10.0 * math.log10(noise), 2))
        st.trials[-1] = t
    if _better(t, s.best):
        s.best, s.best_leaves = t, list(keep)
    return t


def _ratio(leaf: _Leaf) -> float:
    return (leaf.reduction or 0.0) / max(1, leaf.block.elements)


def _shrink(st: _State, s: _Search, acts: set[str]) -> None:
    """A choice that meets the goal made smaller: its block worth least per element dropped, one at a time, while
    the goal still holds (each measured) — the goal at the smallest 16-bit share this search can find."""
    keep = sorted(s.best_leaves, key=_ratio, reverse=True)
    while len(keep) > 1 and st.room():
        fewer = keep[:-1]
        t = _measure_union(st, s, fewer, acts)
        if t is None or not s.met(t):
            break
        keep, s.best, s.best_leaves = fewer, t, fewer


def _sixteen_bit_stage(st: _State, start: Trial, units: Sequence[Unit], goal_db: float) -> Trial:
    """A demotion sweep from every unit in 16 bits: each block's noise when it alone is 8-bit, the blocks worth
    most per element kept in 16 bits within the budget and measured together, blocks split where a finer choice
    is needed — until the goal is met (then the choice is shrunk while it still meets it), the trials run out, or
    nothing is left to split."""
    st.stage_t0 = time.perf_counter()
    total = sum(st.act_elements.values()) + sum(st.weight_elements.values())
    budget = st.opts.budget_16bit * total
    acts = activation_tensors(st.float_proto)[0]
    leaves = [_Leaf(b) for b in initial_blocks(units, BLOCKS_PER_KIND)]
    placeholder = _Search(start, start, tuple(units), 10.0 ** (-goal_db / 10.0), budget, leaves, start)
    full = _sixteen(st, placeholder, units, acts, "all16_", "every weight and activation unit in 16 bits")
    if full is None or full.measure is None:
        return start
    s = replace(placeholder, full=full)
    for leaf in leaves:
        if not st.room():
            break
        _measure_block(st, s, leaf, acts)
    while st.room() and not s.met(s.best):
        chosen = _select(s.leaves, budget)
        split = _to_split(s.leaves, budget)
        if chosen:  # every new selection measured: the best point within budget is always a measured one
            t = _measure_union(st, s, chosen, acts)
            if t is not None and s.met(t):
                break
        if split is None or not st.room(2):
            break
        s.leaves.remove(split)
        for half in split.block.split():
            child = _Leaf(half)
            s.leaves.append(child)
            _measure_block(st, s, child, acts)
    if s.met(s.best):
        _shrink(st, s, acts)
    else:
        final = _select(s.leaves, budget)
        if final and st.room():
            _measure_union(st, s, final, acts)
    st.leaves = s.leaves  # what caps the fix is read from them
    return s.best


def _db_gain(a: Trial | None, b: Trial | None) -> float | None:
    if a is None or b is None or a.db is None or b.db is None:
        return None
    return round(a.db - b.db, 2)


def _caps(st: _State, best8: Trial, chosen: Trial, ceilings: dict[str, Trial], goal_db: float | None) -> list[str]:
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
    kept = {u for lf in _select(st.leaves, st.opts.budget_16bit * total) for u in lf.block.units}
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


def _holdout_note(st: _State, holdout: dict[str, Measure]) -> None:
    """Say when the choice does not hold on the held-out samples (chosen on a few debug samples, it can be noise)."""
    base, fixed = holdout.get("base"), holdout.get("fixed")
    if base is None or fixed is None or base.worst_db is None or fixed.worst_db is None:
        return
    if fixed.worst_db < base.worst_db - MIN_GAIN_DB:
        st.notes.append(f"on the {fixed.samples} held-out samples the fixed model measures {fixed.worst_db:.1f} dB "
                        f"against {base.worst_db:.1f} dB for the start: the choice made on the debug samples does "
                        "not hold there — give more, representative data (--debug-samples, more samples)")  # fmt: skip


def _target_notes(st: _State, chosen: Trial) -> None:
    """What the chosen point's remedies cost on the target (16-bit weights, nodes kept in float), in its words."""
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


def _holdout(st: _State, trials: dict[str, Trial | None], paths: dict[str, Path]) -> dict[str, Measure]:
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


def _start(st: _State, quant_model: Path | None) -> tuple[Trial, Trial, dict[str, Path]]:
    """(the base the user starts from, the 8-bit recipe stage's starting point, model files not in the work folder).

    Without a QDQ model both are ORT's default recipe for the target (it calibrates); with one, the base is that
    model as given, and the recipe stage starts from the better of its recipe (settings and ranges read back from
    its Q/DQ parameters, :mod:`qdebug.mixed.given`) and ORT's default."""
    o = st.opts
    default = QuantConfig(target=o.target, activation_type=o.activation_type, weight_type=o.weight_type)
    ort = _try(st, "ort_default", Stage.BASE, "ONNX Runtime's default recipe for the target", default)
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
    cfg = _with_ranges(recipe.config, dict(recipe.ranges), weights)
    again = _try(st, "given_recipe", Stage.BASE, "your model's recipe, re-quantized", cfg)
    return given, (again if _better(again, ort) else ort), {"given": quant_model}


#: The PTQ recipes a fix measures when none are named, each only when its library's environment exists: NNCF's
#: default and its transformer mode (SmoothQuant; ``make ptq-env``), AMD Quark's A8W8 (``make ptq-env-quark``: it
#: needs torch and an older ORT, so it is opt-in).
DEFAULT_LIBRARY_RECIPES = ("nncf-default", "nncf-transformer", "quark-a8w8")


def _library_recipes(st: _State) -> list[Any]:
    """The recipes to run: those named (their environments made on demand), else the defaults whose environment
    already exists (a note says which were skipped and how to enable them)."""
    from qdebug.ptq import get_recipe, ptq_available

    if st.opts.libraries is not None:
        return [get_recipe(r) for r in st.opts.libraries]
    out = []
    for name in DEFAULT_LIBRARY_RECIPES:
        recipe = get_recipe(name)
        why = ptq_available(recipe.library)
        if why is None:
            out.append(recipe)
        elif not any(str(recipe.library) in n for n in st.notes):
            st.notes.append(f"{recipe.library} was not measured: {why}")
    return out


def _library_stage(st: _State, best: Trial) -> Trial:
    """Each PTQ library recipe (:mod:`qdebug.ptq`) run on the calibration samples and measured."""
    from qdebug.ptq import run_ptq

    winner = best
    for recipe in _library_recipes(st):
        st.say(f"{recipe.name}: {recipe.description}")
        t0 = time.perf_counter()
        out = st.work / f"{recipe.name}.qdq.onnx"
        try:
            run = run_ptq(recipe, st.float_path, list(st.calib), out,
                          activation_type=st.opts.activation_type, weight_type=st.opts.weight_type)  # fmt: skip
            m, error = st.probe.measure(run.model_path), None
        except QDebugError as exc:
            m, error = None, str(exc)
        t = Trial(recipe.name, Stage.LIBRARY, recipe.description, m, 0.0, round(time.perf_counter() - t0, 3),
                  error=error, library_recipe=recipe.name)  # fmt: skip
        st.trials.append(t)
        if _better(t, winner):
            winner = t
    return winner


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
    st = _State(float_path, proto, calib, held_set, probe, work, opts, progress, notes=notes)
    st.debug_source = debug_src
    st.holdout_labels = None if held is None else _window(labels, held)
    base, start, paths = _start(st, None if quant_model is None else Path(quant_model))
    best8, steps = _recipe_stage(st, start)
    ceilings = _ceilings(st, best8)
    units, pass_s = _debug_pass(st, best8)
    st.pass_s = pass_s
    st.trials = [replace(t, share_16bit=st.share(t.config)) if t.config is not None else t for t in st.trials]
    ceilings = {k: st.trials[[t.name for t in st.trials].index(v.name)] for k, v in ceilings.items()}
    goal_db = _goal(st, best8, ceilings)
    library = _library_stage(st, best8) if opts.libraries != () else best8
    chosen8 = library if _better(library, best8) else best8
    if chosen8 is not best8:
        steps.append(Step(chosen8.description, _db_gain(chosen8, best8), 0.0))
    chosen = chosen8
    if opts.budget_16bit > 0 and goal_db is not None and (chosen8.db is None or chosen8.db < goal_db):
        sixteen = _sixteen_bit_stage(st, best8, units, goal_db)
        chosen = sixteen if _better(sixteen, chosen8) else chosen8
    for t in (best8, chosen8):
        if t.library_recipe is not None:
            paths[t.name] = st.work / f"{t.name}.qdq.onnx"
    _target_notes(st, chosen)
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
