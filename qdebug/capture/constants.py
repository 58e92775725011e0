"""Tensors computed from constants alone: computed once for a run, not on every sample.

A QDQ model run with graph optimizations off (what exact Q/DQ semantics need) dequantizes every weight on every
call, and a model may compute more from its constants alone (a signal basis, a dequantized embedding table), which
can be most of a sample's exposed bytes or of a quantized call's time. A whole-model capture run therefore

* **folds** each model (:func:`fold`) when what it adds is small
  (:attr:`~qdebug.capture.tuning.CaptureTuning.fold_max_bytes`): the nodes that
  read only constants are run once, by ONNX Runtime with the same kernels and options, and replaced by their values
  as initializers. The tensors the rest of the graph computes from them are the same, bit for bit (a test checks
  every tensor of the test models; see :func:`_overridable` for why that needs care);
* reduces an activation whose float tensor and quantized tensors are all constants (:func:`split`) once, from
  those values, and gives every sample the same sums for it (:class:`ConstantSums`): it is not exposed, fetched or
  reduced per sample.

Not folded: random generators (a new value each call), nodes with subgraphs, nodes of domains other than ONNX's and
``com.microsoft`` (a custom op's behaviour is unknown), nodes whose output is a graph output, and nothing at all if
ONNX Runtime cannot run the constant part or returns a value that is not a tensor: the model is then run as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import numpy_helper

from qdebug.capture.base import SampleSums
from qdebug.graph_index import topological_nodes
from qdebug.metrics import BatchSums
from qdebug.pairing import ActivationPair, Pairing

__all__ = ["ConstantSums", "Fold", "constant_tensors", "constant_values", "fold", "split"]

#: Operators whose output changes from call to call although their inputs do not.
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})
_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_STORABLE = frozenset("biuf")  # numpy kinds of the values a fold stores as initializers (bool, ints, floats)


def _foldable_op(node: onnx.NodeProto) -> bool:
    return (
        node.domain in _DOMAINS
        and node.op_type not in NONDETERMINISTIC
        and (bool(node.input) or node.op_type == "Constant")
        and not any(a.type in _SUBGRAPH for a in node.attribute)
    )


def constant_tensors(model: onnx.ModelProto) -> frozenset[str]:
    """The tensors of ``model``'s main graph whose value depends on no input: its initializers and the outputs of
    nodes (see the module doc for which) that read only those."""
    const = {i.name for i in model.graph.initializer}
    for node in topological_nodes(model.graph):
        if _foldable_op(node) and all(x == "" or x in const for x in node.input):
            const.update(o for o in node.output if o)
    return frozenset(const)


def _subgraph_names(graph: onnx.GraphProto) -> Iterator[str]:
    """Every tensor name read inside the subgraphs of ``graph``'s nodes (outer-scope values among them)."""
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                for inner in sub.node:
                    yield from inner.input
                yield from (o.name for o in sub.output)
                yield from _subgraph_names(sub)


def _constant_nodes(graph: onnx.GraphProto, const: frozenset[str]) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` (in a topological order) that compute constants from constants alone."""
    return [n for n in topological_nodes(graph) if _foldable_op(n) and all(x == "" or x in const for x in n.input)]


def _needed(nodes: Sequence[onnx.NodeProto], names: Collection[str]) -> list[onnx.NodeProto]:
    """Those of ``nodes`` that ``names`` depend on (in their order)."""
    want, picked = set(names), []
    for node in reversed(nodes):
        if any(o in want for o in node.output):
            picked.append(node)
            want.update(x for x in node.input if x)
    return picked[::-1]


def _evaluate(
    model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], names: Sequence[str], providers: Sequence[str]
) -> list[np.ndarray] | None:
    """The values of ``names`` computed by ``nodes`` alone (no graph inputs), by ONNX Runtime with qdebug's session
    options; ``None`` if it cannot (a value that is not a tensor, an error)."""
    from qdebug.errors import QDebugError
    from qdebug.ort import make_session, ort_errors

    read = {x for n in nodes for x in n.input}
    sub = onnx.helper.make_graph(
        list(nodes),
        "qdebug_constants",
        [],
        [onnx.ValueInfoProto(name=n) for n in names],
        [i for i in model.graph.initializer if i.name in read],
    )
    part = onnx.helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    part.functions.extend(model.functions)
    errors: tuple[type[BaseException], ...] = (QDebugError, *ort_errors())
    try:
        values = make_session(part, providers).run(list(names), {})  # type: ignore[attr-defined]
    except errors:
        return None
    return values if all(isinstance(v, np.ndarray) for v in values) else None


def constant_values(
    model: onnx.ModelProto, names: Sequence[str], providers: Sequence[str], const: frozenset[str] | None = None
) -> dict[str, np.ndarray] | None:
    """The values of constant tensors ``names`` of ``model`` (see :func:`constant_tensors`; ``const``: its result,
    when the caller has it), computed by ONNX Runtime from the nodes they need alone; ``None`` if it cannot."""
    inits = {i.name: i for i in model.graph.initializer}
    out = {n: numpy_helper.to_array(inits[n]) for n in names if n in inits}
    rest = [n for n in names if n not in out]
    if rest:
        nodes = _needed(_constant_nodes(model.graph, const or constant_tensors(model)), rest)
        values = _evaluate(model, nodes, rest, providers)
        if values is None:
            return None
        out |= dict(zip(rest, values, strict=True))
    return out


def _folded(graph: onnx.GraphProto, const: frozenset[str]) -> list[onnx.NodeProto]:
    """The nodes :func:`fold` replaces: constant-only, none with a graph output, none reading a kept node's output."""
    outputs = {o.name for o in graph.output}
    have = {i.name for i in graph.initializer}
    nodes = []
    for n in _constant_nodes(graph, const):
        if not any(o in outputs for o in n.output) and all(x == "" or x in have for x in n.input):
            nodes.append(n)
            have.update(n.output)
    return nodes


def _bytes_of(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> int:
    """An estimate of the bytes folding ``nodes`` adds as initializers, before running anything: the elements of
    the weights and ``Constant`` values they read, at 4 bytes each (a dequantized weight's size)."""
    read = {x for n in nodes for x in n.input}
    elements = sum(int(np.prod(i.dims)) for i in model.graph.initializer if i.name in read)
    for n in nodes:
        for a in n.attribute:
            if n.op_type == "Constant" and a.type == onnx.AttributeProto.TENSOR:
                elements += int(np.prod(a.t.dims))
    return 4 * elements


@dataclass(frozen=True)
class Fold:
    """What :func:`fold` did: how many nodes it replaced, and the bytes it estimated they add (``nodes`` is 0 when
    that is above the caller's bound, or when nothing could be folded)."""

    nodes: int
    estimated_bytes: int


def fold(model: onnx.ModelProto, providers: Sequence[str], max_bytes: int | None = None) -> Fold:
    """Replace ``model``'s constant-only nodes by their values, **in place** (for a copy the caller owns): nodes
    whose output is a graph output are kept (a capture run exposes what it fetches as graph outputs, so those stay
    computed). ``model`` is unchanged when there is nothing to fold, when ONNX Runtime cannot compute it, or when
    the values would add more than ``max_bytes`` (estimated before anything runs)."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    nodes = _folded(graph, constant_tensors(model))
    est = _bytes_of(model, nodes)
    if not nodes or (max_bytes is not None and est > max_bytes):
        return Fold(0, est)
    gone = {o for n in nodes for o in n.output if o}
    read = (
        {x for n in graph.node if not any(o in gone for o in n.output) for x in n.input}
        | set(_subgraph_names(graph))
        | outputs
    )
    boundary = sorted(t for t in read if t in gone)
    values = _evaluate(model, nodes, boundary, providers) if boundary else []
    if values is None or not all(v.dtype.kind in _STORABLE for v in values):
        return Fold(0, est)  # e.g. a string tensor: run the model as it is
    # ONNX Runtime makes a Constant node's output an initializer itself: only the others are made overridable
    from_constant = {o for n in nodes if n.op_type == "Constant" for o in n.output}
    # deleted in place, last first: the kept messages are not copied (a model's weights can be hundreds of MB)
    _drop(graph.node, lambda n: any(o in gone for o in n.output))
    unread = {t.name for t in graph.initializer if t.name not in read}  # e.g. a folded DequantizeLinear's integers
    _drop(graph.initializer, lambda t: t.name in unread)
    _drop(graph.input, lambda i: i.name in unread)  # listed as an input too (IR < 4, or overridable): not any more
    _drop(graph.value_info, lambda v: v.name in gone and v.name not in read)
    for k, name in enumerate(boundary):  # one value at a time in two copies (array, tensor), not all of them
        graph.initializer.add().CopyFrom(numpy_helper.from_array(values[k], name))
        values[k] = None  # type: ignore[call-overload]
    _overridable(model, [t for t in graph.initializer if t.name in gone and t.name not in from_constant])
    return Fold(len(nodes), est)


def _drop(field: Any, gone: Callable[[Any], bool]) -> None:
    """Delete the elements of a repeated protobuf field for which ``gone`` holds, in place."""
    for i in range(len(field) - 1, -1, -1):
        if gone(field[i]):
            del field[i]


def _overridable(model: onnx.ModelProto, computed: Sequence[onnx.TensorProto]) -> None:
    """Declare the folded values graph inputs too (initializers a caller could override), so that ONNX Runtime
    treats them as it treated them before folding: as values computed at run time, not as constant weights. A
    constant weight is pre-packed by some kernels (MatMul, Gemm, LSTM, ...), which changes the order of their
    sums: the same tensors would come out different in their last bits (measured on four corpus models). The
    original initializers stay constant: in a model of IR version < 4, which lists every initializer among its
    inputs and treats them all as constant, they are taken off that list and the version raised to 4."""
    graph = model.graph
    if model.ir_version < 4:
        inits = {i.name for i in graph.initializer}
        inputs = [i for i in graph.input if i.name not in inits]
        del graph.input[:]
        graph.input.extend(inputs)
        model.ir_version = 4
    for t in computed:
        graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))


def split(pairing: Pairing, float_const: frozenset[str], quant_const: frozenset[str]) -> tuple[Pairing, Pairing]:
    """``pairing`` as (varying, constant): an activation is constant when its float tensor and its quantized
    tensors (pre- and post-Q/DQ) are all constants of their models. Outputs and weights stay with the varying part."""

    def constant(a: ActivationPair) -> bool:
        quant = a.post_qdq in quant_const and (not a.quantized or a.pre_qdq in quant_const)
        return a.tensor_name in float_const and quant

    acts = pairing.activations
    varying = tuple(a for a in acts if not constant(a))
    fixed = tuple(a for a in acts if constant(a))
    return replace(pairing, activations=varying), replace(pairing, activations=fixed, weights=(), outputs=())


def _spread(parts: Sequence[tuple[npt.NDArray[np.intp], BatchSums]], n: int) -> BatchSums:
    """One :class:`BatchSums` of ``n`` pairs from parts whose pairs go at the given positions."""
    fields = ("signal", "noise", "count", "max_abs", "nonfinite_reference", "nonfinite_test")
    out = {}
    for f in fields:
        arr = np.empty(n, dtype=getattr(parts[0][1], f).dtype)
        for pos, sums in parts:
            arr[pos] = getattr(sums, f)
        out[f] = arr
    return BatchSums(**out)


class ConstantSums:
    """The constant activations' sums, reduced once, and how to put them back among a sample's varying ones: a
    sample's :class:`SampleSums` of the varying pairing becomes that of the whole pairing (:meth:`complete`), the
    same as if the constant tensors had been fetched and reduced with it."""

    def __init__(self, pairing: Pairing, varying: Pairing, sums: SampleSums) -> None:
        fixed = {id(a) for a in pairing.activations} - {id(a) for a in varying.activations}
        acts = pairing.activations
        quant_ord = {j: k for k, j in enumerate(j for j, a in enumerate(acts) if a.quantized)}
        var = [j for j, a in enumerate(acts) if id(a) not in fixed]
        con = [j for j, a in enumerate(acts) if id(a) in fixed]
        self.n_acts, self.n_quant = len(acts), len(quant_ord)
        self.var, self.con = np.array(var, dtype=np.intp), np.array(con, dtype=np.intp)
        self.var_q = np.array([quant_ord[j] for j in var if acts[j].quantized], dtype=np.intp)
        self.con_q = np.array([quant_ord[j] for j in con if acts[j].quantized], dtype=np.intp)
        self.sums = sums
        self.count = len(con)

    def complete(self, s: SampleSums) -> SampleSums:
        """The whole pairing's sums of a sample whose varying pairs' sums are ``s``."""
        c, n = self.sums, self.n_acts

        def by_act(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            out = np.empty(n, dtype=a.dtype)
            out[self.var], out[self.con] = a, b
            return out

        return SampleSums(
            cumulative=_spread([(self.var, s.cumulative), (self.con, c.cumulative)], n),
            local=_spread([(self.var_q, s.local), (self.con_q, c.local)], self.n_quant),
            outputs=s.outputs,
            float_min=by_act(s.float_min, c.float_min),
            float_max=by_act(s.float_max, c.float_max),
            elements=by_act(s.elements, c.elements),
        )
