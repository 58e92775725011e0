"""Run the float and the quantized model on the same samples and reduce every paired tensor
to streaming sums, one sample at a time.

Tensors are captured by exposing them as extra graph outputs (ONNX Runtime activation augmentation)
with graph optimizations off, so the QDQ model is evaluated as written (fake-quant on the CPU) and no
requested tensor is fused away. Each sample's tensors are reduced to :class:`~qdebug.metrics.ErrorSums`
and dropped before the next sample: peak memory is one sample's activations of both models, whatever
the number of samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from qdebug.data import DataSource
from qdebug.errors import DataError, ModelError
from qdebug.graph import Pairing
from qdebug.metrics import ErrorSums, reduce_pair, sqnr_from_energies

ProgressFn = Callable[[int, int], None]


def expose_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs also include ``names`` (types left to ORT)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    existing = {o.name for o in out.graph.output}
    for name in dict.fromkeys(names):
        if name not in existing:
            # An untyped ValueInfo is enough for ORT; com.microsoft Q/DQ outputs have no inferred type.
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            existing.add(name)
    return out


def make_session(model: onnx.ModelProto, providers: Sequence[str], *, optimize: bool = False) -> object:
    """An ORT session with optimizations off (unless asked) and clear errors."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=list(providers))
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise ModelError(f"ONNX Runtime cannot load the model {model.graph.name!r}: {exc}") from exc


@dataclass
class _Acc:
    """Mutable per-tensor sums (internal; results are frozen dataclasses)."""

    n: int

    def __post_init__(self) -> None:
        self.signal = np.zeros(self.n)
        self.noise = np.zeros(self.n)
        self.count = np.zeros(self.n, dtype=np.int64)
        self.max_abs = np.zeros(self.n)
        self.nf_ref = np.zeros(self.n, dtype=np.int64)
        self.nf_test = np.zeros(self.n, dtype=np.int64)
        self.samples = 0

    def add(self, j: int, s: ErrorSums) -> float:
        self.signal[j] += s.signal
        self.noise[j] += s.noise
        self.count[j] += s.count
        self.max_abs[j] = max(self.max_abs[j], s.max_abs)
        self.nf_ref[j] += s.nonfinite_reference
        self.nf_test[j] += s.nonfinite_test
        if s.nonfinite_reference or s.nonfinite_test:
            return math.nan
        v, _ = sqnr_from_energies(s.signal, s.noise)
        return math.nan if v is None else v

    def sums(self, j: int) -> ErrorSums:
        return ErrorSums(
            signal=float(self.signal[j]),
            noise=float(self.noise[j]),
            count=int(self.count[j]),
            max_abs=float(self.max_abs[j]),
            nonfinite_reference=int(self.nf_ref[j]),
            nonfinite_test=int(self.nf_test[j]),
            samples=self.samples,
        )


@dataclass(frozen=True)
class CaptureResult:
    """Streaming reductions of every paired tensor over all samples."""

    cumulative: tuple[ErrorSums, ...]  # per activation, float vs quant (post-QDQ)
    local: tuple[ErrorSums | None, ...]  # per activation, pre- vs post-QDQ (None if not quantized)
    outputs: tuple[ErrorSums, ...]
    float_min: tuple[float | None, ...]
    float_max: tuple[float | None, ...]
    elements: tuple[int, ...]
    per_sample: np.ndarray  # samples × activations, cumulative SQNR dB
    per_sample_outputs: np.ndarray  # samples × outputs
    num_samples: int


def capture(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    pairing: Pairing,
    data: DataSource,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    progress: ProgressFn | None = None,
) -> CaptureResult:
    """Run both models sample by sample and reduce every paired tensor to sums."""
    acts = pairing.activations
    outs = pairing.outputs
    f_names = list(dict.fromkeys([a.tensor_name for a in acts] + [o.output_name for o in outs]))
    q_names = list(
        dict.fromkeys(
            [a.pre_qdq for a in acts if a.quantized]
            + [a.post_qdq for a in acts]
            + [o.quant_name for o in outs]
        )
    )
    f_sess = make_session(expose_outputs(float_model, f_names), providers)
    q_sess = make_session(expose_outputs(quant_model, q_names), providers)
    f_index = {n: i for i, n in enumerate(f_names)}
    q_index = {n: i for i, n in enumerate(q_names)}

    n_total = len(data)
    cum, loc, out_acc = _Acc(len(acts)), _Acc(len(acts)), _Acc(len(outs))
    fmin = np.full(len(acts), np.inf)
    fmax = np.full(len(acts), -np.inf)
    elements = np.zeros(len(acts), dtype=np.int64)
    per_sample = np.full((n_total, len(acts)), np.nan)
    per_sample_out = np.full((n_total, len(outs)), np.nan)

    i = -1
    for i, sample in enumerate(data):
        if i >= n_total:  # a source that yields more than it announced
            break
        try:
            f_vals = f_sess.run(f_names, sample)  # type: ignore[attr-defined]
            q_vals = q_sess.run(q_names, sample)  # type: ignore[attr-defined]
        except Exception as exc:
            raise DataError(f"sample {i}: ONNX Runtime failed to run the models: {exc}") from exc
        for j, a in enumerate(acts):
            ref = f_vals[f_index[a.tensor_name]]
            post = q_vals[q_index[a.post_qdq]]
            if ref.shape != post.shape:
                raise ModelError(
                    f"tensor {a.tensor_name!r} has shape {ref.shape} in the float model but {post.shape} in "
                    "the quantized model: the models do not correspond"
                )
            ref_c, post_c = ref, post
            if a.measured_through is not None:
                lo, hi = a.measured_through[1], a.measured_through[2]
                ref_c, post_c = np.clip(ref, lo, hi), np.clip(post, lo, hi)
            s = reduce_pair(ref_c, post_c)
            per_sample[i, j] = cum.add(j, s)
            if a.quantized:
                pre = q_vals[q_index[a.pre_qdq]]
                for act in (a.fused_activation, a.measured_through):
                    if act is not None:
                        pre = np.clip(pre, act[1], act[2])
                loc.add(j, reduce_pair(pre, post_c))
            if ref.size and s.nonfinite_reference == 0:
                fmin[j] = min(fmin[j], float(ref.min()))
                fmax[j] = max(fmax[j], float(ref.max()))
            elements[j] = ref.size
        for j, o in enumerate(outs):
            ref = f_vals[f_index[o.output_name]]
            test = q_vals[q_index[o.quant_name]]
            if ref.shape != test.shape:
                raise ModelError(f"model output {o.output_name!r}: shape {ref.shape} vs {test.shape}")
            per_sample_out[i, j] = out_acc.add(j, reduce_pair(ref, test))
        del f_vals, q_vals
        if progress is not None:
            progress(i + 1, n_total)
    n_done = i + 1
    if n_done == 0:
        raise DataError(f"{data.description}: no samples")
    for acc in (cum, loc, out_acc):
        acc.samples = n_done
    return CaptureResult(
        cumulative=tuple(cum.sums(j) for j in range(len(acts))),
        local=tuple(loc.sums(j) if a.quantized else None for j, a in enumerate(acts)),
        outputs=tuple(out_acc.sums(j) for j in range(len(outs))),
        float_min=tuple(float(v) if np.isfinite(v) else None for v in fmin),
        float_max=tuple(float(v) if np.isfinite(v) else None for v in fmax),
        elements=tuple(int(e) for e in elements),
        per_sample=per_sample[:n_done],
        per_sample_outputs=per_sample_out[:n_done],
        num_samples=n_done,
    )
