"""The fix's 16-bit stages: the ceilings (the chosen 8-bit recipe with weights and/or activations in 16 bits), the
one debug pass that sizes every tensor, the goal, and the 16-bit share — a demotion sweep over blocks of the graph,
the blocks worth most per element chosen within the budget and measured together, split where a finer choice is
needed, shrunk once the goal is met."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError
from qdebug.fix.result import Stage, Trial
from qdebug.fix.space import Unit, initial_blocks, sixteen_bit_type, units_of, with_sixteen_bit
from qdebug.fix.state import MIN_GAIN_DB, FixState, Leaf, better, try_config
from qdebug.mixed.promote import activation_tensors

#: Blocks per kind before the first split: enough to tell the graph's regions apart, few enough to measure.
BLOCKS_PER_KIND = 4


def measure_ceilings(st: FixState, best: Trial) -> dict[str, Trial]:
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
        out[name] = try_config(st, name, Stage.CEILING, desc, wide)
    return out


def debug_pass(st: FixState, best: Trial) -> tuple[tuple[Unit, ...], float]:
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


def goal_of(st: FixState, best: Trial, ceilings: dict[str, Trial]) -> float | None:
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


def select_leaves(leaves: Sequence[Leaf], budget: float) -> list[Leaf]:
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


def _to_split(leaves: Sequence[Leaf], budget: float) -> Leaf | None:
    """The leaf worth splitting: the most noise among blocks too big for the budget, else among any block of
    several tensors (a finer choice may keep the same noise out for fewer elements)."""
    splittable = [lf for lf in leaves if (lf.reduction or 0.0) > 0 and len(lf.block.units) > 1]
    too_big = [lf for lf in splittable if lf.block.elements > budget]
    pool = too_big or splittable
    return max(pool, key=lambda lf: lf.reduction or 0.0) if pool else None


@dataclass
class _Search:
    """The 16-bit search: every unit in 16 bits (``full``), each leaf's noise when it alone goes back to 8 bits
    (``Leaf.reduction``: what keeping it in 16 bits is worth), the best measured point within budget."""

    start: Trial
    full: Trial
    units: tuple[Unit, ...]
    goal_noise: float
    budget: float
    leaves: list[Leaf]
    best: Trial
    tried: set[frozenset[Unit]] = field(default_factory=set)
    #: the leaves of the best measured choice (what a choice that meets the goal is shrunk from)
    best_leaves: list[Leaf] = field(default_factory=list)

    def met(self, t: Trial) -> bool:
        return t.measure is not None and t.measure.noise <= self.goal_noise

    def predicted(self, keep: Sequence[Leaf]) -> float:
        """Noise with only ``keep`` in 16 bits: the all-16 noise plus every other leaf's measured share. Near the
        all-16 point the shares add (small noises from independent roundings); far from it they do not, which is
        why a choice is always measured before it is kept."""
        kept = {id(lf) for lf in keep}
        base = self.full.measure.noise if self.full.measure is not None else math.inf
        return base + sum(lf.reduction or 0.0 for lf in self.leaves if id(lf) not in kept)


def _sixteen(st: FixState, s: _Search, units: Iterable[Unit], acts: set[str], name: str, what: str) -> Trial | None:
    assert s.start.config is not None
    try:
        cfg = with_sixteen_bit(s.start.config, st.float_proto, sorted(units, key=lambda u: u.order), acts=acts)
    except ConfigError as exc:
        st.notes.append(f"{what}: {exc}")
        return None
    return try_config(st, f"{name}{len(st.trials)}", Stage.SIXTEEN_BIT, what, cfg)


def _measure_block(st: FixState, s: _Search, leaf: Leaf, acts: set[str]) -> None:
    """Every unit in 16 bits but this block's: the noise the block costs in 8 bits."""
    mine = set(leaf.block.units)
    t = _sixteen(st, s, [u for u in s.units if u not in mine], acts, "demote", f"8-bit {leaf.block.label()}, "
                 "the rest in 16 bits")  # fmt: skip
    full = s.full.measure.noise if s.full.measure is not None else math.inf
    leaf.reduction = 0.0 if t is None or t.measure is None else max(0.0, t.measure.noise - full)


def _within_budget(st: FixState, s: _Search, chosen: list[Leaf], acts: set[str]) -> tuple[list[Leaf], Any]:
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


def _measure_union(st: FixState, s: _Search, chosen: list[Leaf], acts: set[str]) -> Trial | None:
    """The chosen blocks together in 16 bits, the rest in 8 (the choice measured, interactions included)."""
    keep, cfg = _within_budget(st, s, chosen, acts)
    units = frozenset(u for lf in keep for u in lf.block.units)
    if units in s.tried or not units or cfg is None:
        return None
    s.tried.add(units)
    what = f"16-bit: {len(keep)} block(s), {len(units)} tensors"
    t = try_config(st, f"choice{len(st.trials)}", Stage.SIXTEEN_BIT, what, cfg)
    noise = s.predicted(keep)
    if 0 < noise < math.inf:
        t = replace(t, predicted_db=round(-10.0 * math.log10(noise), 2))
        st.trials[-1] = t
    if better(t, s.best):
        s.best, s.best_leaves = t, list(keep)
    return t


def _ratio(leaf: Leaf) -> float:
    return (leaf.reduction or 0.0) / max(1, leaf.block.elements)


def _shrink(st: FixState, s: _Search, acts: set[str]) -> None:
    """A choice that meets the goal made smaller: its block worth least per element dropped, one at a time, while
    the goal still holds (each measured) — the goal at the smallest 16-bit share this search can find."""
    keep = sorted(s.best_leaves, key=_ratio, reverse=True)
    while len(keep) > 1 and st.room():
        fewer = keep[:-1]
        t = _measure_union(st, s, fewer, acts)
        if t is None or not s.met(t):
            break
        keep, s.best, s.best_leaves = fewer, t, fewer


def sixteen_bit_stage(st: FixState, start: Trial, units: Sequence[Unit], goal_db: float) -> Trial:
    """A demotion sweep from every unit in 16 bits: each block's noise when it alone is 8-bit, the blocks worth
    most per element kept in 16 bits within the budget and measured together, blocks split where a finer choice
    is needed — until the goal is met (then the choice is shrunk while it still meets it), the trials run out, or
    nothing is left to split."""
    st.stage_t0 = time.perf_counter()
    total = sum(st.act_elements.values()) + sum(st.weight_elements.values())
    budget = st.opts.budget_16bit * total
    acts = activation_tensors(st.float_proto)[0]
    leaves = [Leaf(b) for b in initial_blocks(units, BLOCKS_PER_KIND)]
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
        chosen = select_leaves(s.leaves, budget)
        split = _to_split(s.leaves, budget)
        if chosen:  # every new selection measured: the best point within budget is always a measured one
            t = _measure_union(st, s, chosen, acts)
            if t is not None and s.met(t):
                break
        if split is None or not st.room(2):
            break
        s.leaves.remove(split)
        for half in split.block.split():
            child = Leaf(half)
            s.leaves.append(child)
            _measure_block(st, s, child, acts)
    if s.met(s.best):
        _shrink(st, s, acts)
    else:
        final = select_leaves(s.leaves, budget)
        if final and st.room():
            _measure_union(st, s, final, acts)
    st.leaves = s.leaves  # what caps the fix is read from them
    return s.best
