"""The state the Deeploy export's passes share: how an integer activation encodes real values (:class:`Activation`)
and the model being rewritten with what earlier passes learnt (:class:`GraphState`).

Both the export's passes (:mod:`qdebug.targets.deeploy_passes`, :mod:`qdebug.targets.deeploy_fold`) and the
transformer ops' (:mod:`qdebug.targets.deeploy_transformer`) read and write it, so it sits below both, with the
small node readers they all share (``_attrs``, ``_label``, ``_qparams``, ``_replace_input``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdebug.errors import TargetError
from qdebug.graph_index import GraphIndex

__all__ = ["Activation", "GraphState", "StatePass"]


@dataclass(frozen=True)
class Activation:
    """How an integer activation tensor encodes real values: ``real = scale·(stored + offset − zero_point)``."""

    scale: float
    zero_point: int
    offset: int  # stored = q − offset; −128 for shifted uint8 tensors, else 0

    @property
    def signed(self) -> bool:
        """int8 (True) or shifted uint8 (False)."""
        return self.offset == 0

    @property
    def residual_zp(self) -> int:
        """The zero point of the *stored* integers (0 for shifted tensors)."""
        return self.zero_point - self.offset

    @property
    def elem_type(self) -> int:
        """ONNX element type of the stored integers."""
        return TensorProto.INT8 if self.signed else TensorProto.UINT8


def _activation(scale: float, zero_point: int) -> Activation:
    return Activation(scale, zero_point, -128 if zero_point == -128 else 0)


@dataclass
class GraphState:
    """What the passes share: the model being rewritten and what earlier passes learnt about its tensors."""

    model: onnx.ModelProto
    #: integer constants taken from DQ(int const): DQ output name → (integers, scale per output channel or scalar)
    weights: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: integer activation tensors → their encoding
    acts: dict[str, Activation] = field(default_factory=dict)
    #: integer compute node name → residual zero point of its activation input still to fold
    pending_zp: dict[str, int] = field(default_factory=dict)
    #: graph output name → the integer tensor that will replace it (set by the RequantShift pass)
    output_sources: dict[str, str] = field(default_factory=dict)
    #: graph input/output name → encoding (for inputs.npz / the reference comparison)
    inputs: dict[str, Activation] = field(default_factory=dict)
    outputs: dict[str, Activation] = field(default_factory=dict)
    #: RequantShift node → worst relative error |mul/div − M| / M of its multiplier
    requant_errors: dict[str, float] = field(default_factory=dict)
    #: RequantShift after Conv/Gemm/MatMul → (exact multiplier M per channel, output zero point, worst-case |acc|)
    requant_targets: dict[str, tuple[np.ndarray, int, np.ndarray]] = field(default_factory=dict)
    #: real values of constants that are not weights (biases added, scalar factors): DQ output name → values
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    #: Deeploy's LayerNorm form: "iLayerNorm" (Generic) or "iRMSNorm" (centring MatMul + iRMSNorm: Siracusa)
    layernorm: str = "iLayerNorm"
    #: MatMul operands must be int8 (PULPOpen/Siracusa): uint8 ones are re-encoded (``deeploy_transformer``)
    int8_matmul: bool = False
    #: the Deeploy platform the network is for (``deeploy_export.PLATFORM_FORMS``)
    platform: str = "Generic"
    #: static tensor shapes of the QDQ model as given (ONNX inference on the rewritten graph loses some)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    #: integer input samples (quantized values q by input name) for data-driven passes and the comparison
    samples: list[dict[str, np.ndarray]] = field(default_factory=list)

    @property
    def graph(self) -> onnx.GraphProto:
        """The graph being rewritten."""
        return self.model.graph

    def index(self) -> GraphIndex:
        """The producer/consumer/constant index of the graph as it is now (a pass builds it once, before it
        rewrites; its node objects are the graph's own, so in-place edits of them edit the graph)."""
        return GraphIndex(self.model)

    def consts(self) -> dict[str, np.ndarray]:
        """Every initializer decoded."""
        return {i.name: numpy_helper.to_array(i) for i in self.graph.initializer}

    def set_const(self, name: str, value: np.ndarray) -> None:
        """Add or replace an initializer."""
        for i, t in enumerate(self.graph.initializer):
            if t.name == name:
                self.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, name))
                return
        self.graph.initializer.append(numpy_helper.from_array(value, name))

    def unique(self, base: str) -> str:
        """A tensor name not used yet."""
        used = {i.name for i in self.graph.initializer} | {t for n in self.graph.node for t in (*n.input, *n.output)}
        name, k = base, 0
        while name in used:
            k += 1
            name = f"{base}_{k}"
        return name


#: An export pass: rewrites ``state.model`` in place, records what it learnt in ``state``, returns its change count.
StatePass = Callable[[GraphState], int]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} node {node.name or node.output[0]!r}"


def _qparams(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of a Q/DQ node; ORT always puts them in initializers or Constant nodes."""
    if node.input[1] not in consts:
        raise TargetError(f"{_label(node)}: its scale {node.input[1]!r} is not a constant")
    scale = np.asarray(consts[node.input[1]], dtype=np.float64)
    zp = np.asarray(consts[node.input[2]]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int8)
    return scale, zp


def _replace_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    for n in graph.node:
        for i, t in enumerate(n.input):
            if t == old:
                n.input[i] = new
    for o in graph.output:
        if o.name == old:
            o.name = new
