"""Make an int8 QDQ model requantization-exact for Deeploy by snapping its scales (as PULP QAT flows do).

Why. Deeploy requantizes every accumulator with an int32 ``RequantShift``:
``y = clip(floor((acc·mul + add + div/2) / div))`` with ``div = 2^k``. The exact ratio of a layer is
``M = s_in·s_w/s_out``; ONNX Runtime's QDQ model computes ``round(acc·M)`` (in float32), the export computes it with
``mul = round(M·2^k)``. On wide layers the int32 headroom leaves ``mul`` only ~11–12 bits, a relative error of
~1e-4 that flips a rounding in ~1 % of the elements per layer (docs/deeploy.md). Snapping changes the QDQ model
itself, by at most ~2^-11 relative per scale, so that every ratio *is* ``mul/2^k`` with a ``mul`` inside the int32
budget: the integer network and the (snapped) QDQ model then round the same real number.

What is snapped, node by node in topological order (a consumer sees its input's already-snapped scale):

- **Conv / Gemm / MatMul**: the *weight* scale, per output channel when the weights are per channel (a single
  output scale cannot make every channel's ``M`` dyadic). ``s_w' = mul·s_out/(s_in·2^k)``; the int8 weights stay;
  the int32 bias is requantized to the new bias scale ``s_in·s_w'`` (``round(b·s_b/(s_in·s_w'))``).
- **GlobalAveragePool** (exported as an all-ones depthwise Conv of weight scale ``1/(H·W)``): it has no weight
  scale, so its *output* scale is snapped: ``s_out' = s_in·2^k/(H·W·mul)``.
- **Add**: the output scale, so that the larger input ratio ``s_a/s_out`` is exactly ``mul_a/2^k`` (the export's
  Add brings both inputs to that 2^k-finer grid); the other ratio keeps a ~22-bit ``mul_b`` (error ≤ 2^-23).
- MaxPool / Reshape / Flatten share their input's scale: when an output scale changes, every Q/DQ of the
  pass-through chain after it changes with it.

``k`` is the largest shift the export's own budget allows (``|acc|max·mul + (|zp|+1)·2^k < 2^31``, with the exact
worst-case accumulator, bias included), and ``mul`` is made **odd**: with ``M = odd/2^k`` an exact rounding tie
(where ONNX Runtime rounds half to even and Deeploy half up) needs ``acc ≡ c (mod 2^k)``, probability ~2^-k. An
``M`` that is already an integer (no rounding at all, e.g. an Add whose input and output scales are equal) is kept.

Scale initializers shared with tensors outside what is snapped get their own copies; the input model is never
modified (a new model is returned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.graph import constant_values, decode_constant, is_dq, is_q, topological_nodes
from qdebug.targets.deeploy_export import (
    _INT32_LIMIT,
    _MAX_SHIFT,
    _PASS_THROUGH,
    Activation,
    _accumulator_bound,
    _activation,
    _attrs,
    _consumers,
    _producers,
    _static_shapes,
)

__all__ = ["SNAPPED_OPS", "SnapReport", "SnappedScale", "snap_scales_for_deeploy"]

#: The ops whose requantization ratio is snapped.
SNAPPED_OPS = ("Conv", "Gemm", "MatMul", "GlobalAveragePool", "Add")


@dataclass(frozen=True)
class SnappedScale:
    """One snapped requantization: which node, which scale changed, the resulting ``mul/2^k``."""

    node: str
    op_type: str
    #: "weight" (Conv/Gemm/MatMul: the weight scale, per channel if so quantized) or "output" (GAP/Add)
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


@dataclass(frozen=True)
class SnapReport:
    """What :func:`snap_scales_for_deeploy` changed."""

    snapped: tuple[SnappedScale, ...]
    #: nodes of a snappable op type left alone, with the reason (the export names the real problem later)
    skipped: tuple[str, ...]

    @property
    def max_rel_change(self) -> float:
        """The largest relative change of any scale."""
        return max((s.rel_change for s in self.snapped), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "snapped": [s.to_dict() for s in self.snapped],
            "skipped": list(self.skipped),
            "max_rel_change": self.max_rel_change,
        }


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


def _export_choice(m: np.ndarray, acc_max: np.ndarray | float, zp: int) -> tuple[np.ndarray, int] | None:
    """What the export's ``_choose_requant`` will pick for these exact ratios."""
    for k in range(_MAX_SHIFT, -1, -1):
        mul = np.rint(m * 2.0**k)
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
    """The model's constants, and rewrites of scale/bias tensors that respect sharing."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.values: dict[str, np.ndarray] = {k: decode_constant(v) for k, v in constant_values(model).items()}
        self.inits = {i.name: i for i in model.graph.initializer}

    def users(self, name: str) -> list[onnx.NodeProto]:
        return [n for n in self.model.graph.node if name in n.input]

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
        if old in self.inits and all(tuple(u.output) in mine for u in self.users(old)):
            self.inits[old].CopyFrom(numpy_helper.from_array(value, old))
            self.values[old] = value
            return old
        name = self.unique(base)
        init = numpy_helper.from_array(value, name)
        self.model.graph.initializer.append(init)
        self.inits[name] = self.model.graph.initializer[-1]
        self.values[name] = value
        for n in nodes:
            n.input[slot] = name
        return name


def _scalar_qparams(node: onnx.NodeProto, scales: _Scales) -> tuple[float, int] | None:
    s = scales.values.get(node.input[1])
    if s is None or s.size != 1:
        return None
    zp_arr = scales.values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int8)
    if zp_arr is None or zp_arr.dtype != np.int8:
        return None
    return float(s.reshape(())), int(zp_arr.reshape(()))


def _output_q(node: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]]) -> onnx.NodeProto | None:
    cur = node
    while True:
        users = consumers.get(cur.output[0], [])
        if len(users) == 1 and users[0].op_type in ("Relu", "Clip"):
            cur = users[0]
            continue
        return users[0] if len(users) == 1 and is_q(users[0]) else None


def _scale_group(q: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """The Q of a tensor, its DQs, and the Q/DQs of the MaxPool/Reshape/Flatten chain after it sharing the scale."""
    group = [q]
    todo = [q]
    while todo:
        cur = todo.pop()
        for user in consumers.get(cur.output[0], []):
            if is_dq(user) and user.input[1] == q.input[1]:
                group.append(user)
                for op in consumers.get(user.output[0], []):
                    if op.op_type in _PASS_THROUGH:
                        for q2 in consumers.get(op.output[0], []):
                            if is_q(q2) and q2.input[1] == q.input[1] and q2 not in group:
                                group.append(q2)
                                todo.append(q2)
    return group


def snap_scales_for_deeploy(
    qdq: onnx.ModelProto, *, ops: Sequence[str] = SNAPPED_OPS
) -> tuple[onnx.ModelProto, SnapReport]:
    """A copy of the int8 QDQ model ``qdq`` whose requantization ratios are exactly ``odd mul / 2^k`` inside
    Deeploy's int32 budget (module docstring), and what changed. ``ops`` limits which op types are snapped.

    Nodes this cannot read (16-bit or per-channel activations, non-constant weights, ...) are skipped and listed
    in the report; the export then refuses them with its own message.
    """
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    g = model.graph
    scales = _Scales(model)
    producers, consumers = _producers(g), _consumers(g)
    shapes = _static_shapes(model)
    snapped: list[SnappedScale] = []
    skipped: list[str] = []
    for node in topological_nodes(g):
        if node.op_type not in ops or node.domain not in ("", "ai.onnx"):
            continue
        label = f"{node.op_type} {node.name or node.output[0]!r}"
        try:
            if node.op_type == "Add":
                res = _snap_add(node, producers, consumers, scales)
            elif node.op_type == "GlobalAveragePool":
                res = _snap_gap(node, producers, consumers, scales, shapes)
            else:
                res = _snap_linear(node, producers, consumers, scales)
        except (KeyError, IndexError, ValueError) as exc:
            res = f"{type(exc).__name__}: {exc}"
        if isinstance(res, str):
            skipped.append(f"{label}: {res}")
        else:
            snapped.append(res)
    return model, SnapReport(tuple(snapped), tuple(skipped))


def _act_in(
    name: str, producers: Mapping[str, onnx.NodeProto], scales: _Scales
) -> tuple[onnx.NodeProto, float, int] | str:
    dq = producers.get(name)
    while dq is not None and dq.op_type in _PASS_THROUGH and dq.input:
        dq = producers.get(dq.input[0])  # an unquantized Reshape/Flatten/MaxPool keeps its input's grid
    if dq is None or not is_dq(dq) or dq.input[0] in scales.values:
        return f"input {name!r} is not a dequantized activation"
    qp = _scalar_qparams(dq, scales)
    if qp is None:
        return f"input {name!r} is not an int8 per-tensor activation"
    return dq, qp[0], qp[1]


def _act_out(
    node: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]], scales: _Scales
) -> tuple[onnx.NodeProto, float, int] | str:
    q = _output_q(node, consumers)
    if q is None:
        return "its output is not quantized by a single QuantizeLinear"
    qp = _scalar_qparams(q, scales)
    if qp is None:
        return "its output is not an int8 per-tensor activation"
    return q, qp[0], qp[1]


def _snap_linear(
    node: onnx.NodeProto,
    producers: Mapping[str, onnx.NodeProto],
    consumers: Mapping[str, list[onnx.NodeProto]],
    scales: _Scales,
) -> SnappedScale | str:
    """Conv/Gemm/MatMul: snap the weight scale (per channel if so) and requantize the bias to s_in·s_w'."""
    x = _act_in(node.input[0], producers, scales)
    if isinstance(x, str):
        return x
    out = _act_out(node, consumers, scales)
    if isinstance(out, str):
        return out
    _, s_in, zp_in = x
    _, s_out, zp_out = out
    w_dq = producers.get(node.input[1])
    if w_dq is None or not is_dq(w_dq) or w_dq.input[0] not in scales.values:
        return "its weight is not a dequantized constant"
    shared = [t for t in (w_dq.output[0], *node.input[2:3]) if t and len(consumers.get(t, [])) > 1]
    if shared:  # one weight scale cannot be snapped for two different ratios
        return f"{shared[0]!r} is read by several nodes"
    w = scales.values[w_dq.input[0]]
    s_w = np.asarray(scales.values[w_dq.input[1]], np.float64)
    if w.dtype != np.int8:
        return f"its weight is {w.dtype}, not int8"
    a = _attrs(node)
    if node.op_type == "Gemm" and (a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0):
        return "Gemm with transA or alpha/beta ≠ 1"
    out_axis = 0 if node.op_type == "Conv" or (node.op_type == "Gemm" and a.get("transB", 0)) else 1
    channels = int(w.shape[out_axis])
    bias_dq = producers.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    b_int = np.zeros(channels, np.int64)
    s_b = np.ones(channels, np.float64)
    if bias_dq is not None:
        if not is_dq(bias_dq) or bias_dq.input[0] not in scales.values:
            return "its bias is not a dequantized int32 constant"
        b_int = scales.values[bias_dq.input[0]].astype(np.int64).reshape(-1)
        s_b = np.broadcast_to(np.asarray(scales.values[bias_dq.input[1]], np.float64).reshape(-1), (channels,))
    in_act: Activation = _activation(s_in, zp_in)
    zp_res = _activation(s_out, zp_out).residual_zp
    m = np.broadcast_to(s_in * s_w.reshape(-1) / s_out, (channels,)).astype(np.float64)
    if np.all(m >= 1) and np.all(m == np.rint(m)):
        return "its ratio is an integer (nothing rounds)"
    m_exact = m.copy()
    b_new = b_int
    for _ in range(6):  # the bias (part of the budget) moves with s_w': settle on a k the export will also pick
        acc_max = _accumulator_bound(w, out_axis, in_act, b_new)
        choice = _choose(m_exact, acc_max, zp_res)
        if choice is None:
            return f"ratio {float(m_exact.max()):.3g} does not fit int32 RequantShift"
        mul, k = choice
        s_w_new = (mul.astype(np.float64) * s_out / (s_in * 2.0**k)).astype(np.float32)
        if s_w.size == 1:
            if np.unique(mul).size != 1:
                raise ValueError("per-tensor weight scale with per-channel ratios")
            s_w_new = s_w_new[:1]
        b_scale_new = (s_in * s_w_new.astype(np.float64)).astype(np.float32)
        b_new = np.rint(b_int * s_b / np.broadcast_to(b_scale_new.astype(np.float64), (channels,))).astype(np.int64)
        m_got = np.broadcast_to(s_in * s_w_new.astype(np.float64) / s_out, (channels,))
        check = _export_choice(m_got, _accumulator_bound(w, out_axis, in_act, b_new), zp_res)
        if check is not None and check[1] == k and np.array_equal(check[0], np.broadcast_to(mul, (channels,))):
            break
        if check is not None:
            m_exact = check[0] / 2.0 ** check[1]  # the export wants another k: snap to that one
    else:
        return "no k on which the export and the snapping agree"
    label = node.name or node.output[0]
    w_scale_value = s_w_new.reshape(()) if s_w.ndim == 0 else s_w_new.reshape(s_w.shape)
    w_name = scales.set([w_dq], 1, w_scale_value, f"{label}_w_scale_snapped")
    if bias_dq is not None:
        s_b_arr = np.asarray(scales.values[bias_dq.input[1]])
        b_scale_value = (
            b_scale_new.reshape(())
            if s_b_arr.ndim == 0
            else np.broadcast_to(b_scale_new, s_b_arr.shape).astype(np.float32)
        )
        if np.abs(b_new).max(initial=0) >= _INT32_LIMIT:
            return "the requantized bias overflows int32"
        scales.set([bias_dq], 1, b_scale_value, f"{label}_b_scale_snapped")
        scales.set([bias_dq], 0, b_new.reshape(scales.values[bias_dq.input[0]].shape).astype(np.int32),
                   f"{label}_b_snapped")  # fmt: skip
    rel = float(np.max(np.abs(s_w_new.astype(np.float64) - s_w.reshape(-1)) / s_w.reshape(-1)))
    return SnappedScale(label, node.op_type, "weight", w_name, k, int(mul.min()), int(mul.max()), rel)


def _set_output_scale(
    q: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]], scales: _Scales, value: float, base: str
) -> str:
    group = _scale_group(q, consumers)
    return scales.set(group, 1, np.array(value, np.float32), base)


def _snap_gap(
    node: onnx.NodeProto,
    producers: Mapping[str, onnx.NodeProto],
    consumers: Mapping[str, list[onnx.NodeProto]],
    scales: _Scales,
    shapes: Mapping[str, list[int]],
) -> SnappedScale | str:
    """GlobalAveragePool: M = s_in/(H·W·s_out); snap s_out."""
    x = _act_in(node.input[0], producers, scales)
    if isinstance(x, str):
        return x
    out = _act_out(node, consumers, scales)
    if isinstance(out, str):
        return out
    _, s_in, zp_in = x
    q, s_out, zp_out = out
    shape = shapes.get(node.input[0])
    if shape is None or len(shape) != 4:
        return f"needs a static 4-D input shape, got {shape}"
    c, hw = shape[1], shape[2] * shape[3]
    in_act = _activation(s_in, zp_in)
    zp_res = _activation(s_out, zp_out).residual_zp
    acc_max = _accumulator_bound(np.ones((c, 1, shape[2], shape[3]), np.int8), 0, in_act, np.zeros(c, np.int64))
    m = np.array([s_in / hw / s_out])
    for _ in range(6):
        choice = _choose(m, acc_max, zp_res)
        if choice is None:
            return f"ratio {float(m[0]):.3g} does not fit int32 RequantShift"
        mul, k = choice
        s_new = float(np.float32(s_in * 2.0**k / (hw * float(mul[0]))))
        check = _export_choice(np.array([s_in * (1.0 / hw) / s_new]), acc_max, zp_res)
        if check is not None and check[1] == k and int(check[0][0]) == int(mul[0]):
            break
        if check is not None:
            m = check[0] / 2.0 ** check[1]
    else:
        return "no k on which the export and the snapping agree"
    label = node.name or node.output[0]
    name = _set_output_scale(q, consumers, scales, s_new, f"{q.output[0]}_scale_snapped")
    return SnappedScale(label, node.op_type, "output", name, k, int(mul[0]), int(mul[0]), abs(s_new - s_out) / s_out)


def _snap_add(
    node: onnx.NodeProto,
    producers: Mapping[str, onnx.NodeProto],
    consumers: Mapping[str, list[onnx.NodeProto]],
    scales: _Scales,
) -> SnappedScale | str:
    """Add: snap s_out so that the larger ratio s_a/s_out is odd/2^k on the export's grid (kept if both are
    integers: then nothing rounds)."""
    if len(node.input) != 2:
        return "Add needs two inputs"
    ins = [_act_in(t, producers, scales) for t in node.input]
    out = _act_out(node, consumers, scales)
    for v in (*ins, out):
        if isinstance(v, str):
            return v
    s_a, s_b = (float(v[1]) for v in ins if not isinstance(v, str))
    assert not isinstance(out, str)
    q, s_out, zp_out = out
    ratios = np.array([s_a, s_b]) / s_out
    if np.all(ratios == np.rint(ratios)):
        return "both input/output ratios are integers (exact already)"
    zp_res = _activation(s_out, zp_out).residual_zp
    anchor = float(max(s_a, s_b))
    s_new = s_out
    k = _add_shift(float(ratios.max()), zp_res)
    for _ in range(6):
        mul = int(_odd_muls(np.array([anchor / s_new]), k)[0])
        s_try = float(np.float32(anchor * 2.0**k / mul))
        k2 = _add_shift(max(s_a, s_b) / s_try, zp_res)
        if k2 == k and int(np.rint(anchor / s_try * 2.0**k)) == mul:
            s_new = s_try
            break
        k = k2
    else:
        return "no k on which the export and the snapping agree"
    label = node.name or node.output[0]
    name = _set_output_scale(q, consumers, scales, s_new, f"{q.output[0]}_scale_snapped")
    return SnappedScale(label, node.op_type, "output", name, k, mul, mul, abs(s_new - s_out) / s_out)
