"""``debug()``: where a quantized model loses accuracy, tensor by tensor."""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug._version import __version__
from qdebug.capture import (
    AUTO,
    FALLBACK_BACKEND,
    CaptureResult,
    CaptureTuning,
    ProgressFn,
    canonical_backend,
    capture,
    capture_choices,
)
from qdebug.cluster import ClusterSpec
from qdebug.data import DataSource, open_data
from qdebug.errors import ConfigError, ModelError
from qdebug.graph_index import GraphIndex
from qdebug.metrics import (
    FROM_STATS,
    METRICS,
    STREAMING_METRICS,
    ErrorSums,
    Metric,
    SqnrStatus,
    Summary,
    TensorStats,
    channel_sqnr,
    sqnr_from_energies,
)
from qdebug.model_io import file_sha256, input_specs, load_model
from qdebug.pairing import ActivationPair, OutputPair, Pairing, WeightPair, pair_models, weight_arrays
from qdebug.qdq_values import qdq_parameter_problems
from qdebug.report import (
    ActivationResult,
    CaptureInfo,
    DebugReport,
    OutputResult,
    PerSample,
    ReportMeta,
    Summaries,
    WeightResult,
)
from qdebug.task_measure import labels_for, task_state
from qdebug.task_metrics import AUTO as AUTO_METRIC
from qdebug.task_metrics import MetricSpec, load_metric, pick_metric
from qdebug.task_score import TaskMetric, TaskScore

ModelLike = str | Path | onnx.ModelProto
DataLike = str | Path | Mapping[str, np.ndarray] | DataSource | None


@dataclass(frozen=True)
class DebugOptions:
    """Options of one debug run (validated on construction).

    ``num_samples`` caps the data (and sets how many synthetic samples are drawn when no data is given);
    ``input_shapes`` fixes dynamic input dimensions for synthetic data. ``capture`` names the capture backend
    (:func:`qdebug.capture.capture_choices`: ``"graph"`` merges both models into one ONNX Runtime graph that
    reduces every pair in-graph; ``"fetch"`` (formerly ``"numpy"``, still accepted) fetches every paired tensor
    and reduces it by the reference definition; ``"compiled"`` fetches the same way and reduces with one compiled
    pass per tensor; ``"auto"``, the default, measures the first samples and keeps the fastest. All report the same
    values, and the report's ``meta.capture`` says which ran, why, and which samples fell back). ``tuning``: the
    capture's thresholds (:class:`~qdebug.capture.tuning.CaptureTuning`; ``None``: its defaults).
    ``cluster`` runs the capture on a Ray cluster (:class:`~qdebug.cluster.ClusterSpec`: local workers or an
    existing cluster; docs/scale.md), with the same report.
    ``metrics`` names the registered metrics the report computes (:data:`qdebug.metrics.STREAMING_METRICS` for
    activations and outputs, :data:`qdebug.metrics.METRICS` for weights); ``None``: all of them.
    ``batch`` > 1 runs up to that many samples of the same input shapes per inference call (the fetching backends:
    fetch, compiled, auto's; checked on the first batch, sums still per sample, equal to unbatched ones up to
    rounding; :mod:`qdebug.capture.batching`); ``1`` one sample per call; ``None``, the default: ``auto`` batches
    up to :attr:`~qdebug.capture.tuning.CaptureTuning.auto_batch` samples when the model's inputs have a batch axis.
    ``task_metric`` adds the task metric's score against the float model to the report (``report.task``): a built-in
    name, ``"auto"`` (chosen from the float model's outputs), ``"module:function"``, a per-sample callable or a
    :class:`~qdebug.task_metrics.TaskMetric` (:func:`~qdebug.task_metrics.load_metric`; loaded, and so checked, on
    construction; ``"auto"`` once the model is read). Its labels, when it reads any, are the ``task_label_key``
    array of an ``.npz`` ``data`` (never a model input). It runs both models once more, outputs only.
    """

    num_samples: int | None = None
    seed: int = 0
    distribution: str = "uniform"
    input_shapes: Mapping[str, Sequence[int]] | None = None
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    ignore_data_keys: tuple[str, ...] = ()
    capture: str = AUTO
    metrics: tuple[str, ...] | None = None
    batch: int | None = None
    cluster: ClusterSpec | None = None
    task_metric: MetricSpec | None = None
    task_label_key: str = "label"
    tuning: CaptureTuning | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.task_metric is not None and self.task_metric != AUTO_METRIC:
            try:  # loaded once, here: a spec that cannot be loaded is said before any work
                object.__setattr__(self, "task_metric", load_metric(self.task_metric))
            except ConfigError as exc:
                problems.append(str(exc))
        if self.num_samples is not None and (not isinstance(self.num_samples, int) or self.num_samples < 1):
            problems.append(f"num_samples must be a positive integer, got {self.num_samples!r}")
        if self.distribution not in ("uniform", "normal"):
            problems.append(f"distribution must be 'uniform' or 'normal', got {self.distribution!r}")
        if self.capture not in capture_choices():
            problems.append(f"capture must be one of {', '.join(capture_choices())}, got {self.capture!r}")
        else:  # a former backend name is recorded as the backend it now is
            object.__setattr__(self, "capture", canonical_backend(self.capture))
        if not self.providers:
            problems.append("at least one execution provider is needed")
        if self.batch is not None and (not isinstance(self.batch, int) or self.batch < 1):
            problems.append(f"batch must be a positive integer, got {self.batch!r}")
        elif self.batch is not None and self.batch > 1 and self.capture == "graph":
            problems.append(
                f"batch {self.batch} needs a fetching capture (auto, fetch, compiled): graph does not batch"
            )
        if self.metrics is not None:
            object.__setattr__(self, "metrics", tuple(self.metrics))
            known = {*STREAMING_METRICS, *METRICS}
            unknown = sorted(set(self.metrics) - known)
            if unknown:
                problems.append(f"unknown metric(s) {unknown}; registered: {sorted(known)}")
            if len(set(self.metrics)) != len(self.metrics):
                problems.append(f"metrics named twice: {sorted(m for m in self.metrics if self.metrics.count(m) > 1)}")
        if problems:
            raise ConfigError("; ".join(problems))

    def selected(self, registry: Mapping[str, Any]) -> list[str]:
        """The names of ``registry`` this run computes."""
        return [n for n in registry if self.metrics is None or n in self.metrics]


def _load(model: ModelLike, role: str) -> tuple[onnx.ModelProto, str, str]:
    if isinstance(model, onnx.ModelProto):
        return model, f"<in-memory {role}>", hashlib.sha256(model.SerializeToString()).hexdigest()
    return load_model(model, role), str(model), file_sha256(model)


def _status(s: ErrorSums) -> tuple[float | None, SqnrStatus]:
    return s.sqnr


def _streaming(s: ErrorSums, names: Sequence[str]) -> dict[str, float | None]:
    return {n: STREAMING_METRICS[n](s) for n in names}


def _channel_worst(w: WeightPair, ref: np.ndarray, d: np.ndarray) -> float | None:
    """The worst per-channel SQNR of a per-channel weight (``None`` otherwise)."""
    if w.params.axis is None or ref.ndim == 0:
        return None
    finite = [p for p in channel_sqnr(ref, ref, w.params.axis, diff=d) if p is not None]
    return min(finite) if finite else None


def _metric(fn: Metric, stats: TensorStats, ref: np.ndarray, test: np.ndarray) -> float:
    """A whole-tensor metric of a weight: a built-in one from the weight's :class:`TensorStats`, another (a user's)
    on the arrays."""
    fast = FROM_STATS.get(fn)
    return fast(stats) if fast is not None else fn(ref, test)


def _weight_result(w: WeightPair, ref: np.ndarray, test: np.ndarray, names: Sequence[str]) -> WeightResult:
    with np.errstate(invalid="ignore", over="ignore"):  # ±inf weights: a NONFINITE status, not a warning
        d = ref - test
        stats = TensorStats.of(ref.reshape(-1), test.reshape(-1), d.reshape(-1))
        v, st = sqnr_from_energies(stats.signal, stats.noise)
        worst = _channel_worst(w, ref, d)
        metrics = {n: _metric(METRICS[n], stats, ref, test) for n in names}
    max_abs = stats.max_abs if d.size else None
    return WeightResult(
        weight_name=w.weight_name,
        consumer_node=w.consumer_node,
        consumer_op=w.consumer_op,
        kind=w.kind,
        quant_type=w.params.quant_type,
        channels=w.params.channels,
        weight_sqnr_db=v,
        weight_status=st,
        worst_channel_sqnr_db=worst,
        max_abs_error=max_abs if max_abs is not None and math.isfinite(max_abs) else None,
        elements=int(ref.size),
        shape=tuple(int(s) for s in ref.shape),
        metrics={k: (None if isinstance(x, float) and math.isnan(x) else x) for k, x in metrics.items()},
    )


class WeightCache:
    """Weight results kept from one :func:`debug` pass to the next (a mixed-precision session's base and its
    variants): a weight whose float model, integers, scale, zero point and DequantizeLinear are all the same has the
    same result, so it is not dequantized and measured again — a promotion re-quantizes activations, and changes
    the few biases whose input scale moved. With it (and types inferred without the weights), MiniLM's search step
    went from 4.0 to 2.3 s (``benchmarks/bench_ops.py``). Bounded: the entries of the last :attr:`passes` passes'
    weights."""

    def __init__(self, passes: int = 4) -> None:
        self.passes = passes
        self._results: OrderedDict[tuple[Any, ...], WeightResult] = OrderedDict()
        self.hits = self.misses = 0

    def results(
        self, pairing: Pairing, fm: onnx.ModelProto, qm: onnx.ModelProto, f_sha: str, names: Sequence[str]
    ) -> list[WeightResult]:
        """Every weight's result: kept ones where the key matches, else measured (and kept)."""
        fi, qi = GraphIndex(fm), GraphIndex(qm)
        metrics = tuple((n, METRICS[n]) for n in names)  # a metric registered again under a name is another key
        out = []
        for w in pairing.weights:
            key = (f_sha, w, _quant_digest(w, qi), metrics)
            got = self._results.get(key)
            if got is None:
                self.misses += 1
                got = self._results[key] = _weight_result(w, *weight_arrays(w, fi, qi), names)
            else:
                self.hits += 1
            self._results.move_to_end(key)
            out.append(got)
        while len(self._results) > self.passes * max(1, len(pairing.weights)):
            self._results.popitem(last=False)
        return out


def _quant_digest(w: WeightPair, qi: GraphIndex) -> bytes:
    """A digest of everything a weight's quantized value depends on in the QDQ model: its DequantizeLinear (inputs,
    attributes) and their constants — the integers, or the float constant and QuantizeLinear quantized in-graph."""
    h = hashlib.blake2b(digest_size=16)
    dq = qi.qdq_nodes[w.dq_node]
    nodes = [dq]
    if dq.input[0] not in qi.consts and dq.input[0] in qi.producer:
        nodes.append(qi.producer[dq.input[0]])
    for node in nodes:
        h.update(node.SerializeToString())
        for name in node.input:
            if name in qi.consts:
                h.update(qi.consts[name].SerializeToString())
    return h.digest()


def _weight_results(
    pairing: Pairing,
    fm: onnx.ModelProto,
    qm: onnx.ModelProto,
    opts: DebugOptions,
    f_sha: str,
    cache: WeightCache | None,
) -> list[WeightResult]:
    names = opts.selected(METRICS)
    if cache is not None:
        return cache.results(pairing, fm, qm, f_sha, names)
    fi, qi = GraphIndex(fm), GraphIndex(qm)
    return [_weight_result(w, *weight_arrays(w, fi, qi), names) for w in pairing.weights]


def _max_abs(s: ErrorSums) -> float | None:
    """The largest absolute error, or None when NaN/Inf make it meaningless (never a misleading 0.0)."""
    return None if s.nonfinite_reference or s.nonfinite_test else s.max_abs


def _worst_sample(col: np.ndarray) -> int | None:
    finite = np.where(np.isnan(col), np.inf, col)
    if not np.isfinite(finite).any():
        return None
    return int(np.argmin(finite))


def _activation(j: int, a: ActivationPair, cap: CaptureResult, names: Sequence[str]) -> ActivationResult:
    cum = cap.cumulative[j]
    cum_v, cum_s = _status(cum)
    loc = cap.local[j]
    loc_v, loc_s = _status(loc) if loc is not None else (None, SqnrStatus.NOT_QUANTIZED)
    p = a.params
    return ActivationResult(
        tensor_name=a.tensor_name,
        producer_op=a.producer_op,
        producer_node=a.producer_node,
        topo_index=a.topo_index,
        quantized=a.quantized,
        quant_type=p.quant_type if p else None,
        scale=p.scale if p else None,
        zero_point=p.zero_point if p else None,
        local_sqnr_db=loc_v,
        local_status=loc_s,
        cumulative_sqnr_db=cum_v,
        cumulative_status=cum_s,
        mse=cum.mse,
        max_abs_error=_max_abs(cum),
        float_min=cap.float_min[j],
        float_max=cap.float_max[j],
        elements=cap.elements[j],
        nonfinite_float=cum.nonfinite_reference,
        nonfinite_quant=cum.nonfinite_test,
        worst_sample=_worst_sample(cap.per_sample[:, j]),
        converted_to=a.converted_to,
        fused_activation=a.fused_activation[0] if a.fused_activation else None,
        measured_through=a.measured_through[0] if a.measured_through else None,
        inputs=a.inputs,
        metrics=_streaming(cum, names),
    )


def _output(j: int, o: OutputPair, cap: CaptureResult, names: Sequence[str]) -> OutputResult:
    s = cap.outputs[j]
    v, st = _status(s)
    return OutputResult(
        output_name=o.output_name,
        cumulative_sqnr_db=v,
        cumulative_status=st,
        mse=s.mse,
        max_abs_error=_max_abs(s),
        worst_sample=_worst_sample(cap.per_sample_outputs[:, j]),
        nonfinite_float=s.nonfinite_reference,
        nonfinite_quant=s.nonfinite_test,
        metrics=_streaming(s, names),
    )


def capture_info(cap: CaptureResult) -> CaptureInfo:
    """The report's record of how the tensors were captured."""
    return CaptureInfo(
        requested=cap.requested,
        backend=cap.path,
        reason=cap.fallback_reason,
        fallback_backend=FALLBACK_BACKEND if cap.fallback_samples else None,
        fallback_samples=cap.fallback_samples,
        fallback_reasons=cap.fallback_reasons,
        batch=cap.batch,
        batch_reason=cap.batch_reason,
        segments=cap.segments,
        segment_note=cap.segment_note,
    )


def _meta(
    paths: tuple[str, str, str, str],
    source: DataSource,
    cap: CaptureResult,
    pairing: Pairing,
    warnings: list[str],
    seconds: float,
) -> ReportMeta:
    import onnxruntime as ort

    f_path, q_path, f_sha, q_sha = paths
    return ReportMeta(
        float_model=f_path,
        quant_model=q_path,
        float_sha256=f_sha,
        quant_sha256=q_sha,
        num_samples=cap.num_samples,
        data=source.description,
        qdebug_version=__version__,
        onnxruntime_version=ort.__version__,
        seconds=round(seconds, 4),
        unmatched_float_tensors=len(pairing.unmatched_float_tensors),
        warnings=tuple(warnings),
        capture=capture_info(cap),
    )


def _named(exc: ModelError, f_path: str, q_path: str) -> ModelError:
    """The engine's error with the file at fault named: the one its role says, else both (a mismatch of the two)."""
    paths = {"float model": f_path, "quantized model": q_path}
    if exc.role in paths:
        return ModelError(f"{paths[exc.role]} ({exc.role}): {exc.reason}")
    return ModelError(f"{exc} (float model: {f_path}; quantized model: {q_path})")


def _capture(
    fm: onnx.ModelProto,
    qm: onnx.ModelProto,
    pairing: Pairing,
    source: DataSource,
    opts: DebugOptions,
    progress: ProgressFn | None,
) -> CaptureResult:
    """The capture in this process, or sharded over ``opts.cluster``'s workers (same result)."""
    if opts.cluster is None:
        return capture(
            fm, qm, pairing, source, opts.providers, progress, path=opts.capture, batch=opts.batch, tuning=opts.tuning
        )
    from qdebug.capture.ray_backend import capture_distributed
    from qdebug.cluster import connect

    with connect(opts.cluster) as cluster:
        return capture_distributed(
            fm, qm, pairing, source, cluster, opts.providers, progress, opts.capture, opts.batch, opts.tuning
        )


def _with_metric(opts: DebugOptions, metric: MetricSpec | None) -> DebugOptions:
    """``opts`` with ``debug(..., metric=...)`` as its task metric (given in both places: a :class:`ConfigError`)."""
    if metric is None:
        return opts
    if opts.task_metric is not None:
        raise ConfigError("the task metric is given twice: as metric= and as options.task_metric")
    return replace(opts, task_metric=metric)


def _task(
    fm: onnx.ModelProto, qm: onnx.ModelProto, source: DataSource, data: DataLike, opts: DebugOptions
) -> tuple[TaskScore | None, str | None]:
    """The report's task score, and a warning: ``(None, None)`` without a task metric; ``(None, why)`` when ``auto``
    finds no built-in that fits the float model's outputs."""
    spec = opts.task_metric
    if spec is None:
        return None, None
    metric: TaskMetric | None
    if spec == AUTO_METRIC:
        metric, why = pick_metric(fm)
        if metric is None:
            return None, f"task metric auto: none fits ({why}); name one with metric="
    else:
        metric = load_metric(spec)
    labels = labels_for(data, opts.task_label_key, len(source), metric.needs_labels)
    return metric.score(task_state(fm, qm, source, metric, labels)), None


def debug(
    float_model: ModelLike,
    quant_model: ModelLike,
    data: DataLike = None,
    options: DebugOptions | None = None,
    *,
    progress: ProgressFn | None = None,
    weight_cache: WeightCache | None = None,
    metric: MetricSpec | None = None,
) -> DebugReport:
    """Compare a float model with its QDQ-quantized counterpart on the same samples.

    Returns local, cumulative, weight and output SQNR per tensor (and every selected registered metric).
    ``data`` is an ``.npz`` path, a folder of them, a mapping of arrays, a :class:`~qdebug.data.DataSource`, or
    ``None`` for seeded synthetic inputs. Memory stays flat in the number of samples. ``weight_cache``: weight
    results of earlier passes to reuse where nothing they depend on changed (:class:`WeightCache`). ``metric``: a
    task metric whose score against the float model the report carries (``report.task``; the same as
    :attr:`DebugOptions.task_metric`).
    """
    opts = _with_metric(options or DebugOptions(), metric)
    t0 = time.perf_counter()
    fm, f_path, f_sha = _load(float_model, "float model")
    qm, q_path, q_sha = _load(quant_model, "quantized model")
    try:
        pairing = pair_models(fm, qm)
    except ModelError as exc:  # the pairing sees protos only: name the files here
        raise _named(exc, f_path, q_path) from exc
    source = open_data(
        data,
        input_specs(fm),
        num_samples=opts.num_samples,
        seed=opts.seed,
        distribution=opts.distribution,
        input_shapes=opts.input_shapes,
        ignore=(*opts.ignore_data_keys, *((opts.task_label_key,) if opts.task_metric is not None else ())),
    )
    try:
        cap = _capture(fm, qm, pairing, source, opts, progress)
        task, task_note = _task(fm, qm, source, data, opts)
    except ModelError as exc:  # the engine sees protos only: name the files here
        raise _named(exc, f_path, q_path) from exc
    streaming = opts.selected(STREAMING_METRICS)
    activations = [_activation(j, a, cap, streaming) for j, a in enumerate(pairing.activations)]
    outputs = [_output(j, o, cap, streaming) for j, o in enumerate(pairing.outputs)]
    weights = _weight_results(pairing, fm, qm, opts, f_sha, weight_cache)
    summaries = Summaries(
        local=Summary.of([a.local_sqnr_db for a in activations if a.quantized]),
        cumulative=Summary.of([a.cumulative_sqnr_db for a in activations]),
        weight=Summary.of([w.weight_sqnr_db for w in weights]),
        output=Summary.of([o.cumulative_sqnr_db for o in outputs]),
    )
    warnings = [*pairing.warnings, *qdq_parameter_problems(qm), *filter(None, [task_note])]
    flagged = [a.tensor_name for a in activations if a.flagged]
    if flagged:
        warnings.append(f"{len(flagged)} tensor(s) hold NaN/Inf, first: {flagged[0]!r}")
    meta = _meta((f_path, q_path, f_sha, q_sha), source, cap, pairing, warnings, time.perf_counter() - t0)
    return DebugReport(
        activations=tuple(activations),
        weights=tuple(weights),
        model_outputs=tuple(outputs),
        summary=summaries,
        per_sample=PerSample(tuple(a.tensor_name for a in pairing.activations), cap.per_sample),
        per_sample_outputs=PerSample(tuple(o.output_name for o in pairing.outputs), cap.per_sample_outputs),
        meta=meta,
        task=task,
    )
