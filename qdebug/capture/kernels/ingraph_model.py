"""The in-graph reduction's merged model (:mod:`qdebug.capture.kernels.ingraph`): both models merged into one ONNX
graph, the float model's nodes renamed ``f/``, the quantized model's ``q/``, and every paired tensor reduced to the
handful of output vectors :data:`OUTPUTS` names, small pairs stacked per shape; :class:`Layout` says where each value
lands. :func:`build` makes it; what the vectors hold, and how they are read back, is the kernel's docstring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper

from qdebug.metrics import SMALL_TENSOR
from qdebug.model_io import _all_tensors, _is_external
from qdebug.pairing import Pairing

OUTPUTS = ("sums64", "stats32", "sizes", "shapes_a", "shapes_b", "check32", "small_a", "small_b", "small_p")

#: Default widest Concat the merged graph uses (:func:`build`'s ``concat_fan_in``; wider ones become trees, see
#: :meth:`_Builder.concat`).
CONCAT_FAN_IN = 16

#: Default size above which a merged model is left to the numpy path (:func:`build`'s ``max_merged_bytes``:
#: protobuf's 2 GiB limit on one serialized model).
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


def _rename(
    model: onnx.ModelProto, prefix: str, keep: set[str]
) -> tuple[list[onnx.NodeProto], list[TensorProto], list[onnx.ValueInfoProto]]:
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
    infos = []
    for vi in model.graph.value_info:
        v = onnx.ValueInfoProto()
        v.CopyFrom(vi)
        v.name = r(vi.name)
        infos.append(v)
    return nodes, inits, infos


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


_Static = dict[str, tuple[int, tuple[int, ...]]]
#: One pair to reduce: (item index, reference name, test name, reference clip layers, test clip layers, static
#: shape or None).
_Entry = tuple[int, str, str, _Clips, _Clips, tuple[int, ...] | None]


class _Builder:
    """Builds the merged reduction graph node by node: the two renamed models, then the reduction nodes whose
    outputs are concatenated into the vectors of :data:`OUTPUTS` (positions recorded in :class:`_Vector`)."""

    def __init__(self, fm: onnx.ModelProto, qm: onnx.ModelProto, fan_in: int = CONCAT_FAN_IN) -> None:
        self.fm, self.qm, self.fan_in = fm, qm, fan_in
        self.keep = {i.name for i in fm.graph.input}
        f_nodes, f_inits, f_infos = _rename(fm, "f/", self.keep)
        q_nodes, q_inits, q_infos = _rename(qm, "q/", self.keep)
        self.infos = [*f_infos, *q_infos]
        self.nodes: list[onnx.NodeProto] = [*f_nodes, *q_nodes]
        self.inits: list[TensorProto] = [*f_inits, *q_inits]
        self.counter = iter(range(1 << 62))
        self.version = _default_opset(fm) or 1
        self.f_static, self.q_static = _static_types(fm), _static_types(qm)
        self.const_cache: dict[tuple[int, ...], str] = {}
        self.reshape_cache: dict[tuple[str, int], str] = {}
        self.flat_cache: dict[str, str] = {}
        self.v64, self.v32, self.vsz, self.vsa, self.vsb, self.vck = (_Vector() for _ in range(6))

    # ----------------------------------------------------------------- naming and nodes
    def fn(self, x: str) -> str:
        """A float-model tensor's name in the merged graph."""
        return x if x in self.keep else "f/" + x

    def qn(self, x: str) -> str:
        """A quantized-model tensor's name in the merged graph."""
        return x if x in self.keep else "q/" + x

    def op(self, kind: str, inputs: list[str], **attrs: Any) -> str:
        out = f"r/{kind}_{next(self.counter)}"
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def const(self, value: npt.NDArray[np.generic]) -> str:
        name = f"r/c_{next(self.counter)}"
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def concat(self, parts: list[str], axis: int, out: str | None = None) -> str:
        """``Concat`` of ``parts`` as a tree of at most :attr:`fan_in` inputs per node.

        ONNX Runtime's session initialisation is quadratic in a node's fan-in; a tree of small Concats is cheap to
        set up and copies each value ``log_fan_in(n)`` times, which for these vectors of sums is nothing.
        """
        k = self.fan_in
        while len(parts) > k:
            parts = [
                self.op("Concat", parts[i : i + k], axis=axis) if len(parts[i : i + k]) > 1 else parts[i]
                for i in range(0, len(parts), k)
            ]
        if out is None:
            return self.op("Concat", parts, axis=axis)
        self.nodes.append(helper.make_node("Concat", parts, [out], axis=axis))
        return out

    def int_const(self, values: tuple[int, ...]) -> str:
        if values not in self.const_cache:
            self.const_cache[values] = self.const(np.array(values, np.int64))
        return self.const_cache[values]

    def row(self, x: str, n: int) -> str:
        """A ``[1, n]`` view (n = -1: whatever the size)."""
        key = (x, n)
        if key not in self.reshape_cache:
            self.reshape_cache[key] = self.op("Reshape", [x, self.int_const((1, n))])
        return self.reshape_cache[key]

    def reduce(self, kind: str, x: str, axes: tuple[int, ...] | None) -> str:
        """Over ``axes`` of [k, ...] -> [k]; ``None``: all of a 1-D tensor -> [1] (ORT's parallel full reduction)."""
        if axes is None:
            return self.op(kind, [x], keepdims=1)
        axes_as_input = self.version >= 18 or (kind == "ReduceSum" and self.version >= 13)
        if axes_as_input:
            return self.op(kind, [x, self.int_const(axes)], keepdims=0)
        return self.op(kind, [x], axes=list(axes), keepdims=0)

    def stack(self, names: list[str], shape: tuple[int, ...] | None) -> tuple[str, tuple[int, ...] | None]:
        """The tensors stacked along a leading axis of k rows, and the axes to reduce (None: one flat tensor)."""
        if shape is None:
            (x,) = names
            if x not in self.flat_cache:
                self.flat_cache[x] = self.op("Reshape", [x, self.int_const((-1,))])
            return self.flat_cache[x], None
        if len(shape) >= 2 and shape[0] == 1:  # batch of one: concatenate as they are
            rows, axes = names, tuple(range(1, len(shape)))
        else:
            n = int(np.prod(shape, dtype=np.int64))
            rows, axes = [self.row(x, n) for x in names], (1,)
        return (rows[0] if len(rows) == 1 else self.concat(rows, axis=0)), axes

    def clip(self, x: str, bounds: list[tuple[str, float, float] | None], rank: int) -> str:
        if all(b is None for b in bounds):
            return x
        if len(bounds) == 1 and bounds[0] is not None and self.version >= 11:
            lo1, hi1 = (self.const(np.array(v, np.float32)) for v in bounds[0][1:])
            return self.op("Clip", [x, lo1, hi1])
        shape = (len(bounds),) + (1,) * (rank - 1)
        lo = np.array([-np.inf if b is None else b[1] for b in bounds], np.float32).reshape(shape)
        hi = np.array([np.inf if b is None else b[2] for b in bounds], np.float32).reshape(shape)
        return self.op("Min", [self.op("Max", [x, self.const(lo)]), self.const(hi)])  # np.clip's values

    @staticmethod
    def static_shape(fa: _Static, a: str, fb: _Static, b: str) -> tuple[int, ...] | None:
        """The common static shape of a small float32 pair (None: unknown, different, large or empty)."""
        ta, tb = fa.get(a), fb.get(b)
        if ta is None or ta != tb or ta[0] != TensorProto.FLOAT:
            return None
        n = int(np.prod(ta[1], dtype=np.int64))
        return ta[1] if 0 < n <= SMALL_TENSOR else None

    # ----------------------------------------------------------------- reductions
    def pairs(self, kind: str, es: list[_Entry], shape: tuple[int, ...] | None, ranges: bool) -> None:
        """Reduce the pairs ``es`` (a = reference, b = test) of one static ``shape`` (None: one pair)."""
        items = [e[0] for e in es]
        (a_raw, axes), (b_raw, _) = self.stack([e[1] for e in es], shape), self.stack([e[2] for e in es], shape)
        rank = 1 if axes is None else len(axes) + 1
        a, b = a_raw, b_raw
        for layer in zip(*[e[3] for e in es], strict=True):
            a = self.clip(a, list(layer), rank)
        for layer in zip(*[e[4] for e in es], strict=True):
            b = self.clip(b, list(layer), rank)
        for clipped, raw in ((a, a_raw), (b, b_raw)):
            if clipped != raw:  # a clip can turn ±inf into a finite value: check the raw tensor
                self.vck.add(self.reduce("ReduceSum", raw, axes), "check", [-1] * len(items))
        self._sums(kind, items, a, self.op("Sub", [a, b]), axes, small=shape is not None)
        if ranges:
            self.v32.add(self.reduce("ReduceMin", a_raw, axes), "f_min", items)
            self.v32.add(self.reduce("ReduceMax", a_raw, axes), "f_max", items)
        if kind != "loc":
            self._counts(kind, items, es[0][1], shape)
        if shape is None:  # a pair of unknown shapes: compare them at run time
            self.vsa.add(self.op("Shape", [es[0][1]]), "shape", [])
            self.vsb.add(self.op("Shape", [es[0][2]]), "shape", [])

    def _sums(self, kind: str, items: list[int], a: str, d: str, axes: tuple[int, ...] | None, small: bool) -> None:
        """Σa², Σd² in float64 and max|d| in float32."""
        if small:  # rows of k references, then k differences, one Cast for both
            both = self.op("Concat", [a, d], axis=0)
            cast = self.op("Cast", [both], to=TensorProto.DOUBLE)
            self.v64.add(self.reduce("ReduceSumSquare", cast, axes), kind + "_sig", items)
            self.v64.add_more(kind + "_noise", items)
        else:  # large: concatenating would copy it
            for x, what in ((a, "_sig"), (d, "_noise")):
                cast = self.op("Cast", [x], to=TensorProto.DOUBLE)
                self.v64.add(self.reduce("ReduceSumSquare", cast, axes), kind + what, items)
        self.v32.add(self.reduce("ReduceMax", self.op("Abs", [d]), axes), kind + "_max", items)

    def _counts(self, kind: str, items: list[int], first: str, shape: tuple[int, ...] | None) -> None:
        count = kind + "_count" if kind == "out" else "act_count"
        if shape is not None:
            n = int(np.prod(shape, dtype=np.int64))
            self.vsz.add(self.const(np.full(len(items), n, np.int64)), count, items)
        else:
            self.vsz.add(self.op("Reshape", [self.op("Size", [first]), self.int_const((1,))]), count, items)

    def grouped(self, kind: str, entries: list[_Entry], ranges: bool) -> None:
        """Reduce ``entries``, one group per static shape (each pair of unknown shape on its own)."""
        by_shape: dict[tuple[int, ...] | int, list[_Entry]] = {}
        for e, entry in enumerate(entries):
            by_shape.setdefault(entry[5] if entry[5] is not None else -1 - e, []).append(entry)
        for key, es in by_shape.items():
            self.pairs(kind, es, key if isinstance(key, tuple) else None, ranges)

    def concat_flat(self, names: list[str], out: str) -> None:
        """The tensors flattened and concatenated into the graph output ``out`` (an empty vector if none)."""
        if not names:
            self.inits.append(numpy_helper.from_array(np.zeros(0, np.float32), out))
            return
        flat = self.int_const((-1,))
        self.concat([self.op("Reshape", [x, flat]) for x in names], axis=0, out=out)


@dataclass(frozen=True)
class _Plan:
    """Which pairs are stacked into the ``small_*`` vectors, and every pair's static shape (None: dynamic/large)."""

    small: Small
    small_loc: list[int]
    cum_shape: list[tuple[int, ...] | None]
    loc_shape: dict[int, tuple[int, ...] | None]
    ordinal: dict[int, int]  # activation index -> quantized ordinal


def _plan(b: _Builder, pairing: Pairing) -> _Plan:
    """Which activations go into the ``small_*`` vectors, and their static shapes."""
    acts = pairing.activations
    ordinal = {j: k for k, j in enumerate(j for j, a in enumerate(acts) if a.quantized)}
    cum_shape = [b.static_shape(b.f_static, a.tensor_name, b.q_static, a.post_qdq) for a in acts]
    loc_shape = {j: b.static_shape(b.q_static, a.pre_qdq, b.q_static, a.post_qdq) for j, a in enumerate(acts)
                 if a.quantized}  # fmt: skip
    small_loc = [j for j in ordinal if cum_shape[j] is not None and loc_shape[j] == cum_shape[j]]
    small_acts = small_loc + [j for j in range(len(acts)) if cum_shape[j] is not None and j not in set(small_loc)]
    sizes_small = np.array([int(np.prod(cum_shape[j] or (), dtype=np.int64)) for j in small_acts], dtype=np.int64)
    offsets = np.zeros(len(small_acts), dtype=np.intp)
    np.cumsum(sizes_small[:-1], out=offsets[1:])

    def bounds(per_act: list[tuple[str, float, float] | None]) -> tuple[npt.NDArray[np.float64], ...]:
        lo = np.repeat([-np.inf if x is None else x[1] for x in per_act], sizes_small[: len(per_act)])
        hi = np.repeat([np.inf if x is None else x[2] for x in per_act], sizes_small[: len(per_act)])
        return lo.astype(np.float64), hi.astype(np.float64)

    through = [acts[j].measured_through for j in small_acts]
    pre_layers = [[acts[j].fused_activation for j in small_loc], [acts[j].measured_through for j in small_loc]]
    small = Small(
        acts=np.array(small_acts, dtype=np.intp),
        quant=np.array([ordinal[j] for j in small_loc], dtype=np.intp),
        offsets=offsets,
        sizes=sizes_small,
        quant_elements=int(sizes_small[: len(small_loc)].sum()),
        through=bounds(through) if any(x is not None for x in through) else None,  # type: ignore[arg-type]
        pre_clips=tuple(bounds(layer) for layer in pre_layers if any(x is not None for x in layer)),  # type: ignore[misc]
    )
    return _Plan(small, small_loc, cum_shape, loc_shape, ordinal)


def _add_reductions(b: _Builder, pairing: Pairing) -> Small:
    """Every pair's reduction nodes (large or dynamic ones one by one, small static ones stacked)."""
    acts = pairing.activations
    plan = _plan(b, pairing)
    in_small, in_small_loc = set(plan.small.acts.tolist()), set(plan.small_loc)
    cum: list[_Entry] = [
        (j, b.fn(a.tensor_name), b.qn(a.post_qdq), [a.measured_through], [a.measured_through], plan.cum_shape[j])
        for j, a in enumerate(acts)
        if j not in in_small
    ]
    b.grouped("cum", cum, ranges=True)
    local: list[_Entry] = [
        (plan.ordinal[j], b.qn(a.pre_qdq), b.qn(a.post_qdq), [a.fused_activation, a.measured_through],
         [a.measured_through], plan.loc_shape[j])
        for j, a in enumerate(acts)
        if a.quantized and j not in in_small_loc
    ]  # fmt: skip
    b.grouped("loc", local, ranges=False)
    b.concat_flat([b.fn(acts[j].tensor_name) for j in plan.small.acts], "small_a")
    b.concat_flat([b.qn(acts[j].post_qdq) for j in plan.small.acts], "small_b")
    b.concat_flat([b.qn(acts[j].pre_qdq) for j in plan.small_loc], "small_p")
    outs: list[_Entry] = [(k, b.fn(o.output_name), b.qn(o.quant_name), [], [],
             b.static_shape(b.f_static, o.output_name, b.q_static, o.quant_name))
            for k, o in enumerate(pairing.outputs)]  # fmt: skip
    b.grouped("out", outs, ranges=False)
    return plan.small


_OUTPUT_TYPES = {
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


def _finish(b: _Builder, max_merged_bytes: int) -> onnx.ModelProto:
    """Concatenate the vectors into the graph outputs and make the model."""
    vectors = (
        (b.v64, "sums64", np.float64),
        (b.v32, "stats32", np.float32),
        (b.vsz, "sizes", np.int64),
        (b.vsa, "shapes_a", np.int64),
        (b.vsb, "shapes_b", np.int64),
        (b.vck, "check32", np.float32),
    )
    for vec, name, dtype in vectors:
        if not vec.parts:
            vec.parts.append(b.const(np.zeros(0, dtype)))
        b.concat(vec.parts, axis=0, out=name)
    outputs = [helper.make_tensor_value_info(name, _OUTPUT_TYPES[name], None) for name in OUTPUTS]
    graph = helper.make_graph(
        b.nodes, "qdebug_reduction", list(b.fm.graph.input), outputs, initializer=b.inits, value_info=b.infos
    )
    opsets = {o.domain: o.version for o in [*b.qm.opset_import, *b.fm.opset_import]}
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
        ir_version=max(b.fm.ir_version, b.qm.ir_version),
    )
    if model.ByteSize() > max_merged_bytes:
        raise UnsupportedGraphError(f"the merged model would be {model.ByteSize() / 1e9:.1f} GB")
    return model


def _layout(b: _Builder, pairing: Pairing, small: Small) -> Layout:
    """Positions index [sums64, stats32] concatenated (float64), and sizes."""
    merged: dict[str, dict[int, int]] = {}
    for vec, offset in ((b.v64, 0), (b.v32, b.v64.length), (b.vsz, 0)):
        for kind, slots in vec.pos.items():
            merged.setdefault(kind, {}).update({k: offset + p for k, p in slots.items()})
    pos = {
        kind: (np.array(list(slots), dtype=np.intp), np.array(list(slots.values()), dtype=np.intp))
        for kind, slots in merged.items()
    }
    lengths = {"sums64": b.v64.length, "stats32": b.v32.length, "sizes": b.vsz.length}
    n_quant = sum(1 for a in pairing.activations if a.quantized)
    return Layout(len(pairing.activations), n_quant, len(pairing.outputs), lengths, pos, small)


def build(
    fm: onnx.ModelProto,
    qm: onnx.ModelProto,
    pairing: Pairing,
    *,
    concat_fan_in: int = CONCAT_FAN_IN,
    max_merged_bytes: int = MAX_MERGED_BYTES,
) -> tuple[onnx.ModelProto, Layout]:
    """The merged reduction model for ``pairing`` (raises :class:`UnsupportedGraphError`, also when it would exceed
    ``max_merged_bytes``); ``concat_fan_in``: the widest ``Concat`` node it uses (the values do not depend on it).

    Pairs whose tensors have the same static shape (by shape inference), are float32 and at most
    :data:`~qdebug.metrics.SMALL_TENSOR` elements are stacked per size into ``[k, n]`` matrices and reduced along
    axis 1 in a few nodes per size (ORT's per-node cost dominates for small tensors); any other pair is reduced on
    its own, with its shapes checked at run time.
    """
    fm = _upgrade_float(fm, qm, {a.tensor_name for a in pairing.activations} | {o.output_name for o in pairing.outputs})
    _check_mergeable(fm, qm)
    b = _Builder(fm, qm, concat_fan_in)
    small = _add_reductions(b, pairing)
    return _finish(b, max_merged_bytes), _layout(b, pairing, small)
