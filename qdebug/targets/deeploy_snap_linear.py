"""Snapping the requantization of Conv / Gemm / MatMul (:mod:`qdebug.targets.deeploy_snap`): the weight scale on
the fine grid, or a biased per-tensor Conv/Gemm's output scale on the tie-free grid (the module docstring of
:mod:`qdebug.targets.deeploy_snap` gives the arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from qdebug.graph_index import GraphIndex
from qdebug.model_io import is_dq
from qdebug.targets.deeploy_fold import _accumulator_bound
from qdebug.targets.deeploy_graph import Activation, _activation, _attrs
from qdebug.targets.deeploy_rq import _INT32_LIMIT
from qdebug.targets.deeploy_snap_scales import (
    SnappedScale,
    _act_in,
    _act_out,
    _choose,
    _export_choice,
    _scalar_qparams,
    _Scales,
    _set_output_scale,
)

__all__: list[str] = []


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
