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

Rooms: the bookkeeping every snapper shares is :mod:`qdebug.targets.deeploy_snap_scales`'s, the Conv / Gemm /
MatMul snapping (fine and tie-free grids) :mod:`qdebug.targets.deeploy_snap_linear`'s; this module walks the graph
and snaps GlobalAveragePool, Add and the ops with one uniform factor (a MatMul of two activations, Mul/Div by a
constant, ReduceMean).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qdebug.graph_index import GraphIndex
from qdebug.model_io import is_dq
from qdebug.targets.deeploy_fold import _accumulator_bound, _static_shapes
from qdebug.targets.deeploy_graph import _activation
from qdebug.targets.deeploy_rq import _MAX_SHIFT
from qdebug.targets.deeploy_snap_linear import _snap_linear
from qdebug.targets.deeploy_snap_scales import (
    SnappedScale,
    _act_in,
    _act_out,
    _add_shift,
    _choose,
    _export_choice,
    _odd_muls,
    _scalar_qparams,
    _Scales,
    _set_output_scale,
)

__all__ = ["GRIDS", "SNAPPED_OPS", "TIE_FREE_SHIFT", "SnapReport", "SnappedScale", "snap_scales_for_deeploy"]

#: The ops whose requantization ratio is snapped.
SNAPPED_OPS = ("Conv", "Gemm", "MatMul", "GlobalAveragePool", "Add", "Mul", "Div", "ReduceMean")


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
