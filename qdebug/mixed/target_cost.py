"""Target-aware cost of search points: compile the Pareto points the user picks for a target (QNN: onnxruntime-qnn,
HTP simulator on x86) and record how the compiled graph came out — accelerator partitions and CPU-fallback nodes.

Why: on the HTP, 16-bit elements are not the whole cost. A promotion whose 8↔16-bit boundaries or 16-bit ops the
backend refuses leaves nodes on the CPU and splits the accelerator graph into several partitions, each boundary a
round trip. Such a point is marked (:attr:`TargetCost.splits`) in the front's ``to_dict()`` and the CLI table.

Each picked point is re-quantized from the cached calibration (the recipe it was measured with) and compiled through
the target's own steps (:func:`qdebug.targets.recompile.recompile`). With ``samples`` > 0 the compiled model also
runs on the target over the first ``samples`` debug samples (QNN: the EPContext model on the HTP simulator) and its
worst output's SQNR vs the float model is recorded next to the CPU QDQ model's on the same samples
(:attr:`TargetCost.target_sqnr_db`, :attr:`TargetCost.cpu_sqnr_db`): the accuracy the point really has on the target,
beside the one the search measured on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qdebug.errors import ConfigError, MissingExtraError, QDebugError, TargetError
from qdebug.mixed.points import SearchPoint, SearchResult, TargetCost

__all__ = ["TargetCost", "compile_points", "pick_points", "preflight"]


@dataclass(frozen=True)
class _Job:
    qdq: Path
    out: Path
    target: str
    options: Any


def _compile_one(job: _Job, float_model: Path | None, data: Any) -> TargetCost:
    """One point compiled (and, given ``float_model``, run on the target). What fails is recorded on the point, not
    raised: a search's measurements are not lost to one point the target refuses (e.g. dynamic input shapes for
    QNN). A missing backend still raises — no point could compile."""
    from qdebug.targets.recompile import recompile

    try:
        r = recompile(job.qdq, job.out, job.target, options=job.options, float_model=float_model, data=data)
        return TargetCost.from_report(r.compile, r.target_accuracy)
    except MissingExtraError:
        raise
    except QDebugError as exc:
        why = f"{type(exc).__name__}: {exc}"
    if float_model is not None:  # did the compile go through and only the run on the target fail?
        try:
            r = recompile(job.qdq, job.out, job.target, options=job.options)
            return TargetCost.from_report(r.compile, None, why)
        except MissingExtraError:
            raise
        except QDebugError as exc:
            why = f"{type(exc).__name__}: {exc}"
    return TargetCost(job.target, False, 0, 0, error=why)


def pick_points(result: SearchResult, spec: str) -> tuple[SearchPoint, ...]:
    """The points ``spec`` names: ``chosen``, ``front`` (every Pareto point) or comma-separated indices into the
    Pareto front as printed (0 = cheapest)."""
    front = result.pareto()
    spec = spec.strip()
    if spec == "chosen":
        return (result.final,)
    if spec == "front":
        return front
    try:
        idx = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--compile-points takes 'chosen', 'front' or front indices like 0,2; got {spec!r}") from None
    bad = [i for i in idx if not 0 <= i < len(front)]
    if not idx or bad:
        raise ConfigError(f"--compile-points: the Pareto front has points 0–{len(front) - 1}; got {spec!r}")
    return tuple(front[i] for i in dict.fromkeys(idx))


def _config(session: Any, result: SearchResult, p: SearchPoint) -> Any:
    """The recipe the point was measured with."""
    base = session.base.config
    if p.label == "all16":
        return base.replace(activation_type=result.goal.to, tensor_overrides=())
    if not p.promoted:
        return base
    return session.promote(p.promoted, result.goal.to).config


def compile_points(
    session: Any,
    result: SearchResult,
    points: Sequence[SearchPoint],
    target: str,
    options: Any = None,
    *,
    samples: int = 0,
) -> SearchResult:
    """``result`` with each of ``points`` compiled for ``target`` (its :class:`TargetCost` set on the point, in the
    curve and the evaluated points alike). ``session`` is the search's
    :class:`~qdebug.mixed.session.MixedPrecisionSession` (its calibration is reused to rebuild each point's model).

    ``samples`` > 0: each compiled model also runs on the target over the first ``samples`` debug samples (the
    target's own check, per-tensor probe off: only the outputs are compared); its worst output SQNR vs float goes
    into the point's :class:`TargetCost` beside the CPU QDQ model's on the same samples. A run that fails is noted
    on the point (``accuracy_error``), not raised: the compile result still stands; a compile that fails (or that the
    target refuses, e.g. QNN and dynamic input shapes) is a point with ``ok`` False and the reason, not an error that
    throws the search's measurements away."""
    from qdebug.targets.recompile import build_options

    if samples < 0:
        raise ConfigError(f"the number of samples to run on the target must be >= 0, got {samples}")
    opts = build_options(target, options, probe_tensors=False) if samples else options
    data = session.target_data(samples) if samples else None
    costs: dict[int, TargetCost] = {}
    for i, p in enumerate(points):
        q = session.requantize(_config(session, result, p), name=f"compile_point{i}")
        job = _Job(Path(q.model_path), session.workdir / f"compile_point{i}.{target}", target, opts)
        costs[id(p)] = _compile_one(job, session.float_path if samples else None, data)

    def mark(ps: tuple[SearchPoint, ...]) -> tuple[SearchPoint, ...]:
        return tuple(replace(p, target_cost=costs[id(p)]) if id(p) in costs else p for p in ps)

    return replace(result, steps=mark(result.steps), evaluated=mark(result.evaluated))


def preflight(session: Any, target: str, options: Any = None) -> tuple[TargetCost, tuple[str, ...]]:
    """Compile the base quantization for ``target`` before a search whose points will be compiled: a model the
    target cannot take at all (e.g. QNN and dynamic input shapes: the corpus' ppocr-cls) is said in one line before
    the search's minutes of measuring, not after. Raises :class:`~qdebug.errors.TargetError` when it does not
    compile; returns its cost (a split base is fine: the search shows what promotions change) and notes: the
    target's compatibility fixes that would change the model (what ``qdebug build`` applies before quantizing), when
    the session searches the model as given (``target_fixes=False``, ``--no-target-fixes``); on ppocr-cls the
    unfixed model's standalone BatchNormalization nodes made the HTP lose 2.5 dB at 8 bits and 22 dB at 16 against
    the CPU, while the fixed model's HTP and CPU agree."""
    q = session.requantize(session.base.config, name="compile_preflight")
    job = _Job(Path(q.model_path), session.workdir / f"compile_preflight.{target}", target, options)
    cost = _compile_one(job, None, None)
    if not cost.ok:
        raise TargetError(
            f"{target} cannot compile this model's base quantization, so no search point would compile: "
            f"{cost.error}; fix the model first (`qdebug build --target {target}` lists the target's fixes; `search` "
            "applies them unless --no-target-fixes)"
        )
    if getattr(session, "target_fixes", None) is not None:  # the session searches the fixed model already
        return cost, ()
    return cost, _fix_notes(session, target, options)


def _fix_notes(session: Any, target: str, options: Any) -> tuple[str, ...]:
    """What the target's own fixes would change in the float model, as one note (none: they change nothing)."""
    from qdebug.targets.base import ShapeSource, get_target
    from qdebug.targets.recompile import build_options

    o = session.debug_options
    shapes = ShapeSource(o.input_shapes, session.debug_data)
    try:
        prepared = get_target(target).prepare(session.float_proto, session.base_config,
                                              build_options(target, options), shapes)  # fmt: skip
    except QDebugError as exc:  # the note is advice: a fix that cannot run here is not the search's failure
        return (f"could not check {target}'s compatibility fixes on this model: {exc}",)
    changed = [f for f in prepared.fixes if f.changed]
    if not changed:
        return ()
    what = "; ".join(f"{f.name}: {f.detail}" for f in changed)
    return (
        f"{target}'s compatibility fixes would change this model ({what}). The search measures the model as given "
        f"and compiles it as given (--no-target-fixes); `qdebug build --target {target}` applies them before "
        "quantizing, so search without --no-target-fixes to measure what that build will run",
    )
