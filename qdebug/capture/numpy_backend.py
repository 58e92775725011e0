"""The ``numpy`` capture backend: every paired tensor is exposed as an extra output of its model (ONNX Runtime
activation augmentation, optimizations off), fetched, and reduced by :func:`~qdebug.capture.reduction.reduce_sample`
— the reference definition itself. Robust on any model ORT can run; it moves every tensor out of ORT."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from qdebug.capture.base import SampleSums
from qdebug.capture.reduction import ReductionPlan, reduce_sample
from qdebug.capture.session import expose_outputs, make_session, ort_message
from qdebug.errors import DataError, ModelError
from qdebug.graph import Pairing

__all__ = ["NumpyBackend", "NumpyRun"]


class NumpyRun:
    """Two sessions whose outputs include every tensor of the :class:`ReductionPlan`."""

    def __init__(
        self, float_model: onnx.ModelProto, quant_model: onnx.ModelProto, pairing: Pairing, providers: Sequence[str]
    ) -> None:
        self.plan = ReductionPlan.of(pairing)
        self.f_sess = make_session(expose_outputs(float_model, self.plan.float_names), providers, role="float model")
        self.q_sess = make_session(
            expose_outputs(quant_model, self.plan.quant_names), providers, role="quantized model"
        )

    def reduce(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums:
        """Run both models on the sample and reduce.

        A sample the float model cannot run is a :class:`DataError`; a sample the float model runs but the quantized
        model cannot (e.g. a zero point whose shape differs from its scale's, an axis out of range: ORT checks
        those at run time only) is the quantized model's fault, a :class:`ModelError` with that role.
        """
        try:
            f_vals = self.f_sess.run(list(self.plan.float_names), sample)  # type: ignore[attr-defined]
        except Exception as exc:  # ORT's own error types carry no common public base
            raise DataError(f"sample {index}: the float model cannot run on it: {ort_message(exc)}") from exc
        try:
            q_vals = self.q_sess.run(list(self.plan.quant_names), sample)  # type: ignore[attr-defined]
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime cannot run it on sample {index}, which the float model runs on: {ort_message(exc)}",
                role="quantized model",
            ) from exc
        f = dict(zip(self.plan.float_names, f_vals, strict=True))
        q = dict(zip(self.plan.quant_names, q_vals, strict=True))
        return reduce_sample(self.plan, f, q)


class NumpyBackend:
    """Fetch every paired tensor and reduce it in numpy."""

    name = "numpy"

    def open(
        self, float_model: onnx.ModelProto, quant_model: onnx.ModelProto, pairing: Pairing, providers: Sequence[str]
    ) -> NumpyRun:
        """Two augmented sessions (a model ORT cannot load is a :class:`~qdebug.errors.ModelError`)."""
        return NumpyRun(float_model, quant_model, pairing, providers)
