"""Top-1 accuracy of a classifier on a labelled ``.npz`` evaluation set (ORT, default optimizations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qdebug.data import NpzData, read_labels
from qdebug.graph import input_specs, load_model


def top1_accuracy(model_path: str | Path, eval_npz: str | Path, label_key: str = "label") -> float:
    """Fraction of samples whose argmax over the first output equals the label."""
    import onnxruntime as ort

    model = load_model(model_path)
    data = NpzData(eval_npz, input_specs(model), ignore=(label_key,))
    labels = read_labels(eval_npz, label_key, len(data))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out_name = sess.get_outputs()[0].name
    hits = 0
    for i, sample in enumerate(data):
        logits = sess.run([out_name], sample)[0]
        hits += int(int(np.argmax(logits.reshape(-1))) == int(labels[i]))
    return hits / len(data)
