"""How a compiled model's numbers on the QNN HTP differ from ONNX Runtime CPU's and the float model's.

:func:`htp_accuracy` compares HTP, CPU-QDQ and float model outputs, and, through a *probe* copy of the QDQ model whose
activation QuantizeLinear outputs are extra graph outputs, every quantized activation's integer values on the HTP
against ONNX Runtime CPU's, in steps of the quantization grid (LSB), and its excess noise over the float model's
(:mod:`qdebug.targets.divergence`). :func:`fp16_accuracy` (a float model on the HTP) and :func:`compiled_top1` are the
fp16 check and the compiled model's top-1.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.data import DataSource, Sample
from qdebug.errors import ConfigError, DataError, ModelError, TargetError
from qdebug.graph_index import constant_values, decode_constant
from qdebug.io import temp_dir
from qdebug.metrics import ErrorSums, reduce_pair, reduce_pairs, sqnr_from_energies
from qdebug.model_io import input_specs, is_dq, is_q, load_model
from qdebug.ort import expose_outputs, make_session
from qdebug.pairing import Pairing, pair_models
from qdebug.qdq_values import dequantize, quant_type_name
from qdebug.report import TargetAccuracy, TargetOutputAccuracy, TargetTensorDiff
from qdebug.targets.base import OutputsSink
from qdebug.targets.compile_report import CompileReport
from qdebug.targets.divergence import (
    EXCESS_NOISE_THRESHOLD,
    Divergence,
    Upstream,
    excess_ratio,
    locate,
    sqnr_drop_db,
    upstream_compared,
)
from qdebug.targets.qnn_compile import CompiledGraph, compile_qnn, load_compiled
from qdebug.targets.qnn_options import CPU_EP, DEFAULT_OPTIONS, QnnOptions
from qdebug.targets.qnn_session import qnn_session, run_compiled

__all__ = ["DATA_MOVEMENT_OPS", "compiled_top1", "fp16_accuracy", "htp_accuracy"]

#: Ops that only move data. Exposing the quantized tensors around them as probe outputs can split the
#: HTP graph (QNN then can no longer fold the Q/DQ pair around the op), so the probe drops them on retry.
DATA_MOVEMENT_OPS = frozenset(
    {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Gather", "Slice", "Concat", "Split"}
)


@dataclass(frozen=True)
class _ProbeTensor:
    tensor_name: str  # the float model's name (joins DebugReport.activations)
    topo_index: int
    q_output: str  # the QuantizeLinear output (integer tensor) in the QDQ model
    quant_type: str
    scale: np.ndarray
    zero_point: np.ndarray | None
    axis: int
    near_data_movement: bool


def _probe_tensors(qmodel: onnx.ModelProto, pairing: Pairing) -> list[_ProbeTensor]:
    """Every quantized activation's QuantizeLinear output, in the float model's topological order."""
    consts = constant_values(qmodel)
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    producer: dict[str, onnx.NodeProto] = {}
    for n in qmodel.graph.node:
        for i in n.input:
            consumers[i].append(n)
        for o in n.output:
            producer[o] = n
    out: list[_ProbeTensor] = []
    graph_outputs = {o.name for o in qmodel.graph.output}
    for a in pairing.activations:
        # A model output's own Q is compared per output already; exposing it makes the compiled probe define
        # that tensor twice (the EPContext node and the by-design CPU DQ both reference it).
        if not a.quantized or a.post_qdq in graph_outputs:
            continue
        q = next(
            (
                n
                for n in consumers[a.pre_qdq]
                if is_q(n) and any(is_dq(c) and c.output[0] == a.post_qdq for c in consumers[n.output[0]])
            ),
            None,
        )
        if q is None or q.input[1] not in consts:
            continue
        scale = decode_constant(consts[q.input[1]])
        zp = decode_constant(consts[q.input[2]]) if len(q.input) > 2 and q.input[2] in consts else None
        axis = next((int(at.i) for at in q.attribute if at.name == "axis"), 1)
        src = producer.get(a.pre_qdq)
        dq_users = [u for c in consumers[q.output[0]] if is_dq(c) for u in consumers[c.output[0]]]
        near = (src is not None and src.op_type in DATA_MOVEMENT_OPS) or any(
            u.op_type in DATA_MOVEMENT_OPS for u in dq_users
        )
        qtype = a.params.quant_type if a.params is not None else quant_type_name(np.dtype(np.uint8))
        out.append(_ProbeTensor(a.tensor_name, a.topo_index, q.output[0], qtype, scale, zp, axis, near))
    return out


@dataclass(frozen=True)
class _Probe:
    compiled: Path | None
    tensors: tuple[_ProbeTensor, ...]
    faithful: bool  # the probe kept the compiled model's partitioning
    notes: tuple[str, ...]


def _build_probe(
    qmodel: onnx.ModelProto,
    pairing: Pairing,
    target: CompiledGraph,
    out_dir: Path,
    options: QnnOptions,
) -> _Probe:
    """Compile the probe (``out_dir/probe.qnn_ctx.onnx``), retrying without data-movement tensors if it splits."""
    tensors = _probe_tensors(qmodel, pairing)
    if not tensors:
        return _Probe(None, (), False, ("probe: the QDQ model has no quantized activation to compare",))
    notes: list[str] = []
    probe_options = replace(options, fail_on_fallback=False)
    attempts = [tensors]
    kept = [t for t in tensors if not t.near_data_movement]
    if kept and len(kept) < len(tensors):
        attempts.append(kept)
    report: CompileReport | None = None
    used: list[_ProbeTensor] = []
    faithful = False
    with temp_dir(prefix=".probe.qdq-", dir=out_dir) as tmp:
        for k, attempt in enumerate(attempts):
            probe_path = Path(tmp) / "probe.qdq.onnx"
            onnx.save(expose_outputs(qmodel, [t.q_output for t in attempt]), str(probe_path))
            report = compile_qnn(probe_path, out_dir, probe_options, name="probe")
            used = attempt
            faithful = (
                report.ok
                and report.accelerator_partitions <= target.partitions
                and report.cpu_nodes <= target.cpu_nodes
            )
            if faithful:
                if k > 0:
                    dropped = [t.tensor_name for t in tensors if t.near_data_movement]
                    shown = ", ".join(dropped[:12]) + (f", … ({len(dropped) - 12} more)" if len(dropped) > 12 else "")
                    notes.append(
                        f"probe: {len(dropped)} tensor(s) next to data-movement ops "
                        f"({'/'.join(sorted(DATA_MOVEMENT_OPS))}) are not compared, because exposing them "
                        f"split the HTP graph: {shown}"
                    )
                break
    assert report is not None
    if not report.ok:
        notes.append(f"probe: compiling the probe model failed, no per-tensor comparison: {report.error}")
        return _Probe(None, (), False, tuple(notes))
    if not faithful:
        notes.append(
            f"probe: exposing the quantized tensors split the HTP graph into {report.accelerator_partitions} "
            f"partition(s) with {report.cpu_nodes} CPU node(s) (compiled model: {target.partitions}, "
            f"{target.cpu_nodes}); per-tensor values may differ from the compiled model's"
        )
    return _Probe(Path(str(report.compiled_model)), tuple(used), faithful, tuple(notes))


def _run(sess: Any, names: list[str], sample: Sample, i: int, what: str, error: type[Exception]) -> list[Any]:
    try:
        return list(sess.run(names, sample))
    except Exception as exc:
        raise error(f"sample {i}: {what} failed: {exc}") from exc


def _sqnr(s: ErrorSums) -> float | None:
    return s.sqnr[0]


def _check_models(
    fpath: Path, qpath: Path, cpath: Path
) -> tuple[onnx.ModelProto, onnx.ModelProto, CompiledGraph, Pairing]:
    """The float and QDQ models, the compiled model's graph, their pairing; the compiled model must be the QDQ
    model's (same outputs)."""
    fmodel = load_model(fpath, "float model")
    qmodel = load_model(qpath, "QDQ model")
    cmodel, target = load_compiled(cpath)
    pairing = pair_models(fmodel, qmodel)
    c_outputs = [o.name for o in cmodel.graph.output]
    missing = [o.quant_name for o in pairing.outputs if o.quant_name not in c_outputs]
    if missing:
        raise ModelError(
            f"{cpath}: has outputs {c_outputs}, not the QDQ model's {missing}: was it compiled from {qpath.name}?"
        )
    return fmodel, qmodel, target, pairing


class _OutputSums:
    """Per model output: HTP vs float, CPU-QDQ vs float, HTP vs CPU-QDQ (streaming sums)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.hf, self.cf, self.hc = ([ErrorSums()] * len(names) for _ in range(3))

    def add(self, f_vals: Sequence[np.ndarray], c_vals: Sequence[np.ndarray], h_vals: Sequence[np.ndarray]) -> None:
        for k, (f, c, h) in enumerate(zip(f_vals, c_vals, h_vals, strict=True)):
            if not (f.shape == c.shape == h.shape):
                raise ModelError(
                    f"model output {self.names[k]!r}: shapes float {f.shape}, CPU {c.shape}, HTP {h.shape}"
                )
            self.hf[k] = self.hf[k].merge(reduce_pair(f, h))
            self.cf[k] = self.cf[k].merge(reduce_pair(f, c))
            self.hc[k] = self.hc[k].merge(reduce_pair(c, h))

    def results(self) -> tuple[TargetOutputAccuracy, ...]:
        return tuple(
            TargetOutputAccuracy(name, _sqnr(self.hf[k]), _sqnr(self.cf[k]), _sqnr(self.hc[k]))
            for k, name in enumerate(self.names)
        )


class _TensorSums:
    """Per probed tensor: the integer values on the HTP vs ONNX Runtime CPU (max LSB, fraction differing, error
    energy of the dequantized values), the HTP's error energy vs float, the CPU-QDQ's (used when the caller has no
    debug report to take it from), and how far the probe's outputs are from the compiled model's."""

    def __init__(self, tensors: Sequence[_ProbeTensor]) -> None:
        n = len(tensors)
        self.tensors = list(tensors)
        self.max_lsb = np.zeros(n, dtype=np.int64)
        self.n_differ = np.zeros(n, dtype=np.int64)
        self.n_elems = np.zeros(n, dtype=np.int64)
        self.signal, self.noise = np.zeros(n), np.zeros(n)
        self.f_signal, self.f_noise, self.hf_noise = np.zeros(n), np.zeros(n), np.zeros(n)
        # Mean rounding noise per element of each tensor's grid (scale²/12; per-channel scales averaged).
        self.grid_noise = np.array([float(np.mean(np.square(t.scale.astype(np.float64)))) / 12.0 for t in tensors])
        self.probe_vs_compiled = 0.0

    def add(
        self,
        cpu: Sequence[np.ndarray],
        htp: Sequence[np.ndarray],
        probe_out: Sequence[np.ndarray],
        h_out: Sequence[np.ndarray],
        flt: Sequence[np.ndarray] = (),
    ) -> None:
        """One sample: the probed tensors' integers on the CPU and the HTP, the outputs of the probe and of the
        compiled model, and the float model's values of the probed tensors."""
        for po, ho in zip(probe_out, h_out, strict=True):
            d = np.abs(po.astype(np.float64) - ho.astype(np.float64))
            self.probe_vs_compiled = max(self.probe_vs_compiled, float(d.max()) if d.size else 0.0)
        refs, tests = [], []
        for j, (t, qc, qh) in enumerate(zip(self.tensors, cpu, htp, strict=True)):
            if qc.shape != qh.shape:
                raise TargetError(f"tensor {t.tensor_name!r}: HTP shape {qh.shape} vs CPU shape {qc.shape}")
            diff = np.abs(qh.astype(np.int64) - qc.astype(np.int64))
            if diff.size:
                self.max_lsb[j] = max(int(self.max_lsb[j]), int(diff.max()))
            self.n_differ[j] += int(np.count_nonzero(diff))
            self.n_elems[j] += diff.size
            refs.append(dequantize(qc, t.scale, t.zero_point, t.axis))
            tests.append(dequantize(qh, t.scale, t.zero_point, t.axis))
        if refs:
            b = reduce_pairs(refs, tests)
            self.signal += b.signal
            self.noise += b.noise
        if refs:
            # The HTP vs float, not only vs CPU: where the HTP is *closer* to float than ORT CPU (its Sigmoid at
            # 8 bits), HTP−CPU is as large as the quantization error and would look like a divergence.
            floats = [np.asarray(f, dtype=np.float64) for f in flt]
            fb = reduce_pairs(floats + floats, refs + tests)
            m = len(refs)
            self.f_signal += fb.signal[:m]
            self.f_noise += fb.noise[:m]
            self.hf_noise += fb.noise[m:]

    def _cpu_noise(self, j: int, cpu_db: Mapping[str, float | None] | None) -> tuple[float | None, float | None]:
        """(CPU-QDQ vs float SQNR in dB, its error energy): from the debug report's cumulative SQNR when given
        (energy = the float signal · 10^(−dB/10), its definition inverted), else from this run's float values;
        ``None`` when undefined."""
        if cpu_db is None:
            db = sqnr_from_energies(float(self.f_signal[j]), float(self.f_noise[j]))[0]
            return db, float(self.f_noise[j]) if db is not None else None
        db = cpu_db.get(self.tensors[j].tensor_name)
        if db is None:
            return None, None
        return db, 0.0 if math.isinf(db) else float(self.f_signal[j]) * 10.0 ** (-db / 10.0)

    def diffs(
        self, cpu_db: Mapping[str, float | None] | None, op_of: Mapping[str, str], threshold: float
    ) -> tuple[TargetTensorDiff, ...]:
        """Every probed tensor with its LSB figures and its excess-noise ratio (flagged above ``threshold``)."""
        out = []
        for j, t in enumerate(self.tensors):
            cpu_vs_float, cpu_noise = self._cpu_noise(j, cpu_db)
            ratio = excess_ratio(float(self.hf_noise[j]), cpu_noise, float(self.grid_noise[j] * self.n_elems[j]))
            out.append(
                TargetTensorDiff(
                    tensor_name=t.tensor_name,
                    topo_index=t.topo_index,
                    quant_type=t.quant_type,
                    max_lsb=int(self.max_lsb[j]),
                    fraction_differ=float(self.n_differ[j] / self.n_elems[j]) if self.n_elems[j] else 0.0,
                    sqnr_db=sqnr_from_energies(float(self.signal[j]), float(self.noise[j]))[0],
                    op_type=op_of.get(t.tensor_name, ""),
                    cpu_vs_float_db=cpu_vs_float,
                    target_vs_float_db=sqnr_from_energies(float(self.f_signal[j]), float(self.hf_noise[j]))[0],
                    excess_noise_ratio=ratio,
                    sqnr_drop_db=sqnr_drop_db(ratio),
                    flagged=ratio > threshold,
                )
            )
        return tuple(out)


def _producer_ops(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor name → the op type producing it (the float model's names, as the probe's tensors carry)."""
    return {o: n.op_type for n in model.graph.node for o in n.output}


@dataclass(frozen=True)
class _Graph:
    """What the divergence localisation needs from the float model, taken before it is released."""

    op_of: dict[str, str]
    upstream: dict[str, Upstream]


def _localise(
    tensors: _TensorSums, graph: _Graph, cpu_db: Mapping[str, float | None] | None, threshold: float
) -> tuple[tuple[TargetTensorDiff, ...], Divergence]:
    """The per-tensor figures and where the divergence starts (:mod:`qdebug.targets.divergence`)."""
    diffs = tensors.diffs(cpu_db, graph.op_of, threshold)
    order = [d.tensor_name for d in diffs]
    where = locate(order, [d.tensor_name for d in diffs if d.flagged], graph.upstream)
    return diffs, where


@dataclass(frozen=True)
class _Names:
    """What each session of the HTP check is asked for."""

    outputs: list[str]  # the float model's outputs
    float_tensors: list[str]  # the probed tensors in the float model
    quant_outputs: list[str]  # the QDQ (and compiled) model's outputs
    probed: list[str]  # the probed QuantizeLinear outputs


def _measure(
    sessions: tuple[Any, Any, Any, Any | None],
    names: _Names,
    data: DataSource,
    sums: tuple[_OutputSums, _TensorSums],
    sink: OutputsSink | None = None,
    probe_limit: int | None = None,
) -> tuple[int, float]:
    """Run float (CPU), QDQ (CPU), compiled (HTP) on every sample and the probe (HTP) on the first ``probe_limit``
    (``None``: every one) into the sums, each model's outputs also to ``sink``; (samples, HTP seconds)."""
    outs, tensors = sums
    f_sess, c_sess, htp, probe_sess = sessions
    f_names, q_names, t_names = names.outputs, names.quant_outputs, names.probed
    htp_seconds, n = 0.0, 0
    for i, sample in enumerate(data):
        f_vals = _run(f_sess, f_names + names.float_tensors, sample, i, "the float model on the CPU", DataError)
        c_vals = _run(c_sess, q_names + t_names, sample, i, "the QDQ model on the CPU", DataError)
        t0 = time.perf_counter()
        h_vals = _run(htp, q_names, sample, i, "the compiled model on the HTP", TargetError)
        htp_seconds += time.perf_counter() - t0
        outs.add(f_vals[: len(f_names)], c_vals[: len(q_names)], h_vals)
        if sink is not None:
            for role, vals in (
                ("float", f_vals[: len(f_names)]),
                ("qdq", c_vals[: len(q_names)]),
                ("compiled", h_vals),
            ):
                sink(role, f_names, vals)
        if probe_sess is not None and (probe_limit is None or i < probe_limit):
            p_vals = _run(probe_sess, t_names + q_names, sample, i, "the probe model on the HTP", TargetError)
            cpu_t, probe_t = c_vals[len(q_names) :], p_vals[: len(t_names)]
            tensors.add(cpu_t, probe_t, p_vals[len(t_names) :], h_vals, f_vals[len(f_names) :])
        n += 1
    return n, htp_seconds


def _probe_notes(probe_vs_compiled: float, probed: int, n: int) -> list[str]:
    """What to know about the probe's figures: over fewer samples than the outputs', or from a changed graph."""
    notes = []
    if probed < n:
        notes.append(f"probe: per-tensor figures over the first {probed} of the {n} samples (--probe-samples)")
    if probe_vs_compiled > 0.0:
        notes.append(
            f"probe: its model outputs differ from the compiled model's by up to {probe_vs_compiled:.3g} "
            "(exposing tensors changed the HTP graph); per-tensor values are indicative"
        )
    return notes


def _check_thresholds(lsb_threshold: object, excess_threshold: object) -> None:
    """A :class:`ConfigError` unless the LSB threshold is a non-negative int and the excess one a positive number."""
    if isinstance(lsb_threshold, bool) or not isinstance(lsb_threshold, int) or lsb_threshold < 0:
        raise ConfigError(f"lsb_threshold must be a non-negative integer, got {lsb_threshold!r}")
    ok = isinstance(excess_threshold, int | float) and not isinstance(excess_threshold, bool)
    if not (ok and math.isfinite(excess_threshold) and excess_threshold > 0):  # type: ignore[arg-type,operator]
        raise ConfigError(f"excess_threshold must be a positive number, got {excess_threshold!r}")


def htp_accuracy(
    float_model: str | Path,
    qdq_model: str | Path,
    compiled_model: str | Path,
    data: DataSource,
    *,
    out_dir: str | Path,
    options: QnnOptions = DEFAULT_OPTIONS,
    probe_tensors: bool = True,
    lsb_threshold: int = 1,
    cpu_sqnr_db: Mapping[str, float | None] | None = None,
    excess_threshold: float = EXCESS_NOISE_THRESHOLD,
    outputs_sink: OutputsSink | None = None,
    probe_samples: int | None = None,
) -> TargetAccuracy:
    """How the compiled model's numbers on the HTP differ from the float and the CPU-QDQ model's.

    Per model output, over all samples (streaming sums): SQNR of HTP vs float, CPU-QDQ vs float and HTP
    vs CPU-QDQ (the CPU-QDQ model runs on ORT CPU with graph optimizations off, as written). With
    ``probe_tensors``, a probe copy of the QDQ model exposing every activation QuantizeLinear output is
    compiled into ``out_dir`` (``probe.qnn_ctx.onnx``) and run on the HTP; each quantized activation's
    values are compared with ORT CPU's in LSB (largest difference, fraction of elements that differ; for
    information) and with the float model's: the HTP's extra error vs float in units of the tensor's own
    quantization error (``excess_noise_ratio``, see :mod:`qdebug.targets.divergence`) flags it above
    ``excess_threshold``. The quantization error is the debug report's cumulative SQNR per float tensor name
    when ``cpu_sqnr_db`` is given (``build`` passes it), else measured here on the same samples.
    ``first_divergent`` is the first flagged tensor in topological order whose nearest compared inputs are not
    flagged and whose error reaches a flagged consumer (``divergence_starts`` has every start, ``isolated_starts``
    those whose consumers are all unflagged). Tensors carry the float model's names (they join the debug report's
    activations); ``probe_single_partition``: the probe kept the compiled partitioning; ``outputs_sink``: top-1's.
    ``probe_samples``: the probe runs on the first that many samples only (``None``: all).
    """
    _check_thresholds(lsb_threshold, excess_threshold)
    cpath, out = Path(compiled_model), Path(out_dir)
    fmodel, qmodel, target, pairing = _check_models(Path(float_model), Path(qdq_model), cpath)
    if len(data) == 0:
        raise DataError(f"{data.description}: no samples")
    out.mkdir(parents=True, exist_ok=True)

    probe = _build_probe(qmodel, pairing, target, out, options) if probe_tensors else _Probe(None, (), False, ())
    notes = list(probe.notes)
    graph = _Graph(_producer_ops(fmodel), upstream_compared(fmodel, [t.tensor_name for t in probe.tensors]))
    names = _Names(
        [o.output_name for o in pairing.outputs],
        [t.tensor_name for t in probe.tensors],
        [o.quant_name for o in pairing.outputs],
        [t.q_output for t in probe.tensors],
    )
    f_sess = make_session(expose_outputs(fmodel, names.float_tensors), [CPU_EP])
    c_sess = make_session(expose_outputs(qmodel, names.probed), [CPU_EP])
    del fmodel, qmodel
    htp = qnn_session(cpath, options)
    probe_sess = qnn_session(probe.compiled, options) if probe.compiled is not None else None
    outs = _OutputSums(names.outputs)
    tensors = _TensorSums(probe.tensors)
    sessions = (f_sess, c_sess, htp, probe_sess)
    n, htp_seconds = _measure(sessions, names, data, (outs, tensors), outputs_sink, probe_samples)
    if n == 0:
        raise DataError(f"{data.description}: no samples")
    diffs, where = _localise(tensors, graph, cpu_sqnr_db, float(excess_threshold))
    if probe_sess is not None:
        notes += _probe_notes(tensors.probe_vs_compiled, n if probe_samples is None else min(probe_samples, n), n)
    return TargetAccuracy(
        target="qnn",
        device=options.device_label(),
        num_samples=n,
        seconds_per_sample=htp_seconds / n,
        outputs=outs.results(),
        tensors=diffs,
        lsb_threshold=lsb_threshold,
        first_divergent=where.first,
        probe_single_partition=probe.faithful if probe_tensors else None,
        notes=tuple(notes),
        excess_threshold=float(excess_threshold),
        divergence_starts=where.starts,
        isolated_starts=where.isolated,
        divergence_ops=where.op_types,
        first_divergent_nodes=where.first_nodes,
        probe_vs_compiled=tensors.probe_vs_compiled if probe_sess is not None else None,
    )


def _outputs_of(result: Any, names: Sequence[str]) -> list[np.ndarray]:
    """``run_compiled``'s per-sample result as arrays in ``names`` order (a mapping or a sequence)."""
    if isinstance(result, Mapping):
        return [np.asarray(result[n]) for n in names]
    return [np.asarray(v) for v in result]


def fp16_accuracy(float_model: Path, compiled: Path, source: DataSource, options: QnnOptions) -> TargetAccuracy:
    """HTP fp16 vs the float model per output (there is no CPU QDQ model to compare with)."""
    ref = make_session(load_model(float_model, "float model"), ["CPUExecutionProvider"], optimize=True)
    names = [o.name for o in ref.get_outputs()]  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    results = list(run_compiled(compiled, source, output_names=names, options=options))
    seconds = time.perf_counter() - t0
    sums = [ErrorSums() for _ in names]
    for sample, res in zip(source, results, strict=True):
        outs = ref.run(names, dict(sample))  # type: ignore[attr-defined]
        for j, (r, t) in enumerate(zip(outs, _outputs_of(res, names), strict=True)):
            sums[j] = sums[j].merge(reduce_pair(np.asarray(r), t))
    outputs = tuple(TargetOutputAccuracy(n, s.sqnr[0], None, None) for n, s in zip(names, sums, strict=True))
    return TargetAccuracy(
        target="qnn",
        device=options.device_label(),
        num_samples=len(results),
        seconds_per_sample=round(seconds / max(len(results), 1), 6),
        outputs=outputs,
        notes=("fp16: no QDQ model, so the HTP is compared with the float model only",),
    )


def compiled_top1(
    compiled: Path, eval_data: Path, label_key: str, model: onnx.ModelProto, options: QnnOptions
) -> float:
    """Top-1 of a compiled model on the HTP over a labelled ``.npz``."""
    from qdebug.data import open_data, read_labels

    source = open_data(eval_data, input_specs(model), ignore=(label_key,))
    labels = read_labels(eval_data, label_key, len(source))
    first = model.graph.output[0].name
    hits = 0
    for i, res in enumerate(run_compiled(compiled, source, output_names=[first], options=options)):
        logits = _outputs_of(res, [first])[0]
        hits += int(int(np.argmax(logits.reshape(-1))) == int(labels[i]))
    return hits / len(source)
