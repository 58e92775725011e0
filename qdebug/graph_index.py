"""The one index of a model snapshot (:class:`GraphIndex`: topological order, producers, consumers, constants, Q/DQ
nodes) and the graph helpers it is built from: topological ordering, constant lookup and decoding, ``Constant``
nodes turned into initializers, and the light model shape inference reads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.errors import ModelError
from qdebug.model_io import QDQ_DOMAINS, is_dq, is_q


def topological_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes in a topological order (the stored order when it already is one)."""
    nodes = list(graph.node)
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    ok = True
    seen = set(available)
    for n in nodes:
        if any(i not in seen for i in n.input):
            ok = False
            break
        seen.update(n.output)
    if ok:
        return nodes
    # Kahn's algorithm, stable with respect to the stored order.
    producers = {o: idx for idx, n in enumerate(nodes) for o in n.output}
    deps = [{producers[i] for i in n.input if i in producers and i not in available} for n in nodes]
    done: set[int] = set()
    order: list[onnx.NodeProto] = []
    while len(order) < len(nodes):
        progressed = False
        for idx, n in enumerate(nodes):
            if idx not in done and deps[idx] <= done:
                done.add(idx)
                order.append(n)
                progressed = True
        if not progressed:
            raise ModelError(f"graph {graph.name!r} has a cycle or reads tensors nothing produces")
    return order


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, … — the first not in ``taken``, which it joins (names of tensors and
    initializers a rewrite adds must not clash with the graph's)."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def constant_values(model: onnx.ModelProto) -> dict[str, onnx.TensorProto | onnx.NodeProto]:
    """Where each constant tensor lives: initializers and ``Constant`` node outputs (decoded lazily)."""
    out: dict[str, onnx.TensorProto | onnx.NodeProto] = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in QDQ_DOMAINS:
            out[n.output[0]] = n
    return out


def decode_constant(c: onnx.TensorProto | onnx.NodeProto) -> np.ndarray:
    """Decode an initializer or a ``Constant`` node's value to numpy (a tensor that cannot be decoded — an
    undefined or unknown element type, data that do not fit its shape — is a :class:`ModelError` naming it)."""
    if isinstance(c, onnx.TensorProto):
        return _to_array(c, c.name)
    for a in c.attribute:
        if a.name == "value":
            return _to_array(a.t, c.output[0] if c.output else c.name)
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), dtype=np.float32)
        if a.name == "value_int":
            return np.array(a.i, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), dtype=np.int64)
    raise ModelError(f"Constant node {c.name or c.output[0]!r} has no supported value attribute")


def constants_to_initializers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with its top-level ``Constant`` nodes turned into initializers of the same name (the input is
    never modified), and the names moved.

    ONNX Runtime's QDQ quantizer treats a ``Constant`` node's output as an activation: a Conv weight exported that
    way (paddle2onnx writes every constant so) gets a calibrated per-tensor activation Q/DQ instead of the weight
    type, and Resize's ``scales`` get rounded (2.0 comes back as 1.99 and the model no longer runs). As initializers
    they are weights, as ORT's own ``quant_pre_process`` would make them. String and sparse constants stay nodes.
    """
    movable = [
        n
        for n in model.graph.node
        if n.op_type == "Constant"
        and n.domain in QDQ_DOMAINS
        and len(n.output) == 1
        and any(a.name in _DENSE_CONSTANT_ATTRS for a in n.attribute)
        and not any(a.name == "value" and a.t.data_type == onnx.TensorProto.STRING for a in n.attribute)
    ]
    if not movable:
        return model, []
    m = onnx.ModelProto()
    m.CopyFrom(model)
    moved = {n.output[0] for n in movable}
    kept = [n for n in m.graph.node if not (n.op_type == "Constant" and n.output and n.output[0] in moved)]
    by_name = {n.output[0]: n for n in movable}
    tensors = []
    for name in [n.output[0] for n in movable]:
        value = next((a.t for a in by_name[name].attribute if a.name == "value"), None)
        if value is not None:  # the tensor as it is (its exact type and bytes)
            t = onnx.TensorProto()
            t.CopyFrom(value)
            t.name = name
        else:
            t = numpy_helper.from_array(decode_constant(by_name[name]), name)
        tensors.append(t)
    del m.graph.node[:]
    m.graph.node.extend(kept)
    m.graph.initializer.extend(tensors)
    if m.ir_version < 4:  # before IR 4 every initializer must also be a graph input
        m.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in tensors)
    return m, sorted(moved)


_DENSE_CONSTANT_ATTRS = frozenset({"value", "value_float", "value_floats", "value_int", "value_ints"})


def _to_array(t: onnx.TensorProto, name: str) -> np.ndarray:
    try:
        return numpy_helper.to_array(t)
    except (TypeError, ValueError, KeyError) as exc:  # onnx raises these on an unknown type or a size mismatch
        raise ModelError(f"constant {name!r} cannot be decoded: {exc}") from exc


def light_model(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None, keep_values: int = 4096
) -> onnx.ModelProto:
    """The model for shape and type inference: initializers of more than ``keep_values`` values become typed graph
    inputs (inference serializes the whole model, weights included, just to read types), inputs named in
    ``shapes`` are pinned to them. Small initializers stay: ONNX's data propagation reads them (Reshape's shape)."""
    g = model.graph
    light = onnx.helper.make_graph([], g.name, [], list(g.output))
    light.node.extend(g.node)
    for i in g.input:
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(i)
        if shapes is not None and i.name in shapes and vi.type.HasField("tensor_type"):
            dims = vi.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[i.name]:
                dims.dim.add().dim_value = int(d)
        light.input.append(vi)
    inputs = {i.name for i in g.input}
    for t in g.initializer:
        if int(np.prod(t.dims)) <= keep_values:
            light.initializer.append(t)
        elif t.name not in inputs:
            light.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    out = onnx.helper.make_model(light, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.functions.extend(model.functions)
    return out


#: Ops whose output holds exactly the values of their first input, rearranged (same min/max/histogram): a
#: calibrated range or a promotion crosses them unchanged in either direction.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})


class GraphIndex:
    """The one index of a model snapshot, built once: nodes in topological order, each tensor's producer (and its
    position) and consumers, constant values (initializers and Constant nodes), Q/DQ nodes, graph inputs and
    outputs. Every pass and analysis reads these maps instead of building its own."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.model = model
        self.consts = constant_values(model)
        self.nodes = topological_nodes(g)
        self.position = {o: idx for idx, n in enumerate(self.nodes) for o in n.output if o}
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.consumers[i].append(n)
        self.qdq_nodes = {(n.name or n.output[0]): n for n in self.nodes if is_dq(n) or is_q(n)}
        initializers = {t.name for t in g.initializer}
        self.inputs = tuple(i.name for i in g.input if i.name not in initializers)
        self.outputs = tuple(o.name for o in g.output)

    def value(self, name: str) -> np.ndarray:
        """Decoded value of a constant tensor."""
        return decode_constant(self.consts[name])

    def consumers_of(self, name: str) -> list[onnx.NodeProto]:
        """The nodes reading ``name`` (in topological order; empty for a tensor nothing reads)."""
        return self.consumers.get(name, [])

    def distinct_consumers(self, name: str) -> list[onnx.NodeProto]:
        """The nodes reading ``name``, each once (a node reading it in two slots is listed once)."""
        # By identity: NodeProto equality compares contents, and two distinct nodes may be equal.
        return list({id(n): n for n in self.consumers_of(name)}.values())

    def sole_consumer(self, name: str) -> onnx.NodeProto | None:
        """The one node reading ``name``, if exactly one does (and it is not a graph output)."""
        users = self.consumers_of(name)
        return users[0] if len(users) == 1 and name not in self.outputs else None

    def set_input(self, node: onnx.NodeProto, slot: int, name: str) -> None:
        """Make ``node`` (one of this index's nodes) read ``name`` in input ``slot``, keeping the consumer lists
        right. Why: a rewrite that redirects inputs one by one (the Deeploy scale snapping gives a scale tensor its
        own copy) asks "who else reads this?" after earlier redirects; rebuilding the index each time is quadratic."""
        old = node.input[slot]
        if old == name:
            return
        users = self.consumers.get(old, [])
        for k, u in enumerate(users):
            if u is node:
                del users[k]
                break
        node.input[slot] = name
        self.consumers[name].append(node)

    def activations(self) -> list[str]:
        """Graph inputs, then every non-constant node output, in topological order."""
        return [*self.inputs, *(o for n in self.nodes if n.op_type != "Constant" for o in n.output if o)]
