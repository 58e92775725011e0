"""Run the float and the quantized model on the same samples and reduce every paired tensor
to streaming sums, one sample at a time.

Tensors are captured by exposing them as extra graph outputs (ONNX Runtime activation augmentation)
with graph optimizations off, so the QDQ model is evaluated as written (fake-quant on the CPU) and no
requested tensor is fused away. Each sample's tensors are reduced to :class:`~qdebug.metrics.ErrorSums`
and dropped before the next sample: peak memory is one sample's activations of both models, whatever
the number of samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from qdebug.data import DataSource
from qdebug.errors import DataError, ModelError
from qdebug.graph import Pairing
from qdebug.metrics import BatchSums, ErrorSums, reduce_pairs, value_ranges

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

    def add(self, idx: np.ndarray, b: BatchSums) -> None:
        self.signal[idx] += b.signal
        self.noise[idx] += b.noise
        self.count[idx] += b.count
        self.max_abs[idx] = np.maximum(self.max_abs[idx], b.max_abs)
        self.nf_ref[idx] += b.nonfinite_reference
        self.nf_test[idx] += b.nonfinite_test

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
            [a.pre_qdq for a in acts if a.quantized] + [a.post_qdq for a in acts] + [o.quant_name for o in outs]
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

    # Fixed per-run plan: which fetched array feeds which comparison, and which are seen through an activation.
    act_f = [f_index[a.tensor_name] for a in acts]
    act_post = [q_index[a.post_qdq] for a in acts]
    all_idx = np.arange(len(acts))
    quant_idx = np.array([j for j, a in enumerate(acts) if a.quantized], dtype=np.intp)
    through = [(j, a.measured_through) for j, a in enumerate(acts) if a.measured_through is not None]
    pre_plan = [
        (q_index[a.pre_qdq], [act for act in (a.fused_activation, a.measured_through) if act is not None])
        for a in acts
        if a.quantized
    ]
    out_f = [f_index[o.output_name] for o in outs]
    out_q = [q_index[o.quant_name] for o in outs]
    out_idx = np.arange(len(outs))

    i = -1
    for i, sample in enumerate(data):
        if i >= n_total:  # a source that yields more than it announced
            break
        try:
            f_vals = f_sess.run(f_names, sample)  # type: ignore[attr-defined]
            q_vals = q_sess.run(q_names, sample)  # type: ignore[attr-defined]
        except Exception as exc:
            raise DataError(f"sample {i}: ONNX Runtime failed to run the models: {exc}") from exc
        refs = [f_vals[k] for k in act_f]
        posts = [q_vals[k] for k in act_post]
        for j, (ref, post) in enumerate(zip(refs, posts, strict=True)):
            if ref.shape != post.shape:
                raise ModelError(
                    f"tensor {acts[j].tensor_name!r} has shape {ref.shape} in the float model but {post.shape} "
                    "in the quantized model: the models do not correspond"
                )
        ref_c, post_c = list(refs), list(posts)
        for j, (_, lo, hi) in through:
            ref_c[j], post_c[j] = np.clip(refs[j], lo, hi), np.clip(posts[j], lo, hi)
        cum_b = reduce_pairs(ref_c, post_c)
        cum.add(all_idx, cum_b)
        per_sample[i] = cum_b.sqnr_db()
        if len(quant_idx):
            pres = []
            for k, clips in pre_plan:
                pre = q_vals[k]
                for _, lo, hi in clips:
                    pre = np.clip(pre, lo, hi)
                pres.append(pre)
            loc.add(quant_idx, reduce_pairs(pres, [post_c[j] for j in quant_idx]))
        lo_v, hi_v = value_ranges(refs)
        fmin = np.fmin(fmin, lo_v)
        fmax = np.fmax(fmax, hi_v)
        elements[:] = [r.size for r in refs]
        o_refs = [f_vals[k] for k in out_f]
        o_tests = [q_vals[k] for k in out_q]
        for o, r, t in zip(outs, o_refs, o_tests, strict=True):
            if r.shape != t.shape:
                raise ModelError(f"model output {o.output_name!r}: shape {r.shape} vs {t.shape}")
        out_b = reduce_pairs(o_refs, o_tests)
        out_acc.add(out_idx, out_b)
        per_sample_out[i] = out_b.sqnr_db()
        del f_vals, q_vals, refs, posts, ref_c, post_c
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
