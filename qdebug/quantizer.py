"""``quantize()``: float model + data + :class:`~qdebug.config.QuantConfig` → QDQ model.

Two timed phases, both ONNX Runtime's own code:

1. **calibration** — ORT's calibrator over the data; the tensor ranges are saved as ORT's calibration
   cache (JSON) next to the output, so a later re-quantization (e.g. a 16-bit promotion) skips it;
2. **QDQ insertion** — ``quantize_static`` fed from that cache.

The float model file is only read; the QDQ model is written atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.cluster import ClusterSpec
from qdebug.config import DEFAULT_SYNTHETIC_SAMPLES, QUANT_TYPES, QuantConfig, normalize_quant_type
from qdebug.data import DataSource, Sample, as_ort_reader, open_data, range_reader
from qdebug.errors import ConfigError, DataError, InputFileError, ModelError, QDebugError
from qdebug.graph_index import VIEW_OPS, constants_to_initializers
from qdebug.io import atomic_path, atomic_write_bytes, refuse_overwrite_input, temp_dir
from qdebug.metrics import energies, sqnr_from_energies
from qdebug.model_io import ModelKind, input_specs, is_dq, is_q, load_model, model_kind
from qdebug.ort import make_session, ort_errors, ort_log_severity, ort_message
from qdebug.ort_index import indexed_quantizer
from qdebug.quantize_choice import (
    CHOICE_MARGIN_DB,
    RecipeChoice,
    RecipeTrial,
    check_samples,
    recipe_label,
    weight_steps,
)
from qdebug.targets.base import to_ort_config

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


class _DropOrtAdvice(logging.Filter):
    """ORT logs a pre-processing advice on every call, and one warning per bias that is not an initializer (a real
    model can have dozens): noise on the user's terminal. The advice is dropped; the biases are collected for one
    note in the result."""

    def __init__(self) -> None:
        super().__init__()
        self.float_biases: list[str] = []
        self.other: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg.startswith("Expected bias '") and msg.endswith("' to be an initializer"):
            self.float_biases.append(msg.split("'")[1])
        elif "pre-process" in msg or "Automatically update the model to opset" in msg:
            pass  # advice the user cannot act on here: qdebug documents that 16-bit types raise the opset to 21
        elif record.levelno >= logging.WARNING:
            self.other.append(msg.splitlines()[0] if msg else msg)
        else:
            return True
        return False

    def notes(self) -> list[str]:
        """One note for the biases ORT left in float."""
        notes = []
        b = sorted(set(self.float_biases))
        if b:
            more = f" and {len(b) - 3} more" if len(b) > 3 else ""
            notes.append(
                f"{len(b)} bias(es) are computed in the graph rather than stored as initializers and stay in float "
                f"(ONNX Runtime quantizes only initializer biases): {', '.join(b[:3])}{more}"
            )
        if self.other:  # one line for whatever else ORT's quantizer logged (it can be one line per tensor)
            more = f" (and {len(self.other) - 1} more)" if len(self.other) > 1 else ""
            notes.append(f"ONNX Runtime's quantizer warned: {self.other[0]}{more}")
        return notes


@contextlib.contextmanager
def _quiet_ort() -> Any:
    """ORT's quantizer logs through Python's root logger and runs its own calibration sessions, whose C++ warnings
    (removed initializers, merged shapes) go to stderr: neither takes qdebug's session options. Both are held back
    here; what matters reaches the result's notes."""
    root = logging.getLogger()
    flt = _DropOrtAdvice()
    root.addFilter(flt)
    try:
        with ort_log_severity(3):
            yield flt
    finally:
        root.removeFilter(flt)


def count_quantized_nodes(model: onnx.ModelProto) -> tuple[int, int, int]:
    """(compute nodes reading a dequantized tensor, all compute nodes, Q/DQ nodes)."""
    dq_outputs = {n.output[0] for n in model.graph.node if is_dq(n)}
    compute = [n for n in model.graph.node if not (is_q(n) or is_dq(n))]
    quantized = sum(1 for n in compute if any(i in dq_outputs for i in n.input))
    return quantized, len(compute), len(model.graph.node) - len(compute)


def _name_new_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Name the nodes ONNX's version converter adds without a name (from their first output, so the same model
    always gets the same names): overrides name their consumers in ``recv_nodes`` and ORT excludes nodes by name."""
    taken = {n.name for n in model.graph.node if n.name}
    for node in model.graph.node:
        if not node.name:
            stem = f"{node.output[0]}/{node.op_type}" if node.output else node.op_type
            # A lazy search: unpacking a million candidate names per node cost 11 s of a 15 s re-quantization on
            # PP-OCR's classifier (every node the opset converter adds is unnamed).
            name, k = stem, 0
            while name in taken:
                k += 1
                name = f"{stem}_{k}"
            node.name = name
            taken.add(name)
    return model


def quantizer_view(
    model: str | Path | onnx.ModelProto,
    weight_type: str,
    activation_types: Iterable[str],
    tensor_overrides: Mapping[str, Any] | None = None,
    *,
    per_channel: bool = False,
) -> onnx.ModelProto | None:
    """The float model as ONNX Runtime's quantizer will see it for these types, or ``None`` when ORT keeps it.

    ``quantize_static`` raises the opset where the types need it (16-bit Q/DQ: opset 21) with ONNX's version
    converter, which may add tensors and unnamed nodes (Softmax-12 becomes Flatten → Softmax → Reshape around
    ``<name>_intermediate``). Calibration, the mixed-precision fixer and the overrides check all read this one view
    (the added nodes named by :func:`_name_new_nodes`), so every name they use is one ORT will find.

    Constant nodes become initializers first (:func:`qdebug.graph_index.constants_to_initializers`, as :func:`quantize`
    does), so the view has the weights ORT will quantize as weights. ``per_channel`` also raises an opset below 13
    to 13: per-channel Q/DQ need its ``axis`` attribute, and ORT's quantizer would otherwise write a model ONNX
    Runtime cannot load (u2netp, opset 11)."""
    types = [normalize_quant_type(t) for t in activation_types]
    act = next((t for t in types if t.endswith("16")), types[0] if types else "uint8")
    # The view is a function of the model and of what decides ORT's opset (the types, whether an override is 16-bit,
    # per-channel): every step of a search asks for the same one, and making it (opset conversion, shape inference
    # twice) cost MiniLM 3 s a step, promote and re-quantize each. Memoized by the model's bytes.
    data = Path(model).read_bytes() if isinstance(model, str | Path) else model.SerializeToString()
    weight = normalize_quant_type(weight_type)
    if len(data) > _VIEW_BYTES:  # not kept: memory
        return _make_view(model, weight, act, tensor_overrides, per_channel)
    # ORT reads the activation type and the overrides only for whether one is 16-bit (``update_opset_version``)
    wide = act.endswith("16") or _wants_16bit(tensor_overrides)
    key = (hashlib.sha256(data).hexdigest(), weight, wide, per_channel)
    if key not in _VIEWS:
        _VIEWS[key] = _make_view(model, weight, act, tensor_overrides, per_channel)
        while len(_VIEWS) > _VIEWS_KEPT:
            _VIEWS.pop(next(iter(_VIEWS)))
    view = _VIEWS[key]
    if view is None:
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(view)  # the caller's to change
    return copy


#: Views kept (:func:`quantizer_view`): a search needs three at most (the 8-bit base; the 16-bit one of the float
#: model the fixer reads and of the copy ``quantize`` hands to ORT).
_VIEWS_KEPT = 3
#: Larger models' views are made every time, not kept.
_VIEW_BYTES = 256 << 20
_VIEWS: dict[tuple[str, str, bool, bool], onnx.ModelProto | None] = {}


def _wants_16bit(overrides: Mapping[str, Any] | None) -> bool:
    """Whether an override (or its ``convert``) asks for a 16-bit type: what makes ORT raise the opset to 21
    (``update_opset_version`` reads the same two fields)."""
    for entries in (overrides or {}).values():
        for e in entries if isinstance(entries, list | tuple) else ():
            if not isinstance(e, Mapping):
                continue
            conv = e.get("convert")
            for qt in (e.get("quant_type"), conv.get("quant_type") if isinstance(conv, Mapping) else None):
                if qt is not None and str(getattr(qt, "name", qt)).lower().endswith("int16"):
                    return True
    return False


def _make_view(
    model: str | Path | onnx.ModelProto,
    weight_type: str,
    act: str,
    tensor_overrides: Mapping[str, Any] | None,
    per_channel: bool,
) -> onnx.ModelProto | None:
    """:func:`quantizer_view`, computed."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.quant_utils import (
        get_opset_version,
        load_model_with_shape_infer,
        save_and_reload_model_with_shape_infer,
        update_opset_version,
    )

    with temp_dir(prefix="qdebug-view-") as tmp:
        path = Path(model) if isinstance(model, str | Path) else Path(tmp) / "float.onnx"
        if isinstance(model, onnx.ModelProto):
            onnx.save_model(model, str(path))
        loaded = load_model_with_shape_infer(path)  # as quantize_static loads it: the converter sees the shapes
        moved, _ = constants_to_initializers(loaded)  # as quantize() does first: Constant nodes are weights
        with _quiet_ort():
            updated = update_opset_version(
                moved,
                QuantType[QUANT_TYPES[normalize_quant_type(weight_type)]],
                QuantType[QUANT_TYPES[act]],
                tensor_quant_overrides=dict(tensor_overrides) if tensor_overrides else None,
            )
        if per_channel and get_opset_version(updated) < PER_CHANNEL_OPSET:
            converted = onnx.version_converter.convert_version(updated, PER_CHANNEL_OPSET)
            updated = save_and_reload_model_with_shape_infer(converted)
    return None if updated is loaded else _name_new_nodes(updated)  # `moved` is `loaded` when nothing moved


#: The first opset whose QuantizeLinear/DequantizeLinear take an ``axis`` (per-channel quantization).
PER_CHANNEL_OPSET = 13


def _ort_model(model_path: Path, ort_cfg: Any, work: Path) -> Path:
    """The model ORT's quantizer really works on (:func:`quantizer_view`), as a file both phases read: ORT finds
    the opset raised already and changes nothing, and a calibration on it names every tensor the quantizer touches
    (a cache made at another opset is translated by :func:`_cache_for`)."""
    extra = ort_cfg.extra_options or {}
    view = quantizer_view(
        model_path,
        normalize_quant_type(ort_cfg.weight_type.name),
        [normalize_quant_type(ort_cfg.activation_type.name)],
        extra.get("TensorQuantOverrides"),
        per_channel=bool(ort_cfg.per_channel),
    )
    if view is None:
        return model_path
    path = work / "opset_updated.onnx"
    onnx.save_model(view, str(path), save_as_external_data=True)
    return path


def _op_types(ort_cfg: Any) -> list[str]:
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return list(ort_cfg.op_types_to_quantize or sorted(set(QLinearOpsRegistry) | set(QDQRegistry)))


def _cache_for(cache: Path, model_path: Path, ort_cfg: Any, work: Path) -> Path | None:
    """A calibration cache naming every tensor ORT will calibrate in ``model_path``, from the ranges in ``cache``.

    Tensors the cache lacks (made by an opset conversion) take the range of the tensor they are a reshaped or
    transposed view of, exactly what calibrating them would give. ``cache`` itself when nothing is missing; a
    translated copy in ``work``; ``None`` when a missing tensor has no such twin (the caller re-calibrates)."""
    from types import SimpleNamespace

    from onnxruntime.quantization.calibrate import CalibraterBase, load_tensors_data, save_tensors_data
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(model_path)
    # ORT's own rule for which tensors calibration covers (float/float16 activations of the quantized op types).
    needed, _ = CalibraterBase.select_tensors_to_calibrate(
        SimpleNamespace(op_types_to_calibrate=_op_types(ort_cfg)),
        model,
    )
    ranges = load_tensors_data(cache)
    missing = {t for t in needed if t not in ranges}
    if not missing:
        return cache
    data = dict(ranges.data)
    views = [(n.input[0], n.output[0]) for n in model.graph.node if n.op_type in VIEW_OPS and n.input]
    changed = True
    while missing and changed:  # a chain of views (e.g. Flatten then Reshape) resolves over several rounds
        changed = False
        for a, b in views:
            for src, dst in ((a, b), (b, a)):
                if dst in missing and src in data:
                    data[dst] = data[src]
                    missing.discard(dst)
                    changed = True
    if missing:
        return None
    translated = work / "calibration.translated.json"
    save_tensors_data(type(ranges)(ranges.calibration_method, data), translated)
    return translated


def _calibrate(model_path: Path, ort_cfg: Any, work: Path) -> Any:
    """ORT's calibration exactly as ``quantize_static`` runs it (on the model of :func:`_ort_model`), returning its
    ``TensorsData``."""
    from onnxruntime.quantization.calibrate import create_calibrator

    extra = ort_cfg.extra_options or {}
    op_types = _op_types(ort_cfg)
    calib_input = model_path
    calib_keys = {
        "CalibTensorRangeSymmetric": "symmetric",
        "CalibMovingAverage": "moving_average",
        "CalibMovingAverageConstant": "averaging_constant",
        "CalibMaxIntermediateOutputs": "max_intermediate_outputs",
        "CalibPercentile": "percentile",
    }
    calibrator = create_calibrator(
        Path(calib_input),
        op_types,
        augmented_model_path=str(work / "augmented_model.onnx"),
        calibrate_method=ort_cfg.calibrate_method,
        use_external_data_format=ort_cfg.use_external_data_format,
        providers=ort_cfg.calibration_providers,
        extra_options={k: extra[n] for n, k in calib_keys.items() if n in extra},
    )
    calibrator.collect_data(ort_cfg.calibration_data_reader)
    return calibrator.compute_data()


def unmergeable_calibration(ort_cfg: Any) -> str | None:
    """Why this calibration cannot be split into shards whose statistics merge exactly (``None``: it can).

    ORT's MinMax keeps per-tensor minima and maxima (symmetric: the largest magnitude), which merge exactly; its
    moving average depends on the order of the batches, and its histogram calibrators (Entropy, Percentile,
    Distribution) re-fit their bins as data arrive, so histograms of shards do not add up to the one-process one."""
    from onnxruntime.quantization import CalibrationMethod

    if ort_cfg.calibrate_method != CalibrationMethod.MinMax:
        return f"ORT's {ort_cfg.calibrate_method.name} histograms re-fit their bins as data arrive"
    if (ort_cfg.extra_options or {}).get("CalibMovingAverage"):
        return "a moving-average MinMax depends on the order of the samples"
    if ort_cfg.use_external_data_format:
        return "a model with external data is not shipped to workers"
    return None


class _RangeSource:
    """Samples ``[start, stop)`` of a :class:`~qdebug.data.RangeReader`, as a data source (on a worker)."""

    def __init__(self, reader: Any, start: int, stop: int) -> None:
        self.reader, self.start, self.stop = reader, start, stop
        self.description = f"samples {start}-{stop - 1}"

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Any:
        for _, sample in self.reader.read(self.start, self.stop):
            yield sample


def minmax_shard(
    model: bytes, op_types: list[str], providers: Any, extra: dict[str, Any], reader: Any, start: int, stop: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """ORT's MinMax calibration of samples ``[start, stop)`` (run on a Ray worker): each tensor's (min, max)."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import create_calibrator

    with temp_dir(prefix="qdebug-calib-") as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model)
        calibrator = create_calibrator(
            path,
            op_types,
            augmented_model_path=str(Path(tmp) / "augmented_model.onnx"),
            calibrate_method=CalibrationMethod.MinMax,
            providers=providers,
            extra_options=extra,
        )
        calibrator.collect_data(as_ort_reader(_RangeSource(reader, start, stop)))
        data = calibrator.compute_data()
    return {k: (np.asarray(v.range_value[0]), np.asarray(v.range_value[1])) for k, v in data.data.items()}


def _calibrate_sharded(model_path: Path, ort_cfg: Any, cluster: ClusterSpec) -> Any:
    """ORT's MinMax calibration with the samples sharded over ``cluster`` (one Ray task per shard, retried by Ray
    on another worker if its worker dies); the shards' minima and maxima merged in shard order: ORT's ranges."""
    from onnxruntime.quantization.calibrate import TensorsData

    from qdebug.cluster import MAX_ATTEMPTS, connect, plan_shards

    extra = ort_cfg.extra_options or {}
    keys = {"CalibTensorRangeSymmetric": "symmetric", "CalibMaxIntermediateOutputs": "max_intermediate_outputs"}
    source = ort_cfg.calibration_data_reader.source
    reader = range_reader(source)
    with connect(cluster) as c:
        task = c.ray.remote(num_cpus=1, max_retries=MAX_ATTEMPTS - 1)(minmax_shard)
        model = c.ray.put(Path(model_path).read_bytes())
        args = (_op_types(ort_cfg), ort_cfg.calibration_providers, {k: extra[n] for n, k in keys.items() if n in extra})
        refs = [task.remote(model, *args, reader, a, b) for a, b in plan_shards(len(source), c.workers)]
        try:
            parts = c.ray.get(refs)
        except c.ray.exceptions.RayTaskError as exc:  # a qdebug error of a shard's data: raised as it was there
            if isinstance(exc.cause, QDebugError):
                raise exc.cause from None
            raise
    merged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for part in parts:  # shard order; fmin/fmax as ORT's nanmin/nanmax: a NaN-only shard changes nothing
        for k, (lo, hi) in part.items():
            merged[k] = (np.fmin(merged[k][0], lo), np.fmax(merged[k][1], hi)) if k in merged else (lo, hi)
    return TensorsData(ort_cfg.calibrate_method, merged)


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
    # model content: a search re-quantizes the same float model at every step (MiniLM: 0.8 s a step).
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


def _calibration(
    model_path: Path, ort_cfg: Any, work: Path, cache: Path, label: str, cluster: ClusterSpec | None = None
) -> float:
    """Calibrate (sharded over ``cluster`` where the statistics merge) and save the ranges to ``cache``; the
    seconds it took."""
    from onnxruntime.quantization.calibrate import save_tensors_data

    t0 = time.perf_counter()
    errors: tuple[type[Exception], ...] = (ValueError, RuntimeError, *ort_errors())
    try:
        if cluster is not None and unmergeable_calibration(ort_cfg) is None:
            ranges = _calibrate_sharded(model_path, ort_cfg, cluster)
        else:
            ranges = _calibrate(model_path, ort_cfg, work)
    except errors as exc:
        raise ModelError(f"{label}: calibration failed: {ort_message(exc)}") from exc
    scratch = work / "ranges.calib.json"
    save_tensors_data(ranges, scratch)
    atomic_write_bytes(cache, scratch.read_bytes())  # ORT writes through mkstemp: its file would be mode 0600
    return time.perf_counter() - t0


def _insert_qdq(model_path: Path, ort_cfg: Any, cache: Path, out: Path, label: str) -> float:
    """ORT's ``quantize_static`` from the cached ranges, written atomically to ``out``; the seconds it took."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    # the same model, without ORT's O(nodes × tensors) look-ups (on the QDQ path, the one qdebug's recipes take)
    qdq = ort_cfg.quant_format == QuantFormat.QDQ
    t1 = time.perf_counter()
    try:  # written to a short-named sibling with the umask's mode, renamed over out (atomic_path)
        with atomic_path(out, ".onnx") as tmp_out, indexed_quantizer() if qdq else contextlib.nullcontext(False):
            quantize_static(
                str(model_path),
                str(tmp_out),
                None,
                calibrate_method=ort_cfg.calibrate_method,
                quant_format=ort_cfg.quant_format,
                activation_type=ort_cfg.activation_type,
                weight_type=ort_cfg.weight_type,
                op_types_to_quantize=ort_cfg.op_types_to_quantize,
                nodes_to_quantize=ort_cfg.nodes_to_quantize,
                nodes_to_exclude=ort_cfg.nodes_to_exclude,
                per_channel=ort_cfg.per_channel,
                reduce_range=ort_cfg.reduce_range,
                use_external_data_format=False,
                calibration_providers=ort_cfg.calibration_providers,
                extra_options=ort_cfg.extra_options,
                calibration_cache_path=str(cache),
            )
            seconds = time.perf_counter() - t1
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        if "scale issue" in str(exc):  # ORT's words for a non-finite or zero calibrated range
            raise DataError(
                f"{label}: calibration gave a tensor a non-finite or empty range (calibration data too large, "
                "or NaN/Inf inside the model); check the data's value range"
            ) from exc
        raise ConfigError(f"ONNX Runtime could not quantize {label}: {exc}") from exc
    return seconds


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


def _phases(
    model_path: Path,
    ort_cfg: Any,
    work: Path,
    reused: Path | None,
    out: Path,
    label: str,
    notes: list[str],
    cluster: ClusterSpec | None = None,
) -> tuple[float, float]:
    """Calibration (skipped when the ``reused`` cache names every tensor; else its ranges go to the ``.calib.json``
    next to ``out``), then QDQ insertion: the seconds of each."""
    ort_model = _ort_model(model_path, ort_cfg, work)
    calib_s, ranges = 0.0, _cache_for(reused, ort_model, ort_cfg, work) if reused is not None else None
    if ranges is None:  # calibrate (again, when the cache cannot name this model's tensors)
        ranges = work / "calibration.json" if reused is not None else out.with_suffix(".calib.json")
        calib_s = _calibration(ort_model, ort_cfg, work, ranges, label, cluster)
        why = unmergeable_calibration(ort_cfg) if cluster is not None else None
        if why is not None:
            notes.append(f"calibration ran in one process, not on the workers: {why}")
        if reused is not None:
            notes.append(
                f"the calibration ranges in {reused} do not cover every tensor of this quantization "
                "(an opset conversion made new ones); calibrated again"
            )
    return calib_s, _insert_qdq(ort_model, ort_cfg, ranges, out, label)


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
            _phases(redo.model_path, ort_cfg, redo.work, redo.cache, path, redo.label, notes)
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
    :func:`unmergeable_calibration`, docs/scale.md)."""
    cfg = config or QuantConfig()  # validated on construction, its target's rules included
    with _quiet_ort() as ort_log, temp_dir(prefix="qdebug-quant-") as tmp:
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
        ort_cfg = to_ort_config(cfg, model_path, as_ort_reader(source))
        ort_cfg.nodes_to_exclude = [*(ort_cfg.nodes_to_exclude or []), *keep_float]
        try:
            # Overflowing data is reported as one error, not as numpy's or ORT's warnings.
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                reused = cache if reuse else None
                calib_s, qdq_s = _phases(model_path, ort_cfg, work, reused, out, label, notes, cluster)
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
