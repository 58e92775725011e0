"""The one definition of what is compared with what (docs/metrics.md):

* **cumulative** (per activation): the float model's tensor vs the quantized model's post-Q/DQ tensor;
* **local** (per quantized activation): the quantized model's own tensor before its Q/DQ vs after it;
* **outputs**: each float model output vs the quantized model's;

where a tensor consumed only by a Relu/Clip is seen *through* it (``measured_through``: both sides clipped to
the activation's bounds, so rounding the activation discards is not counted), and the pre-Q/DQ tensor of a
fused activation is clipped by it first (``fused_activation``). Sums are float64 (:func:`qdebug.metrics.reduce_pairs`);
ranges are of the float tensor before any clip.

:func:`reduce_sample` computes one sample's :class:`~qdebug.capture.base.SampleSums` from fetched tensors. The
numpy backend is this function; every other backend is tested against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from qdebug.capture.base import SampleSums
from qdebug.capture.dequant import Dequantized
from qdebug.errors import ModelError
from qdebug.metrics import reduce_pairs, value_ranges
from qdebug.pairing import ActivationPair, Pairing

__all__ = ["ReductionPlan", "bounds_or_inf", "check_shapes", "clip_to", "local_pre", "reduce_sample"]

Bounds = tuple[str, float, float]


@dataclass(frozen=True)
class ReductionPlan:
    """The tensors a sample's reduction needs from each model, in a fixed order."""

    pairing: Pairing
    float_names: tuple[str, ...]
    quant_names: tuple[str, ...]

    @classmethod
    def of(cls, pairing: Pairing) -> ReductionPlan:
        """The plan of ``pairing``."""
        acts, outs = pairing.activations, pairing.outputs
        f_names = [a.tensor_name for a in acts] + [o.output_name for o in outs]
        q_names = [a.pre_qdq for a in acts if a.quantized] + [a.post_qdq for a in acts] + [o.quant_name for o in outs]
        return cls(pairing, tuple(dict.fromkeys(f_names)), tuple(dict.fromkeys(q_names)))


def bounds_or_inf(bounds: Bounds | None) -> tuple[float, float]:
    """An activation's clip bounds as (low, high), ±inf when there are none (the compiled kernels' form)."""
    return (-np.inf, np.inf) if bounds is None else (bounds[1], bounds[2])


def clip_to(x: np.ndarray, bounds: Bounds | None) -> np.ndarray:
    """``x`` clipped to an activation's bounds (``None``: as is)."""
    return x if bounds is None else np.clip(x, bounds[1], bounds[2])


def local_pre(a: ActivationPair, q: Mapping[str, np.ndarray]) -> np.ndarray:
    """The pre-Q/DQ tensor as the local comparison sees it (fused activation, then measured-through)."""
    return clip_to(clip_to(q[a.pre_qdq], a.fused_activation), a.measured_through)


def check_shapes(plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> None:
    """A tensor whose shapes differ between the two models means they do not correspond: :class:`ModelError`."""
    shape_of = q.shape if isinstance(q, Dequantized) else (lambda name: q[name].shape)
    for a in plan.pairing.activations:
        ref_shape, post_shape = f[a.tensor_name].shape, tuple(shape_of(a.post_qdq))
        if tuple(ref_shape) != post_shape:
            raise ModelError(
                f"tensor {a.tensor_name!r} has shape {ref_shape} in the float model but {post_shape} "
                "in the quantized model: the models do not correspond"
            )
    for o in plan.pairing.outputs:
        r, t = f[o.output_name], q[o.quant_name]
        if r.shape != t.shape:
            raise ModelError(f"model output {o.output_name!r}: shape {r.shape} vs {t.shape}")


def reduce_sample(plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> SampleSums:
    """One sample's sums from the fetched tensors ``f`` (float model) and ``q`` (quantized model), by name.

    A tensor whose shapes differ between the two models means they do not correspond: :class:`ModelError`.
    """
    check_shapes(plan, f, q)
    acts, outs = plan.pairing.activations, plan.pairing.outputs
    refs = [f[a.tensor_name] for a in acts]
    posts = [q[a.post_qdq] for a in acts]
    ref_c = [clip_to(r, a.measured_through) for a, r in zip(acts, refs, strict=True)]
    post_c = [clip_to(p, a.measured_through) for a, p in zip(acts, posts, strict=True)]
    quant = [j for j, a in enumerate(acts) if a.quantized]
    o_refs, o_tests = [f[o.output_name] for o in outs], [q[o.quant_name] for o in outs]
    lo, hi = value_ranges(refs)
    return SampleSums(
        cumulative=reduce_pairs(ref_c, post_c),
        local=reduce_pairs([local_pre(acts[j], q) for j in quant], [post_c[j] for j in quant]),
        outputs=reduce_pairs(o_refs, o_tests),
        float_min=lo,
        float_max=hi,
        elements=np.array([r.size for r in refs], dtype=np.int64),
    )
