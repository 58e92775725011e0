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

**Tie-free grid** (``grid="tie_free"``, the default). With the fine grid above the exact pre-rounding values of a
wide layer lie on a 2^-19–2^-20 LSB grid, so a few lie within ONNX Runtime's float32 error (measured up to ~3e-5
LSB) of a rounding half, and ORT's QDQ run rounds them the other way (``digits_cnn``: 8 of 5,400 logits differ). A
biased **Conv / Gemm with a per-tensor weight scale** is instead snapped to a coarse grid: ``M = mul/2^k`` with
``k ≤ tie_free_shift`` (13: ``mul`` ≈ 8–60), by moving its *output* scale, ``s_out' = s_in·s_w·2^k/mul`` (the
layer's gain stays, only its output grid moves; up to ``0.5/mul`` relative, rounded so that it never grows past an
absorbed Relu/Clip), and its bias becomes an **odd**
integer on the half-unit scale ``s_in·s_w/2``. Every exact value is then ``(2·acc + b)·mul/2^(k+1)`` = odd/2^(k+1)
LSB: never a tie, and at least ``2^-(k+1)`` (6.1e-5 for k=13) from a rounding half. The export puts the bias's
integer part in the Conv/Gemm and its half (``mul/2`` with an even ``mul``) in the RequantShift add. Per-channel
weights (a per-channel gain change of up to 0.5/mul), unbiased Conv/Gemm, MatMul, GlobalAveragePool and Add keep
the fine grid.

Scale initializers shared with tensors outside what is snapped get their own copies; the input model is never
modified (a new model is returned).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.graph_index import GraphIndex, decode_constant
from qdebug.model_io import is_dq, is_q
from qdebug.targets.deeploy_fold import _PASS_THROUGH, _accumulator_bound, _static_shapes
from qdebug.targets.deeploy_graph import Activation, _activation, _attrs
from qdebug.targets.deeploy_rq import _INT32_LIMIT, _MAX_SHIFT

__all__ = ["GRIDS", "SNAPPED_OPS", "TIE_FREE_SHIFT", "SnapReport", "SnappedScale", "snap_scales_for_deeploy"]

#: The ops whose requantization ratio is snapped.
SNAPPED_OPS = ("Conv", "Gemm", "MatMul", "GlobalAveragePool", "Add", "Mul", "Div", "ReduceMean")


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


@dataclass(frozen=True)
class SnapReport:
    """What :func:`snap_scales_for_deeploy` changed."""

    snapped: tuple[SnappedScale, ...]
    #: nodes of a snappable op type left alone, with the reason (the export names the real problem later)
    skipped: tuple[str, ...]
    #: "tie_free" or "fine" (:data:`GRIDS`)
    grid: str = "fine"

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
            "grid": self.grid,
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

    Every input redirect goes through the model's :class:`~qdebug.pairing.GraphIndex` (``ix.set_input``), so "who
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


#: The grids :func:`snap_scales_for_deeploy` can snap to (module docstring).
GRIDS = ("tie_free", "fine")
#: The default largest shift of the tie-free grid: every exact value ≥ 2^-14 ≈ 6.1e-5 LSB from a rounding half.
TIE_FREE_SHIFT = 13


def snap_scales_for_deeploy(
    qdq: onnx.ModelProto,
    *,
    ops: Sequence[str] = SNAPPED_OPS,
    grid: str = "tie_free",
    tie_free_shift: int = TIE_FREE_SHIFT,
) -> tuple[onnx.ModelProto, SnapReport]:
    """A copy of the int8 QDQ model ``qdq`` whose requantization ratios are exactly ``mul / 2^k`` inside
    Deeploy's int32 budget (module docstring), and what changed. ``ops`` limits which op types are snapped.
    ``grid="tie_free"`` (default) puts biased per-tensor Conv/Gemm layers on the coarse tie-free grid of shift
    ``≤ tie_free_shift``; ``grid="fine"`` snaps every layer to the largest shift with an odd ``mul``.

    Nodes this cannot read (16-bit or per-channel activations, non-constant weights, ...) are skipped and listed
    in the report; the export then refuses them with its own message.
    """
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
    if not 1 <= tie_free_shift <= _MAX_SHIFT:
        raise ValueError(f"tie_free_shift must be in 1..{_MAX_SHIFT}, got {tie_free_shift}")
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    g = model.graph
    used_before = {t for n in g.node for t in n.input}
    ix = GraphIndex(model)
    scales = _Scales(model, ix)
    shapes = _static_shapes(model)
    snapped: list[SnappedScale] = []
    skipped: list[str] = []
    for node in ix.nodes:
        if node.op_type not in ops or node.domain not in ("", "ai.onnx"):
            continue
        label = f"{node.op_type} {node.name or node.output[0]!r}"
        try:
            uniform = _uniform_factor(node, ix, scales, shapes)
            if uniform is not None:
                res = uniform if isinstance(uniform, str) else _snap_uniform(node, ix, scales, *uniform)
            elif node.op_type == "Add":
                res = _snap_add(node, ix, scales)
            elif node.op_type == "GlobalAveragePool":
                res = _snap_gap(node, ix, scales, shapes)
            else:
                res = _snap_linear(node, ix, scales, tie_free_shift if grid == "tie_free" else None)
        except (KeyError, IndexError, ValueError) as exc:
            res = f"{type(exc).__name__}: {exc}"
        if isinstance(res, str):
            skipped.append(f"{label}: {res}")
        else:
            snapped.append(res)
    # Scale initializers orphaned by giving a Q/DQ chain one initializer (_set_output_scale).
    used = {t for n in g.node for t in n.input} | {o.name for o in g.output}
    orphans = [i for i in g.initializer if i.name in used_before and i.name not in used]
    for init in orphans:
        g.initializer.remove(init)
    return model, SnapReport(tuple(snapped), tuple(skipped), grid)


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


@dataclass(frozen=True)
class _Linear:
    """A Conv/Gemm/MatMul's quantization: input, weight, bias and output scales, and the requantization ratios."""

    label: str
    w_dq: onnx.NodeProto
    w: np.ndarray
    s_w: np.ndarray
    out_axis: int
    channels: int
    bias_dq: onnx.NodeProto | None
    b_int: np.ndarray
    s_b: np.ndarray
    s_in: float
    in_act: Activation
    s_out: float
    zp_res: int
    out_q: onnx.NodeProto
    m: np.ndarray  # s_in·s_w / s_out per output channel


def _weight_of(
    node: onnx.NodeProto,
    ix: GraphIndex,
    scales: _Scales,
) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray, int] | str:
    """(weight DQ, int8 weight, its scale, output axis), or why it cannot be snapped."""
    w_dq = ix.producer.get(node.input[1])
    if w_dq is None or not is_dq(w_dq) or w_dq.input[0] not in scales.values:
        return "its weight is not a dequantized constant"
    shared = [t for t in (w_dq.output[0], *node.input[2:3]) if t and len(ix.consumers_of(t)) > 1]
    if shared:  # one weight scale cannot be snapped for two different ratios
        return f"{shared[0]!r} is read by several nodes"
    w = scales.values[w_dq.input[0]]
    if w.dtype != np.int8:
        return f"its weight is {w.dtype}, not int8"
    a = _attrs(node)
    if node.op_type == "Gemm" and (a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0):
        return "Gemm with transA or alpha/beta ≠ 1"
    out_axis = 0 if node.op_type == "Conv" or (node.op_type == "Gemm" and a.get("transB", 0)) else 1
    return w_dq, w, np.asarray(scales.values[w_dq.input[1]], np.float64), out_axis


def _linear_operands(
    node: onnx.NodeProto,
    ix: GraphIndex,
    scales: _Scales,
) -> _Linear | str:
    """Everything the snapping of a linear node reads, or why it cannot be snapped."""
    x = _act_in(node.input[0], ix, scales)
    out = _act_out(node, ix, scales)
    weight = _weight_of(node, ix, scales)
    for why in (x, out, weight):
        if isinstance(why, str):
            return why
    assert not isinstance(x, str) and not isinstance(out, str) and not isinstance(weight, str)
    w_dq, w, s_w, out_axis = weight
    channels = int(w.shape[out_axis])
    bias_dq = ix.producer.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    b_int, s_b = np.zeros(channels, np.int64), np.ones(channels, np.float64)
    if bias_dq is not None:
        if not is_dq(bias_dq) or bias_dq.input[0] not in scales.values:
            return "its bias is not a dequantized int32 constant"
        b_int = scales.values[bias_dq.input[0]].astype(np.int64).reshape(-1)
        s_b = np.broadcast_to(np.asarray(scales.values[bias_dq.input[1]], np.float64).reshape(-1), (channels,))
    (_, s_in, zp_in), (out_q, s_out, zp_out) = x, out
    m = np.broadcast_to(s_in * s_w.reshape(-1) / s_out, (channels,)).astype(np.float64)
    if np.all(m >= 1) and np.all(m == np.rint(m)):
        return "its ratio is an integer (nothing rounds)"
    label = node.name or node.output[0]
    return _Linear(
        label,
        w_dq,
        w,
        s_w,
        out_axis,
        channels,
        bias_dq,
        b_int,
        s_b,
        s_in,
        _activation(s_in, zp_in),
        s_out,
        _activation(s_out, zp_out).residual_zp,
        out_q,
        m,
    )


def _fine_grid(lin: _Linear) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray] | str:
    """(mul, k, new weight scale, new bias scale, new int bias) on the finest grid the export agrees with."""
    m_exact, b_new = lin.m.copy(), lin.b_int
    for _ in range(6):  # the bias (part of the budget) moves with s_w': settle on a k the export will also pick
        choice = _choose(m_exact, _accumulator_bound(lin.w, lin.out_axis, lin.in_act, b_new), lin.zp_res)
        if choice is None:
            return f"ratio {float(m_exact.max()):.3g} does not fit int32 RequantShift"
        mul, k = choice
        s_w_new = (mul.astype(np.float64) * lin.s_out / (lin.s_in * 2.0**k)).astype(np.float32)
        if lin.s_w.size == 1:
            if np.unique(mul).size != 1:
                raise ValueError("per-tensor weight scale with per-channel ratios")
            s_w_new = s_w_new[:1]
        b_scale_new = (lin.s_in * s_w_new.astype(np.float64)).astype(np.float32)
        b_scale = np.broadcast_to(b_scale_new.astype(np.float64), (lin.channels,))
        b_new = np.rint(lin.b_int * lin.s_b / b_scale).astype(np.int64)
        m_got = np.broadcast_to(lin.s_in * s_w_new.astype(np.float64) / lin.s_out, (lin.channels,))
        check = _export_choice(m_got, _accumulator_bound(lin.w, lin.out_axis, lin.in_act, b_new), lin.zp_res)
        if check is not None and check[1] == k and np.array_equal(check[0], np.broadcast_to(mul, (lin.channels,))):
            return mul, k, s_w_new, b_scale_new, b_new
        if check is not None:
            m_exact = check[0] / 2.0 ** check[1]  # the export wants another k: snap to that one
    return "no k on which the export and the snapping agree"


def _store_fine(
    node: onnx.NodeProto,
    lin: _Linear,
    fine: tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray],
    scales: _Scales,
) -> SnappedScale | str:
    """Write the snapped weight scale (and the requantized bias) into the model."""
    mul, k, s_w_new, b_scale_new, b_new = fine
    w_scale_value = s_w_new.reshape(()) if lin.s_w.ndim == 0 else s_w_new.reshape(lin.s_w.shape)
    w_name = scales.set([lin.w_dq], 1, w_scale_value, f"{lin.label}_w_scale_snapped")
    if lin.bias_dq is not None:
        bias_dq = lin.bias_dq
        s_b_arr = np.asarray(scales.values[bias_dq.input[1]])
        b_scale_value = (
            b_scale_new.reshape(())
            if s_b_arr.ndim == 0
            else np.broadcast_to(b_scale_new, s_b_arr.shape).astype(np.float32)
        )
        if np.abs(b_new).max(initial=0) >= _INT32_LIMIT:
            return "the requantized bias overflows int32"
        scales.set([bias_dq], 1, b_scale_value, f"{lin.label}_b_scale_snapped")
        b_value = b_new.reshape(scales.values[bias_dq.input[0]].shape).astype(np.int32)
        scales.set([bias_dq], 0, b_value, f"{lin.label}_b_snapped")
    rel = float(np.max(np.abs(s_w_new.astype(np.float64) - lin.s_w.reshape(-1)) / lin.s_w.reshape(-1)))
    return SnappedScale(lin.label, node.op_type, "weight", w_name, k, int(mul.min()), int(mul.max()), rel)


def _snap_linear(
    node: onnx.NodeProto,
    ix: GraphIndex,
    scales: _Scales,
    tie_free: int | None = None,
) -> SnappedScale | str:
    """Conv/Gemm/MatMul: snap the weight scale (per channel if so) and requantize the bias to s_in·s_w'.

    ``tie_free`` = K: a biased Conv/Gemm gets ``M = mul/2^k`` with ``k ≤ K`` and an odd bias in half units
    (scale ``s_in·s_w'/2``), so every exact value is ``odd/2^(k+1)`` output LSB: at least ``2^-(k+1)`` from a half.
    """
    lin = _linear_operands(node, ix, scales)
    if isinstance(lin, str):
        return lin
    if tie_free is not None and lin.bias_dq is not None and lin.s_w.size == 1:
        coarse = _snap_linear_tie_free(
            node,
            (lin.w, float(lin.s_w.reshape(())), lin.out_axis),
            (lin.bias_dq, lin.b_int, lin.s_b),
            (lin.s_in, lin.in_act, lin.s_out, lin.zp_res, lin.out_q, ix),
            float(lin.m[0]),
            scales,
            tie_free,
        )
        if not isinstance(coarse, str):
            return coarse  # else (no tie-free scale fits): the fine grid below
    fine = _fine_grid(lin)
    return fine if isinstance(fine, str) else _store_fine(node, lin, fine, scales)


def _set_output_scale(q: onnx.NodeProto, ix: GraphIndex, scales: _Scales, value: float, base: str) -> str:
    group = _scale_group(q, ix, scales)
    for n in group:  # members holding an equal value under another name now name q's initializer
        ix.set_input(n, 1, q.input[1])
    return scales.set(group, 1, np.array(value, np.float32), base)


def _snap_gap(
    node: onnx.NodeProto,
    ix: GraphIndex,
    scales: _Scales,
    shapes: Mapping[str, list[int]],
) -> SnappedScale | str:
    """GlobalAveragePool: M = s_in/(H·W·s_out); snap s_out."""
    x = _act_in(node.input[0], ix, scales)
    if isinstance(x, str):
        return x
    out = _act_out(node, ix, scales)
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
    # The export's GAP weight scale is 1/(H·W), so its ratio is s_in·(1/(H·W))/s_out: computed in that order here.
    found = _snapped_output_scale(
        s_in / hw / s_out, acc_max, zp_res,
        lambda mul, k: s_in * 2.0**k / (hw * mul), lambda s_new: s_in * (1.0 / hw) / s_new,
    )  # fmt: skip
    if isinstance(found, str):
        return found
    mul, k, s_new = found
    label = node.name or node.output[0]
    name = _set_output_scale(q, ix, scales, s_new, f"{q.output[0]}_scale_snapped")
    return SnappedScale(label, node.op_type, "output", name, k, mul, mul, abs(s_new - s_out) / s_out)


def _snapped_output_scale(
    m0: float,
    bound: np.ndarray | float,
    zp_res: int,
    scale_for: Callable[[int, int], float],
    ratio_of: Callable[[float], float],
) -> tuple[int, int, float] | str:
    """The fixed-point search shared by every output-scale snapping: from the ratio ``m0``, choose ``(mul, k)``
    (odd mul, largest k in the int32 budget ``bound``), take the float32 output scale ``scale_for(mul, k)`` and
    check that the export, reading ``ratio_of(that scale)``, picks the same ``(mul, k)``; otherwise retry from the
    export's own choice (at most 6 rounds). Returns ``(mul, k, scale)`` or why it failed."""
    m = np.array([m0])
    for _ in range(6):
        choice = _choose(m, bound, zp_res)
        if choice is None:
            return f"ratio {float(m[0]):.3g} does not fit int32 RequantShift"
        mul, k = int(choice[0][0]), choice[1]
        s_new = float(np.float32(scale_for(mul, k)))
        check = _export_choice(np.array([ratio_of(s_new)]), bound, zp_res)
        if check is not None and check[1] == k and int(check[0][0]) == mul:
            return mul, k, s_new
        if check is not None:
            m = check[0] / 2.0 ** check[1]
    return "no k on which the export and the snapping agree"


def _const_scalar(name: str, ix: GraphIndex, scales: _Scales) -> float | None:
    """The real value of a DQ'd scalar constant, else None."""
    dq = ix.producer.get(name)
    if dq is None or not is_dq(dq) or dq.input[0] not in scales.values:
        return None
    q = scales.values[dq.input[0]]
    qp = _scalar_qparams(dq, scales)
    if qp is None or q.size != 1:
        return None
    return qp[0] * (float(q.reshape(())) - qp[1])


def _uniform_factor(
    node: onnx.NodeProto, ix: GraphIndex, scales: _Scales, shapes: Mapping[str, list[int]]
) -> tuple[float, float, float] | str | None:
    """For the transformer ops the export requantizes with one multiplier (deeploy_transformer): (the real factor
    ``f`` in ``M = f / s_out``, the export's accumulator bound, its zero-point term); None for any other node."""
    op = node.op_type
    if op == "MatMul" and len(node.input) == 2:
        ins = [_act_in(t, ix, scales) for t in node.input]
        if any(isinstance(v, str) for v in ins):
            return None  # a constant weight: _snap_linear
        s_a, s_b = (float(v[1]) for v in ins if not isinstance(v, str))
        shape = shapes.get(node.input[0])
        if shape is None:
            return "needs a static input shape"
        return s_a * s_b, shape[-1] * 255.0 * 128, 0.0
    if op in ("Mul", "Div") and len(node.input) == 2:
        xi = next((i for i, t in enumerate(node.input) if not isinstance(_act_in(t, ix, scales), str)), None)
        c = _const_scalar(node.input[1 - xi], ix, scales) if xi is not None else None
        if xi is None or c is None or c <= 0 or (op == "Div" and xi != 0):
            return "not an activation times/over a positive scalar constant"
        x = _act_in(node.input[xi], ix, scales)
        assert not isinstance(x, str)
        zp_res = _activation(x[1], x[2]).residual_zp
        return x[1] * (c if op == "Mul" else 1.0 / c), 256.0, float(abs(zp_res))
    if op == "ReduceMean":
        x = _act_in(node.input[0], ix, scales)
        shape = shapes.get(node.input[0])
        axes = [a.ints for a in node.attribute if a.name == "axes"]
        if isinstance(x, str) or shape is None or not axes or len(axes[0]) != 1:
            return "needs one axis and a static quantized input"
        n = shape[axes[0][0]]
        return x[1] / n, n * 255.0, float(n * abs(_activation(x[1], x[2]).residual_zp))
    return None


def _snap_uniform(
    node: onnx.NodeProto, ix: GraphIndex, scales: _Scales, factor: float, acc_max: float, zp_term: float
) -> SnappedScale | str:
    """One multiplier ``M = factor / s_out`` (MatMul of two activations, Mul/Div by a constant, ReduceMean):
    snap s_out so that M is odd/2^k on the export's own choice of k."""
    out = _act_out(node, ix, scales)
    if isinstance(out, str):
        return out
    q, s_out, zp_out = out
    zp_res = _activation(s_out, zp_out).residual_zp
    bound = acc_max + zp_term
    found = _snapped_output_scale(
        factor / s_out, bound, zp_res, lambda mul, k: factor * 2.0**k / float(mul), lambda s_new: factor / s_new
    )
    if isinstance(found, str):
        return found
    mul, k, s_new = found
    name = _set_output_scale(q, ix, scales, s_new, f"{q.output[0]}_scale_snapped")
    label = node.name or node.output[0]
    return SnappedScale(label, node.op_type, "output", name, k, mul, mul, abs(s_new - s_out) / s_out)


def _snap_add(
    node: onnx.NodeProto,
    ix: GraphIndex,
    scales: _Scales,
) -> SnappedScale | str:
    """Add: snap s_out so that the larger ratio s_a/s_out is odd/2^k on the export's grid (kept if both are
    integers: then nothing rounds)."""
    if len(node.input) != 2:
        return "Add needs two inputs"
    ins = [_act_in(t, ix, scales) for t in node.input]
    out = _act_out(node, ix, scales)
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
    name = _set_output_scale(q, ix, scales, s_new, f"{q.output[0]}_scale_snapped")
    return SnappedScale(label, node.op_type, "output", name, k, mul, mul, abs(s_new - s_out) / s_out)


def _clip_bounds(node: onnx.NodeProto, ix: GraphIndex, scales: _Scales) -> tuple[float, float]:
    """The tightest (min, max) of the Relu/Clip chain between ``node`` and its output Q (±inf without one)."""
    lo, hi = -np.inf, np.inf
    cur = node
    while True:
        users = ix.consumers_of(cur.output[0])
        if len(users) != 1 or users[0].op_type not in ("Relu", "Clip"):
            return lo, hi
        cur = users[0]
        if cur.op_type == "Relu":
            lo = max(lo, 0.0)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in cur.attribute}
        c_lo = scales.values.get(cur.input[1]) if len(cur.input) > 1 and cur.input[1] else attrs.get("min")
        c_hi = scales.values.get(cur.input[2]) if len(cur.input) > 2 and cur.input[2] else attrs.get("max")
        if c_lo is not None:
            lo = max(lo, float(np.asarray(c_lo).reshape(())))
        if c_hi is not None:
            hi = min(hi, float(np.asarray(c_hi).reshape(())))


def _nearest_odd(x: np.ndarray) -> np.ndarray:
    """The odd integers nearest to ``x`` (on the side of ``x`` when the nearest integer is even)."""
    r = np.rint(x)
    out: np.ndarray = np.where(r % 2 == 0, np.where(x >= r, r + 1, r - 1), r).astype(np.int64)
    return out


def _snap_linear_tie_free(
    node: onnx.NodeProto,
    weight: tuple[np.ndarray, float, int],
    bias: tuple[onnx.NodeProto, np.ndarray, np.ndarray],
    acts: tuple[float, Activation, float, int, onnx.NodeProto, GraphIndex],
    m: float,
    scales: _Scales,
    k_max: int,
) -> SnappedScale | str:
    """The ``grid="tie_free"`` snapping of a biased Conv/Gemm with a per-tensor weight scale (module docstring).

    The *output* scale is snapped, ``s_out' = s_in·s_w·2^k/mul`` (the layer's gain stays; only its output grid
    moves), and the bias becomes an odd integer on the half-unit scale ``s_in·s_w/2``. The export reads it as an
    integer Conv/Gemm bias plus ``mul/2`` in the RequantShift add, with an even ``mul`` on a shift of ``k+1`` or
    more: ``k`` stays at least one below what the int32 budget allows.
    """
    w, s_w, out_axis = weight
    bias_dq, b_int, s_b = bias
    s_in, in_act, s_out, zp_res, q, ix = acts
    channels = b_int.size
    fine = _choose(np.array([m]), _accumulator_bound(w, out_axis, in_act, b_int), zp_res)
    if fine is None:
        return f"ratio {m:.3g} does not fit int32 RequantShift"
    b_scale = np.float32(s_in * s_w / 2)
    b_new = _nearest_odd(b_int * s_b / float(b_scale))
    half = b_new >> 1  # the export's integer bias; the real one lies between it and the next integer
    acc_max = np.maximum(
        _accumulator_bound(w, out_axis, in_act, half), _accumulator_bound(w, out_axis, in_act, half + 1)
    )
    clip_lo, clip_hi = _clip_bounds(node, ix, scales)
    qp = _scalar_qparams(q, scales)
    assert qp is not None
    q_lo, q_hi = -128 - qp[1], 127 - qp[1]  # the Q's range in units of its scale

    # A Clip (e.g. ReLU6) absorbed by the Q: the Q's range may not grow past the Clip's (the export's
    # _check_absorbed), nor past the calibrated range where that already touches the Clip (float32 rounding).
    lim_lo, lim_hi = min(clip_lo, s_out * q_lo), max(clip_hi, s_out * q_hi)

    def inside(scale: float) -> bool:
        return bool(scale * q_lo >= lim_lo and scale * q_hi <= lim_hi)

    k = min(k_max, fine[1] - 1)
    while k >= 1:
        mul = max(int(np.rint(m * 2.0**k)), 1)
        if mul % 2**k == 0:  # an integer M would make every value a tie
            mul += 1
        s_out_new = float(np.float32(s_in * s_w * 2.0**k / mul))
        if not inside(s_out_new):  # round mul up: the output scale shrinks instead
            mul = int(np.ceil(m * 2.0**k))
            mul += mul % 2**k == 0
            s_out_new = float(np.float32(s_in * s_w * 2.0**k / mul))
            if not inside(s_out_new):
                return "its Clip bounds its output range at the calibrated scale; no tie-free scale fits inside"
        # What the export will do with these float32 scales (its _integer_linear, mul a multiple of 2).
        check = _export_choice(np.array([s_in * s_w / s_out_new]), acc_max, zp_res, multiple_of=2)
        if check is not None and check[0][0] * 2.0 ** -check[1] == mul / 2.0**k:
            break
        k -= 1
    else:
        return "no tie-free k on which the export and the snapping agree"
    if np.abs(b_new).max(initial=0) >= _INT32_LIMIT:
        return "the requantized bias overflows int32"
    label = node.name or node.output[0]
    name = _set_output_scale(q, ix, scales, s_out_new, f"{q.output[0]}_scale_snapped")
    s_b_arr = np.asarray(scales.values[bias_dq.input[1]])
    scales.set([bias_dq], 1, np.full(s_b_arr.shape, b_scale, np.float32), f"{label}_b_scale_snapped")
    b_shape = scales.values[bias_dq.input[0]].shape
    scales.set(
        [bias_dq], 0, np.broadcast_to(b_new, (channels,)).reshape(b_shape).astype(np.int32), f"{label}_b_snapped"
    )
    return SnappedScale(label, node.op_type, "output", name, k, mul, mul, abs(s_out_new - s_out) / s_out)
