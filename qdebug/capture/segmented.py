"""Segmented fetch: one sample's memory bounded on models whose exposed tensors do not fit at once.

Exposing every paired tensor keeps all of them alive until the run returns, so on a large model one sample's tensors
set the peak however the reduction is done. When one sample's exposed tensors — estimated by shape inference
(ONNX's, or where it leaves gaps ONNX Runtime's symbolic one) at the first sample's input shapes — exceed a
threshold (:class:`~qdebug.capture.tuning.SegmentRule`), both models are cut into consecutive **segments** along
the float model's topological order, about the rule's budget of exposed tensors each. Each segment is its own ORT
session exposing only its own tensors; a sample runs segment after segment, the tensors that cross a cut are handed
to the next segments as inputs, and each segment's pairs are reduced (by the run's reducer: numpy or compiled) as
soon as their tensors exist, then dropped. On two or more cores the next segment is inferred on a worker thread
while the current one is reduced (the next *sample* is not: two samples' tensors are what segmenting avoids). The
sums are those of the whole-model run: the same kernels compute the same tensors (graph optimizations are off, so
a cut changes no arithmetic), and a pair is reduced from the same arrays.

The segment sessions share **one ORT memory arena** (:func:`~qdebug.ort.shared_arena`): an arena keeps
every tensor it ever held, so with one arena per session each segment would keep its own peak and the segments' sum
would be the whole model's again; without any arena every tensor of every segment is fresh memory from the kernel on
every sample (page faults, and a higher peak). One shared arena holds about one segment's working set and is reused
by every segment and sample. They do not spin either: the idle intra-op threads of 2 × segments sessions
busy-waiting would take the reduction's core.

Models with control flow (``If``/``Loop``/``Scan`` subgraphs read outer tensors implicitly) are not segmented.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from qdebug._symbolic import symbolic_shapes
from qdebug.capture.base import SampleSums
from qdebug.capture.dequant import Dequantized, DequantSpec
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.capture.threads import submit_started
from qdebug.capture.tuning import CaptureTuning
from qdebug.errors import DataError, ModelError
from qdebug.graph_index import light_model, topological_nodes
from qdebug.metrics import BatchSums
from qdebug.ort import make_session, ort_message
from qdebug.pairing import Pairing

__all__ = ["SegmentedFetch", "exposed_bytes", "mean_elements", "plan_segments", "tensor_elements"]

#: Initializers up to this many elements keep their values in the shape-inference copy (shape tensors for Reshape,
#: Expand, Slice...); larger ones are replaced by typed inputs, so the copy costs no weight memory.
_KEEP_VALUES = 4096

_Vals = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]  # values by name: float model, QDQ model
_Out = tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]  # one segment's outputs per model, its seconds
Reducer = Any  # Callable[[ReductionPlan, Mapping, Mapping], SampleSums]; Any avoids importing fetch


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` through ONNX Runtime's symbolic shape inference, or ``None`` if it fails.

    It follows shape arithmetic (Shape -> Gather -> Cast -> Concat -> Reshape, as in every exported ViT) that
    ONNX's own data propagation gives up on, but it is pure Python and slower (and may fail), so it runs only where
    ONNX's leaves gaps."""
    return symbolic_shapes(model)


def _item_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes per element of every tensor whose element type is inferred."""
    g = model.graph
    return {
        v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).itemsize
        for v in [*g.value_info, *g.output, *g.input]
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
    }


def _probed(
    model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], names: Sequence[str], items: Mapping[str, int]
) -> dict[str, int] | None:
    """Bytes of ``names`` from one run of ONNX Runtime on zeros of ``shapes``, each tensor's ``Shape`` an extra
    output (its element size from ``items``, else 4), or ``None`` if ORT cannot make or run that model (see
    :attr:`~qdebug.capture.tuning.CaptureTuning.probe_model_bytes` for when this replaces the symbolic
    inference)."""
    g = model.graph
    fed = [i for i in g.input if i.name not in {t.name for t in g.initializer}]
    if not all(i.name in shapes and i.type.HasField("tensor_type") for i in fed):
        return None
    targets = [n for n in names if n not in {i.name for i in g.input}]
    known = {n: math.prod(shapes[n]) * items.get(n, 4) for n in names if n in shapes}
    if not targets:
        return known
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    for k, n in enumerate(targets):
        probe.graph.node.append(onnx.helper.make_node("Shape", [n], [f"qdebug_probe_{k}"]))
        probe.graph.output.append(onnx.helper.make_tensor_value_info(f"qdebug_probe_{k}", onnx.TensorProto.INT64, None))
    dtype = onnx.helper.tensor_dtype_to_np_dtype
    feed = {i.name: np.zeros(shapes[i.name], dtype(i.type.tensor_type.elem_type)) for i in fed}
    try:
        got = make_session(probe, ["CPUExecutionProvider"], role="shape probe").run(None, feed)  # type: ignore[attr-defined]
    except Exception:  # ORT's own error types (an op zeros make fail, a model it cannot load): infer instead
        return None
    sizes = {n: math.prod(int(d) for d in np.asarray(v)) * items.get(n, 4) for n, v in zip(targets, got, strict=True)}
    return sizes | known


def _onnx_inferred(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` through ONNX's own shape inference (with data propagation), or ``None`` if it fails."""
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # onnx raises its own InferenceError / ValidationError types
        return None


def _sizes(model: onnx.ModelProto) -> dict[str, int | None]:
    """Bytes of every tensor whose type and shape can be inferred (``None``: not fully known)."""
    g = model.graph
    return {v.name: _tensor_bytes(v) for v in [*g.value_info, *g.output, *g.input]}


def _tensor_bytes(vi: onnx.ValueInfoProto) -> int | None:
    """Bytes of a fully known tensor type, else ``None``."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape") or not tt.elem_type:
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
    if any(d < 0 for d in dims):
        return None
    return math.prod(dims) * onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize


def _multiplicity(plan: ReductionPlan) -> dict[str, int]:
    """How many values each float tensor of the plan stands for once exposed: itself plus its QDQ model's pre- and
    post-Q/DQ values (a model output: itself and the quantized model's)."""
    mult: dict[str, int] = {}
    for a in plan.pairing.activations:
        mult[a.tensor_name] = mult.get(a.tensor_name, 0) + 1 + (2 if a.quantized else 1)
    for o in plan.pairing.outputs:
        mult[o.output_name] = mult.get(o.output_name, 0) + 2
    return mult


def tensor_elements(weight: Mapping[str, int], plan: ReductionPlan) -> dict[str, float]:
    """Each float tensor's size in float32 elements (bytes / 4), from :func:`exposed_bytes`'s ``weight`` (which
    counts every value the tensor stands for once exposed)."""
    mult = _multiplicity(plan)
    return {t: w / mult[t] / 4 for t, w in weight.items() if mult.get(t)}


def mean_elements(weight: Mapping[str, int], plan: ReductionPlan) -> float:
    """The mean size of the plan's float tensors in float32 elements (bytes / 4), from :func:`exposed_bytes`'s
    ``weight``: the static counterpart of what ``auto`` measures on sample 0 (``SampleSums.elements``)."""
    sizes = list(tensor_elements(weight, plan).values())
    return sum(sizes) / len(sizes) if sizes else 0.0


def exposed_bytes(
    float_model: onnx.ModelProto,
    plan: ReductionPlan,
    shapes: Mapping[str, tuple[int, ...]],
    probe_bytes: int = CaptureTuning.probe_model_bytes,
) -> dict[str, int] | None:
    """Exposed bytes per float tensor of the plan (its float value plus its QDQ model's pre- and post-Q/DQ values),
    from shape inference at ``shapes``; ``None`` when more than a tenth of them have no static size (the model's
    shapes depend on data: no estimate, no segmenting)."""
    mult = _multiplicity(plan)
    if not mult:
        return None
    light = light_model(float_model, shapes, _KEEP_VALUES)
    # ONNX's inference first (C++, milliseconds); where it leaves more than a tenth unknown, one run of a small model
    # or ORT's symbolic inference
    inferred = _onnx_inferred(light)
    sizes = _sizes(inferred) if inferred is not None else {}
    known = {t: s * m for t, m in mult.items() if (s := sizes.get(t)) is not None}
    if len(known) < 0.9 * len(mult):
        unknown = [t for t in mult if t not in known]
        probed: Mapping[str, int | None] | None = None
        if float_model.ByteSize() <= probe_bytes:
            probed = _probed(float_model, shapes, unknown, _item_sizes(inferred) if inferred is not None else {})
        if probed is None:
            symbolic = _symbolic(light)
            probed = _sizes(symbolic) if symbolic is not None else {}
        known |= {t: s * mult[t] for t in unknown if (s := probed.get(t)) is not None}
    if len(known) < 0.9 * len(mult):
        return None
    mean = sum(known.values()) // max(1, len(known))
    return {t: known.get(t, mean) for t in mult}


def _has_subgraphs(model: onnx.ModelProto) -> bool:
    kinds = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    return any(a.type in kinds for n in model.graph.node for a in n.attribute)


def _float_cuts(nodes: Sequence[onnx.NodeProto], weight: Mapping[str, int], budget: int) -> list[int]:
    """Each node's segment: consecutive runs of the topological order holding about ``budget`` exposed bytes."""
    seg, acc, out = 0, 0, []
    for n in nodes:
        w = sum(weight.get(o, 0) for o in n.output)
        if acc and acc + w > budget:
            seg, acc = seg + 1, 0
        acc += w
        out.append(seg)
    return out


def _quant_segments(nodes: Sequence[onnx.NodeProto], float_seg: Mapping[str, int]) -> list[int]:
    """Each QDQ-model node's segment: its float twin's (a node writing a tensor of the float model), and never
    before a producer of its inputs; a node reading constants only (a weight's DequantizeLinear) goes with its
    first consumer, so dequantized weights are not handed across cuts."""
    produced: dict[str, int] = {}
    seg: list[int | None] = []
    for n in nodes:
        producers = [produced[i] for i in n.input if i in produced]
        twins = [float_seg[o] for o in n.output if o in float_seg]
        if not producers and not twins:
            seg.append(None)
            continue
        s = max([*producers, *twins])
        seg.append(s)
        for o in n.output:
            produced[o] = s
    consumers: dict[str, list[int]] = {}
    for idx, n in enumerate(nodes):
        for i in n.input:
            consumers.setdefault(i, []).append(idx)
    for idx in range(len(nodes) - 1, -1, -1):  # reverse order: consumers are placed before constant-only producers
        if seg[idx] is None:
            later = [seg[c] for o in nodes[idx].output for c in consumers.get(o, ())]
            seg[idx] = min((s for s in later if s is not None), default=0)
    return [s if s is not None else 0 for s in seg]


@dataclass(frozen=True)
class _Part:
    """One segment of one model: its nodes, what it reads from earlier segments, and what it writes."""

    nodes: tuple[onnx.NodeProto, ...]
    inputs: tuple[str, ...]  # tensors from the sample or earlier segments
    outputs: tuple[str, ...]  # exposed tensors produced here, and tensors later segments read


def _parts(
    model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], seg: Sequence[int], exposed: set[str], k: int
) -> list[_Part]:
    """The ``k`` segments of one model (some may be empty)."""
    inits = {t.name for t in model.graph.initializer}
    producer = {o: s for n, s in zip(nodes, seg, strict=True) for o in n.output if o}
    last_read: dict[str, int] = {}
    for n, s in zip(nodes, seg, strict=True):
        for i in n.input:
            if i and i not in inits:
                last_read[i] = max(last_read.get(i, -1), s)
    graph_outputs = {o.name for o in model.graph.output}
    parts = []
    for j in range(k):
        mine = [n for n, s in zip(nodes, seg, strict=True) if s == j]
        reads = dict.fromkeys(i for n in mine for i in n.input if i and i not in inits and producer.get(i, -1) < j)
        writes = dict.fromkeys(
            o for n in mine for o in n.output if o and (o in exposed or o in graph_outputs or last_read.get(o, -1) > j)
        )
        parts.append(_Part(tuple(mine), tuple(reads), tuple(writes)))
    return parts


def _part_model(model: onnx.ModelProto, part: _Part, types: Mapping[str, onnx.TypeProto], j: int) -> onnx.ModelProto:
    """One segment as a model: typed inputs (from the values the sample produced), untyped outputs (ORT's own)."""
    used = {i for n in part.nodes for i in n.input}
    g = onnx.helper.make_graph(
        list(part.nodes),
        f"{model.graph.name}_segment{j}",
        [onnx.helper.make_value_info(i, types[i]) for i in part.inputs],
        [onnx.ValueInfoProto(name=o) for o in part.outputs],
        [t for t in model.graph.initializer if t.name in used],
    )
    out = onnx.helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.functions.extend(model.functions)
    return out


class _Heap:
    """Gives freed heap memory back to the system every ``every`` samples.

    Without an arena, the segments' tensors come from glibc's heap, where blocks of different sizes freed in a
    different order each sample fragment it, so the peak creeps up sample after sample. ``malloc_trim`` returns the
    free pages, but after every sample it would cost their page faults again: every few samples balances the two
    (:attr:`~qdebug.capture.tuning.CaptureTuning.trim_every`). Not glibc: no-op."""

    def __init__(self, every: int) -> None:
        self.samples, self.every = 0, every
        self.trims = 0
        try:
            import ctypes

            self._trim: Any = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            self._trim = None

    def check(self) -> None:
        """Called after each sample."""
        self.samples += 1
        if self._trim is not None and self.samples % self.every == 0:
            self._trim(0)
            self.trims += 1


def _type_of(value: np.ndarray) -> onnx.TypeProto:
    """A segment input's type: the element type of the value that crossed the cut, no shape (later samples may
    have other shapes; ORT checks each run's shapes against the kernels, not against this)."""
    return onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(value.dtype), None)


@dataclass(frozen=True)
class SegmentPlan:
    """Where the two models are cut, and which pairs each segment reduces."""

    float_parts: tuple[_Part, ...]
    quant_parts: tuple[_Part, ...]
    plans: tuple[ReductionPlan, ...]  # the pairs reduced after each segment
    acts: tuple[np.ndarray, ...]  # their indices among all activations
    locals_: tuple[np.ndarray, ...]  # their indices among the quantized activations
    outs: tuple[np.ndarray, ...]  # their indices among the model outputs
    exposed_bytes: int  # one sample's exposed tensors, estimated
    #: post-Q/DQ tensors not exposed: computed from their integers, which are (qdebug.capture.dequant)
    dequant: Mapping[str, DequantSpec] = field(default_factory=dict)

    @property
    def count(self) -> int:
        """How many segments."""
        return len(self.float_parts)


def plan_segments(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    plan: ReductionPlan,
    shapes: Mapping[str, tuple[int, ...]],
    above: int,
    budget: int,
    dequant: Mapping[str, DequantSpec] | None = None,
    weight: Mapping[str, int] | None = None,
) -> SegmentPlan | None:
    """The segments for samples of input ``shapes``, or ``None`` when one sample's tensors fit in ``above`` bytes
    cannot be estimated, or a model has control flow; ``budget`` is the exposed bytes per segment. Of the post-Q/DQ
    tensors ``dequant`` can compute, those
    that do not cross a cut are not exposed: their integers are (:attr:`SegmentPlan.dequant`). ``weight``:
    :func:`exposed_bytes` at ``shapes`` when the caller has it already."""
    if weight is None:
        weight = exposed_bytes(float_model, plan, shapes)
    if weight is None or sum(weight.values()) <= above or _has_subgraphs(float_model) or _has_subgraphs(quant_model):
        return None
    f_nodes, q_nodes = topological_nodes(float_model.graph), topological_nodes(quant_model.graph)
    f_seg = _float_cuts(f_nodes, weight, budget)
    if max(f_seg, default=0) == 0:
        return None
    float_seg = {o: s for n, s in zip(f_nodes, f_seg, strict=True) for o in n.output if o}
    q_seg = _quant_segments(q_nodes, float_seg)
    quant_seg = {o: s for n, s in zip(q_nodes, q_seg, strict=True) for o in n.output if o}
    k = max(*f_seg, *q_seg) + 1

    def at(*names: str) -> int:
        return max(max(float_seg.get(n, 0), quant_seg.get(n, 0)) for n in names)

    pairing = plan.pairing
    act_seg = [at(a.tensor_name, a.pre_qdq, a.post_qdq) for a in pairing.activations]
    out_seg = [at(o.output_name, o.quant_name) for o in pairing.outputs]
    ordinal = np.cumsum([a.quantized for a in pairing.activations]) - 1
    plans, acts, locs, outs = [], [], [], []
    for j in range(k):
        ai = np.array([i for i, s in enumerate(act_seg) if s == j], dtype=np.intp)
        oi = np.array([i for i, s in enumerate(out_seg) if s == j], dtype=np.intp)
        sub = Pairing(
            activations=tuple(pairing.activations[i] for i in ai),
            weights=(),
            outputs=tuple(pairing.outputs[i] for i in oi),
        )
        plans.append(ReductionPlan.of(sub))
        acts.append(ai)
        locs.append(np.array([ordinal[i] for i in ai if pairing.activations[i].quantized], dtype=np.intp))
        outs.append(oi)
    swapped = _local_posts(quant_model, q_nodes, q_seg, dequant or {})
    q_exposed = (set(plan.quant_names) - set(swapped)) | {spec.ints for spec in swapped.values()}
    f_parts = _parts(float_model, f_nodes, f_seg, set(plan.float_names), k)
    q_parts = _parts(quant_model, q_nodes, q_seg, q_exposed, k)
    return SegmentPlan(
        tuple(f_parts),
        tuple(q_parts),
        tuple(plans),
        tuple(acts),
        tuple(locs),
        tuple(outs),
        sum(weight.values()),
        swapped,
    )


def _local_posts(
    model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], seg: Sequence[int], dequant: Mapping[str, DequantSpec]
) -> dict[str, DequantSpec]:
    """The specs whose post-Q/DQ tensor is read only in the segment that makes it and is no graph output: exposing
    its integers instead saves its float bytes (one that crosses a cut is handed over as floats anyway)."""
    made = {o: s for n, s in zip(nodes, seg, strict=True) for o in n.output if o in dequant}
    later = {i for n, s in zip(nodes, seg, strict=True) for i in n.input if i in made and s != made[i]}
    outputs = {o.name for o in model.graph.output}
    return {post: spec for post, spec in dequant.items() if post in made and post not in later | outputs}


def _scatter(parts: Sequence[BatchSums], where: Sequence[np.ndarray], n: int) -> BatchSums:
    """The segments' sums of some pairs each, as the sums of all ``n`` pairs in their original order."""
    fields = {}
    for name in ("signal", "noise", "count", "max_abs", "nonfinite_reference", "nonfinite_test"):
        first = getattr(parts[0], name) if parts else np.zeros(0)
        full = np.zeros(n, dtype=first.dtype)
        for p, idx in zip(parts, where, strict=True):
            full[idx] = getattr(p, name)
        fields[name] = full
    return BatchSums(**fields)


class SegmentedFetch:
    """Runs a :class:`SegmentPlan` sample by sample, reducing each segment's pairs as soon as they exist.

    Sessions are made on the first sample, from the types of the values that cross each cut (shape inference
    leaves some QDQ-model types open: com.microsoft Q/DQ outputs)."""

    def __init__(
        self,
        segments: SegmentPlan,
        models: tuple[onnx.ModelProto, onnx.ModelProto],
        providers: Sequence[str],
        tuning: CaptureTuning,
        pipelined: bool = False,
    ):
        self.segments, self.models, self.providers = segments, models, tuple(providers)
        self.sessions: list[tuple[Any, Any]] = []
        self.n_acts = sum(len(a) for a in segments.acts)
        self.n_local = sum(len(a) for a in segments.locals_)
        self.n_outs = sum(len(a) for a in segments.outs)
        self._last_use = self._last_uses()
        self.ran = False  # a whole sample has run (a segment that fails to load after that is an error)
        self.load_failure: str | None = None  # why a segment's session could not be made
        self._heap = _Heap(tuning.trim_every)
        self.wait_s = tuning.started_wait_s
        self.pipelined = pipelined
        self.threads: int | None = None  # the segment sessions' intra-op threads (None: ORT's default, one per core)
        self._pool: ThreadPoolExecutor | None = None

    def _last_uses(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per model, the last segment after which each value is still needed (as an input or by a pair)."""
        uses: tuple[dict[str, int], dict[str, int]] = ({}, {})
        for side, parts in enumerate((self.segments.float_parts, self.segments.quant_parts)):
            for j, part in enumerate(parts):
                for i in part.inputs:
                    uses[side][i] = max(uses[side].get(i, -1), j)
        dequant = self.segments.dequant
        for j, plan in enumerate(self.segments.plans):
            for i in plan.float_names:
                uses[0][i] = max(uses[0].get(i, -1), j)
            for i in (dequant[n].ints if n in dequant else n for n in plan.quant_names):
                uses[1][i] = max(uses[1].get(i, -1), j)
        return uses

    def _session(self, side: int, j: int, values: Mapping[str, np.ndarray]) -> Any:
        part = (self.segments.float_parts, self.segments.quant_parts)[side][j]
        if not part.nodes:
            return None
        types = {i: _type_of(np.asarray(values[i])) for i in part.inputs}
        model = _part_model(self.models[side], part, types, j)
        role = ("float model", "quantized model")[side]
        try:
            return make_session(
                model, self.providers, role=f"{role} (segment {j})", arena="shared", spin=False, threads=self.threads
            )
        except ModelError as exc:
            self.load_failure = str(exc)
            raise

    def _run(self, side: int, j: int, inputs: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
        """Segment ``j`` of one model on its inputs: its outputs by name."""
        if len(self.sessions) <= j:
            self.sessions.append((None, None))
        sess = self.sessions[j][side]
        if sess is None:
            sess = self._session(side, j, inputs)
            pair = list(self.sessions[j])
            pair[side] = sess
            self.sessions[j] = (pair[0], pair[1])
        part = (self.segments.float_parts, self.segments.quant_parts)[side][j]
        if sess is None:
            return {}
        try:
            out = sess.run(list(part.outputs), dict(inputs))
        except Exception as exc:  # ORT's error types have no common public base
            if side == 0:
                raise DataError(f"sample {index}: the float model cannot run on it: {ort_message(exc)}") from exc
            raise ModelError(
                f"ONNX Runtime cannot run it on sample {index}, which the float model runs on: {ort_message(exc)}",
                role="quantized model",
            ) from exc
        return dict(zip(part.outputs, out, strict=True))

    def _infer(self, j: int, inputs: tuple[dict[str, np.ndarray], dict[str, np.ndarray]], index: int) -> _Out:
        """Segment ``j`` of both models (on the worker thread when pipelined): outputs, and the seconds it took."""
        t0 = time.perf_counter()
        f = self._run(0, j, inputs[0], index)
        q = self._run(1, j, inputs[1], index)
        return f, q, time.perf_counter() - t0

    def _inputs(self, j: int, vals: _Vals) -> _Vals:
        """Segment ``j``'s inputs of both models (the arrays themselves, taken before the segment runs)."""
        parts = (self.segments.float_parts[j], self.segments.quant_parts[j])
        return ({i: vals[0][i] for i in parts[0].inputs}, {i: vals[1][i] for i in parts[1].inputs})

    def reduce(self, index: int, sample: Mapping[str, np.ndarray], reducer: Reducer) -> tuple[SampleSums, float, float]:
        """The sample's sums, and the seconds its reductions and its inference took.

        Pipelined (:attr:`pipelined`), segment ``j + 1`` is inferred on a worker thread while segment ``j`` is
        reduced: its inputs are taken before, so the two threads share no mutable state, and two segments' tensors
        are alive at once (~2 × the rule's budget)."""
        vals: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = (dict(sample), dict(sample))
        sums: list[SampleSums] = []
        reduce_s = infer_s = 0.0
        k = len(self.segments.plans)
        pending: Future[_Out] | None = None
        if self.pipelined:
            pending = self._worker().submit(self._infer, 0, self._inputs(0, vals), index)
        for j, plan in enumerate(self.segments.plans):
            f, q, took = pending.result() if pending is not None else self._infer(j, self._inputs(j, vals), index)
            vals[0].update(f)
            vals[1].update(q)
            infer_s += took
            if pending is not None and j + 1 < k:  # started before this thread builds segment j's call table
                pending = submit_started(
                    self._worker(), self.wait_s, self._infer, j + 1, self._inputs(j + 1, vals), index
                )
            t0 = time.perf_counter()
            quant = Dequantized(vals[1], self.segments.dequant) if self.segments.dequant else vals[1]
            sums.append(reducer(plan, vals[0], quant))
            reduce_s += time.perf_counter() - t0
            del f, q
            for side in (0, 1):  # drop what no later segment reads and no later pair reduces
                for name in [n for n in vals[side] if self._last_use[side].get(n, -1) <= j and n not in sample]:
                    del vals[side][name]
        self.ran = True
        self._heap.check()
        return self._assemble(sums), reduce_s, infer_s

    def set_threads(self, threads: int | None) -> None:
        """The segment sessions' intra-op threads from the next sample on (``None``: ORT's default): they are made
        again then (:class:`qdebug.capture.threads.ThreadTrial`; called between samples, when no segment runs)."""
        if threads != self.threads:
            self.threads, self.sessions = threads, []

    def _worker(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="qdebug-segment")
        return self._pool

    def close(self) -> None:
        """Stop the worker thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _assemble(self, sums: Sequence[SampleSums]) -> SampleSums:
        s = self.segments
        lo = np.zeros(self.n_acts)
        hi = np.zeros(self.n_acts)
        elements = np.zeros(self.n_acts, dtype=np.int64)
        for part, idx in zip(sums, s.acts, strict=True):
            lo[idx], hi[idx], elements[idx] = part.float_min, part.float_max, part.elements
        return SampleSums(
            cumulative=_scatter([p.cumulative for p in sums], s.acts, self.n_acts),
            local=_scatter([p.local for p in sums], s.locals_, self.n_local),
            outputs=_scatter([p.outputs for p in sums], s.outs, self.n_outs),
            float_min=lo,
            float_max=hi,
            elements=elements,
        )
