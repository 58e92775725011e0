"""The catalogue of rewrites the QNN compatibility loop (:mod:`qdebug.targets.qnn_compat`) applies to the *float*
model where QNN rejected a node: each :class:`Rewrite` names the rejections it answers (QNN's op type and reason,
read from the compile log) and rewrites the nodes QNN named, on a copy of the model.

``einsum_to_matmul``
    QNN takes few Einsum equations ("Einsum unsupported equation: btgi,gih->btgh" for a grouped linear layer). Any
    one- or two-operand equation without ellipsis, repeated letters (diagonals) or broadcast dimensions is a
    batched matrix product: letters summed within one operand are summed out first (ReduceSum), then each operand
    is transposed to (batch, free, contracted) order and reshaped to rank 3 (without batch letters the left one
    keeps its leading dimensions), one MatMul, then a reshape and a transpose to the output's order; a one-operand
    equation is a ReduceSum and/or a Transpose. Constant operands are transposed and reshaped in numpy (a data
    move, exact). The rest is refused with its reason.
``graph_input_constants``
    Exports made for IR < 4 list every initializer as a graph input too, which makes it an *overridable* input:
    ORT and QNN then treat it as a runtime tensor ("QNN BatchNorm doesn't support dynamic mean."). Removing those
    inputs (keeping the initializers) makes them constants; the model computes the same thing unless a caller fed
    a weight, which no caller of an exported network does.

Every rewrite's result is checked on ORT's CPU against the model before it (:func:`check_rewrite`) by the loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdebug.targets.compile_report import FallbackNode

__all__ = [
    "CATALOGUE",
    "Exactness",
    "Rewrite",
    "RewriteResult",
    "einsum_plan",
    "einsum_to_matmul",
    "graph_input_constants",
]


class Exactness(StrEnum):
    """What a rewrite promises about the numbers (and what :func:`check_rewrite` measured)."""

    BIT_IDENTICAL = "bit-identical"
    FLOAT_ROUNDING = "within float rounding"  # a different summation order: equal up to float rounding


@dataclass(frozen=True)
class RewriteResult:
    """What one rewrite did: the new model (``None``: nothing changed), the nodes it rewrote and those it refused
    with the reason."""

    model: onnx.ModelProto | None
    rewritten: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rewrite:
    """One catalogue entry: which rejections it answers, the rewrite, and the exactness it promises."""

    name: str
    answers: Callable[[FallbackNode, onnx.ModelProto], bool]
    apply: Callable[[onnx.ModelProto, Sequence[str]], RewriteResult]
    exactness: Exactness
    description: str
    #: whether the model has anything this rewrite could change (no probe is needed for a model where none has)
    present: Callable[[onnx.ModelProto], bool]


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def targeted(model: onnx.ModelProto, op_type: str, names: Sequence[str]) -> list[onnx.NodeProto]:
    """The ``op_type`` nodes among ``names`` (QNN's node names are the float model's, which ORT's quantizer keeps);
    every ``op_type`` node when none of the names is found (an unnamed node has no name in the log to match)."""
    nodes = [n for n in model.graph.node if n.op_type == op_type]
    wanted = set(names)
    named = [n for n in nodes if n.name and n.name in wanted]
    return named or nodes


# ------------------------------------------------------------------------------------------------ graph-input constants
def _input_constants(model: onnx.ModelProto) -> set[str]:
    inits = {t.name for t in model.graph.initializer}
    return {i.name for i in model.graph.input if i.name in inits}


def _reads_input_constant(f: FallbackNode, model: onnx.ModelProto) -> bool:
    consts = _input_constants(model)
    if not consts:
        return False
    named = {n.name: n for n in model.graph.node if n.name}
    nodes = [named[x] for x in f.node_names if x in named] or [n for n in model.graph.node if n.op_type == f.op_type]
    return any(i in consts for n in nodes for i in n.input) or "dynamic" in f.reason.lower()


def graph_input_constants(model: onnx.ModelProto, names: Sequence[str] = ()) -> RewriteResult:
    """Remove every graph input that has an initializer of the same name (the initializer stays): the tensor
    becomes a constant. ``names`` is unused: the rewrite is the whole graph's, triggered by any node QNN refused
    for reading one."""
    consts = _input_constants(model)
    if not consts:
        return RewriteResult(None)
    m = _copy(model)
    kept = [i for i in m.graph.input if i.name not in consts]
    del m.graph.input[:]
    m.graph.input.extend(kept)
    return RewriteResult(m, tuple(sorted(consts)))


# ------------------------------------------------------------------------------------------------ Einsum
@dataclass(frozen=True)
class EinsumPlan:
    """A two-operand Einsum as one batched MatMul: each operand's permutation and 2-D/3-D shape, and the
    reshape and permutation that give the output's order (identity steps are ``None``)."""

    perm_a: tuple[int, ...] | None
    shape_a: tuple[int, ...]
    perm_b: tuple[int, ...] | None
    shape_b: tuple[int, ...]
    shape_out: tuple[int, ...]
    perm_out: tuple[int, ...] | None


def _parse(equation: str, operands: int) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    if "." in eq:
        raise ValueError("ellipsis ('...') is not supported")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != operands:
        raise ValueError(f"{len(terms)} operand term(s) for {operands} input(s)")
    if not arrow:  # implicit output: the letters seen once, in alphabetical order
        letters = "".join(terms)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for t in [*terms, out]:
        if len(set(t)) != len(t):
            raise ValueError(f"repeated letter in {t!r} (a diagonal)")
    return terms, out


def _perm(src: str, dst: str) -> tuple[int, ...] | None:
    p = tuple(src.index(c) for c in dst)
    return None if p == tuple(range(len(p))) else p


def einsum_plan(equation: str, shape_a: Sequence[int], shape_b: Sequence[int]) -> EinsumPlan:
    """The MatMul plan for ``equation`` over operands of these static shapes; :class:`ValueError` says why an
    equation is not a batched matrix product."""
    (a, b), out = _parse(equation, 2)
    if len(a) != len(shape_a) or len(b) != len(shape_b):
        raise ValueError("the operand ranks do not match the equation")
    size: dict[str, int] = {}
    for term, shape in ((a, shape_a), (b, shape_b)):
        for c, d in zip(term, shape, strict=True):
            if size.setdefault(c, int(d)) != int(d):
                raise ValueError(f"letter {c!r} has sizes {size[c]} and {d} (broadcasting is not supported)")
    if set(out) - set(a) - set(b):
        raise ValueError("an output letter is in no operand")
    lonely = [c for c in a + b if c not in out and ((c in a) != (c in b))]
    if lonely:  # _rewrite_einsum sums these out first (ReduceSum); a plan is for what is left
        raise ValueError(f"letter(s) {''.join(sorted(set(lonely)))!r} are summed within one operand")
    batch = "".join(c for c in out if c in a and c in b)
    left = "".join(c for c in out if c in a and c not in b)
    right = "".join(c for c in out if c in b and c not in a)
    contracted = "".join(c for c in a if c in b and c not in out)

    def prod(letters: str) -> int:
        return math.prod(size[c] for c in letters)

    # Without batch letters MatMul broadcasts the left operand's leading dimensions: they stay unflattened.
    rows = (prod(batch), prod(left)) if batch else (tuple(size[c] for c in left) or (1,))
    mid = batch + left + right
    return EinsumPlan(
        perm_a=_perm(a, batch + left + contracted),
        shape_a=(*rows, prod(contracted)),
        perm_b=_perm(b, batch + contracted + right),
        shape_b=(*((prod(batch),) if batch else ()), prod(contracted), prod(right)),
        shape_out=tuple(size[c] for c in mid),
        perm_out=_perm(mid, out),
    )


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference fails on some custom ops: use what the model declares
        inferred = model
    g = inferred.graph
    out: dict[str, tuple[int, ...]] = {t.name: tuple(t.dims) for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            out.setdefault(vi.name, tuple(int(d.dim_value) for d in dims))
    return out


class _Emitter:
    """Nodes and initializers that replace one Einsum, with names unique in the graph."""

    def __init__(self, model: onnx.ModelProto, prefix: str) -> None:
        self.g = model.graph
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inits = {t.name: t for t in self.g.initializer}
        self.taken = {*self.inits, *(o for n in self.g.node for o in n.output), *(i.name for i in self.g.input)}

    def name(self, what: str) -> str:
        base, i = f"{self.prefix}/{what}", 0
        while (n := base if i == 0 else f"{base}_{i}") in self.taken:
            i += 1
        self.taken.add(n)
        return n

    def const(self, value: np.ndarray, what: str) -> str:
        n = self.name(what)
        self.g.initializer.append(numpy_helper.from_array(value, n))
        return n

    def node(self, op: str, inputs: list[str], what: str, out: str | None = None, **attrs: Any) -> str:
        o = out or self.name(what)
        self.nodes.append(helper.make_node(op, inputs, [o], name=self.name(f"{what}_node"), **attrs))
        return o

    def sum_out(self, name: str, term: str, dims: Sequence[int], keep: str, opset: int) -> tuple[str, str, list[int]]:
        """The operand with the axes of its letters not in ``keep`` summed out (ReduceSum; numpy for a constant)."""
        axes = [i for i, c in enumerate(term) if c not in keep]
        if not axes:
            return name, term, list(dims)
        rest = "".join(c for c in term if c in keep)
        kept = [d for i, d in enumerate(dims) if i not in axes]
        if name in self.inits and name not in {i.name for i in self.g.input}:
            arr = numpy_helper.to_array(self.inits[name])
            return self.const(arr.sum(axis=tuple(axes), dtype=np.float64).astype(arr.dtype), "sum"), rest, kept
        if opset >= 13:  # ReduceSum takes its axes as an input from opset 13 on
            out = self.node("ReduceSum", [name, self.const(np.array(axes, np.int64), "sum_axes")], "sum", keepdims=0)
        else:
            out = self.node("ReduceSum", [name], "sum", axes=axes, keepdims=0)
        return out, rest, kept

    def operand(
        self, name: str, dims: Sequence[int], perm: tuple[int, ...] | None, shape: tuple[int, ...], what: str
    ) -> str:
        """The operand transposed and reshaped; a constant one in numpy (exact), a tensor through nodes (a step
        that would change nothing is left out)."""
        if name in self.inits and name not in {i.name for i in self.g.input}:
            arr = numpy_helper.to_array(self.inits[name])
            arr = np.ascontiguousarray(arr.transpose(perm) if perm else arr).reshape(shape)
            return self.const(arr, what)
        x = self.node("Transpose", [name], f"{what}_t", perm=list(perm)) if perm else name
        if tuple(dims[p] for p in perm or range(len(dims))) == shape:
            return x
        return self.node("Reshape", [x, self.const(np.array(shape, np.int64), f"{what}_shape")], what)


def _rewrite_einsum(model: onnx.ModelProto, node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Replace one Einsum of ``model`` (edited in place) by Transpose/Reshape/MatMul; the reason when refused."""
    eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
    if len(node.input) not in (1, 2):
        return f"{len(node.input)} operands (one or two are supported)"
    missing = [i for i in node.input if i not in shapes]
    if missing:
        return f"operand {missing[0]!r} has no static shape"
    em = _Emitter(model, _node_label(node))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    try:
        terms, out = _parse(eq, len(node.input))
        # Letters summed within one operand (in neither the other operand nor the output) are summed out first.
        ops = [
            em.sum_out(x, t, shapes[x], "".join(terms[1 - k] if len(terms) == 2 else "") + out, opset)
            for k, (x, t) in enumerate(zip(node.input, terms, strict=True))
        ]
        if len(ops) == 1:
            (x, term, _), final = ops[0], node.output[0]
            if sorted(term) != sorted(out):
                raise ValueError("an output letter is in no operand")
            perm = _perm(term, out)
            if perm:
                em.node("Transpose", [x], "t", out=final, perm=list(perm))
            elif em.nodes:  # the sum alone is the result
                em.nodes[-1].output[0] = final
            else:
                em.node("Identity", [x], "t", out=final)
        else:
            (xa, ta, da), (xb, tb, db) = ops
            plan = einsum_plan(f"{ta},{tb}->{out}", da, db)
            a = em.operand(xa, da, plan.perm_a, plan.shape_a, "a")
            b = em.operand(xb, db, plan.perm_b, plan.shape_b, "b")
            final = node.output[0]
            flat = plan.shape_out != (*plan.shape_a[:-1], plan.shape_b[-1])
            y = em.node("MatMul", [a, b], "matmul", out=None if flat or plan.perm_out else final)
            if flat:
                shape = em.const(np.array(plan.shape_out, np.int64), "out_shape")
                y = em.node("Reshape", [y, shape], "out", out=None if plan.perm_out else final)
            if plan.perm_out:
                em.node("Transpose", [y], "out_t", out=final, perm=list(plan.perm_out))
    except ValueError as exc:
        return f"equation {eq!r}: {exc}"
    g = model.graph
    at = list(g.node).index(node)
    g.node.remove(node)
    for k, n in enumerate(em.nodes):
        g.node.insert(at + k, n)
    return None


def einsum_to_matmul(model: onnx.ModelProto, names: Sequence[str] = ()) -> RewriteResult:
    """Rewrite the Einsum nodes among ``names`` (all of them when none resolves) as Transpose/Reshape/MatMul."""
    m = _copy(model)
    shapes = _static_shapes(m)
    done: list[str] = []
    refused: list[str] = []
    for node in targeted(m, "Einsum", names):
        label = _node_label(node)
        why = _rewrite_einsum(m, node, shapes)
        if why is None:
            done.append(label)
        else:
            refused.append(f"{label}: {why}")
    _drop_unused_initializers(m)
    return RewriteResult(m if done else None, tuple(done), tuple(refused))


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove the initializers no node reads any more (a constant operand replaced by its transposed copy)."""
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output} | {i.name for i in g.input}
    kept = [t for t in g.initializer if t.name in used]
    if len(kept) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(kept)


def _is_op(op_type: str) -> Callable[[FallbackNode, onnx.ModelProto], bool]:
    def answers(f: FallbackNode, model: onnx.ModelProto) -> bool:
        return f.op_type == op_type

    return answers


#: The rewrites the loop may apply, in the order it tries them on one round's rejections.
CATALOGUE: tuple[Rewrite, ...] = (
    Rewrite(
        "graph_input_constants",
        _reads_input_constant,
        graph_input_constants,
        Exactness.BIT_IDENTICAL,
        "graph inputs that have an initializer of the same name become plain initializers (constants)",
        lambda m: bool(_input_constants(m)),
    ),
    Rewrite(
        "einsum_to_matmul",
        _is_op("Einsum"),
        einsum_to_matmul,
        Exactness.FLOAT_ROUNDING,
        "Einsum as Transpose/Reshape/MatMul (a batched matrix product)",
        lambda m: any(n.op_type == "Einsum" for n in m.graph.node),
    ),
)
