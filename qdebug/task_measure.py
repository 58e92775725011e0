"""A task metric measured: the float and the quantized model run sample by sample on ONNX Runtime (CPU, graph
optimizations off: the QDQ model runs as written, as ``qdebug debug`` runs it), each sample's outputs folded into the
metric's state (:mod:`qdebug.task_metrics`), one sample in memory at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.data import DataSource, open_data, read_labels
from qdebug.errors import DataError, ModelError
from qdebug.io import open_input
from qdebug.model_io import input_specs, load_model
from qdebug.ort import make_session, ort_errors, ort_message
from qdebug.task_metrics import MetricSpec, load_metric
from qdebug.task_score import State, TaskMetric, TaskScore

__all__ = ["labels_for", "measure_task", "task_state"]

ModelLike = str | Path | onnx.ModelProto
DataLike = str | Path | Mapping[str, np.ndarray] | DataSource | None
CPU = ("CPUExecutionProvider",)


def _proto(model: ModelLike, role: str) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else load_model(model, role)


def _has_key(path: Path, key: str) -> bool:
    with open_input(path) as fh, np.load(fh, allow_pickle=False) as npz:
        return key in npz.files


def labels_for(data: DataLike, key: str, n: int, needed: bool) -> np.ndarray | None:
    """The labels of ``data`` under ``key`` (one per sample, ``n`` of them): read when ``data`` is one ``.npz``
    file that holds them; ``None`` otherwise, unless ``needed`` (a metric that scores labels), which makes a missing
    array — or data that is not one labelled ``.npz`` — a :class:`~qdebug.errors.DataError` naming it."""
    path = Path(data) if isinstance(data, str | Path) else None
    if path is None or path.is_dir() or path.suffix.lower() != ".npz":
        if needed:
            what = path if path is not None else "the data"
            raise DataError(f"{what}: a task metric on labels reads them from one .npz file (array {key!r})")
        return None
    if not needed and not _has_key(path, key):
        return None
    labels = read_labels(path, key)
    if labels.shape[0] < n:
        raise DataError(f"{path}: label array {key!r}: {labels.shape[0]} labels for {n} samples")
    return labels


def task_state(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    source: DataSource,
    metric: TaskMetric,
    labels: Sequence[Any] | np.ndarray | None = None,
    start: int = 0,
) -> State:
    """The metric's state over every sample of ``source`` (``labels[start + i]`` is sample *i*'s label): both
    models on ONNX Runtime CPU with optimizations off, every float output the quantized model also has. Errors of a
    run are :class:`~qdebug.errors.ModelError` naming the model and the sample."""
    fs: Any = make_session(float_model, CPU, role="float model")
    qs: Any = make_session(quant_model, CPU, role="quantized model")
    have = {o.name for o in qs.get_outputs()}
    names = [o.name for o in fs.get_outputs() if o.name in have]
    if not names:
        raise ModelError("the float and the quantized model share no output name: a task metric compares outputs")
    state = metric.start()
    for i, sample in enumerate(source):
        outs = []
        for sess, role in ((fs, "float model"), (qs, "quantized model")):
            try:
                outs.append(dict(zip(names, sess.run(names, sample), strict=True)))
            except ort_errors() as exc:
                raise ModelError(f"ONNX Runtime failed on sample {i}: {ort_message(exc)}", role=role) from exc
        label = None if labels is None else np.asarray(labels[start + i])
        state = metric.update(state, outs[0], outs[1], label)
    return state


def measure_task(
    float_model: ModelLike,
    qdq_model: ModelLike,
    data: DataLike,
    metric: MetricSpec,
    *,
    num_samples: int | None = None,
    labels_key: str = "label",
    labels: Sequence[Any] | np.ndarray | None = None,
    seed: int = 0,
) -> TaskScore:
    """``metric`` (a name, ``"module:function"``, a callable or a :class:`~qdebug.task_metrics.TaskMetric`:
    :func:`~qdebug.task_metrics.load_metric`) of the quantized model against the float model on ``data`` — an
    ``.npz`` (its ``labels_key`` array, when there is one, gives the labels; it is not a model input), a folder of
    them, arrays by input name, a :class:`~qdebug.data.DataSource`, or ``None`` for seeded synthetic samples — the
    first ``num_samples`` of it. ``labels`` (one per sample) overrides the file's. Memory does not grow with the
    number of samples."""
    fm = _proto(float_model, "float model")
    qm = _proto(qdq_model, "quantized model")
    m = load_metric(metric, fm)
    source = open_data(data, input_specs(fm), num_samples=num_samples, seed=seed, ignore=(labels_key,))
    if labels is None:
        labels = labels_for(data, labels_key, len(source), m.needs_labels)
    elif len(labels) < len(source):
        raise DataError(f"{len(labels)} labels for {len(source)} samples")
    return m.score(task_state(fm, qm, source, m, labels))
