"""ONNX Runtime's two quantization phases as :func:`qdebug.quantizer.quantize` runs them (:func:`run_phases`):
calibration — ORT's calibrator on the model of :func:`~qdebug.ort_view.quantizer_view`, in one process or as MinMax
shards over a Ray cluster whose minima and maxima merge exactly — saved as ORT's calibration cache (a cache made at
another opset is translated through view ops); then QDQ insertion, ``quantize_static`` fed from that cache.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.cluster import ClusterSpec
from qdebug.config import normalize_quant_type
from qdebug.data import as_ort_reader, range_reader
from qdebug.errors import ConfigError, DataError, ModelError, QDebugError
from qdebug.graph_index import VIEW_OPS
from qdebug.io import atomic_path, atomic_write_bytes, temp_dir
from qdebug.ort import ort_errors, ort_message
from qdebug.ort_index import indexed_quantizer
from qdebug.ort_view import quantizer_view


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


def run_phases(
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
