"""QDQ int8 model → Deeploy-ready integer ONNX (``network.onnx`` + ``inputs.npz`` + ``outputs.npz``).

The export is a list of small named passes (:data:`PASSES`) over one mutable :class:`GraphState`; each can be
listed, run alone in a test, or disabled by name. :func:`export` runs them through the one pass runner
(:func:`qdebug.passes.run_passes`), each adapted to the ``model -> (model, PassReport)`` signature. The passes are
:mod:`qdebug.targets.deeploy_passes`'s (the central fold of each quantized op into its integer form:
:mod:`qdebug.targets.deeploy_fold`), the integer evaluator :mod:`qdebug.targets.deeploy_evaluate`'s; this module
runs them and checks the result, and re-exports :data:`PASSES`, :func:`pass_names` and :func:`evaluate_integer`,
which docs/deeploy.md documents as this module's API. The contract
they target is Deeploy's integer network (docs/deeploy.md): integer
Conv/Gemm/MatMul/Add/MaxPool/Reshape/Flatten, each accumulator brought back to 8 bits by
``RequantShift(x, mul, add)`` with ``y = clip(floor((x·mul + add + div/2) / div), lo, hi)``.

Integer representation of an activation. ORT gives every activation a scale ``s`` and an int8 zero point ``zp``.
A tensor whose ``zp`` is −128 (a ReLU output, or a non-negative graph input) is stored *shifted* as
``u = q + 128`` in uint8 (``signed=0`` RequantShift), so its effective zero point is 0; every other tensor is
stored as ``q`` in int8 with its zero point folded into the consumer's bias. Why: a Conv pads with integer 0,
which is the real value 0 only if the effective zero point is 0; with the shift, the common ReLU→Conv case is
exact at the borders.

Requantization constants. For an accumulator ``acc`` (real value ``acc·s_in·s_w``) and an output ``(s_out, zp)``
the exact target is ``round(acc·M) + zp`` with ``M = s_in·s_w/s_out``. We take ``div = 2^k`` with the largest
``k ≤ 30`` such that ``|acc|·mul + |add| + div/2 < 2^31`` for the worst-case ``|acc|`` (Σ|w|·255 + |bias|, since
Deeploy computes in int32), ``mul = round(M·div)``, ``add = zp·div`` (no ``div/2``: Deeploy adds it). The largest
relative error ``|mul/div − M| / M`` over the network is reported as ``worst_requant_rel_error``. The export never
changes a scale: :func:`qdebug.targets.deeploy_snap.snap_scales_for_deeploy` makes the QDQ model's ratios exactly
``mul/2^k`` beforehand (``build``/``recompile`` for Deeploy do), and this export then finds that same ``mul``.

A bias whose scale is the accumulator scale over ``2^j`` (``s_in·s_w/2^j``, j ≤ 4; the tie-free snapping writes
odd biases with ``j = 1``) is split: its integer part (floor) stays the Conv/Gemm bias, its fraction ``r/2^j`` goes
into the RequantShift add as ``r·mul/2^j``, with ``mul`` chosen a multiple of ``2^j``. Any other bias scale is
read in accumulator units, as the quantizers write it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug._signals import signals_held
from qdebug.errors import DataError, TargetError
from qdebug.graph_index import GraphIndex
from qdebug.io import new_temp_dir
from qdebug.model_io import ModelKind, is_q, model_kind
from qdebug.passes import Pass, PassReport, run_passes
from qdebug.targets.deeploy_evaluate import evaluate_integer, evaluate_tensors
from qdebug.targets.deeploy_fold import _static_shapes
from qdebug.targets.deeploy_graph import Activation, GraphState, StatePass, _activation, _qparams
from qdebug.targets.deeploy_movement import identity_casts
from qdebug.targets.deeploy_passes import OPTIONAL_PASSES, PASSES, pass_names

__all__ = [
    "PASSES",
    "Activation",
    "ExportResult",
    "GraphState",
    "PassResult",
    "evaluate_integer",
    "export",
    "pass_names",
]

SCHEMA_VERSION = 1
#: Deeploy's LayerNorm forms: ``iLayerNorm`` (mapped on Generic), ``iRMSNorm`` (the decomposition for Siracusa).
LAYERNORM_FORMS = ("iLayerNorm", "iRMSNorm")
#: Each Deeploy platform's form of the network: (LayerNorm form, MatMul operands int8 only). Generic maps
#: iLayerNorm and takes uint8 MatMul operands; PULPOpen (Siracusa) maps iRMSNorm only and its MatMul is int8 × int8.
PLATFORM_FORMS: dict[str, tuple[str, bool]] = {
    "Generic": ("iLayerNorm", False),
    "Siracusa": ("iRMSNorm", True),
    "PULPOpen": ("iRMSNorm", True),
}
_OUTPUT_FILES = ("network.onnx", "inputs.npz", "outputs.npz")


#: The export's passes share the one report type of every rewrite (:class:`qdebug.passes.PassReport`).
PassResult = PassReport


# --------------------------------------------------------------------------- export

#: Deeploy's integer kernels that approximate a float function (I-BERT style): an output computed through one
#: may differ from the QDQ model's by a few LSB although every tensor before it is equal.
APPROXIMATING_KERNELS = {
    "iSoftmax": ("Softmax", "exp"),
    "RequantizediGELU": ("GELU", "erf"),
    "iLayerNorm": ("LayerNorm", "the square root"),
    "iRMSNorm": ("RMSNorm", "the square root"),
}


@dataclass(frozen=True)
class OutputEquality:
    """One graph output of the integer network vs the QDQ model on ORT, on the output's grid; the approximating
    kernels (:data:`APPROXIMATING_KERNELS`) it is computed through, as (op type, node name)."""

    output_name: str
    equal_fraction: float
    max_lsb_diff: int
    approximated_by: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ExportResult:
    """Where the export went, what each pass did, and how bit-exact the integer graph is against ORT's QDQ run."""

    out_dir: str
    passes: tuple[PassReport, ...]
    num_samples: int
    equal_fraction: float
    max_lsb_diff: int
    worst_requant_rel_error: float
    outputs: tuple[OutputEquality, ...] = ()
    #: the inputs of the approximating kernels the differing outputs go through vs the QDQ model's tensors, on
    #: their grids: equal fraction and max LSB (``None``: nothing differs, or the tensors could not be matched)
    before_approx_equal: float | None = None
    before_approx_max_lsb: int | None = None

    @property
    def bit_exact_ok(self) -> bool:
        """The issue's target: ≥ 99.9 % equal elements and never more than 1 LSB apart."""
        return self.equal_fraction >= 0.999 and self.max_lsb_diff <= 1

    def __bool__(self) -> bool:
        return self.bit_exact_ok

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        d = asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExportResult:
        """Inverse of :meth:`to_dict`."""
        kw = {k: v for k, v in d.items() if k != "schema_version"}
        kw["passes"] = tuple(PassReport.from_dict(p) for p in kw["passes"])
        kw["outputs"] = tuple(
            OutputEquality(**{**o, "approximated_by": tuple(tuple(a) for a in o.get("approximated_by", ()))})
            for o in kw.get("outputs", ())
        )
        return cls(**kw)

    def mismatch_reason(self) -> str:
        """Why the outputs differ from the QDQ model's, when the export can tell ("" when it cannot, or nothing
        differs): the outputs computed through an approximating integer kernel, and whether the tensors before it
        are equal (then the kernel's approximation is the whole mismatch)."""
        differ = [o for o in self.outputs if o.equal_fraction < 1.0 or o.max_lsb_diff > 0]
        if not differ or any(not o.approximated_by for o in differ):
            return ""
        kernels = dict.fromkeys(op for o in differ for op, _ in o.approximated_by)
        what = " and ".join(
            f"Deeploy's integer {APPROXIMATING_KERNELS[k][0]} ({k}, which approximates {APPROXIMATING_KERNELS[k][1]})"
            for k in kernels
        )
        names = ", ".join(
            f"{o.output_name} {o.equal_fraction:.2%} equal, max {o.max_lsb_diff} LSB "
            f"(after {', '.join(n for _, n in o.approximated_by)})"
            for o in differ
        )
        if self.before_approx_equal is None:
            return f"the outputs that differ come after {what}: {names}; the tensors before it were not compared"
        before = (
            f"the tensors before it are {self.before_approx_equal:.2%} equal (max {self.before_approx_max_lsb} LSB)"
        )
        return f"only outputs after {what} differ: {names}; {before}"

    @property
    def approximation_only(self) -> bool:
        """The mismatch is confined to outputs after approximating kernels whose inputs meet the bit-exact target."""
        return (
            bool(self.mismatch_reason())
            and self.before_approx_equal is not None
            and (self.before_approx_equal >= 0.999 and (self.before_approx_max_lsb or 0) <= 1)
        )

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def _select(
    passes: Sequence[str] | None, disable: Sequence[str], enable: Sequence[str] = ()
) -> list[tuple[str, StatePass]]:
    known = dict(PASSES)
    default = [p for p in known if p not in OPTIONAL_PASSES or p in enable]
    wanted = list(passes) if passes is not None else default
    unknown = [p for p in (*wanted, *disable, *enable) if p not in known]
    if unknown:
        raise TargetError(f"unknown export pass(es) {unknown}; known: {list(known)}")
    return [(name, known[name]) for name in wanted if name not in disable]


def _as_pass(name: str, fn: StatePass, state: GraphState) -> Pass:
    """One export pass in the one pass signature (:data:`qdebug.passes.Pass`): it rewrites a copy of the model it
    is given, through ``state`` (whose facts the later passes read), and reports its change count. A malformed
    graph's KeyError/IndexError/ValueError becomes a TargetError naming the pass."""

    def run(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
        state.model = onnx.ModelProto()
        state.model.CopyFrom(model)
        try:
            changes = fn(state)
        except (KeyError, IndexError, ValueError) as exc:
            raise TargetError(f"export pass {name!r} failed: {type(exc).__name__}: {exc}") from exc
        return state.model, PassReport(name, changed=changes > 0, rewrites=changes)

    return run


def _progress_line(r: PassReport) -> str:
    return f"{r.name} … nodes {r.nodes_before} → {r.nodes_after} ({r.rewrites} changes)"


def _input_activations(model: onnx.ModelProto) -> dict[str, Activation]:
    ix = GraphIndex(model)
    consts = {k: ix.value(k) for k in ix.consts}
    names = {i.name for i in model.graph.input}
    same = identity_casts(model)  # a graph input cast to its own type, then quantized
    cast_of = {n.output[0]: n.input[0] for n in ix.nodes if n.op_type == "Cast" and n.output[0] in same}
    out: dict[str, Activation] = {}
    for node in ix.nodes:
        src = cast_of.get(node.input[0], node.input[0]) if node.input else ""
        if is_q(node) and src in names:
            scale, zp = _qparams(node, consts)
            out[src] = _activation(float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]))
    return out


def _samples(
    model: onnx.ModelProto, data: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None, n: int
) -> list[dict[str, np.ndarray]]:
    """Integer input samples ``q`` per graph input: float ``data`` quantized with the input's own
    QuantizeLinear parameters, or ``n`` seeded random int8 samples."""
    acts = _input_activations(model)
    shapes = {vi.name: [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
              for vi in model.graph.input}  # fmt: skip
    if data is None:
        rng = np.random.default_rng(0)
        return [{k: rng.integers(-128, 128, shapes[k]).astype(np.int64) for k in acts} for _ in range(n)]
    per_sample: list[Mapping[str, np.ndarray]]
    if isinstance(data, Mapping):
        count = min(len(np.asarray(v)) for v in data.values())
        per_sample = [{k: np.asarray(v)[i] for k, v in data.items()} for i in range(min(count, n))]
    else:
        per_sample = list(data)[:n]
    out = []
    for i, sample in enumerate(per_sample):
        q: dict[str, np.ndarray] = {}
        for k, act in acts.items():
            if k not in sample:
                raise DataError(f"sample {i}: no array for graph input {k!r} (has {sorted(sample)})")
            x = np.asarray(sample[k], np.float64)
            if list(x.shape) != shapes[k]:
                raise DataError(f"sample {i}: input {k!r} has shape {list(x.shape)}, the model expects {shapes[k]}")
            q[k] = np.clip(np.rint(x / act.scale) + act.zero_point, -128, 127).astype(np.int64)
        out.append(q)
    if not out:
        raise DataError("no samples to export with")
    return out


class _Tally:
    """Equal elements, total elements and the largest difference of integer tensors on one grid."""

    def __init__(self) -> None:
        self.equal = self.total = self.worst = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        diff = np.abs(np.asarray(a, np.int64) - np.asarray(b, np.int64))
        self.equal += int((diff == 0).sum())
        self.total += diff.size
        self.worst = max(self.worst, int(diff.max(initial=0)))

    def merge(self, other: _Tally) -> None:
        self.equal += other.equal
        self.total += other.total
        self.worst = max(self.worst, other.worst)

    @property
    def fraction(self) -> float:
        return self.equal / self.total if self.total else 1.0


def _approximated_by(exported: onnx.ModelProto) -> dict[str, tuple[onnx.NodeProto, ...]]:
    """Per graph output, the approximating kernels (:data:`APPROXIMATING_KERNELS`) it is computed through."""
    producer = {o: n for n in exported.graph.node for o in n.output}
    found: dict[str, tuple[onnx.NodeProto, ...]] = {}
    for out in exported.graph.output:
        seen: set[str] = set()
        todo, hits = [out.name], []
        while todo:
            node = producer.get(todo.pop())
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            hits += [node] if node.op_type in APPROXIMATING_KERNELS else []
            todo += [t for t in node.input if t]
        found[out.name] = tuple(reversed(hits))
    return found


def _qdq_twins(qdq: onnx.ModelProto, state: GraphState, tensors: Sequence[str]) -> dict[str, str]:
    """Integer-network tensor → the QDQ model's float tensor it quantizes (the QuantizeLinear's input, or the
    tensor itself), for the ones both graphs name."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    twins = {}
    for t in tensors:
        node = producer.get(t)
        if t in state.acts and node is not None:
            twins[t] = node.input[0] if is_q(node) else t
    return twins


def _compare(
    qdq: onnx.ModelProto, state: GraphState, exported: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]
) -> tuple[list[tuple[OutputEquality, _Tally]], tuple[float, int] | None, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run ORT CPU (optimizations off) on the dequantized inputs and the integer graph; compare on the q grid: per
    output, and the inputs of the approximating kernels the outputs go through (where the QDQ model names them)."""
    from qdebug.ort import expose_outputs, make_session

    approx = _approximated_by(exported)
    twins = _qdq_twins(qdq, state, [n.input[0] for nodes in approx.values() for n in nodes])
    # The engine's own CPU-QDQ session (optimizations off), also giving the approximating kernels' inputs.
    sess: Any = make_session(expose_outputs(qdq, list(twins.values())), ("CPUExecutionProvider",))
    per_out = {name: _Tally() for name in state.outputs}
    before = _Tally()
    first_in: dict[str, np.ndarray] = {}
    first_out: dict[str, np.ndarray] = {}
    for i, q_in in enumerate(samples):
        feeds = {
            k: (state.inputs[k].scale * (v - state.inputs[k].zero_point)).astype(np.float32) for k, v in q_in.items()
        }
        stored_in = {k: v - state.inputs[k].offset for k, v in q_in.items()}
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
        vals = evaluate_tensors(exported, stored_in)
        got = {o.name: vals[o.name] for o in exported.graph.output}
        for name, act in state.outputs.items():
            ref_q = np.clip(np.rint(ref[name].astype(np.float64) / act.scale) + act.zero_point, -128, 127)
            per_out[name].add(ref_q, got[name] + act.offset)
        for t, f in twins.items():
            act = state.acts[t]
            before.add(np.clip(np.rint(ref[f].astype(np.float64) / act.scale) + act.zero_point, -128, 127),
                       vals[t] + act.offset)  # fmt: skip
        if i == 0:
            first_in = {k: v.astype(np.uint8 if state.inputs[k].offset else np.int8) for k, v in stored_in.items()}
            first_out = {k: v.astype(np.uint8 if state.outputs[k].offset else np.int8) for k, v in got.items()}
    outputs = [
        (OutputEquality(k, t.fraction, t.worst, tuple((n.op_type, n.name) for n in approx.get(k, ()))), t)
        for k, t in per_out.items()
    ]
    return outputs, ((before.fraction, before.worst) if twins else None), first_in, first_out


def _write_export(
    out: Path, model: onnx.ModelProto, first_in: Mapping[str, np.ndarray], first_out: Mapping[str, np.ndarray]
) -> None:
    """``out`` appears whole or not at all: built in a temp folder next to it and renamed (a previous export is
    moved aside first, so a failure keeps one whole folder)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp: Path | None = None
    try:
        with signals_held():  # mkdir's mode (it becomes the output), a short name; a signal raised inside the try
            tmp = new_temp_dir(out.parent)
        onnx.save_model(model, str(tmp / "network.onnx"))
        np.savez(tmp / "inputs.npz", **first_in)  # type: ignore[arg-type]
        np.savez(tmp / "outputs.npz", **first_out)  # type: ignore[arg-type]
        if out.exists():  # a previous export: move it aside first, so a failure keeps one whole folder
            old = new_temp_dir(out.parent, ".old")
            os.replace(out, old / "prev")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def export(
    qdq_model: onnx.ModelProto | str | Path,
    out_dir: str | Path,
    *,
    passes: Sequence[str] | None = None,
    disable: Sequence[str] = (),
    enable: Sequence[str] = (),
    data: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
    verbose: bool = True,
    num_samples: int = 16,
    layernorm: str | None = None,
    platform: str = "Generic",
) -> ExportResult:
    """Export a QDQ int8 model to ``out_dir/{network.onnx, inputs.npz, outputs.npz}`` for Deeploy.

    ``passes`` replaces the default pass list (:func:`pass_names`), ``disable`` removes passes from it and
    ``enable`` adds optional ones (:data:`OPTIONAL_PASSES`). ``data``: *float* input samples, either
    ``{input name: array[N, *shape]}`` (an npz's layout) or a list of ``{input name: array}``; they are quantized
    with the model's own input QuantizeLinear. ``None`` draws ``num_samples`` seeded random int8 inputs. At most
    ``num_samples`` samples are compared with ONNX Runtime; the first becomes inputs.npz/outputs.npz.

    ``platform`` picks the network's form (:data:`PLATFORM_FORMS`): ``"Siracusa"``/``"PULPOpen"`` write
    LayerNorm as a centring MatMul + ``iRMSNorm`` and re-encode uint8 MatMul operands to int8 (docs/deeploy.md,
    "Siracusa"); ``layernorm`` overrides the LayerNorm form alone.

    ``out_dir`` appears whole or not at all: it is built in a temp folder next to it and renamed. An existing
    ``out_dir`` is replaced only if it holds nothing but a previous export's three files.
    """
    from qdebug.model_io import load_model

    src = qdq_model if isinstance(qdq_model, onnx.ModelProto) else load_model(qdq_model, "QDQ model")
    model = onnx.ModelProto()
    model.CopyFrom(src)
    if platform not in PLATFORM_FORMS:
        raise TargetError(f"platform must be one of {tuple(PLATFORM_FORMS)}, got {platform!r}")
    form, int8_matmul = PLATFORM_FORMS[platform]
    layernorm = layernorm or form
    if layernorm not in LAYERNORM_FORMS:
        raise TargetError(f"layernorm must be one of {LAYERNORM_FORMS}, got {layernorm!r}")
    state = GraphState(model, layernorm=layernorm, int8_matmul=int8_matmul, platform=platform)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or set(os.listdir(out)) - set(_OUTPUT_FILES)):
        raise TargetError(f"{out}: exists and holds other files than a previous export; choose another folder")
    selected = _select(passes, disable, enable)
    if model_kind(src) is ModelKind.QDQ:
        state.samples = _samples(src, data, num_samples)
        state.shapes = _static_shapes(src)
    model, results = run_passes(
        model, [_as_pass(name, fn, state) for name, fn in selected], progress=print if verbose else None,
        line=_progress_line,
    )  # fmt: skip
    samples = state.samples
    if not state.inputs or not state.outputs:
        raise TargetError(
            "the exported graph has no quantized input or output (were strip_input_quant/strip_output_dequant "
            "disabled?); nothing to write"
        )
    outputs, before, first_in, first_out = _compare(src, state, model, samples)
    eq = _Tally()
    for _, t in outputs:
        eq.merge(t)
    _write_export(out, model, first_in, first_out)
    result = ExportResult(
        out_dir=str(out),
        passes=results,
        num_samples=len(samples),
        equal_fraction=eq.fraction,
        max_lsb_diff=eq.worst,
        worst_requant_rel_error=max(state.requant_errors.values(), default=0.0),
        outputs=tuple(o for o, _ in outputs),
        before_approx_equal=None if before is None else before[0],
        before_approx_max_lsb=None if before is None else before[1],
    )
    if verbose:
        print(f"bit-exactness vs ORT QDQ on {len(samples)} samples: {eq.fraction:.4%} equal, max {eq.worst} LSB")
    return result
