"""Several samples per inference call (``DebugOptions.batch``, ``--batch N``) with every sum still per sample.

Samples whose inputs have the same shapes are stacked along their batch axis and run as one batch; each exposed
tensor is then cut back into one view per sample, and each sample is reduced on its own by the reference definition
(:func:`~qdebug.capture.kernels.reference.reduce_sample`), so pairing, counts, ranges and per-sample SQNR stay those of
that sample. What a batch can change is floating-point rounding: ONNX Runtime's kernels may sum in another order
for a larger batch (a few tensors, in the last bits), so a batched report
agrees with an unbatched one to rounding, not bit for bit (docs/benchmarks.md).

Whether a model batches is *checked*, never assumed, on the run's first batch:

* every input must have a batch axis — the first axis declared free or 1 (:func:`batch_axes`: axis 0 of an image
  batch, axis 1 of a recurrent state ``[2, 1, 128]``) — and one fixed at 1 is relaxed to a free dimension
  (:func:`relax_batch_dim`): ONNX Runtime then says whether the graph allows it;
* every exposed tensor must split by sample (:func:`batch_views`): exactly one of its axes is the batch times the
  size it has for one sample, or its shape does not depend on the batch at all (a tensor computed from
  constants, such as position embeddings, is the same for every sample);
* one sample of the first batch is also run alone, and every one of its tensors must equal its batched slice to
  within :data:`SPLIT_TOLERANCE` of its energy (:func:`mismatch`): this catches a graph that folds the batch
  into another axis in a different order (a time-major LSTM layout, a hard-coded ``Reshape``).

Any failure stops batching for the rest of the run with the reason, which the report records
(``meta.capture.batch_reason``); the samples concerned are run one at a time as without ``--batch``. A batch holds
at most :attr:`~qdebug.capture.tuning.CaptureTuning.batch_bytes` of exposed tensors (both models): the batch size
is cut to fit, so peak memory stays bounded whatever ``--batch`` says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from qdebug.model_io import input_specs

__all__ = [
    "SPLIT_TOLERANCE",
    "batch_axes",
    "batch_views",
    "input_key",
    "mismatch",
    "relax_batch_dim",
    "sample_view",
    "stack",
    "stackable",
]

#: A tensor of a sample computed in a batch may differ from the same sample computed alone by this much of its
#: energy (``‖batched − alone‖² ≤ tol·‖alone‖²``): rounding differs by ~1e-12 of the energy, a sample taken from
#: the wrong place in the batch by ~1.
SPLIT_TOLERANCE = 1e-6

Shapes = tuple[tuple[int, ...], ...]
InputKey = tuple[tuple[str, tuple[int, ...], str], ...]


def input_key(sample: Mapping[str, np.ndarray]) -> InputKey:
    """What must be equal for samples to share a batch: each input's name, shape and dtype."""
    return tuple((k, tuple(v.shape), v.dtype.str) for k, v in sorted(sample.items()))


def batch_axes(model: onnx.ModelProto) -> dict[str, int]:
    """Per graph input, the axis samples are stacked on: the first whose declared size is free or 1 (axis 0 for
    an image batch ``[N, C, H, W]``; axis 1 for a recurrent state ``[2, 1, 128]``); inputs with no such axis are
    left out (they cannot be stacked)."""
    initializers = {t.name for t in model.graph.initializer}
    axes = {}
    for inp in model.graph.input:
        if inp.name in initializers or not inp.type.tensor_type.HasField("shape"):
            continue
        for ax, d in enumerate(inp.type.tensor_type.shape.dim):
            if not d.HasField("dim_value") or d.dim_value in (1, -1):
                axes[inp.name] = ax
                break
    return axes


def stackable(model: onnx.ModelProto) -> bool:
    """Whether every real input of ``model`` has an axis to stack samples on (batching is possible at all)."""
    return {spec.name for spec in input_specs(model)} <= set(batch_axes(model))


def stack(samples: Sequence[Mapping[str, np.ndarray]], axes: Mapping[str, int]) -> dict[str, np.ndarray] | None:
    """The samples concatenated along each input's batch axis, or ``None`` when they cannot be (an input with
    no batch axis)."""
    first = samples[0]
    if any(k not in axes or np.ndim(v) <= axes[k] for k, v in first.items()):
        return None
    return {k: np.concatenate([s[k] for s in samples], axis=axes[k]) for k in first}


def relax_batch_dim(model: onnx.ModelProto, copy: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` (``copy=False``: ``model`` itself, changed) whose graph inputs take any size on their
    batch axis (:func:`batch_axes`) where it is fixed at 1.

    The graph's ``value_info`` (shape hints for intermediate tensors, which would pin the batch at 1 again) is
    dropped; hints only, ONNX Runtime infers what it needs. The model is unchanged for one sample at a time.
    """
    if copy:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    else:
        out = model
    axes = batch_axes(model)
    relaxed = False
    for inp in out.graph.input:
        if inp.name not in axes:
            continue
        d = inp.type.tensor_type.shape.dim[axes[inp.name]]
        if d.HasField("dim_value"):
            d.dim_param = "qdebug_batch"
            relaxed = True
    if relaxed:
        del out.graph.value_info[:]
    return out


def batch_views(values: Sequence[np.ndarray], names: Sequence[str], alone: Shapes, n: int) -> list[np.ndarray] | str:
    """Each tensor of one batched run of ``n`` samples as a 3-D view ``(outer, n, inner)`` whose ``[:, i, :]`` is
    sample ``i``'s values (a tensor that does not depend on the batch is broadcast to every sample); or the reason
    the batch does not split (a tensor named with its shapes). ``alone`` are the tensors' shapes for one sample of
    the same input shapes; a tensor's batch axis is the one axis that is ``n`` times longer in the batch."""
    views: list[np.ndarray] = []
    for name, v, one in zip(names, values, alone, strict=True):
        shape = tuple(v.shape)
        grown = [ax for ax in range(len(one)) if len(shape) == len(one) and shape[ax] != one[ax]]
        if len(grown) == 1 and shape[grown[0]] == n * one[grown[0]]:
            ax = grown[0]
            outer = int(np.prod(shape[:ax], dtype=np.int64))
            views.append(v.reshape(outer, n, -1) if v.size else v.reshape(outer, n, 0))
        elif shape == one:  # does not depend on the batch (checked against a sample alone by `mismatch`)
            views.append(np.broadcast_to(v.reshape(1, 1, -1), (1, n, v.size)))
        else:
            return f"tensor {name!r} has shape {shape} for {n} samples and {one} for one: it does not split by sample"
    return views


def sample_view(view: np.ndarray, i: int, shape: tuple[int, ...]) -> np.ndarray:
    """Sample ``i``'s values of a :func:`batch_views` view, in its shape ``shape`` as one sample (a view where the
    layout allows, as it does for a batch axis 0 or a tensor shared by every sample)."""
    return view[:, i, :].reshape(shape)


def mismatch(batched: Sequence[np.ndarray], alone: Sequence[np.ndarray], names: Sequence[str]) -> str | None:
    """Why a sample's tensors computed in a batch are not the ones it has alone (``None``: they are)."""
    for name, b, a in zip(names, batched, alone, strict=True):
        if b.shape != a.shape:
            return f"tensor {name!r}: shape {b.shape} in the batch, {a.shape} alone"
        if b.dtype.kind not in "fc":
            if not np.array_equal(b, a):
                return f"tensor {name!r} differs in the batch from the sample alone"
            continue
        if _close(a, b):
            continue
        x, y = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
        both_nan = np.isnan(x) & np.isnan(y)
        if not np.array_equal(np.isnan(x), np.isnan(y)) or not np.array_equal(np.isinf(x), np.isinf(y)):
            return f"tensor {name!r}: its non-finite values move in the batch"
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.where(both_nan | np.isinf(x), 0.0, x - y)
            fin = np.where(np.isfinite(x), x, 0.0)
        err, energy = float(np.vdot(d, d)), float(np.vdot(fin, fin))
        if err > SPLIT_TOLERANCE * energy:
            return f"tensor {name!r} of a sample differs in the batch from the sample alone ({err:.3g} vs {energy:.3g})"
    return None


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """The common case of :func:`mismatch` in three passes instead of a dozen: both finite, and the difference's
    energy within the tolerance (sums in the tensors' own float type). ``False`` only means "look closer": a
    non-finite value or a float32 overflow makes a sum non-finite, and the exact float64 check decides."""
    if a.dtype != b.dtype or not a.size:
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        d = (a - b).reshape(-1)
        err, energy = float(np.vdot(d, d)), float(np.vdot(a.reshape(-1), a.reshape(-1)))
    return math.isfinite(err) and math.isfinite(energy) and err <= SPLIT_TOLERANCE * energy * 0.5
