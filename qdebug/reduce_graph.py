"""In-graph reduction: both models merged into one ONNX graph that reduces every paired tensor to sums.

The float model's nodes are renamed with an ``f/`` prefix and the quantized model's with ``q/``; both read the
same (unprefixed) graph inputs. For every pair the merged graph computes, per sample, exactly the sums the
numpy path (:func:`qdebug.metrics.reduce_pairs`, :func:`qdebug.metrics.value_ranges`) computes from fetched
tensors, and returns them as a handful of small vectors, so no activation leaves ONNX Runtime:

``sums64`` (float64)
    Σref², Σ(ref−post)² per activation; Σpre², Σ(pre−post)² per quantized activation; Σref², Σ(ref−test)²
    per model output. Squares are summed in float64 (``Cast`` before ``ReduceSumSquare``); the differences are
    float32, as in the numpy path for large tensors.
``stats32`` (float32)
    max|ref−post|, min(ref), max(ref) per activation; max|pre−post| per quantized activation; max|ref−test|
    per output.
``sizes`` (int64)
    the element count of every reference (activations, then outputs).
``shapes_a`` / ``shapes_b`` (int64)
    the concatenated run-time shapes of both sides of every pair whose shapes are not known statically: equal
    vectors mean equal shapes.
``check32`` (float32)
    Σ of every tensor that is clipped before it is compared (``fused_activation`` / ``measured_through``): a
    clip can turn ±inf into a finite value, so NaN/Inf in those tensors are detected here.

:class:`Layout` says where each value lands. Small float32 pairs of one static shape are stacked (``Concat``
along the batch axis, or as ``[1, n]`` rows) and reduced together: ONNX Runtime's per-node cost, not the
arithmetic, dominates for tensors of a few hundred elements. Larger or dynamic ones are reduced one by one.

Anything non-finite in a sample's vectors, or shapes that differ, means the sample must be redone the numpy way
(exact non-finite counts, statuses and error messages). The graph is evaluated with optimizations off, like the
numpy path's sessions, so every tensor has the same value in both. A float model at a lower default opset than
the quantized one (quantizers raise it for 16-bit Q/DQ) is converted up with ONNX's version converter first;
anything the merge cannot express raises :class:`UnsupportedGraphError` and the caller uses the numpy path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper

from qdebug.graph import Pairing, _all_tensors, _is_external
from qdebug.metrics import SMALL_TENSOR

OUTPUTS = ("sums64", "stats32", "sizes", "shapes_a", "shapes_b", "check32", "small_a", "small_b", "small_p")

#: Larger merged models are left to the numpy path (protobuf's 2 GiB limit on one serialized model).
MAX_MERGED_BYTES = 1_500_000_000


class UnsupportedGraphError(Exception):
    """The merged reduction graph cannot reproduce the numpy path for this model pair (reason in the text)."""


@dataclass(frozen=True)
class Small:
    """Small pairs of static shape, concatenated in-graph into ``small_a`` / ``small_b`` / ``small_p`` (float32)
    and reduced in numpy with ``reduceat`` (cheaper than ONNX Runtime nodes for tensors of a few hundred elements).

    ``acts`` are activation indices in concatenation order; the first ``len(quant)`` of them are quantized
    activations whose pre-QDQ tensor (``small_p``, same offsets) is compared too (``quant`` = their quantized
    ordinals). Per-element clip bounds reproduce ``measured_through`` (refs and posts) and
    ``fused_activation`` then ``measured_through`` (pres); ``None`` when nothing is clipped.
    """

    acts: npt.NDArray[np.intp]
    quant: npt.NDArray[np.intp]
    offsets: npt.NDArray[np.intp]
    sizes: npt.NDArray[np.int64]
    quant_elements: int
    through: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None
    pre_clips: tuple[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]], ...]


@dataclass(frozen=True)
class Layout:
    """Where each value lives in the output vectors: ``pos[kind] = (items, indices)``.

    Kinds of ``[sums64, stats32]`` (one float64 vector): ``cum_sig``, ``cum_noise``, ``cum_max``, ``f_min``,
    ``f_max`` (per activation), ``loc_sig``, ``loc_noise``, ``loc_max`` (per quantized activation, by ordinal),
    ``out_sig``, ``out_noise``, ``out_max`` (per output); of ``sizes``: ``act_count``, ``out_count``. Items in
    :attr:`small` are not in ``pos``.
    """

    n_acts: int
    n_quant: int
    n_outs: int
    lengths: dict[str, int]  # output name -> expected length (sums64, stats32, sizes)
    pos: dict[str, tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]]
    small: Small


_Clips = list[tuple[str, float, float] | None]


class _Vector:
    """One concatenated output vector under construction: parts and where each item lands."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.pos: dict[str, dict[int, int]] = {}

    def add(self, part: str, kind: str, items: list[int]) -> None:
        self.parts.append(part)
        slots = self.pos.setdefault(kind, {})
        for t, k in enumerate(items):
            slots[k] = self.length + t
        self.length += len(items)

    def add_more(self, kind: str, items: list[int]) -> None:
        """More items of the last part (a part that holds several kinds)."""
        slots = self.pos.setdefault(kind, {})
        for t, k in enumerate(items):
            slots[k] = self.length + t
        self.length += len(items)


def _static_types(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Element type and fully static shape of every tensor shape inference can tell (best effort)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return {}
    out = {}
    g = inferred.graph
    for vi in [*g.value_info, *g.input, *g.output]:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = tt.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[vi.name] = (tt.elem_type, tuple(int(d.dim_value) for d in dims))
    return out


def _rename(model: onnx.ModelProto, prefix: str, keep: set[str]) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    def r(name: str) -> str:
        return name if not name or name in keep else prefix + name

    nodes = []
    for n in model.graph.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = prefix + n.name if n.name else ""
        m.input[:] = [r(x) for x in n.input]
        m.output[:] = [r(x) for x in n.output]
        nodes.append(m)
    inits = []
    for t in model.graph.initializer:
        c = TensorProto()
        c.CopyFrom(t)
        c.name = r(t.name)
        inits.append(c)
    return nodes, inits


def _check_mergeable(fm: onnx.ModelProto, qm: onnx.ModelProto) -> None:
    for m, role in ((fm, "float"), (qm, "quantized")):
        if m.functions:
            raise UnsupportedGraphError(f"the {role} model has local functions")
        if m.graph.sparse_initializer:
            raise UnsupportedGraphError(f"the {role} model has sparse initializers")
        if any(_is_external(t) for t in _all_tensors(m)):
            raise UnsupportedGraphError(f"the {role} model has external data")
        for n in m.graph.node:
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
                raise UnsupportedGraphError(f"the {role} model has a subgraph ({n.op_type} {n.name!r})")
        inits = {t.name for t in m.graph.initializer}
        if any(i.name in inits for i in m.graph.input):
            raise UnsupportedGraphError(f"the {role} model has initializers that are also graph inputs")
    f_in = [i.name for i in fm.graph.input]
    q_in = [i.name for i in qm.graph.input]
    if sorted(f_in) != sorted(q_in):
        raise UnsupportedGraphError("the models' graph inputs differ")
    f_ops = {o.domain or "ai.onnx": o.version for o in fm.opset_import}
    q_ops = {o.domain or "ai.onnx": o.version for o in qm.opset_import}
    for d in f_ops.keys() & q_ops.keys():
        if f_ops[d] != q_ops[d]:
            raise UnsupportedGraphError(
                f"the models import different versions of opset {d!r}: {f_ops[d]} vs {q_ops[d]}"
            )


def _default_opset(m: onnx.ModelProto) -> int:
    return max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _upgrade_float(fm: onnx.ModelProto, qm: onnx.ModelProto, needed: set[str]) -> onnx.ModelProto:
    """The float model at the quantized model's default opset (quantizers raise it for 16-bit Q/DQ).

    ONNX's version converter keeps the semantics of every node; the pairs' tensors must keep their names.
    """
    target = _default_opset(qm)
    if _default_opset(fm) >= target or any(o.domain not in ("", "ai.onnx") for o in fm.opset_import):
        return fm
    try:
        up = onnx.version_converter.convert_version(fm, target)
    except Exception as exc:  # the converter raises its own error types
        raise UnsupportedGraphError(f"the float model cannot be converted to opset {target}: {exc}") from exc
    produced = {i.name for i in up.graph.input} | {o for n in up.graph.node for o in n.output}
    if not needed <= produced:
        raise UnsupportedGraphError(f"converting the float model to opset {target} renamed tensors")
    return up


def build(fm: onnx.ModelProto, qm: onnx.ModelProto, pairing: Pairing) -> tuple[onnx.ModelProto, Layout]:
    """The merged reduction model for ``pairing`` (raises :class:`UnsupportedGraphError`).

    Pairs whose tensors have the same static shape (by shape inference), are float32 and at most
    :data:`~qdebug.metrics.SMALL_TENSOR` elements are stacked per size into ``[k, n]`` matrices and reduced along
    axis 1 in a few nodes per size (ORT's per-node cost dominates for small tensors); any other pair is reduced on
    its own, with its shapes checked at run time.
    """
    fm = _upgrade_float(fm, qm, {a.tensor_name for a in pairing.activations} | {o.output_name for o in pairing.outputs})
    _check_mergeable(fm, qm)
    keep = {i.name for i in fm.graph.input}
    f_nodes, f_inits = _rename(fm, "f/", keep)
    q_nodes, q_inits = _rename(qm, "q/", keep)
    nodes = [*f_nodes, *q_nodes]
    inits = [*f_inits, *q_inits]
    counter = iter(range(1 << 62))
    version = max((o.version for o in fm.opset_import if o.domain in ("", "ai.onnx")), default=1)
    f_static, q_static = _static_types(fm), _static_types(qm)

    def fn(x: str) -> str:
        return x if x in keep else "f/" + x

    def qn(x: str) -> str:
        return x if x in keep else "q/" + x

    def op(kind: str, inputs: list[str], **attrs: Any) -> str:
        out = f"r/{kind}_{next(counter)}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def const(value: npt.NDArray[np.generic]) -> str:
        name = f"r/c_{next(counter)}"
        inits.append(numpy_helper.from_array(value, name))
        return name

    const_cache: dict[tuple[int, ...], str] = {}

    def int_const(values: tuple[int, ...]) -> str:
        if values not in const_cache:
            const_cache[values] = const(np.array(values, np.int64))
        return const_cache[values]

    reshape_cache: dict[tuple[str, int], str] = {}
    flat_cache: dict[str, str] = {}

    def row(x: str, n: int) -> str:  # [1, n] view (n = -1: whatever the size)
        key = (x, n)
        if key not in reshape_cache:
            reshape_cache[key] = op("Reshape", [x, int_const((1, n))])
        return reshape_cache[key]

    def reduce(kind: str, x: str, axes: tuple[int, ...] | None) -> str:
        """Over ``axes`` of [k, ...] -> [k]; ``None``: all of a 1-D tensor -> [1] (ORT's parallel full reduction)."""
        if axes is None:
            return op(kind, [x], keepdims=1)
        axes_as_input = version >= 18 or (kind == "ReduceSum" and version >= 13)
        if axes_as_input:
            return op(kind, [x, int_const(axes)], keepdims=0)
        return op(kind, [x], axes=list(axes), keepdims=0)

    def stack(names: list[str], shape: tuple[int, ...] | None) -> tuple[str, tuple[int, ...] | None]:
        """The tensors stacked along a leading axis of k rows, and the axes to reduce (None: one flat tensor)."""
        if shape is None:
            (x,) = names
            if x not in flat_cache:
                flat_cache[x] = op("Reshape", [x, int_const((-1,))])
            return flat_cache[x], None
        if shape is not None and len(shape) >= 2 and shape[0] == 1:  # batch of one: concatenate as they are
            rows, axes = names, tuple(range(1, len(shape)))
        else:
            n = -1 if shape is None else int(np.prod(shape, dtype=np.int64))
            rows, axes = [row(x, n) for x in names], (1,)
        return (rows[0] if len(rows) == 1 else op("Concat", rows, axis=0)), axes

    def clip(x: str, bounds: list[tuple[str, float, float] | None], rank: int) -> str:
        if all(b is None for b in bounds):
            return x
        if len(bounds) == 1 and bounds[0] is not None and version >= 11:
            lo1, hi1 = (const(np.array(v, np.float32)) for v in bounds[0][1:])
            return op("Clip", [x, lo1, hi1])
        shape = (len(bounds),) + (1,) * (rank - 1)
        lo = np.array([-np.inf if b is None else b[1] for b in bounds], np.float32).reshape(shape)
        hi = np.array([np.inf if b is None else b[2] for b in bounds], np.float32).reshape(shape)
        return op("Min", [op("Max", [x, const(lo)]), const(hi)])  # np.clip's values for finite inputs

    def static_shape(
        fa: dict[str, tuple[int, tuple[int, ...]]], a: str, fb: dict[str, tuple[int, tuple[int, ...]]], b: str
    ) -> tuple[int, ...] | None:
        """The common static shape of a small float32 pair (None: unknown, different, large or empty)."""
        ta, tb = fa.get(a), fb.get(b)
        if ta is None or ta != tb or ta[0] != TensorProto.FLOAT:
            return None
        n = int(np.prod(ta[1], dtype=np.int64))
        return ta[1] if 0 < n <= SMALL_TENSOR else None

    v64, v32, vsz, vsa, vsb, vck = (_Vector() for _ in range(6))

    def pairs(
        kind: str,
        items: list[int],
        a_names: list[str],
        b_names: list[str],
        a_clips: list[_Clips],
        b_clips: list[_Clips],
        shape: tuple[int, ...] | None,
        ranges: bool,
    ) -> None:
        """Reduce the pairs ``items`` (a = reference, b = test) of one static ``shape`` (None: one pair)."""
        (a_raw, axes), (b_raw, _) = stack(a_names, shape), stack(b_names, shape)
        a, b = a_raw, b_raw
        for layer in zip(*a_clips, strict=True):
            a = clip(a, list(layer), 1 if axes is None else len(axes) + 1)
        for layer in zip(*b_clips, strict=True):
            b = clip(b, list(layer), 1 if axes is None else len(axes) + 1)
        if a != a_raw:
            vck.add(reduce("ReduceSum", a_raw, axes), "check", [-1] * len(items))
        if b != b_raw:
            vck.add(reduce("ReduceSum", b_raw, axes), "check", [-1] * len(items))
        d = op("Sub", [a, b])
        if shape is not None:  # small: rows of k references, then k differences, one Cast for both
            both = op("Concat", [a, d], axis=0)
            v64.add(reduce("ReduceSumSquare", op("Cast", [both], to=TensorProto.DOUBLE), axes), kind + "_sig", items)
            v64.add_more(kind + "_noise", items)
        else:  # large: concatenating would copy it
            for x, what in ((a, "_sig"), (d, "_noise")):
                v64.add(reduce("ReduceSumSquare", op("Cast", [x], to=TensorProto.DOUBLE), axes), kind + what, items)
        v32.add(reduce("ReduceMax", op("Abs", [d]), axes), kind + "_max", items)
        if ranges:
            v32.add(reduce("ReduceMin", a_raw, axes), "f_min", items)
            v32.add(reduce("ReduceMax", a_raw, axes), "f_max", items)
        if kind != "loc":
            count = kind + "_count" if kind == "out" else "act_count"
            if shape is not None:
                n = int(np.prod(shape, dtype=np.int64))
                vsz.add(const(np.full(len(items), n, np.int64)), count, items)
            else:
                vsz.add(op("Reshape", [op("Size", [a_names[0]]), int_const((1,))]), count, items)
        if shape is None:  # a pair of unknown shapes: compare them at run time
            vsa.add(op("Shape", [a_names[0]]), "shape", [])
            vsb.add(op("Shape", [b_names[0]]), "shape", [])

    def grouped(
        kind: str, entries: list[tuple[int, str, str, _Clips, _Clips, tuple[int, ...] | None]], ranges: bool
    ) -> None:
        by_shape: dict[tuple[int, ...] | int, list[int]] = {}
        for e, entry in enumerate(entries):
            shape = entry[5]
            by_shape.setdefault(shape if shape is not None else -1 - e, []).append(e)  # unknown: its own group
        for key, members in by_shape.items():
            es = [entries[e] for e in members]
            pairs(
                kind,
                [e[0] for e in es],
                [e[1] for e in es],
                [e[2] for e in es],
                [e[3] for e in es],
                [e[4] for e in es],
                key if isinstance(key, tuple) else None,
                ranges,
            )

    acts = pairing.activations
    quant = [a for a in acts if a.quantized]
    ordinal = {j: k for k, j in enumerate(j for j, a in enumerate(acts) if a.quantized)}
    cum_shape = [static_shape(f_static, a.tensor_name, q_static, a.post_qdq) for a in acts]
    loc_shape = {j: static_shape(q_static, a.pre_qdq, q_static, a.post_qdq) for j, a in enumerate(acts) if a.quantized}
    small_loc = [j for j in ordinal if cum_shape[j] is not None and loc_shape[j] == cum_shape[j]]
    small_rest = [j for j in range(len(acts)) if cum_shape[j] is not None and j not in set(small_loc)]
    small_acts = small_loc + small_rest
    in_small = set(small_acts)
    grouped(
        "cum",
        [
            (j, fn(a.tensor_name), qn(a.post_qdq), [a.measured_through], [a.measured_through], cum_shape[j])
            for j, a in enumerate(acts)
            if j not in in_small
        ],
        ranges=True,
    )
    grouped(
        "loc",
        [
            (
                ordinal[j],
                qn(a.pre_qdq),
                qn(a.post_qdq),
                [a.fused_activation, a.measured_through],
                [a.measured_through],
                loc_shape[j],
            )
            for j, a in enumerate(acts)
            if a.quantized and j not in set(small_loc)
        ],
        ranges=False,
    )
    flat1 = int_const((-1,))

    def concat_flat(names: list[str], out: str) -> None:
        if not names:
            inits.append(numpy_helper.from_array(np.zeros(0, np.float32), out))
            return
        nodes.append(helper.make_node("Concat", [op("Reshape", [x, flat1]) for x in names], [out], axis=0))

    concat_flat([fn(acts[j].tensor_name) for j in small_acts], "small_a")
    concat_flat([qn(acts[j].post_qdq) for j in small_acts], "small_b")
    concat_flat([qn(acts[j].pre_qdq) for j in small_loc], "small_p")
    sizes_small = np.array([int(np.prod(cum_shape[j] or (), dtype=np.int64)) for j in small_acts], dtype=np.int64)
    offsets = np.zeros(len(small_acts), dtype=np.intp)
    np.cumsum(sizes_small[:-1], out=offsets[1:])

    def bounds(
        per_act: list[tuple[str, float, float] | None],
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        lo = np.repeat([-np.inf if b is None else b[1] for b in per_act], sizes_small[: len(per_act)])
        hi = np.repeat([np.inf if b is None else b[2] for b in per_act], sizes_small[: len(per_act)])
        return lo.astype(np.float64), hi.astype(np.float64)

    through = [acts[j].measured_through for j in small_acts]
    pre_layers = [[acts[j].fused_activation for j in small_loc], [acts[j].measured_through for j in small_loc]]
    small = Small(
        acts=np.array(small_acts, dtype=np.intp),
        quant=np.array([ordinal[j] for j in small_loc], dtype=np.intp),
        offsets=offsets,
        sizes=sizes_small,
        quant_elements=int(sizes_small[: len(small_loc)].sum()),
        through=bounds(through) if any(b is not None for b in through) else None,
        pre_clips=tuple(bounds(layer) for layer in pre_layers if any(b is not None for b in layer)),
    )
    grouped(
        "out",
        [
            (
                k,
                fn(o.output_name),
                qn(o.quant_name),
                [],
                [],
                static_shape(f_static, o.output_name, q_static, o.quant_name),
            )
            for k, o in enumerate(pairing.outputs)
        ],
        ranges=False,
    )
    for vec, dtype in (
        (v64, np.float64),
        (v32, np.float32),
        (vsz, np.int64),
        (vsa, np.int64),
        (vsb, np.int64),
        (vck, np.float32),
    ):
        if not vec.parts:
            vec.parts.append(const(np.zeros(0, dtype)))
    for vec, name in (
        (v64, "sums64"),
        (v32, "stats32"),
        (vsz, "sizes"),
        (vsa, "shapes_a"),
        (vsb, "shapes_b"),
        (vck, "check32"),
    ):
        if vec.parts:
            nodes.append(helper.make_node("Concat", vec.parts, [name], axis=0))
    types = {
        "sums64": TensorProto.DOUBLE,
        "stats32": TensorProto.FLOAT,
        "sizes": TensorProto.INT64,
        "shapes_a": TensorProto.INT64,
        "shapes_b": TensorProto.INT64,
        "check32": TensorProto.FLOAT,
        "small_a": TensorProto.FLOAT,
        "small_b": TensorProto.FLOAT,
        "small_p": TensorProto.FLOAT,
    }
    outputs = [helper.make_tensor_value_info(name, types[name], None) for name in OUTPUTS]
    graph = helper.make_graph(nodes, "qdebug_reduction", list(fm.graph.input), outputs, initializer=inits)
    opsets = {o.domain: o.version for o in [*qm.opset_import, *fm.opset_import]}
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
        ir_version=max(fm.ir_version, qm.ir_version),
    )
    if model.ByteSize() > MAX_MERGED_BYTES:
        raise UnsupportedGraphError(f"the merged model would be {model.ByteSize() / 1e9:.1f} GB")
    # Positions index [sums64, stats32] concatenated (float64), and sizes.
    merged: dict[str, dict[int, int]] = {}
    for vec, offset in ((v64, 0), (v32, v64.length), (vsz, 0)):
        for kind, slots in vec.pos.items():
            merged.setdefault(kind, {}).update({k: offset + p for k, p in slots.items()})
    pos = {
        kind: (np.array(list(slots), dtype=np.intp), np.array(list(slots.values()), dtype=np.intp))
        for kind, slots in merged.items()
    }
    lengths = {"sums64": v64.length, "stats32": v32.length, "sizes": vsz.length}
    return model, Layout(len(acts), len(quant), len(pairing.outputs), lengths, pos, small)
