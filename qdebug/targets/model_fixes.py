"""Compatibility rewrites of the *float* model (or its config), applied before quantizing and compiling.

Written for the QNN HTP, they are generic graph fixes: the Deeploy target runs some of them too, which is why this
module belongs to neither backend.

Each rule is a small named function that returns what it produced plus a :class:`~qdebug.passes.PassReport`
saying what it changed; :func:`apply_qnn_fixes` runs them in order (the graph rewrites through the one pass runner,
:func:`qdebug.passes.run_passes`). None of them touches the caller's model: every rewrite works on a copy. Why
each exists (measured with onnxruntime-qnn 2.7.0, see ``docs/qnn.md``):

``static_shapes``
    QNN needs a static shape on every tensor. With a symbolic dimension on a graph input it refuses every node
    ("Cannot get shape") and the compile "succeeds" with zero nodes on the HTP; on a large detector it left two
    EPContext partitions and ~1,100 CPU nodes. Fixing the input dimensions *before quantizing* and re-running
    shape inference gives one partition (ORT's session then constant-folds the Shape→Gather→Reshape chains).
``batchnorm_folding``
    A BatchNormalization kept as its own node after a Conv (common in exports with BN "preserved") runs on the HTP
    as a separate quantized op, and its numbers are far from ORT CPU's: on the sample CNN (one partition all the
    same) the HTP output was 20.3 dB from float with uint8 activations (CPU-QDQ: 32.8 dB), 10.0 dB with uint16
    activations (CPU: 36.4 dB) and 9.9 dB with int8 weights, costing 6 points of top-1. Folding each BN into its
    Conv's weights and bias (exact in float) gives 33.2 / 34.5 / 33.2 dB on the HTP, level with the CPU.
``gelu_fusion``
    PyTorch exports exact GELU as Div→Erf→Add→Mul→Mul; QNN has no Erf ("Operators of type `Erf` are not supported
    by QNN EP"), so each GELU splits the graph. ORT's transformer fusion turns the pattern into one
    ``com.microsoft`` Gelu, which both ORT's quantizer and QNN accept. (In onnxruntime 1.31 the basic graph
    optimizations do *not* fuse it, the extended ones do but also emit CPU-only FusedMatMul; ``qnn_preprocess_model``
    does not fuse it either.)
``layernorm_gamma_unsigned``
    With signed 8-bit weights the HTP rejects LayerNormalization ("Supported INT8: (u8,u8,u8→u8) (u8,u8,s32→u8)
    (s8,s8,s32→s8)"): activations are unsigned, so the gamma must be too. The fix is a ``TensorQuantOverrides``
    entry on each gamma initializer (asymmetric uint8), merged into
    the :class:`~qdebug.config.QuantConfig`; everything else keeps its signed weights.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from qdebug.config import QuantConfig, TensorOverride, make_overrides
from qdebug.errors import ConfigError, DataError, ModelError
from qdebug.graph_index import GraphIndex, constants_to_initializers, topological_nodes, unique_name
from qdebug.model_io import InputSpec, input_specs
from qdebug.passes import Pass, PassReport, run_passes

__all__ = [
    "FIX_NAMES",
    "MODEL_FIXES",
    "FixedModel",
    "apply_qnn_fixes",
    "dynamic_tensors",
    "fix_passes",
    "fix_static_shapes",
    "fold_batchnorm",
    "fuse_gelu",
    "layernorm_gamma_unsigned",
]

#: The rules that rewrite the float model, in the order :func:`apply_qnn_fixes` runs them (:func:`fix_passes`).
MODEL_FIXES = ("static_shapes", "batchnorm_folding", "gelu_fusion")
_GAMMA = "layernorm_gamma_unsigned"
#: The rules in the order :func:`apply_qnn_fixes` runs them: the model rewrites, then the config-only gamma rule.
FIX_NAMES = (*MODEL_FIXES, _GAMMA)
_MS_DOMAIN = "com.microsoft"
_MAX_LISTED = 5
#: Signed weight types whose LayerNorm gamma the HTP needs unsigned, and the type it gets instead.
_UNSIGNED_GAMMA = {"int8": "uint8"}


@dataclass(frozen=True)
class FixedModel:
    """The result of :func:`apply_qnn_fixes`: the rewritten float model, the config to quantize it with, and
    one report per rule (in order, including the rules that changed nothing or were skipped)."""

    model: onnx.ModelProto
    config: QuantConfig | None
    reports: tuple[PassReport, ...]

    @property
    def changed(self) -> tuple[str, ...]:
        """Names of the rules that changed something."""
        return tuple(r.name for r in self.reports if r.changed)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    return shown + (f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]


def _is_static(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    return tt.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim)


def dynamic_tensors(model: onnx.ModelProto) -> list[str]:
    """Node outputs (in graph order) whose shape is unknown or symbolic in the model's value_info/outputs.

    Run shape inference first: this only reads what the model declares.
    """
    g = model.graph
    known = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
    out = []
    for node in g.node:
        for name in node.output:
            if name and (name not in known or not _is_static(known[name])):
                out.append(name)
    return out


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference with data propagation (folds Shape→Gather→Concat chains into static shapes)."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"ONNX shape inference failed on the model with static input shapes: {exc}") from exc


def _symbolic_infer(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ORT's symbolic shape inference: knows ORT's contrib ops, which ONNX inference leaves untyped."""
    from qdebug._symbolic import symbolic_shapes

    return symbolic_shapes(model)  # None: it raised on an op it does not know; ONNX inference's result then stands


def _check_input_shapes(specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Every dynamic input has a shape, and every given shape fits the model's fixed dimensions."""
    problems: list[str] = []
    for s in specs:
        if s.is_static and s.name not in shapes:
            continue
        if s.name not in shapes:
            problems.append(f"input {s.name!r} has dynamic dimensions {list(s.shape)} and no shape was given")
            continue
        want = shapes[s.name]
        if len(want) != len(s.shape) or any(isinstance(m, int) and m != d for m, d in zip(s.shape, want, strict=True)):
            problems.append(f"input {s.name!r}: shape {list(want)} does not fit the model's {list(s.shape)}")
        elif any(d <= 0 for d in want):
            problems.append(f"input {s.name!r}: shape {list(want)} has non-positive dimensions")
    if problems:
        raise DataError("cannot fix static shapes: " + "; ".join(problems) + " (pass --input-shape NAME:D0,D1,...)")


def fix_static_shapes(
    model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> tuple[onnx.ModelProto, PassReport]:
    """Give every dynamic graph-input dimension the value in ``input_shapes`` and infer every tensor's shape.

    ``input_shapes`` maps input names to full shapes (e.g. the first data sample's, or ``--input-shape``); it must
    cover every input with a symbolic or unknown dimension (:class:`~qdebug.errors.DataError` otherwise, and when
    a shape contradicts a fixed dimension). Symbolic dimensions of graph outputs and stale ``value_info`` entries
    are cleared so that inference recomputes them. Returns the new model and a report naming the changed inputs
    and any tensor that is still not static.
    """
    shapes = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    specs = input_specs(model)
    names = {s.name for s in specs}
    unknown = sorted(set(shapes) - names)
    if unknown:
        raise DataError(f"input shape given for unknown input(s) {unknown}; the model has {sorted(names)}")
    _check_input_shapes(specs, shapes)
    m = _copy(model)
    inputs = {vi.name: vi for vi in m.graph.input}
    changes = []
    for s in specs:
        if s.is_static:
            continue
        vi = inputs[s.name]
        before = _dims(vi)
        for d, v in zip(vi.type.tensor_type.shape.dim, shapes[s.name], strict=True):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                d.Clear()
                d.dim_value = v
        changes.append(f"{s.name} {before} -> {list(shapes[s.name])}")
    out_changes = []
    for vi in m.graph.output:
        if vi.type.tensor_type.HasField("shape") and not _is_static(vi):
            out_changes.append(vi.name)
            for d in vi.type.tensor_type.shape.dim:
                if not d.HasField("dim_value"):
                    d.Clear()  # unknown: inference fills it in
    # value_info with symbolic dims would be merged back by inference; drop it and let inference recompute it.
    keep = [vi for vi in m.graph.value_info if _is_static(vi)]
    del m.graph.value_info[:]
    m.graph.value_info.extend(keep)

    inferred, n_folded = fold_constants(_infer(m))
    dynamic = dynamic_tensors(inferred)
    via = "ONNX shape inference"
    if dynamic:
        symbolic = _symbolic_infer(inferred)
        if symbolic is not None and len(dynamic_tensors(symbolic)) < len(dynamic):
            inferred, dynamic, via = symbolic, dynamic_tensors(symbolic), "ORT symbolic shape inference"
    total = sum(1 for n in inferred.graph.node for o in n.output if o)
    parts = [("inputs " + "; ".join(changes)) if changes else "all inputs already static"]
    if out_changes:
        parts.append(f"output shapes re-inferred for {_listing(out_changes)}")
    parts.append(f"{total - len(dynamic)}/{total} tensors static after {via}")
    if n_folded:
        parts.append(f"{n_folded} node(s) of shape arithmetic folded into constants")
    if dynamic:
        parts.append(f"still dynamic: {_listing(dynamic)} (QNN will leave their nodes on the CPU)")
    return inferred, PassReport("static_shapes", bool(changes or out_changes or n_folded), "; ".join(parts))


def _const_array(inits: Mapping[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    t = inits.get(name)
    return None if t is None else onnx.numpy_helper.to_array(t)


def _drop_dead_tensors(g: onnx.GraphProto) -> None:
    """Initializers nothing reads (and their old-IR graph-input entries) and value_info of vanished tensors."""
    used = {i for n in g.node for i in n.input}
    dead = {t.name for t in g.initializer if t.name not in used}
    keep = [t for t in g.initializer if t.name not in dead]
    del g.initializer[:]
    g.initializer.extend(keep)
    inputs = [vi for vi in g.input if vi.name not in dead]  # old IR versions list initializers as inputs too
    del g.input[:]
    g.input.extend(inputs)
    produced = {o for n in g.node for o in n.output}
    vis = [vi for vi in g.value_info if vi.name in produced]
    del g.value_info[:]
    g.value_info.extend(vis)


def _foldable(bn: onnx.NodeProto, conv: onnx.NodeProto | None, ix: GraphIndex) -> bool:
    """A BN directly after a single-consumer Conv, in inference mode (spatial), not at a graph output."""
    attrs = {a.name: a for a in bn.attribute}
    return not (
        conv is None
        or conv.op_type != "Conv"
        or ix.sole_consumer(conv.output[0]) is None
        or sum(1 for o in bn.output if o) != 1  # training mode: running statistics are outputs too
        or ("spatial" in attrs and attrs["spatial"].i == 0)
    )


def _read_once(ix: GraphIndex, name: str) -> bool:
    return len(ix.consumers_of(name)) == 1


def fold_batchnorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """Fold every inference-mode BatchNormalization that directly follows a Conv into that Conv.

    ``W' = W·s``, ``b' = (b − mean)·s + beta`` with ``s = gamma / sqrt(var + eps)`` per output channel, computed in
    float64. The Conv then produces the BatchNormalization's output tensor (its name, and so debug reports and
    overrides on it, stay valid); the Conv's own output tensor disappears. A BN whose Conv output has other
    consumers, is a graph output, or whose parameters are not initializers is left (and counted in the report).
    """
    g = model.graph
    bns = [n for n in g.node if n.op_type == "BatchNormalization"]
    if not bns:
        return model, PassReport("batchnorm_folding", False, "no BatchNormalization node")
    # Parameters exported as Constant nodes (paddle2onnx) are read as initializers (the model's meaning is the same).
    m, _ = constants_to_initializers(model)
    m = _copy(m) if m is model else m
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    # Built once, before any fold: a Conv→BN→BN chain folds only its first BN (the second's producer is a BN).
    ix = GraphIndex(m)
    taken = {t.name for t in g.initializer} | set(ix.producer) | {i.name for i in g.input}
    folded: list[onnx.NodeProto] = []
    left: list[str] = []
    for bn in [n for n in g.node if n.op_type == "BatchNormalization"]:
        conv = ix.producer.get(bn.input[0])
        attrs = {a.name: a for a in bn.attribute}
        params = [_const_array(inits, i) for i in bn.input[1:5]]
        weight = _const_array(inits, conv.input[1]) if conv is not None and len(conv.input) > 1 else None
        if not _foldable(bn, conv, ix) or weight is None or any(p is None for p in params):
            left.append(bn.name or bn.output[0])
            continue
        assert conv is not None
        gamma, beta, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)
        eps = attrs["epsilon"].f if "epsilon" in attrs else 1e-5
        scale = gamma / np.sqrt(var + eps)
        has_bias = len(conv.input) > 2 and bool(conv.input[2])
        bias = _const_array(inits, conv.input[2]) if has_bias else np.zeros(weight.shape[0])
        if bias is None:  # a bias that is computed, not constant: cannot fold
            left.append(bn.name or bn.output[0])
            continue
        w_new = (weight.astype(np.float64) * scale.reshape(-1, *([1] * (weight.ndim - 1)))).astype(weight.dtype)
        b_new = ((bias.astype(np.float64) - mean) * scale + beta).astype(weight.dtype)
        # A weight shared with another node keeps its value there: the folded copy gets a new name.
        w_name = conv.input[1] if _read_once(ix, conv.input[1]) else unique_name(f"{conv.input[1]}_bn_folded", taken)
        b_default = f"{conv.name or conv.output[0]}_bias"
        b_name = conv.input[2] if has_bias and _read_once(ix, conv.input[2]) else unique_name(b_default, taken)
        for name, value in ((w_name, w_new), (b_name, b_new)):
            t = onnx.numpy_helper.from_array(value, name)
            if name in inits:
                inits[name].CopyFrom(t)
            else:
                g.initializer.append(t)
                inits[name] = g.initializer[-1]
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]
        folded.append(bn)
    if not folded:
        none = f"{len(bns)} BatchNormalization node(s), none after a Conv"
        return model, PassReport("batchnorm_folding", False, none)
    for bn in folded:
        g.node.remove(bn)
    _drop_dead_tensors(g)
    detail = f"{len(folded)} BatchNormalization node(s) folded into the preceding Conv"
    if left:
        detail += f"; {len(left)} left (not after a single-consumer Conv with constant parameters): {_listing(left)}"
    return m, PassReport("batchnorm_folding", True, detail)


def fuse_gelu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
    """Fuse exact-erf GELU subgraphs (Div→Erf→Add→Mul→Mul, as exported by PyTorch/Keras) into ``com.microsoft``
    Gelu with ORT's own transformer fusion; Erf nodes that are not part of a GELU are left (and reported)."""
    erfs = sum(1 for n in model.graph.node if n.op_type == "Erf")
    if erfs == 0:
        return model, PassReport("gelu_fusion", False, "no Erf node")
    from onnxruntime.transformers.fusion_gelu import FusionGelu
    from onnxruntime.transformers.onnx_model import OnnxModel

    m = _copy(model)
    om = OnnxModel(m)
    before = len(m.graph.node)
    FusionGelu(om).apply()
    fused = sum(1 for n in om.model.graph.node if n.op_type == "Gelu" and n.domain == _MS_DOMAIN) - sum(
        1 for n in model.graph.node if n.op_type == "Gelu" and n.domain == _MS_DOMAIN
    )
    if fused == 0:
        return model, PassReport("gelu_fusion", False, f"{erfs} Erf node(s), none part of a GELU pattern")
    om.remove_unused_constant()
    om.topological_sort()
    out = om.model
    if not any(o.domain == _MS_DOMAIN for o in out.opset_import):  # the fusion adds the node, not its domain
        out.opset_import.append(onnx.helper.make_opsetid(_MS_DOMAIN, 1))
    out = _type_gelu_outputs(out)
    left = sum(1 for n in out.graph.node if n.op_type == "Erf")
    detail = f"{fused} Erf GELU(s) fused into com.microsoft Gelu ({before} -> {len(out.graph.node)} nodes)"
    if left:
        detail += f"; {left} Erf node(s) are not a GELU and stay (QNN has no Erf: they run on the CPU)"
    return out, PassReport("gelu_fusion", True, detail)


def _type_gelu_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Declare each Gelu output's type and shape (those of its input: Gelu is elementwise).

    ONNX shape inference does not know ``com.microsoft`` ops, so a Gelu output and everything after it would be
    untyped, and ORT's quantizer skips untyped tensors ("failed to infer the type of tensor"): the GELU and the op
    after it would stay float. With the Gelu outputs declared, inference types the rest of the graph again.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = model
    g = inferred.graph
    known = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
    added = False
    for n in g.node:
        if n.op_type == "Gelu" and n.domain == _MS_DOMAIN and n.output[0] not in known and n.input[0] in known:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(known[n.input[0]])
            vi.name = n.output[0]
            g.value_info.append(vi)
            known[vi.name] = vi
            added = True
    if not added:
        return inferred
    try:
        return onnx.shape_inference.infer_shapes(inferred, strict_mode=False)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return inferred


def _gamma_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(LayerNorm gammas that are constants, gammas that are activations) in graph order, deduplicated."""
    consts = GraphIndex(model).consts
    weights: dict[str, None] = {}
    acts: dict[str, None] = {}
    for n in model.graph.node:
        if n.op_type == "LayerNormalization" and len(n.input) > 1 and n.input[1]:
            (weights if n.input[1] in consts else acts)[n.input[1]] = None
    return list(weights), list(acts)


def layernorm_gamma_unsigned(model: onnx.ModelProto, config: QuantConfig) -> tuple[QuantConfig, PassReport]:
    """With signed 8-bit weights, override every LayerNormalization gamma to unsigned 8-bit.

    Returns ``config`` with the overrides merged in. A gamma the config already overrides with an explicit
    ``quant_type`` is left as the user set it (and named in the report); an existing entry without a type (e.g.
    rmin/rmax) gets the type added.
    """
    unsigned = _UNSIGNED_GAMMA.get(config.weight_type)
    if unsigned is None:
        why = "unsigned" if config.weight_type.startswith("u") else f"{config.weight_type} (not handled)"
        return config, PassReport("layernorm_gamma_unsigned", False, f"weights are {why}; nothing to do")
    gammas, act_gammas = _gamma_names(model)
    if not gammas:
        detail = "no LayerNormalization with a constant gamma"
        if act_gammas:
            detail += f"; {len(act_gammas)} gamma(s) are activations, quantized like any activation"
        return config, PassReport("layernorm_gamma_unsigned", False, detail)
    overrides: dict[str, tuple[TensorOverride, ...]] = config.overrides_dict
    changed: list[str] = []
    kept: list[tuple[str, str]] = []
    # Always asymmetric: QNN needs symmetric weights only at 16 bits, gammas are mostly positive, and a symmetric
    # uint8 grid (zero point 128) spends half its levels on values that never occur (measured: ~6 dB lower weight
    # SQNR on the sample transformer's gammas).
    for g in gammas:
        entries = overrides.get(g)
        if entries and entries[0].quant_type is not None:
            kept.append((g, entries[0].quant_type))
            continue
        if entries:
            first = entries[0]
            upd = TensorOverride.from_dict({**first.to_dict(), "quant_type": unsigned})
            overrides[g] = (upd, *entries[1:])
        else:
            overrides[g] = (TensorOverride(quant_type=unsigned, symmetric=False),)
        changed.append(g)
    try:
        new = config.replace(tensor_overrides=make_overrides(overrides))
    except ConfigError as exc:
        raise ConfigError(f"the LayerNorm gamma overrides do not fit the config: {exc}") from exc
    parts = []
    if changed:
        parts.append(
            f"{len(changed)} LayerNorm gamma(s) quantized as asymmetric {unsigned} instead of {config.weight_type}: "
            f"{_listing(changed)}"
        )
    if kept:
        parts.append("kept the type the config gives " + ", ".join(f"{g!r} ({t})" for g, t in kept[:_MAX_LISTED]))
        signed = [g for g, t in kept if not t.startswith("u")]
        if signed:
            parts.append(f"the HTP rejects LayerNorm with a signed gamma: expect CPU fallback at {_listing(signed)}")
    return new, PassReport("layernorm_gamma_unsigned", bool(changed), "; ".join(parts))


def _skipped(name: str) -> Pass:
    def run(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
        return model, PassReport(name, False, "skipped on request", skipped=True)

    return run


def fix_passes(
    names: Sequence[str] = MODEL_FIXES,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    skip: Sequence[str] = (),
) -> list[Pass]:
    """The graph-rewriting fixes ``names`` (of :data:`MODEL_FIXES`) as passes for
    :func:`qdebug.passes.run_passes`, in the order given; a fix in ``skip`` reports itself as skipped, so a
    manifest always lists every fix of its target. ``input_shapes`` feeds :func:`fix_static_shapes`."""
    rules: dict[str, Pass] = {
        "static_shapes": functools.partial(fix_static_shapes, input_shapes=input_shapes),
        "batchnorm_folding": fold_batchnorm,
        "gelu_fusion": fuse_gelu,
    }
    unknown = [n for n in names if n not in rules]
    if unknown:
        raise ConfigError(f"unknown model fix name(s) {unknown}; known: {list(MODEL_FIXES)}")
    return [_skipped(n) if n in skip else rules[n] for n in names]


def apply_qnn_fixes(
    model: onnx.ModelProto,
    config: QuantConfig | None,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    skip: Sequence[str] = (),
) -> FixedModel:
    """Run every rule of :data:`FIX_NAMES` not in ``skip`` on ``model`` (never modified) and ``config``.

    ``config=None`` means "not quantized" (fp16): the gamma rule then has nothing to do. ``input_shapes`` feeds
    :func:`fix_static_shapes`. Skipped rules are reported as such, so the manifest always lists all of them.
    The graph rewrites run through :func:`qdebug.passes.run_passes` (timed, node counts in their reports); the
    gamma rule, last, changes only the config.
    """
    unknown = sorted(set(skip) - set(FIX_NAMES))
    if unknown:
        raise ConfigError(f"unknown fix name(s) {unknown}; known: {list(FIX_NAMES)}")
    m, reports = run_passes(model, fix_passes(input_shapes=input_shapes, skip=skip))
    cfg = config
    if _GAMMA in skip:
        gamma = PassReport(_GAMMA, False, "skipped on request", skipped=True)
    elif cfg is None:
        gamma = PassReport(_GAMMA, False, "not quantized (fp16); nothing to do")
    else:
        cfg, gamma = layernorm_gamma_unsigned(m, cfg)
    return FixedModel(m if m is not model else _copy(m), cfg, (*reports, gamma))


#: A folded constant larger than this many elements stays a node: folding is for shape arithmetic, and a large
#: folded tensor (e.g. ConstantOfShape) would only make the model bigger.
FOLD_MAX_ELEMENTS = 1 << 20
_NOT_FOLDED = frozenset(
    {"Constant", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def _static_dims(model: onnx.ModelProto) -> dict[str, list[int]]:
    g = model.graph
    return {vi.name: [int(d) for d in _dims(vi)] for vi in [*g.input, *g.value_info, *g.output] if _is_static(vi)}


def _eval_node(
    node: onnx.NodeProto, values: Mapping[str, np.ndarray], opsets: Sequence[onnx.OperatorSetIdProto]
) -> list[np.ndarray]:
    """One node evaluated by ONNX's reference implementation at the model's opsets."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape)
        for n in node.input
        if n
    ]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output]
    m = helper.make_model(helper.make_graph([node], "fold", ins, outs), opset_imports=list(opsets))
    return [np.asarray(v) for v in ReferenceEvaluator(m).run(None, {n: values[n] for n in node.input if n})]


def _foldable_value(
    node: onnx.NodeProto,
    values: Mapping[str, np.ndarray],
    dims: Mapping[str, list[int]],
    opsets: Sequence[onnx.OperatorSetIdProto],
) -> list[np.ndarray] | None:
    """The node's outputs if they are constants: a Shape of a static tensor, or a deterministic default-domain op
    whose inputs are all constants (``None``: not foldable)."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDED:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None
    if node.op_type == "Shape" and node.input[0] in dims:
        shape = np.array(dims[node.input[0]], dtype=np.int64)
        a = {x.name: x.i for x in node.attribute}
        return [shape[a.get("start", 0) : a.get("end")]]
    if not node.input or not all(not i or i in values for i in node.input):
        return None
    try:
        out = _eval_node(node, values, opsets)
    except Exception:  # an op the reference implementation cannot run here: leave it to ORT
        return None
    return out if all(v.size <= FOLD_MAX_ELEMENTS for v in out) else None


def fold_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Fold the shape arithmetic a static-shape model no longer needs (``Shape`` of static tensors and every
    deterministic node whose inputs are then constant, e.g. ``Range``) into initializers, as ORT's
    ``quant_pre_process`` does. QNN refuses nodes such as ``Range`` with non-constant inputs, which split the HTP
    graph. Returns the new model and the number of nodes folded."""
    m = _copy(model)
    g = m.graph
    values: dict[str, np.ndarray] = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
    values |= {
        n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
        for n in g.node
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
    }
    dims, outputs = _static_dims(m), {o.name for o in g.output}
    folded: list[onnx.NodeProto] = []
    for node in topological_nodes(g):
        if any(o in outputs for o in node.output):
            continue
        out = _foldable_value(node, values, dims, m.opset_import)
        if out is None:
            continue
        for name, v in zip(node.output, out, strict=True):
            values[name] = v
            g.initializer.append(onnx.numpy_helper.from_array(v, name))
        folded.append(node)
    if not folded:
        return model, 0
    for node in folded:
        g.node.remove(node)
    _drop_dead_tensors(g)
    return _infer(m), len(folded)
