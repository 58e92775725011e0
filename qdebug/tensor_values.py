"""Engine functions the views need beyond the report: one tensor's values on demand, and which activation
tensor "owns" the weights of a node that has no captured output of its own."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qdebug.data import DataSource
from qdebug.graph_index import GraphIndex
from qdebug.ort import expose_outputs, make_session
from qdebug.pairing import pair_models, weight_arrays

__all__ = ["TensorValues", "WeightValues", "tensor_values", "weight_owners", "weight_values"]


@dataclass(frozen=True)
class TensorValues:
    """One tensor of one sample in both models, with the quantization parameters of its Q/DQ pair."""

    name: str
    float_values: np.ndarray
    quant_values: np.ndarray
    scale: float | None
    zero_point: int | None

    def __iter__(self) -> Iterator[Any]:
        # Unpacks as (float_values, quant_values, scale, zero_point), the order the histogram figure takes.
        return iter((self.float_values, self.quant_values, self.scale, self.zero_point))


def _sample(source: DataSource, index: int) -> Mapping[str, np.ndarray]:
    if not 0 <= index < len(source):
        raise IndexError(f"sample {index} out of range: the data has {len(source)} sample(s)")
    return next(s for i, s in enumerate(source) if i == index)


def tensor_values(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    tensors: tuple[str, str],
    source: DataSource,
    sample: int = 0,
    *,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    params: tuple[float | None, int | None] = (None, None),
) -> TensorValues:
    """The values of ``tensors`` = (float tensor, its quantized model counterpart) on sample ``sample``: each is
    exposed as an extra output of its model and one sample is run (optimizations off, as in the debug pass)."""
    feed = dict(_sample(source, sample))
    values = []
    for model, tensor in ((float_model, tensors[0]), (quant_model, tensors[1])):
        sess: Any = make_session(expose_outputs(model, [tensor]), providers)
        inputs = {i.name for i in sess.get_inputs()}
        values.append(np.asarray(sess.run([tensor], {k: v for k, v in feed.items() if k in inputs})[0]))
    return TensorValues(tensors[0], values[0], values[1], *params)


def weight_owners(model: onnx.ModelProto, activations: Iterable[str]) -> dict[str, str]:
    """``{node name: activation tensor}`` for nodes whose output is not itself one of ``activations``.

    A Conv fused with its Relu has no quantized output of its own (only the Relu's output is captured), so its
    weights would have no tensor in the views. This follows such a node's output forward through single-consumer
    nodes to the first tensor that is an activation.
    """
    names = set(activations)
    index = GraphIndex(model)
    out: dict[str, str] = {}
    for n in index.nodes:
        node = n
        for _ in range(8):  # a fused chain is short (Conv → BatchNorm → Relu); bounded against odd graphs
            if not node.output:
                break
            t = node.output[0]
            if t in names:
                if node is not n:
                    out[n.name or n.output[0]] = t
                break
            nxt = index.consumers_of(t)
            if len(nxt) != 1:
                break
            node = nxt[0]
    return out


@dataclass(frozen=True)
class WeightValues:
    """One quantized weight (or bias) of a node: float values, dequantized values, the per-channel axis."""

    name: str
    kind: str
    float_values: np.ndarray
    quant_values: np.ndarray
    axis: int | None


def weight_values(
    float_model: onnx.ModelProto, quant_model: onnx.ModelProto, nodes: Iterable[str]
) -> list[WeightValues]:
    """Every quantized weight consumed by one of ``nodes`` (node names of the float model), weights first."""
    wanted = set(nodes)
    pairs = [w for w in pair_models(float_model, quant_model).weights if w.consumer_node in wanted]
    if not pairs:
        return []
    fi, qi = GraphIndex(float_model), GraphIndex(quant_model)
    out = [WeightValues(w.weight_name, w.kind, *weight_arrays(w, fi, qi), w.params.axis) for w in pairs]
    return sorted(out, key=lambda v: v.kind != "weight")
