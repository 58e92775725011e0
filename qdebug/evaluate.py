"""Top-1 accuracy of a classifier on a labelled ``.npz`` evaluation set (ORT, default optimizations), and the check
of such a set before any work (:func:`check_eval_set`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx

from qdebug.data import NpzData, read_labels
from qdebug.model_io import input_specs, load_model

__all__ = ["check_eval_set", "num_classes", "top1_accuracy"]


def _dims(value: onnx.ValueInfoProto) -> list[int | None] | None:
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim]


def num_classes(model: onnx.ModelProto, tensor: str | None = None) -> int | None:
    """How many scores top-1 takes the argmax of: the elements of one sample of the model's first output (or of
    ``tensor``) — a leading dimension that is not fixed is the batch, one per sample. ``None`` when another
    dimension is only known once the model runs."""
    g = model.graph
    name = tensor if tensor is not None else (g.output[0].name if g.output else None)
    info = next((v for v in (*g.output, *g.value_info) if v.name == name), None)
    if info is None and name is not None:  # an inner tensor (a region's end): its shape is inferred
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # a model shape inference cannot read: the count is unknown
            return None
        info = next((v for v in (*inferred.output, *inferred.value_info) if v.name == name), None)
    dims = None if info is None else _dims(info)
    if dims is None:
        return None
    if dims and dims[0] is None:
        dims = dims[1:]
    if any(d is None for d in dims):
        return None
    return math.prod(d for d in dims if d is not None)


def check_eval_set(
    model: str | Path | onnx.ModelProto, eval_npz: str | Path, label_key: str = "label", *, scores: str | None = None
) -> int:
    """What :func:`top1_accuracy` asks of ``eval_npz``, asked before any work: the model's inputs (names, shapes,
    finite values) and one class index per sample under ``label_key``, below the number of classes when it is known
    (:func:`num_classes` of the first output, or of the tensor ``scores``: a region's end). Raises the error top-1
    would raise (:class:`~qdebug.errors.DataError` naming the file and the array); returns the sample count."""
    m = model if isinstance(model, onnx.ModelProto) else load_model(model, "float model")
    data = NpzData(eval_npz, input_specs(m), ignore=(label_key,))
    read_labels(eval_npz, label_key, len(data), num_classes(m, scores))
    return len(data)


def top1_accuracy(model_path: str | Path, eval_npz: str | Path, label_key: str = "label") -> float:
    """Fraction of samples whose argmax over the first output equals the label."""
    import onnxruntime as ort

    model = load_model(model_path)
    data = NpzData(eval_npz, input_specs(model), ignore=(label_key,))
    labels = read_labels(eval_npz, label_key, len(data), num_classes(model))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out_name = sess.get_outputs()[0].name
    hits = 0
    for i, sample in enumerate(data):
        logits = sess.run([out_name], sample)[0]
        hits += int(int(np.argmax(logits.reshape(-1))) == int(labels[i]))
    return hits / len(data)
