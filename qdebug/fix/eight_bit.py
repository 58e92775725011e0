"""The fix's 8-bit stages: the recipe (coordinate ascent over whole-model choices with no 16-bit share — per-channel
weights, the weight type, a calibration method's ranges, a float fallback for sentinel constants — each measured and
kept only when it measures better) and the field's PTQ libraries (:mod:`qdebug.ptq`), each run and measured."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qdebug.config import QuantConfig, make_overrides
from qdebug.errors import ConfigError, QDebugError
from qdebug.fix.result import Stage, Step, Trial
from qdebug.fix.state import FixState, better, try_config
from qdebug.mixed.promote import activation_tensors
from qdebug.quantizer import quantize


def _method_ranges(st: FixState, method: str) -> dict[str, tuple[float, float]]:
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


def with_ranges(config: QuantConfig, ranges: dict[str, tuple[float, float]], weights: set[str]) -> QuantConfig:
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


def _axes(st: FixState, base: QuantConfig) -> list[_Axis]:
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
        calib.append((f"{method} ranges", functools.partial(with_ranges, ranges=ranges, weights=weights)))
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


def _sentinel_nodes(st: FixState) -> tuple[str, ...]:
    """Nodes to keep in float so a sentinel constant (−FLT_MAX mask) never shares a grid with real values."""
    from qdebug.sentinel import find_sentinels

    found = find_sentinels(st.float_proto)
    return tuple(sorted({n for s in found for n in s.float_nodes}))


def recipe_stage(st: FixState, start: Trial) -> tuple[Trial, list[Step]]:
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
            t = try_config(st, f"recipe{len(st.trials)}", Stage.RECIPE, label, cfg)
            if better(t, best):
                gain = None if t.db is None or best.db is None else round(t.db - best.db, 2)
                steps.append(Step(label, gain, 0.0))
                best = t
    return best, steps


#: The PTQ recipes a fix measures when none are named, each only when its library's environment exists: NNCF's
#: default and its transformer mode (SmoothQuant; ``make ptq-env``), AMD Quark's A8W8 (``make ptq-env-quark``: it
#: needs torch and an older ORT, so it is opt-in).
DEFAULT_LIBRARY_RECIPES = ("nncf-default", "nncf-transformer", "quark-a8w8")


def _library_recipes(st: FixState) -> list[Any]:
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


def library_stage(st: FixState, best: Trial) -> Trial:
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
        if better(t, winner):
            winner = t
    return winner
