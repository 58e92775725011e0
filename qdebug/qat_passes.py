"""The passes :func:`qdebug.qat.canonicalize` runs, each ``(model) -> (model, PassReport)``, and the node-list
rewriter they share (:class:`_Ctx`: a snapshot's :class:`~qdebug.graph_index.GraphIndex` maps, fresh names, replacements
committed at once). Each rewrites one spelling of quantization into default-domain QuantizeLinear/DequantizeLinear —
decomposed QCDQ arithmetic, ``com.microsoft`` Q/DQ, OpenVINO ``FakeQuantize`` with stored ranges, in-graph weight
fake-quantization, no-op DQ→Q pairs, training leftovers — and keeps the model runnable and numerically equivalent (up
to float rounding); see docs/qat.md.

Why one module: every pass is a short rewrite through the one ``_Ctx`` rewriter, whose conventions (a snapshot's
maps, names made fresh, replacements committed at once) they share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdebug.graph_index import GraphIndex, decode_constant, unique_name
from qdebug.model_io import is_dq, is_q
from qdebug.passes import PassReport
from qdebug.qdq_values import quantize_array

#: The custom domain and op of OpenVINO/NNCF fake quantization (the min/max representation handled).
FAKEQUANT_DOMAIN = "org.openvinotoolkit"
FAKEQUANT_OP = "FakeQuantize"
_MSFT = "com.microsoft"

# Clip range → zero-point dtype. QuantizeLinear saturates to the full type range, so only full ranges
# are equivalent to a Clip; a narrow range (e.g. [-127, 127]) is left alone.
_RANGE_TYPES: tuple[np.dtype[Any], ...] = (
    np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16), np.dtype(np.int32),
)  # fmt: skip
_LEVEL_TYPES: dict[int, np.dtype[Any]] = {256: np.dtype(np.int8), 65536: np.dtype(np.int16)}
_ONNX_INT = {np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8,
             np.dtype(np.int16): TensorProto.INT16, np.dtype(np.uint16): TensorProto.UINT16,
             np.dtype(np.int32): TensorProto.INT32}  # fmt: skip


# --------------------------------------------------------------------------- graph helpers
class _Ctx:
    """A model snapshot's :class:`~qdebug.graph_index.GraphIndex` maps, plus a node-list rewriter."""

    def __init__(self, model: onnx.ModelProto) -> None:
        # A private copy: passes rewire node inputs in place and must never touch the caller's model.
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)
        model = self.model
        self.nodes = list(model.graph.node)  # stored order: the rewriter edits positions in it
        self.index = index = GraphIndex(model)
        self.consts = index.consts
        self.producer = index.producer
        self.consumers = index.consumers
        self.outputs = set(index.outputs)
        self.names = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
        self.names |= {o for n in self.nodes for o in n.output} | {n.name for n in self.nodes}
        self.remove: set[int] = set()
        self.insert: dict[int, list[onnx.NodeProto]] = defaultdict(list)
        self.new_inits: list[TensorProto] = []

    def const(self, name: str) -> np.ndarray | None:
        c = self.consts.get(name)
        return None if c is None else decode_constant(c)

    def sole_consumer(self, tensor: str) -> onnx.NodeProto | None:
        """The only node reading ``tensor`` (None when several read it or it is a graph output)."""
        return self.index.sole_consumer(tensor)

    def fresh(self, base: str) -> str:
        return unique_name(base, self.names)

    def add_init(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.new_inits.append(numpy_helper.from_array(value, name))
        return name

    def taken(self, *nodes: onnx.NodeProto) -> bool:
        return any(id(n) in self.remove for n in nodes)

    def replace(self, old: Sequence[onnx.NodeProto], new: Sequence[onnx.NodeProto]) -> None:
        """Remove ``old``; put ``new`` where the last of ``old`` was (its inputs all exist by then)."""
        pos = max(self.nodes.index(n) for n in old)
        self.remove.update(id(n) for n in old)
        self.insert[pos].extend(new)

    def commit(self) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(self.model)
        g = out.graph
        new_nodes: list[onnx.NodeProto] = []
        for idx, n in enumerate(self.nodes):
            if id(n) not in self.remove:
                new_nodes.append(n)
            new_nodes.extend(self.insert.get(idx, []))
        copies = [_clone(n) for n in new_nodes]
        del g.node[:]
        g.node.extend(copies)
        g.initializer.extend(self.new_inits)
        produced = {o for n in g.node for o in n.output}
        keep_vi = [vi for vi in g.value_info if vi.name in produced]  # stale types of removed tensors
        del g.value_info[:]
        g.value_info.extend(keep_vi)
        return out


def _clone(n: onnx.NodeProto) -> onnx.NodeProto:
    c = onnx.NodeProto()
    c.CopyFrom(n)
    return c


def _other(node: onnx.NodeProto, tensor: str) -> str | None:
    """The other input of a binary node that reads ``tensor`` (None if it reads it twice)."""
    if len(node.input) != 2:
        return None
    a, b = node.input
    if a == tensor and b != tensor:
        return str(b)
    if b == tensor and a != tensor:
        return str(a)
    return None


def _scalar(v: np.ndarray | None) -> float | None:
    if v is None or v.size != 1 or v.dtype.kind not in "fiu":
        return None
    return float(v.reshape(-1)[0])


def _clip_bounds(ctx: _Ctx, clip: onnx.NodeProto) -> tuple[float, float] | None:
    lo = hi = None
    for a in clip.attribute:  # opset < 11
        if a.name == "min":
            lo = float(a.f)
        elif a.name == "max":
            hi = float(a.f)
    if len(clip.input) > 1 and clip.input[1]:
        lo = _scalar(ctx.const(clip.input[1]))
    if len(clip.input) > 2 and clip.input[2]:
        hi = _scalar(ctx.const(clip.input[2]))
    return None if lo is None or hi is None else (lo, hi)


def _range_dtype(lo: float, hi: float) -> np.dtype[Any] | None:
    # Compared in float32 because that is how the exporter stored the bounds (2**31 - 1 is not exact).
    for dt in _RANGE_TYPES:
        info = np.iinfo(dt)
        if np.float32(lo) == np.float32(info.min) and np.float32(hi) == np.float32(info.max):
            return dt
    return None


def _count(model: onnx.ModelProto) -> int:
    return len(model.graph.node)


def _report(name: str, before: onnx.ModelProto, after: onnx.ModelProto, details: list[str],
            warnings: list[str]) -> PassReport:  # fmt: skip
    return PassReport(
        name,
        changed=bool(details),
        nodes_before=_count(before),
        nodes_after=_count(after),
        rewrites=len(details),
        details=tuple(details),
        warnings=tuple(warnings),
    )


def _cast_to_float(ctx: _Ctx, src: str, out: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Cast", [src], [out], name=ctx.fresh(name), to=TensorProto.FLOAT)


def _drop_unused_opsets(model: onnx.ModelProto, *domains: str) -> None:
    used = {n.domain for n in model.graph.node}
    keep = [o for o in model.opset_import if o.domain not in domains or o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def _opset(model: onnx.ModelProto) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


# --------------------------------------------------------------------------- passes
def _quant_scale(ctx: _Ctx, first: onnx.NodeProto) -> tuple[str, float] | None:
    """``Div(x, s)`` or ``Mul(x, 1/s)`` (either operand order): (x, s) for a positive constant scalar s."""
    if first.op_type == "Div":
        x = first.input[0]
        scale = _scalar(ctx.const(first.input[1]))
    else:
        a, b = first.input
        inv_name, x = (b, a) if b in ctx.consts else (a, b)
        inv = _scalar(ctx.const(inv_name))
        scale = None if inv is None or inv == 0 else float(np.float32(1.0) / np.float32(inv))
    return (x, scale) if scale is not None and scale > 0 else None


def _round_chain(ctx: _Ctx, first: onnx.NodeProto) -> tuple[list[onnx.NodeProto], float, onnx.NodeProto] | None:
    """After the scaling: Round and Add(zp) in either order, then Clip — (chain so far, zero point, the Clip)."""
    chain, zp, seen_round = [first], 0.0, False
    node = ctx.sole_consumer(first.output[0])
    while node is not None and node.op_type in ("Round", "Add") and len(chain) < 3:
        if node.op_type == "Round":
            if seen_round:
                break
            seen_round = True
        else:
            other = _other(node, chain[-1].output[0])
            z = _scalar(ctx.const(other)) if other else None
            if z is None or z != round(z) or zp != 0.0:
                break
            zp = z
        chain.append(node)
        node = ctx.sole_consumer(node.output[0])
    if not seen_round or node is None or node.op_type != "Clip" or node.input[0] != chain[-1].output[0]:
        return None
    return chain, zp, node


def _fold_int32_constant(
    ctx: _Ctx, chain: list[onnx.NodeProto], x: str, scale: float, zp: np.ndarray, int_cast: bool
) -> str | None:
    """A bias-like int32 fake quantization of a constant, folded to the integer constant (QuantizeLinear has no
    int32 output); the detail line, or ``None`` when ``x`` is not a constant."""
    x_val = ctx.const(x)
    if x_val is None:
        return None
    out = chain[-1].output[0]
    q = quantize_array(x_val, np.array(scale, np.float32), zp)
    if int_cast:  # the integer tensor itself is the Cast's output name
        ctx.new_inits.append(numpy_helper.from_array(q, out))
        ctx.replace(chain, [])
    else:
        q_name = ctx.add_init(f"{x.replace('/', '_')}_quantized", q)
        ctx.replace(chain, [_cast_to_float(ctx, q_name, out, f"{x.replace('/', '_')}_cast")])
    return f"{x}: int32 constant fake-quant folded (scale {scale:.6g})"


def _to_quantize_linear(
    ctx: _Ctx, chain: list[onnx.NodeProto], x: str, scale: float, zp: np.ndarray, int_cast: bool
) -> str:
    """Replace the chain by QuantizeLinear (then a Cast back to float when the chain had no integer Cast)."""
    out, base = chain[-1].output[0], x.replace("/", "_")
    s_name = ctx.add_init(f"{base}_scale", np.array(scale, dtype=np.float32))
    z_name = ctx.add_init(f"{base}_zero_point", zp)
    q_out = out if int_cast else ctx.fresh(f"{base}_QuantizeLinear_Output")
    new = [helper.make_node("QuantizeLinear", [x, s_name, z_name], [q_out], name=ctx.fresh(f"{base}_Q"))]
    if not int_cast:
        new.append(_cast_to_float(ctx, q_out, out, f"{base}_Q_cast"))
    ctx.replace(chain, new)
    return f"{x}: {' → '.join(n.op_type for n in chain)} ⇒ QuantizeLinear ({zp.dtype.name}, scale {scale:.6g})"


def _fold_one_quant(ctx: _Ctx, first: onnx.NodeProto, warnings: list[str]) -> str | None:
    """Fold the decomposed quantization starting at ``first``; the detail line, or ``None`` if it is not one."""
    xs = _quant_scale(ctx, first)
    found = _round_chain(ctx, first) if xs is not None else None
    if xs is None or found is None:
        return None
    (x, scale), (chain, zp, clip) = xs, found
    bounds = _clip_bounds(ctx, clip)
    dt = _range_dtype(*bounds) if bounds else None
    if dt is None:
        if bounds and chain[0].op_type == "Div":
            warnings.append(f"{clip.name or clip.output[0]}: Clip range {bounds} is not a full integer range; left")
        return None
    chain.append(clip)
    cast = ctx.sole_consumer(clip.output[0])
    to = next((a.i for a in cast.attribute if a.name == "to"), None) if cast and cast.op_type == "Cast" else None
    int_cast = cast is not None and to == _ONNX_INT[dt]
    if cast is not None and int_cast:
        chain.append(cast)
    if ctx.taken(*chain):
        return None
    if dt == np.dtype(np.int32):
        detail = _fold_int32_constant(ctx, chain, x, scale, np.array(zp, dtype=dt), int_cast)
        if detail is None:
            warnings.append(f"{clip.name or chain[-1].output[0]}: int32 fake quantization of a non-constant; left")
        return detail
    return _to_quantize_linear(ctx, chain, x, scale, np.array(zp, dtype=dt), int_cast)


def fold_decomposed_quant(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """Div(x, s) [→ Add(zp)] → Round [→ Add(zp)] → Clip(qmin, qmax) [→ Cast(int)] ⇒ QuantizeLinear.

    Why: exporters that cannot emit QuantizeLinear for a training graph (QCDQ style) spell it out in
    float arithmetic; qdebug pairs tensors through QuantizeLinear. ``Mul(x, 1/s)`` is accepted for the
    Div. The zero-point dtype is the one whose full range the Clip bounds are. Without a trailing
    Cast the float result is kept through ``Cast(to=float)`` so the graph stays valid on its own; a
    constant ``x`` with an int32 range (a bias) is folded to an int32 initializer directly because
    QuantizeLinear has no int32 output.
    """
    ctx = _Ctx(model)
    details: list[str] = []
    warnings: list[str] = []
    for first in ctx.nodes:
        if first.op_type not in ("Div", "Mul") or first.domain not in ("", "ai.onnx") or ctx.taken(first):
            continue
        detail = _fold_one_quant(ctx, first, warnings)
        if detail is not None:
            details.append(detail)
    out_model = ctx.commit()
    return out_model, _report("fold_decomposed_quant", model, out_model, details, warnings)


def fold_decomposed_dequant(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """q → Cast(float) [→ Sub(zp)] → Mul(s) ⇒ DequantizeLinear(q, s, zp).

    Why: the dequantizing half of QCDQ is also spelled in float arithmetic. ``q`` is the output of a
    QuantizeLinear (its zero point must equal the Sub's, so a mismatch is not silently merged) or an
    integer constant (a bias folded by :func:`fold_decomposed_quant`). ``Mul`` alone means zp = 0.
    """
    ctx = _Ctx(model)
    details: list[str] = []
    warnings: list[str] = []
    for cast in ctx.nodes:
        if cast.op_type != "Cast" or ctx.taken(cast):
            continue
        if next((a.i for a in cast.attribute if a.name == "to"), None) != TensorProto.FLOAT:
            continue
        q_t = cast.input[0]
        prod = ctx.producer.get(q_t)
        q_zp: np.ndarray | None = None
        if prod is not None and is_q(prod):
            q_zp = ctx.const(prod.input[2]) if len(prod.input) > 2 and prod.input[2] else np.array(0, np.uint8)
            if q_zp is None or q_zp.size != 1:  # per-channel: Sub/Mul cannot be told apart from rescaling
                continue
            dt = q_zp.dtype
        else:
            val = ctx.const(q_t)
            if val is None or val.dtype.kind not in "iu":
                continue
            dt = val.dtype
        chain = [cast]
        node = ctx.sole_consumer(cast.output[0])
        zp = 0.0
        if node is not None and node.op_type == "Sub" and node.input[0] == cast.output[0]:
            z = _scalar(ctx.const(node.input[1]))
            if z is None:
                continue
            zp = z
            chain.append(node)
            node = ctx.sole_consumer(node.output[0])
        if node is None or node.op_type != "Mul":
            continue
        other = _other(node, chain[-1].output[0])
        scale = _scalar(ctx.const(other)) if other else None
        if scale is None or not scale > 0:
            continue
        if q_zp is not None and float(q_zp.reshape(-1)[0]) != zp:
            warnings.append(f"{q_t}: dequant zero point {zp:g} differs from the quant's {q_zp.reshape(-1)[0]}; left")
            continue
        chain.append(node)
        if ctx.taken(*chain):
            continue
        base = q_t.replace("/", "_")
        s_name = ctx.add_init(f"{base}_dq_scale", np.array(scale, dtype=np.float32))
        z_name = ctx.add_init(f"{base}_dq_zero_point", np.array(zp, dtype=dt))
        dq = helper.make_node("DequantizeLinear", [q_t, s_name, z_name], [node.output[0]], name=ctx.fresh(f"{base}_DQ"))
        ctx.replace(chain, [dq])
        details.append(f"{q_t}: {' → '.join(n.op_type for n in chain)} ⇒ DequantizeLinear (scale {scale:.6g})")
    out_model = ctx.commit()
    return out_model, _report("fold_decomposed_dequant", model, out_model, details, warnings)


def normalize_qdq_domain(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """``com.microsoft`` QuantizeLinear/DequantizeLinear ⇒ default domain where the opset allows it.

    Why: compile targets (Deeploy, QNN converters) and the ONNX checker only know the standard ops;
    the contrib spelling exists because 16-bit Q/DQ needs opset ≥ 21. 8-bit (and int32 DQ) moves
    from opset 13; 16-bit only from opset 21, otherwise it is left (qdebug handles both) and reported.
    """
    ctx = _Ctx(model)
    opset = _opset(model)
    details: list[str] = []
    warnings: list[str] = []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        if n.domain != _MSFT or not (is_q(n) or is_dq(n)):
            continue
        zp = ctx.const(n.input[2]) if len(n.input) > 2 and n.input[2] else np.array(0, np.uint8)
        dt = np.dtype(np.uint8) if zp is None else zp.dtype
        need = 21 if dt.itemsize == 2 else 13
        if dt.itemsize == 4 and is_q(n):
            need = 10**6  # no standard int32 QuantizeLinear
        if opset >= need:
            n.domain = ""
            details.append(f"{n.name or n.output[0]}: {n.op_type} ({dt.name}) → default domain")
        else:
            warnings.append(
                f"{n.name or n.output[0]}: {dt.name} {n.op_type} needs opset {need}, model has {opset}; left"
            )
    _drop_unused_opsets(out, _MSFT)
    return out, _report("normalize_qdq_domain", model, out, details, warnings)


def fakequant_from_minmax(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """OpenVINO/NNCF ``org.openvinotoolkit::FakeQuantize(x, in_lo, in_hi, out_lo, out_hi; levels)`` ⇒ Q → DQ.

    Why: these exports store the range, not the scale, and ORT cannot run the custom op. With
    ``in == out`` ranges and 256 (int8) or 65536 (int16) levels the op is an affine Q/DQ with
    scale = (max − min)/(qmax − qmin) and zp = clip(round(qmin − min/scale)); when ``min/scale`` is
    not an integer the grid moves by < scale/2, which the report warns about.
    """
    ctx = _Ctx(model)
    details: list[str] = []
    warnings: list[str] = []
    for fq in ctx.nodes:
        if fq.op_type != FAKEQUANT_OP or fq.domain != FAKEQUANT_DOMAIN:
            continue
        label = fq.name or fq.output[0]
        levels = next((int(a.i) for a in fq.attribute if a.name == "levels"), 0)
        dt = _LEVEL_TYPES.get(levels)
        vals = [_scalar(ctx.const(i)) for i in fq.input[1:5]] if len(fq.input) == 5 else []
        if dt is None or len(vals) != 4 or any(v is None for v in vals):
            warnings.append(f"{label}: FakeQuantize with levels={levels} or non-constant/per-channel ranges; left")
            continue
        lo, hi, olo, ohi = (float(v) for v in vals if v is not None)
        if (lo, hi) != (olo, ohi) or not hi > lo:
            warnings.append(f"{label}: input and output ranges differ (or are empty); left")
            continue
        info = np.iinfo(dt)
        scale = float(np.float32((hi - lo) / (int(info.max) - int(info.min))))
        exact = float(info.min) - lo / scale
        zp = int(np.clip(np.rint(exact), info.min, info.max))
        if abs(exact - round(exact)) > 1e-3:
            warnings.append(f"{label}: min/scale is not an integer (zp {exact:.3f} → {zp}); the grid moves slightly")
        base = fq.input[0].replace("/", "_")
        s_name = ctx.add_init(f"{base}_scale", np.array(scale, np.float32))
        z_name = ctx.add_init(f"{base}_zero_point", np.array(zp, dt))
        q_out = ctx.fresh(f"{base}_QuantizeLinear_Output")
        ctx.replace(
            [fq],
            [
                helper.make_node("QuantizeLinear", [fq.input[0], s_name, z_name], [q_out], name=ctx.fresh(f"{base}_Q")),
                helper.make_node(
                    "DequantizeLinear", [q_out, s_name, z_name], [fq.output[0]], name=ctx.fresh(f"{base}_DQ")
                ),
            ],
        )  # fmt: skip
        details.append(
            f"{fq.input[0]}: FakeQuantize[{lo:.6g}, {hi:.6g}] ⇒ Q/DQ ({dt.name}, scale {scale:.6g}, zp {zp})"
        )
    out = ctx.commit()
    _drop_unused_opsets(out, FAKEQUANT_DOMAIN)
    return out, _report("fakequant_from_minmax", model, out, details, warnings)


def fold_weight_fakequant(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """constant float weight → QuantizeLinear → DQ ⇒ integer initializer → DQ.

    Why: QAT graphs quantize the float weight on every run; targets want the integer weight stored
    (Deeploy takes int8 initializers + DQ) and it makes the file's weights what the debugger measures.
    The Q is evaluated with numpy exactly as QuantizeLinear does (round half to even, saturate).
    """
    ctx = _Ctx(model)
    details: list[str] = []
    rename: dict[str, str] = {}
    for q in ctx.nodes:
        if not is_q(q) or q.input[0] not in ctx.consts or q.output[0] in ctx.outputs:
            continue
        w = ctx.const(q.input[0])
        s = ctx.const(q.input[1])
        zp = ctx.const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.array(0, np.uint8)
        if w is None or s is None or zp is None or w.dtype.kind != "f":
            continue
        axis = next((int(a.i) for a in q.attribute if a.name == "axis"), 1)
        qv = quantize_array(w, s, zp, axis)
        # The integer weight takes the name ORT's quantizer gives it, so files read the same either way.
        name = ctx.fresh(f"{q.input[0]}_quantized")
        rename[q.output[0]] = name
        ctx.new_inits.append(numpy_helper.from_array(qv, name))
        ctx.replace([q], [])
        details.append(f"{q.input[0]}: {list(w.shape)} folded to {qv.dtype.name} initializer {name!r}")
    for n in ctx.nodes:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = rename[i]
    out = ctx.commit()
    return out, _report("fold_weight_fakequant", model, out, details, [])


def eliminate_redundant_dq_q(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """DQ(a; s, zp) → Q(s, zp, same type) ⇒ a (consumers of the Q read ``a`` directly).

    Why: a re-quantization with identical parameters is the identity on the integers, but it
    hides the real Q→DQ pair from qdebug's pairing and costs a conversion on the target.
    """
    ctx = _Ctx(model)
    details: list[str] = []
    rename: dict[str, str] = {}
    for q in ctx.nodes:
        dq = ctx.producer.get(q.input[0])
        if not is_q(q) or dq is None or not is_dq(dq) or q.output[0] in ctx.outputs or ctx.taken(dq):
            continue
        same = _same_params(ctx, dq, q)
        if not same:
            continue
        rename[q.output[0]] = dq.input[0]
        old = [q]
        # The DQ goes too when the Q was its only reader.
        if ctx.sole_consumer(dq.output[0]) is q:
            old.append(dq)
        ctx.remove.update(id(n) for n in old)
        details.append(f"{dq.name or dq.output[0]} → {q.name or q.output[0]}: identical parameters, removed")
    for n in ctx.nodes:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = rename[i]
    out = ctx.commit()
    return out, _report("eliminate_redundant_dq_q", model, out, details, [])


def _same_params(ctx: _Ctx, dq: onnx.NodeProto, q: onnx.NodeProto) -> bool:
    def params(n: onnx.NodeProto) -> tuple[np.ndarray | None, np.ndarray | None, int]:
        s = ctx.const(n.input[1])
        z = ctx.const(n.input[2]) if len(n.input) > 2 and n.input[2] else np.array(0, np.uint8)
        return s, z, next((int(a.i) for a in n.attribute if a.name == "axis"), 1)

    (s1, z1, a1), (s2, z2, a2) = params(dq), params(q)
    if s1 is None or s2 is None or z1 is None or z2 is None or z1.dtype != z2.dtype:
        return False
    if s1.shape != s2.shape or z1.shape != z2.shape or (s1.size > 1 and a1 != a2):
        return False
    return bool(np.array_equal(s1, s2) and np.array_equal(z1, z2))


def prune_training_leftovers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """Remove Identity, inference Dropout, orphan nodes and unused initializers.

    Why: training exports keep nodes that compute nothing at inference; they break the one-producer
    walk from a DQ to its consumer and inflate the graph. Graph outputs are never removed (an
    Identity that produces one stays), and a Dropout whose mask is read stays. Unused graph inputs
    that are not initializers are reported, not removed: that would change the model's signature.
    """
    ctx = _Ctx(model)
    details: list[str] = []
    warnings: list[str] = []
    rename: dict[str, str] = {}

    def resolve(t: str) -> str:
        while t in rename:
            t = rename[t]
        return t

    for n in ctx.nodes:
        passthrough = n.op_type == "Identity" or (
            n.op_type == "Dropout" and (len(n.output) < 2 or not n.output[1] or not ctx.consumers.get(n.output[1]))
        )
        if not passthrough or n.output[0] in ctx.outputs:
            continue
        rename[n.output[0]] = n.input[0]
        ctx.remove.add(id(n))
        details.append(f"{n.name or n.output[0]}: {n.op_type} removed")
    for n in ctx.nodes:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = resolve(i)
    pruned = ctx.commit()
    g = pruned.graph
    outputs = {o.name for o in g.output}
    # Orphans: nodes none of whose outputs is read or is a graph output, to a fixed point.
    while True:
        used = {i for n in g.node for i in n.input} | outputs
        dead = [k for k, n in enumerate(g.node) if not any(o in used for o in n.output if o)]
        if not dead:
            break
        for k in reversed(dead):
            details.append(f"{g.node[k].name or g.node[k].output[0]}: orphan {g.node[k].op_type} removed")
            del g.node[k]
    used = {i for n in g.node for i in n.input} | outputs
    inits = {i.name for i in g.initializer}
    keep_init = [i for i in g.initializer if i.name in used]
    unused = [i.name for i in g.initializer if i.name not in used]
    if unused:  # one line: QCDQ folding orphans dozens of scale/bound constants
        shown = ", ".join(unused[:5]) + (", …" if len(unused) > 5 else "")
        details.append(f"{len(unused)} unused initializer(s) removed: {shown}")
    del g.initializer[:]
    g.initializer.extend(keep_init)
    keep_in = []
    for vi in g.input:
        if vi.name in used or vi.name in outputs:
            keep_in.append(vi)
        elif vi.name in inits:
            details.append(f"{vi.name}: unused initializer input removed")
        else:
            keep_in.append(vi)
            warnings.append(f"{vi.name}: graph input is unused; kept so the model's signature does not change")
    del g.input[:]
    g.input.extend(keep_in)
    produced = {o for n in g.node for o in n.output}
    keep_vi = [vi for vi in g.value_info if vi.name in produced]
    del g.value_info[:]
    g.value_info.extend(keep_vi)
    return pruned, _report("prune_training_leftovers", model, pruned, details, warnings)
