"""``quantize()``: float model + data + :class:`~qdebug.config.QuantConfig` → QDQ model.

Two timed phases, both ONNX Runtime's own code:

1. **calibration** — ORT's calibrator over the data; the tensor ranges are saved as ORT's calibration
   cache (JSON) next to the output, so a later re-quantization (e.g. a 16-bit promotion) skips it;
2. **QDQ insertion** — ``quantize_static`` fed from that cache.

Both phases are :mod:`qdebug.ort_phases`; the model they work on, :mod:`qdebug.ort_view`. This module prepares the
float model, checks the QDQ model's outputs and chooses the weight recipe. The float model file is only read; the QDQ
model is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.cluster import ClusterSpec
from qdebug.config import DEFAULT_SYNTHETIC_SAMPLES, QuantConfig
from qdebug.data import DataSource, Sample, as_ort_reader, open_data
from qdebug.errors import ConfigError, DataError, InputFileError, ModelError
from qdebug.graph_index import constants_to_initializers
from qdebug.io import atomic_write_bytes, refuse_overwrite_input, temp_dir
from qdebug.metrics import energies, sqnr_from_energies
from qdebug.model_io import ModelKind, input_specs, is_dq, is_q, load_model, model_kind
from qdebug.ort import make_session, ort_errors, ort_message
from qdebug.ort_phases import run_phases
from qdebug.ort_view import quiet_ort
from qdebug.quantize_choice import (
    CHOICE_MARGIN_DB,
    RecipeChoice,
    RecipeTrial,
    check_samples,
    recipe_label,
    weight_steps,
)
from qdebug.targets.base import to_ort_config
from qdebug.targets.quant_constraints import constraint_note

#: 2: ``checked_on`` and ``choice`` (version 1 results read with neither)
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class QuantizeResult:
    """What :func:`quantize` produced and how long each phase took."""

    model_path: str
    calibration_cache: str
    config: QuantConfig
    nodes_quantized: int
    nodes_total: int
    qdq_nodes: int
    calibration_seconds: float
    qdq_seconds: float
    num_calibration_samples: int
    reused_calibration: bool = False
    #: what quantize did on its own to keep the model sound (e.g. nodes left in float next to a non-finite constant)
    warnings: tuple[str, ...] = ()
    #: SQNR (dB) of each float model output, QDQ vs float, on the ``checked_samples`` check samples
    #: (``None``: not a float output, identical, or not measurable); empty when the check was off
    output_sqnr_db: dict[str, float | None] = field(default_factory=dict)
    checked_samples: int = 0
    #: which samples the check ran: samples calibration did not see first (``quantize_choice.check_samples``)
    checked_on: str = ""
    #: the weight recipes the check measured and the one written, with each one's dB (``None``: the recipe was
    #: followed as given — check off, a recipe to follow exactly, or nothing else to try)
    choice: RecipeChoice | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["choice"] = None if self.choice is None else self.choice.to_dict()
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantizeResult:
        """Inverse of :meth:`to_dict`."""
        kw = {k: v for k, v in d.items() if k != "schema_version"}
        kw["config"] = QuantConfig.from_dict(kw["config"])
        kw["warnings"] = tuple(kw.get("warnings", ()))
        kw["output_sqnr_db"] = dict(kw.get("output_sqnr_db", {}))
        kw["choice"] = None if kw.get("choice") is None else RecipeChoice.from_dict(kw["choice"])
        return cls(**kw)

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def count_quantized_nodes(model: onnx.ModelProto) -> tuple[int, int, int]:
    """(compute nodes reading a dequantized tensor, all compute nodes, Q/DQ nodes)."""
    dq_outputs = {n.output[0] for n in model.graph.node if is_dq(n)}
    compute = [n for n in model.graph.node if not (is_q(n) or is_dq(n))]
    quantized = sum(1 for n in compute if any(i in dq_outputs for i in n.input))
    return quantized, len(compute), len(model.graph.node) - len(compute)


def _nonfinite_consumers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """Nodes that read a constant holding NaN/±inf (e.g. a ``-inf`` fed into ``Max``): quantizing such a constant
    gives it an infinite scale and wrecks every tensor after it, so these nodes stay in float. Returns the model
    (a copy whose such nodes all have names, since ORT excludes nodes by name), their names and what was done."""
    from qdebug.graph_index import GraphIndex, decode_constant

    index = GraphIndex(model)
    bad = {n for n, c in index.consts.items() if not np.isfinite(decode_constant(c).astype(np.float64)).all()}
    readers = [n for n in index.nodes if n.op_type != "Constant" and any(i in bad for i in n.input)]
    if not readers:
        return model, [], []
    m = onnx.ModelProto()
    m.CopyFrom(model)
    taken = {n.name for n in m.graph.node}
    names = []
    for k, node in enumerate(m.graph.node):
        if node.op_type != "Constant" and any(i in bad for i in node.input):
            if not node.name:
                node.name = next(
                    f"qdebug_float_{k}_{j}" for j in range(1 << 20) if f"qdebug_float_{k}_{j}" not in taken
                )
            names.append(node.name)
    note = (
        f"{len(names)} node(s) read a constant holding NaN/Inf ({', '.join(sorted(bad))}) and stay in float: "
        f"{', '.join(names[:5])}{' …' if len(names) > 5 else ''} (an infinite constant would get an infinite scale)"
    )
    return m, names, [note]


def _moved_note(moved: Sequence[str]) -> str:
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    return (
        f"{len(moved)} Constant node(s) quantized as weights, not as activations (made initializers first, as ORT's "
        f"quant_pre_process does): {', '.join(moved[:3])}{more}"
    )


def _load_float(float_model: str | Path | onnx.ModelProto, work: Path) -> tuple[onnx.ModelProto, Path]:
    """The float model and a path ORT can read it from (an in-memory model is written to ``work``)."""
    if isinstance(float_model, onnx.ModelProto):
        model_path = work / "float.onnx"
        onnx.save_model(float_model, str(model_path))
        model = float_model
    else:
        model_path = Path(float_model)
        model = load_model(model_path, "float model")
    kind = model_kind(model)
    if kind is not ModelKind.FLOAT:
        raise ModelError(f"{model_path}: is already quantized ({kind.value}); quantize the float model")
    # ORT must run the model before calibration does (its errors would otherwise name a temporary file). Once per
    # model content: a search re-quantizes the same float model at every step.
    digest = hashlib.sha256(model.SerializeToString()).hexdigest()
    if digest not in _LOADABLE:
        make_session(
            model,
            ["CPUExecutionProvider"],
            what=str(float_model if isinstance(float_model, str | Path) else "the float model"),
        )
        _LOADABLE.add(digest)
    return model, model_path


#: Digests of float models ONNX Runtime has made a session of (:func:`_load_float`).
_LOADABLE: set[str] = set()


def _prepared_float(
    float_model: str | Path | onnx.ModelProto, work: Path
) -> tuple[onnx.ModelProto, Path, list[str], list[str]]:
    """The float model as quantize works on it (Constant nodes made initializers, nodes reading a non-finite
    constant kept in float), the path ORT reads it from, those nodes, and notes on what was done."""
    model, model_path = _load_float(float_model, work)
    model, moved = constants_to_initializers(model)
    model, keep_float, notes = _nonfinite_consumers(model)
    if moved:
        notes.insert(0, _moved_note(moved))
    if model_path.parent != work:
        # Always a copy: ORT's quantizer writes a '<model>-inferred.onnx' next to the file it is given, which must
        # not appear (or, after a Ctrl-C, stay) in the user's folder, and its bindings take UTF-8 paths only.
        model_path = work / "float.onnx"
        onnx.save_model(model, str(model_path), save_as_external_data=model.ByteSize() > _PROTO_LIMIT)
    elif keep_float or moved:
        onnx.save_model(model, str(model_path), save_as_external_data=model.ByteSize() > _PROTO_LIMIT)
    return model, model_path, keep_float, notes


#: Protobuf's 2 GiB message limit, with a margin: larger models are saved with external data.
_PROTO_LIMIT = 1_800_000_000


#: An output at or below this SQNR carries as much quantization error as signal: the model is not usable.
BROKEN_OUTPUT_DB = 0.0


class _OutputCheck:
    """The float model's outputs on the check samples, computed once, against which each QDQ model is measured
    (sessions with optimizations off: exact QDQ semantics, the numbers ``qdebug debug`` reports). Holds
    :data:`~qdebug.quantize_choice.CHECK_SAMPLES` samples and their float outputs: a fixed, small amount."""

    def __init__(self, float_model: onnx.ModelProto, source: DataSource) -> None:
        self.float_model, self.source = float_model, source
        self._reference: list[tuple[Sample, list[Any]]] | None = None
        self.names: list[str] = []

    def _float_outputs(self) -> list[tuple[Sample, list[Any]]]:
        if self._reference is None:
            fs: Any = make_session(self.float_model, ["CPUExecutionProvider"], what="the float model")
            self.names = [o.name for o in fs.get_outputs()]
            self._reference = [(s, fs.run(self.names, s)) for s in self.source]
        return self._reference

    def sqnr(self, qdq_path: Path) -> tuple[dict[str, float | None], int]:
        """Each model output's SQNR in dB, QDQ vs float, from energies summed over the check samples; ``None``
        where it is not a float output or not finite."""
        reference = self._float_outputs()
        qs: Any = make_session(onnx.load(str(qdq_path)), ["CPUExecutionProvider"], what=str(qdq_path))
        have = {o.name for o in qs.get_outputs()}
        names = [n for n in self.names if n in have]
        signal, noise = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
        floating = set(names)
        for sample, f_outs in reference:
            by_name = dict(zip(self.names, f_outs, strict=True))
            for name, q_out in zip(names, qs.run(names, sample), strict=True):
                f, q = np.asarray(by_name[name]), np.asarray(q_out)
                if not np.issubdtype(f.dtype, np.floating) or f.shape != q.shape:
                    floating.discard(name)
                    continue
                s, n = energies(f, q)
                signal[name] += s
                noise[name] += n
        result: dict[str, float | None] = {}
        for name in names:
            db = sqnr_from_energies(signal[name], noise[name])[0] if name in floating else None
            result[name] = round(db, 3) if db is not None and math.isfinite(db) else None
        return result, len(reference)


def _worst(outputs: Mapping[str, float | None]) -> tuple[str, float] | None:
    """The output with the lowest measured SQNR."""
    measured = [(db, name) for name, db in outputs.items() if db is not None]
    if not measured:
        return None
    db, name = min(measured)
    return name, db


def _measured(check: _OutputCheck, qdq_path: Path, notes: list[str]) -> tuple[dict[str, float | None], int]:
    """:meth:`_OutputCheck.sqnr`, or nothing (with a note) when the check itself cannot run the models."""
    caught: tuple[type[Exception], ...] = (*ort_errors(), ModelError, DataError)
    try:
        return check.sqnr(qdq_path)
    except caught as exc:
        notes.append(f"the written model's outputs could not be measured: {ort_message(exc)}")
        return {}, 0


@dataclass(frozen=True)
class _Redo:
    """What a second QDQ insertion of the same float model needs (the calibration ranges are reused)."""

    model_path: Path
    keep_float: list[str]
    work: Path
    cache: Path
    label: str
    fallback: bool


def _trial(cfg: QuantConfig, outputs: dict[str, float | None], seconds: float) -> RecipeTrial:
    """The record of one measured weight recipe."""
    worst = _worst(outputs)
    return RecipeTrial(
        per_channel=cfg.per_channel,
        weight_type=cfg.weight_type,
        worst_output=None if worst is None else worst[0],
        worst_db=None if worst is None else worst[1],
        output_sqnr_db=outputs,
        seconds=round(seconds, 4),
    )


def _try_recipe(
    cfg: QuantConfig, path: Path, source: DataSource, check: _OutputCheck, redo: _Redo, notes: list[str]
) -> RecipeTrial | None:
    """Insert QDQ with ``cfg`` from the calibration ranges already made (written to ``path`` in quantize's own
    temporary folder) and measure it; ``None`` (with a note) when ORT cannot quantize or run it this way."""
    t0 = time.perf_counter()
    try:
        ort_cfg = to_ort_config(cfg, redo.model_path, as_ort_reader(source))
        ort_cfg.nodes_to_exclude = [*(ort_cfg.nodes_to_exclude or []), *redo.keep_float]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            run_phases(redo.model_path, ort_cfg, redo.work, redo.cache, path, redo.label, notes)
    except (ConfigError, DataError, ModelError) as exc:
        notes.append(f"{recipe_label(cfg.per_channel, cfg.weight_type)} weights were not tried: {exc}")
        return None
    outputs, n = _measured(check, path, notes)
    return _trial(cfg, outputs, time.perf_counter() - t0) if n else None


def _alternative(cfg: QuantConfig, step: Mapping[str, Any]) -> QuantConfig | None:
    """``cfg`` with one change, or ``None`` when the target cannot run it (its rules refuse the config)."""
    try:
        return cfg.replace(**step)
    except ConfigError:
        return None


def _choose(
    out: Path, source: DataSource, cfg: QuantConfig, check: tuple[_OutputCheck, int], given: RecipeTrial,
    redo: _Redo, notes: list[str],
) -> tuple[QuantConfig, RecipeChoice | None]:  # fmt: skip
    """Measure each alternative of :func:`~qdebug.quantize_choice.weight_steps` on top of the best recipe so far and
    write the best one to ``out``: an alternative is kept only when its worst output beats the best so far by more
    than :data:`~qdebug.quantize_choice.CHOICE_MARGIN_DB`. Per-tensor weights of a layer whose output channels
    differ by orders of magnitude are the usual loser; a better recipe is cheap here (no re-calibration), so it is
    measured whatever the given recipe's SQNR. ``source`` is the calibration data (for a re-calibration, when an
    opset conversion made tensors the ranges lack); ``check`` the check and its number of samples."""
    trials, best, best_cfg, best_path = [given], 0, cfg, out
    for k, step in enumerate(weight_steps(cfg)):
        alt = _alternative(best_cfg, step)
        if alt is None:
            continue
        path = redo.work / f"recipe{k}.qdq.onnx"  # in quantize's own temporary folder, removed with it
        tried = _try_recipe(alt, path, source, check[0], redo, notes)
        best_db = trials[best].worst_db
        if tried is None or tried.worst_db is None or best_db is None:
            path.unlink(missing_ok=True)
            continue
        trials.append(tried)
        if tried.worst_db > best_db + CHOICE_MARGIN_DB:
            if best_path != out:
                best_path.unlink(missing_ok=True)
            best, best_cfg, best_path = len(trials) - 1, alt, path
        else:
            path.unlink(missing_ok=True)
    if best_path != out:
        atomic_write_bytes(out, best_path.read_bytes())  # the trial is in another folder, maybe device
        best_path.unlink(missing_ok=True)
    if len(trials) == 1:
        return cfg, None
    return best_cfg, RecipeChoice(tuple(trials), best, CHOICE_MARGIN_DB, check[1])


def _others(choice: RecipeChoice) -> str:
    """The recipes not written, with their worst output's dB."""
    return ", ".join(
        f"{t.label} {t.worst_db:.1f} dB" for t in choice.trials if t is not choice.written and t.worst_db is not None
    )


def _checked(
    model: onnx.ModelProto, out: Path, source: DataSource, cfg: QuantConfig, redo: _Redo, notes: list[str]
) -> tuple[QuantConfig, dict[str, float | None], int, str, RecipeChoice | None]:
    """Measure the written model's outputs on the check samples (:func:`~qdebug.quantize_choice.check_samples`);
    when the caller allows it, measure the other weight recipes too and write the best (:func:`_choose`); warn
    about an output still at or below :data:`BROKEN_OUTPUT_DB`. Returns the config written, its outputs' SQNR, the
    number of check samples, which they were, and the choice made (``None``: none was)."""
    samples, checked_on, _ = check_samples(source)
    check = _OutputCheck(model, samples)
    t0 = time.perf_counter()
    outputs, n = _measured(check, out, notes)
    given = _trial(cfg, outputs, time.perf_counter() - t0)
    choice = None
    if given.worst_db is not None and redo.fallback:
        cfg, choice = _choose(out, source, cfg, (check, n), given, redo, notes)
    final = given if choice is None else choice.written
    if final.worst_db is None or final.worst_db > BROKEN_OUTPUT_DB:
        return cfg, final.output_sqnr_db, n, checked_on, choice
    others = "" if choice is None else f" (the other weight recipes measured did not do better: {_others(choice)})"
    notes.append(
        f"output {final.worst_output!r} measures {final.worst_db:.1f} dB on {n} check sample(s): its quantization "
        "error is as large as the signal, so this model does not reproduce the float model; 'qdebug debug' shows "
        "where it is lost" + others
    )
    return cfg, final.output_sqnr_db, n, checked_on, choice


def _cache_path(calibration_cache: str | Path | None, out: Path) -> tuple[Path, bool]:
    """Where the calibration ranges are (a given cache, else ``<out>.calib.json``) and whether they are reused."""
    if calibration_cache is None:
        return out.with_suffix(".calib.json"), False
    cache = Path(calibration_cache)
    if not cache.is_file():
        raise InputFileError(f"{cache}: calibration cache not found")
    return cache, True


def _ort_config(cfg: QuantConfig, model_path: Path, source: DataSource, keep_float: list[str], notes: list[str]) -> Any:
    """ORT's config by the target's recipe, the non-finite consumers kept in float; says in ``notes`` which tensors
    the target's quantization constraints put on a symmetric grid."""
    ort_cfg = to_ort_config(cfg, model_path, as_ort_reader(source))
    ort_cfg.nodes_to_exclude = [*(ort_cfg.nodes_to_exclude or []), *keep_float]
    notes += [n for n in (constraint_note(cfg.target, cfg.ort_overrides(), ort_cfg),) if n]
    return ort_cfg


def quantize(
    float_model: str | Path | onnx.ModelProto,
    data: str | Path | Mapping[str, Any] | DataSource | None,
    config: QuantConfig | None = None,
    output: str | Path | None = None,
    *,
    calibration_cache: str | Path | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    check: bool = True,
    per_channel_fallback: bool = True,
    cluster: ClusterSpec | None = None,
) -> QuantizeResult:
    """Quantize ``float_model`` to a QDQ model at ``output`` (a temp folder if omitted), by the recipe of the
    config's target (:meth:`qdebug.targets.base.Target.ort_config`; the config is checked against it first).

    ``data`` feeds calibration (``None``: ``config.num_samples`` seeded synthetic samples, default 32; a file or
    folder is used whole unless ``config.num_samples`` caps it). With an existing ``calibration_cache`` (from an
    earlier result) calibration is skipped and its ranges reused. ``input_shapes`` fixes dynamic input dimensions of
    synthetic calibration data (see ``docs/data.md``). ``check`` measures the written model's outputs against the
    float model's on check samples (samples calibration did not use first: ``QuantizeResult.checked_on``) and warns
    about an output at or below :data:`BROKEN_OUTPUT_DB`; with ``per_channel_fallback`` it also measures the other
    weight recipes of the same ranges (per-channel, ``int8``: :mod:`qdebug.quantize_choice`) and writes the best
    (``QuantizeResult.choice``): off when the caller's recipe must be followed exactly (a config or overrides file,
    weight flags). ``check=False`` for re-quantizations that must follow their config exactly (the mixed-precision
    search). ``cluster`` shards a MinMax calibration over Ray workers (same ranges; other methods run here:
    :func:`~qdebug.ort_phases.unmergeable_calibration`, docs/scale.md)."""
    cfg = config or QuantConfig()  # validated on construction, its target's rules included
    with quiet_ort() as ort_log, temp_dir(prefix="qdebug-quant-") as tmp:
        work = Path(tmp)
        model, model_path, keep_float, notes = _prepared_float(float_model, work)
        if output is None:
            output = Path(tempfile.mkdtemp(prefix="qdebug-")) / "model.qdq.onnx"
        out = Path(output)
        label = "the float model" if isinstance(float_model, onnx.ModelProto) else str(float_model)
        if not isinstance(float_model, onnx.ModelProto):
            refuse_overwrite_input(out, float_model)
        cache, reuse = _cache_path(calibration_cache, out)
        source = open_data(
            data,
            input_specs(model),
            num_samples=cfg.num_samples if data is not None else (cfg.num_samples or DEFAULT_SYNTHETIC_SAMPLES),
            seed=cfg.seed,
            distribution=cfg.synthetic_distribution,
            input_shapes=input_shapes,
        )
        ort_cfg = _ort_config(cfg, model_path, source, keep_float, notes)
        try:
            # Overflowing data is reported as one error, not as numpy's or ORT's warnings.
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                reused = cache if reuse else None
                calib_s, qdq_s = run_phases(model_path, ort_cfg, work, reused, out, label, notes, cluster)
        except BaseException as exc:
            if not reuse:  # a failed quantization leaves no calibration ranges behind
                cache.unlink(missing_ok=True)
            if isinstance(exc, DataError) and source.description not in str(exc):  # name the data too
                raise DataError(f"{exc} (calibration data: {source.description})") from exc
            raise
        redo = _Redo(model_path, keep_float, work, cache, label, per_channel_fallback)
        checked = _checked(model, out, source, cfg, redo, notes) if check else (cfg, {}, 0, "", None)
        cfg, measured, n_checked, checked_on, choice = checked
    quantized, total, qdq = count_quantized_nodes(onnx.load(str(out)))
    return QuantizeResult(
        model_path=str(out),
        calibration_cache=str(cache),
        config=cfg,
        nodes_quantized=quantized,
        nodes_total=total,
        qdq_nodes=qdq,
        calibration_seconds=round(calib_s, 4),
        qdq_seconds=round(qdq_s, 4),
        num_calibration_samples=len(source),
        reused_calibration=reuse and calib_s == 0.0,
        warnings=tuple(dict.fromkeys((*notes, *ort_log.notes()))),  # each alternative's insertion may say it again
        output_sqnr_db=measured,
        checked_samples=n_checked,
        checked_on=checked_on,
        choice=choice,
    )
