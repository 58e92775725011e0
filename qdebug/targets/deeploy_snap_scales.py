"""What every scale snapper of :mod:`qdebug.targets.deeploy_snap` shares: the model's scale constants and their
sharing-aware rewrites (:class:`_Scales`), the quantization of a node's input and output, the odd ``mul/2^k``
choices and the export's own choices they must agree with, and the record of one snap (:class:`SnappedScale`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.graph_index import GraphIndex, decode_constant
from qdebug.model_io import is_dq, is_q
from qdebug.targets.deeploy_fold import _PASS_THROUGH
from qdebug.targets.deeploy_rq import _INT32_LIMIT, _MAX_SHIFT

__all__ = ["SnappedScale"]


@dataclass(frozen=True)
class SnappedScale:
    """One snapped requantization: which node, which scale changed, the resulting ``mul/2^k``."""

    node: str
    op_type: str
    #: "weight" (Conv/Gemm/MatMul on the fine grid: the weight scale, per channel if so quantized) or "output"
    #: (GAP/Add; a biased per-tensor Conv/Gemm on the tie-free grid)
    what: str
    #: the scale tensor (initializer) now holding the snapped value
    scale: str
    shift: int
    mul_min: int
    mul_max: int
    #: largest |s' − s| / s over the scale's values
    rel_change: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _odd_muls(m: np.ndarray, k: int) -> np.ndarray:
    """The odd integers nearest to ``m·2^k`` (on the side of the exact value when the nearest is even)."""
    x = np.asarray(m, np.float64) * 2.0**k
    r = np.rint(x)
    even = (r % 2) == 0
    r = np.where(even, np.where(x >= r, r + 1, r - 1), r)
    return np.maximum(r, 1).astype(np.int64)


def _choose(m: np.ndarray, acc_max: np.ndarray | float, zp: int) -> tuple[np.ndarray, int] | None:
    """(odd mul, k) with the largest k inside the export's int32 budget (same test as the export's)."""
    for k in range(_MAX_SHIFT, -1, -1):
        mul = _odd_muls(m, k)
        if np.max(mul * acc_max) + (abs(zp) + 1) * 2.0**k < _INT32_LIMIT:
            return mul, k
    return None


def _export_choice(
    m: np.ndarray, acc_max: np.ndarray | float, zp: int, multiple_of: int = 1
) -> tuple[np.ndarray, int] | None:
    """What the export's ``_choose_requant`` will pick for these exact ratios."""
    for k in range(_MAX_SHIFT, -1, -1):
        mul = np.rint(m * 2.0**k / multiple_of) * multiple_of
        if np.max(mul * acc_max) + (abs(zp) + 1) * 2.0**k < _INT32_LIMIT and mul.min() >= 1:
            return mul.astype(np.int64), k
    return None


def _add_shift(ratio_max: float, zp: int) -> int:
    """The export's Add grid shift (``_integer_add``)."""
    k = 30
    while k > 0 and (ratio_max * 2.0**k * 256 * 2 + (abs(zp) + 1) * 2.0**k >= _INT32_LIMIT):
        k -= 1
    return k


class _Scales:
    """The model's constants, and rewrites of scale/bias tensors that respect sharing.

    Every input redirect goes through the model's :class:`~qdebug.graph_index.GraphIndex` (``ix.set_input``), so "who
    else reads this scale?" stays right after earlier snaps gave some readers their own copy.
    """

    def __init__(self, model: onnx.ModelProto, ix: GraphIndex) -> None:
        self.model = model
        self.ix = ix
        self.values: dict[str, np.ndarray] = {k: decode_constant(v) for k, v in ix.consts.items()}
        self.inits = {i.name: i for i in model.graph.initializer}

    def unique(self, base: str) -> str:
        used = set(self.values) | {t for n in self.model.graph.node for t in (*n.input, *n.output)}
        name, i = base, 0
        while name in used:
            i += 1
            name = f"{base}_{i}"
        return name

    def set(self, nodes: Sequence[onnx.NodeProto], slot: int, value: np.ndarray, base: str) -> str:
        """Give ``nodes``' input ``slot`` (all naming the same tensor) the constant ``value``.

        In place when that initializer has no other user; otherwise under a new initializer name.
        """
        old = str(nodes[0].input[slot])
        mine = {tuple(n.output) for n in nodes}  # outputs identify a node (protobuf wrappers are not stable)
        if old in self.inits and all(tuple(u.output) in mine for u in self.ix.consumers_of(old)):
            self.inits[old].CopyFrom(numpy_helper.from_array(value, old))
            self.values[old] = value
            return old
        name = self.unique(base)
        init = numpy_helper.from_array(value, name)
        self.model.graph.initializer.append(init)
        self.inits[name] = self.model.graph.initializer[-1]
        self.values[name] = value
        for n in nodes:
            self.ix.set_input(n, slot, name)
        return name


def _scalar_qparams(node: onnx.NodeProto, scales: _Scales) -> tuple[float, int] | None:
    s = scales.values.get(node.input[1])
    if s is None or s.size != 1:
        return None
    zp_arr = scales.values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int8)
    if zp_arr is None or zp_arr.dtype != np.int8:
        return None
    return float(s.reshape(())), int(zp_arr.reshape(()))


def _output_q(node: onnx.NodeProto, ix: GraphIndex) -> onnx.NodeProto | None:
    cur = node
    while True:
        users = ix.consumers_of(cur.output[0])
        if len(users) == 1 and users[0].op_type in ("Relu", "Clip"):
            cur = users[0]
            continue
        return users[0] if len(users) == 1 and is_q(users[0]) else None


def _scale_group(q: onnx.NodeProto, ix: GraphIndex, scales: _Scales) -> list[onnx.NodeProto]:
    """The Q of a tensor, its DQs, and the Q/DQs of the MaxPool/Reshape/Flatten chain after it sharing the scale
    (the same initializer, or one of the same value and zero point: QAT exports repeat the constants)."""

    def same(n: onnx.NodeProto) -> bool:
        return n.input[1] == q.input[1] or _scalar_qparams(n, scales) == _scalar_qparams(q, scales)

    group = [q]
    todo = [q]
    while todo:
        cur = todo.pop()
        for user in ix.consumers_of(cur.output[0]):
            if is_dq(user) and same(user):
                group.append(user)
                for op in ix.consumers_of(user.output[0]):
                    if op.op_type in _PASS_THROUGH:
                        for q2 in ix.consumers_of(op.output[0]):
                            if is_q(q2) and same(q2) and q2 not in group:
                                group.append(q2)
                                todo.append(q2)
    return group


def _act_in(name: str, ix: GraphIndex, scales: _Scales) -> tuple[onnx.NodeProto, float, int] | str:
    dq = ix.producer.get(name)
    while dq is not None and dq.op_type in _PASS_THROUGH and dq.input:
        dq = ix.producer.get(dq.input[0])  # an unquantized Reshape/Flatten/MaxPool keeps its input's grid
    if dq is None or not is_dq(dq) or dq.input[0] in scales.values:
        return f"input {name!r} is not a dequantized activation"
    qp = _scalar_qparams(dq, scales)
    if qp is None:
        return f"input {name!r} is not an int8 per-tensor activation"
    return dq, qp[0], qp[1]


def _act_out(node: onnx.NodeProto, ix: GraphIndex, scales: _Scales) -> tuple[onnx.NodeProto, float, int] | str:
    q = _output_q(node, ix)
    if q is None:
        return "its output is not quantized by a single QuantizeLinear"
    qp = _scalar_qparams(q, scales)
    if qp is None:
        return "its output is not an int8 per-tensor activation"
    return q, qp[0], qp[1]


def _set_output_scale(q: onnx.NodeProto, ix: GraphIndex, scales: _Scales, value: float, base: str) -> str:
    group = _scale_group(q, ix, scales)
    for n in group:  # members holding an equal value under another name now name q's initializer
        ix.set_input(n, 1, q.input[1])
    return scales.set(group, 1, np.array(value, np.float32), base)
