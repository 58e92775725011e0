"""qdebug's streamed SQNR against an independent, materialise-everything float64 reference.

The reference runs both models once per sample with *every* tensor exposed, keeps all of them in
memory, pairs tensors by reading the Q/DQ graph itself (ORT's naming, not qdebug's pairing) and
computes 10·log10(Σ‖x‖² / Σ‖x−y‖²) over all samples in float64. Weights are dequantized here in
float64 from the stored integers. qdebug must agree within 0.01 dB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE_MODELS, TINY_CONFIGS
from onnx import numpy_helper

from qdebug.config import QuantConfig
from qdebug.data import SyntheticData
from qdebug.debugger import DebugOptions, debug
from qdebug.model_io import input_specs
from qdebug.quantizer import quantize
from qdebug.report import DebugReport

TOL_DB = 0.01


# ------------------------------------------------------------------ the reference
def _run_all(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Every tensor of every sample (inputs included), with ORT's graph optimizations off."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = [o for n in m.graph.node for o in n.output if o]
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=n))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    result = []
    for s in samples:
        vals = dict(zip(out_names, sess.run(out_names, s), strict=True))
        vals.update(s)
        result.append(vals)
    return result


def _sqnr(signal: float, noise: float) -> float | None:
    if not (math.isfinite(signal) and math.isfinite(noise)):
        return None
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return None
    return 10.0 * math.log10(signal / noise)


def _energies(refs: list[np.ndarray], tests: list[np.ndarray]) -> tuple[float, float]:
    x = np.concatenate([r.astype(np.float64).ravel() for r in refs])
    y = np.concatenate([t.astype(np.float64).ravel() for t in tests])
    return float(x @ x), float((x - y) @ (x - y))


def _dequantize64(q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int) -> np.ndarray:
    qf = q.astype(np.float64)
    s = scale.astype(np.float64)
    z = np.zeros_like(s) if zp is None else zp.astype(np.float64)
    if s.size == 1:
        return (qf - z.reshape(())) * s.reshape(())
    shape = [1] * qf.ndim
    shape[axis % qf.ndim] = -1
    return (qf - z.reshape(shape)) * s.reshape(shape)


@dataclass
class Reference:
    """Expected values keyed by tensor/weight/output name."""

    local: dict[str, float | None] = field(default_factory=dict)  # quantized activations only
    cumulative: dict[str, float | None] = field(default_factory=dict)
    per_sample: dict[str, list[float | None]] = field(default_factory=dict)
    outputs: dict[str, float | None] = field(default_factory=dict)
    weights: dict[str, float | None] = field(default_factory=dict)
    worst_channel: dict[str, float | None] = field(default_factory=dict)
    quantized: set[str] = field(default_factory=set)


def reference(
    float_model: onnx.ModelProto, quant_model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]
) -> Reference:
    """Materialise everything and compute every SQNR the report should contain."""
    fv = _run_all(float_model, samples)
    qv = _run_all(quant_model, samples)
    qg, fg = quant_model.graph, float_model.graph
    q_inits = {i.name: numpy_helper.to_array(i) for i in qg.initializer}
    for n in qg.node:
        if n.op_type == "Constant":
            q_inits[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    f_inits = {i.name: numpy_helper.to_array(i) for i in fg.initializer}
    q_prod = {o: n for n in qg.node for o in n.output}
    f_prod = {o: n for n in fg.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in qg.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    float_tensors = [i.name for i in fg.input if i.name not in f_inits] + [
        o for n in fg.node if n.op_type != "Constant" for o in n.output
    ]

    ref = Reference()
    pairs: dict[str, tuple[str, str | None]] = {}  # float name -> (quant tensor compared, pre-QDQ tensor)
    for n in qg.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in q_inits:
            continue
        src = n.input[0]
        if src in q_prod and q_prod[src].op_type == "DequantizeLinear":
            continue  # a mixed-precision convert of an already-quantized tensor
        dq = next(c for c in consumers[n.output[0]] if c.op_type == "DequantizeLinear")
        # ORT renames a graph output's producer to '<out>_QuantizeLinear_Input' and gives the DQ its name.
        name = src if src in set(float_tensors) else dq.output[0]
        pairs[name] = (dq.output[0], src)
    for name in float_tensors:
        if name in pairs or not np.issubdtype(fv[0][name].dtype, np.floating):
            continue
        producer = q_prod.get(name)
        in_quant = name in qv[0]
        if in_quant and not (producer is not None and producer.op_type in ("QuantizeLinear", "DequantizeLinear")):
            pairs[name] = (name, None)

    for name, (post, pre) in pairs.items():
        refs = [s[name] for s in fv]
        tests = [s[post] for s in qv]
        ref.cumulative[name] = _sqnr(*_energies(refs, tests))
        ref.per_sample[name] = [_sqnr(*_energies([r], [t])) for r, t in zip(refs, tests, strict=True)]
        if pre is not None:
            ref.quantized.add(name)
            pres = [s[pre] for s in qv]
            fnode, qnode = f_prod.get(name), q_prod.get(pre)
            if fnode is not None and fnode.op_type == "Relu" and (qnode is None or qnode.op_type != "Relu"):
                pres = [np.maximum(p, 0) for p in pres]  # the Relu the quantizer folded into the Q
            ref.local[name] = _sqnr(*_energies(pres, tests))
    for o in fg.output:
        ref.outputs[o.name] = _sqnr(*_energies([s[o.name] for s in fv], [s[o.name] for s in qv]))

    for n in qg.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in q_inits:
            continue
        qname = n.input[0]
        fname = qname.removesuffix("_quantized")
        assert fname in f_inits, f"no float twin for {qname}"
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        zp = q_inits[n.input[2]] if len(n.input) > 2 and n.input[2] else None
        deq = _dequantize64(q_inits[qname], q_inits[n.input[1]], zp, axis)
        w = f_inits[fname].astype(np.float64)
        ref.weights[fname] = _sqnr(float((w * w).sum()), float(((w - deq) ** 2).sum()))
        if q_inits[n.input[1]].size > 1:
            wm = np.moveaxis(w, axis % w.ndim, 0).reshape(w.shape[axis % w.ndim], -1)
            em = np.moveaxis(w - deq, axis % w.ndim, 0).reshape(wm.shape)
            per = [_sqnr(float(wm[c] @ wm[c]), float(em[c] @ em[c])) for c in range(wm.shape[0])]
            ref.worst_channel[fname] = min(p for p in per if p is not None)
    return ref


# ------------------------------------------------------------------ comparison
def _close(actual: float | None, expected: float | None) -> bool:
    if expected is None or actual is None:
        return expected is None and actual is None
    if math.isinf(expected) or math.isinf(actual):
        return actual == expected
    return abs(actual - expected) <= TOL_DB


def assert_matches(report: DebugReport, ref: Reference, num_samples: int) -> None:
    names = [a.tensor_name for a in report.activations]
    assert len(names) == len(set(names))
    assert set(names) == set(ref.cumulative), (sorted(names), sorted(ref.cumulative))
    assert {a.tensor_name for a in report.activations if a.quantized} == ref.quantized
    assert len(ref.quantized) > 0
    bad = []
    for a in report.activations:
        if not _close(a.cumulative_sqnr_db, ref.cumulative[a.tensor_name]):
            bad.append(("cumulative", a.tensor_name, a.cumulative_sqnr_db, ref.cumulative[a.tensor_name]))
        if a.quantized:
            if not _close(a.local_sqnr_db, ref.local[a.tensor_name]):
                bad.append(("local", a.tensor_name, a.local_sqnr_db, ref.local[a.tensor_name]))
        else:
            assert a.local_status == "not_quantized"
            assert a.local_sqnr_db is None
    assert not bad, bad

    assert {o.output_name for o in report.model_outputs} == set(ref.outputs)
    for o in report.model_outputs:
        assert _close(o.cumulative_sqnr_db, ref.outputs[o.output_name]), (o, ref.outputs[o.output_name])
        assert o.cumulative_status == "ok"

    assert {w.weight_name for w in report.weights} == set(ref.weights)
    assert len(report.weights) == len(ref.weights)
    for w in report.weights:
        assert _close(w.weight_sqnr_db, ref.weights[w.weight_name]), (w, ref.weights[w.weight_name])
        if w.weight_name in ref.worst_channel:
            assert _close(w.worst_channel_sqnr_db, ref.worst_channel[w.weight_name]), w

    ps = report.per_sample
    assert ps.values.shape == (num_samples, len(report.activations))
    assert list(ps.tensor_names) == names
    for j, name in enumerate(ps.tensor_names):
        for i, expected in enumerate(ref.per_sample[name]):
            got = ps.values[i, j]
            assert _close(None if math.isnan(got) else float(got), expected), (name, i, got, expected)
    assert report.per_sample_outputs.values.shape == (num_samples, len(report.model_outputs))


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("config", sorted(TINY_CONFIGS))
def test_tiny_convnet_matches_float64_reference(config: str, tiny_float: Path, tiny_quant) -> None:
    qpath = tiny_quant(config)
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(qpath))
    n = 6
    source = SyntheticData(input_specs(fm), n, seed=7)
    samples = list(source)
    report = debug(tiny_float, qpath, source)
    ref = reference(fm, qm, samples)
    assert_matches(report, ref, n)
    # The configurations really are what they claim to be.
    types = {a.quant_type for a in report.activations if a.quantized}
    expected_type = TINY_CONFIGS[config].activation_type
    assert types == {expected_type}
    weight_types = {w.quant_type for w in report.weights if w.kind == "weight"}
    assert weight_types == {TINY_CONFIGS[config].weight_type}
    if TINY_CONFIGS[config].per_channel:
        assert {w.channels for w in report.weights if w.kind == "weight"} == {4, 3}
        assert all(w.worst_channel_sqnr_db is not None for w in report.weights if w.kind == "weight")
    # Quantization really happened: finite, plausible dB, not +inf everywhere.
    finite = [a.cumulative_sqnr_db for a in report.activations if a.cumulative_sqnr_db not in (None, math.inf)]
    assert finite and all(20 < v < 120 for v in finite), finite


@pytest.mark.parametrize("name", ["digits_cnn", "digits_transformer"])
def test_sample_models_match_float64_reference(name: str, tmp_path: Path) -> None:
    model = SAMPLE_MODELS / f"{name}.onnx"
    calib, evaluation = SAMPLE_MODELS / "digits_calib.npz", SAMPLE_MODELS / "digits_eval.npz"
    missing = [p.name for p in (model, calib, evaluation) if not p.exists()]
    if missing:
        print(f"skipping: sample files not generated yet: {missing}")
        pytest.skip(f"sample files not generated yet: {missing}")
    qpath = tmp_path / f"{name}.qdq.onnx"
    quantize(model, calib, QuantConfig(), qpath)
    n = 32
    report = debug(model, qpath, evaluation, DebugOptions(ignore_data_keys=("label",), num_samples=n))
    with np.load(evaluation) as npz:
        inputs = npz["input"][:n]
    samples = [{"input": np.ascontiguousarray(inputs[i])} for i in range(n)]
    ref = reference(onnx.load(str(model)), onnx.load(str(qpath)), samples)
    assert report.meta.num_samples == n
    assert_matches(report, ref, n)
