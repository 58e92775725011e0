"""Every reduction kernel against the reference definition (docs/metrics.md), through its
:class:`~qdebug.capture.kernels.base.Reducer` face, on the same cases: sizes around the SIMD lanes (16) and their
tails, dot blocks and the small-tensor limit; clips (``measured_through``, ``fused_activation``, both); NaN and ±Inf
in each tensor; float32 and float64; post-Q/DQ tensors given as the four integer types the compiled kernels read;
batches; empty and all-zero tensors. A new kernel registers a reducer and is checked here with no new test.

The C kernel needs a C compiler and numba the ``fast`` extra; both are part of ``make test``'s install: without them
these tests skip locally and fail under ``CI=true``. The in-graph kernel runs in a real ONNX Runtime session."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
from capture_helpers import assert_same_sums, plan_of
from hypothesis import given, settings
from hypothesis import strategies as st

from qdebug.capture.base import SampleSums
from qdebug.capture.dequant import Dequantized, DequantSpec
from qdebug.capture.kernels import ingraph
from qdebug.capture.kernels.base import KernelUnavailableError, Reducer, Samples, get_reducer, reducer_names
from qdebug.capture.kernels.batched import BatchedReducer
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.metrics import SMALL_TENSOR

INTS = (np.uint8, np.int8, np.uint16, np.int16)
CLIPS = {
    "none": (None, None),
    "through": (None, ("Relu", 0.0, np.inf)),
    "fused": (("Clip", 0.0, 6.0), None),
    "both": (("Clip", -1.0, 6.0), ("Clip", -0.5, 2.0)),
}
SIZES = (0, 1, 15, 16, 17, 33, 255, 2049, 8193, SMALL_TENSOR + 3)
KERNELS = [n for n in reducer_names() if n != "reference"]


def _fail_or_skip(msg: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg} (CI=true: every kernel must be tested, not skipped)")
    pytest.skip(msg)


def _reducer(name: str) -> Reducer:
    try:
        return get_reducer(name)
    except KernelUnavailableError as exc:
        _fail_or_skip(str(exc))
        raise


@dataclass(frozen=True)
class Spec:
    """One case: every activation of the plan gets tensors of ``size`` elements for each of ``n`` samples."""

    size: int = 33
    n: int = 1
    dtype: type = np.float32
    clip: str = "none"
    ints: type | None = None  # post-Q/DQ tensors given as these integers
    special: float | None = None  # NaN/Inf put into one tensor of one sample
    where: int = 0  # which tensor: 0 reference, 1 pre-Q/DQ, 2 post-Q/DQ (floats only), 3 an output
    zero: bool = False  # every tensor all-zero
    seed: int = 0


def _shape(size: int) -> tuple[int, ...]:
    return (2, size // 2) if size >= 6 and size % 2 == 0 else (size,)


def make_case(spec: Spec) -> tuple[ReductionPlan, Samples]:
    """A plan of a quantized activation (clipped as ``spec.clip`` says), a quantized one without clips, one not
    quantized, and one output, and ``spec.n`` samples of its tensors."""
    fused, through = CLIPS[spec.clip]
    plan = plan_of([(True, fused, through), (True, None, None), (False, None, None)])
    rng, shape = np.random.default_rng(spec.seed), _shape(spec.size)
    samples = []
    for i in range(spec.n):
        f: dict[str, np.ndarray] = {}
        q: dict[str, np.ndarray] = {}
        specs: dict[str, DequantSpec] = {}
        for a in plan.pairing.activations:
            ref = (rng.standard_normal(shape) * 3).astype(spec.dtype)
            pre = (ref + rng.standard_normal(shape) * 0.1).astype(spec.dtype)
            f[a.tensor_name] = ref
            if a.quantized:
                q[a.pre_qdq] = pre
            if spec.ints is not None and a.quantized:
                info = np.iinfo(spec.ints)
                scale, zp = 0.05, int(info.min + (info.max - info.min) // 2)
                ints = np.clip(np.round(pre / np.float32(scale)) + zp, info.min, info.max).astype(spec.ints)
                specs[a.post_qdq] = DequantSpec(a.post_qdq, a.tensor_name + "_ints", scale, zp, np.dtype(spec.ints))
                q[a.tensor_name + "_ints"] = ints
            else:
                q[a.post_qdq] = (pre + rng.standard_normal(shape) * 0.2).astype(spec.dtype)
            if spec.zero:
                for d in (f, q):
                    for k in [k for k in d if k.startswith(a.tensor_name)]:
                        d[k] = np.zeros_like(d[k])
        f["out"] = rng.standard_normal(4).astype(spec.dtype)
        q["out_q"] = (f["out"] + np.float32(0.01)).astype(spec.dtype)
        if spec.special is not None and i == spec.n - 1 and spec.size:
            name = ("t0", "t0_pre", "t1_post" if spec.ints is None else "t2_post", "out_q")[spec.where]
            (f if name in f else q)[name].reshape(-1)[spec.seed % f["t0"].size if name != "out_q" else 0] = spec.special
        samples.append((f, Dequantized(q, specs) if specs else q))
    return plan, samples


def assert_reference_sums(want: list[SampleSums], got: list[SampleSums]) -> None:
    """Each sample's sums as the reference's: counts exact, sums to float32-product rounding, ranges equal."""
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        for kind in ("cumulative", "local", "outputs"):
            assert_same_sums(getattr(w, kind), getattr(g, kind))
        np.testing.assert_array_equal(w.elements, g.elements)
        np.testing.assert_allclose(w.float_min, g.float_min, rtol=0, atol=0)
        np.testing.assert_allclose(w.float_max, g.float_max, rtol=0, atol=0)


def _check(name: str, spec: Spec) -> None:
    plan, samples = make_case(spec)
    want = get_reducer("reference").reduce(plan, samples)
    assert_reference_sums(want, _reducer(name).reduce(plan, samples))


#: The named edge cases, each on every kernel.
CASES = [
    *(Spec(size=s) for s in SIZES),
    *(Spec(size=s, dtype=np.float64) for s in (1, 17, 2049)),
    *(Spec(size=300, clip=c) for c in CLIPS),
    *(Spec(size=s, ints=t, clip="both") for t in INTS for s in (15, 2049)),
    Spec(size=17, ints=np.int8, dtype=np.float64),
    *(Spec(size=40, special=v, where=w) for v in (np.nan, np.inf, -np.inf) for w in range(4)),
    Spec(size=40, special=np.inf, where=1, clip="both"),  # a clip turns +inf into a finite value
    Spec(size=40, special=np.nan, where=0, ints=np.uint8),
    *(Spec(size=s, n=3) for s in (17, 300, SMALL_TENSOR + 3)),
    Spec(size=64, n=4, ints=np.uint8, clip="both"),
    Spec(size=64, n=3, special=np.nan, where=2),
    Spec(size=0, n=2),
    *(Spec(size=s, zero=True) for s in (16, 300)),
    Spec(size=300, zero=True, ints=np.int8),
]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("spec", CASES, ids=repr)
def test_every_kernel_gives_the_reference_sums(name: str, spec: Spec) -> None:
    _check(name, spec)


@pytest.mark.parametrize("name", KERNELS)
@settings(max_examples=15, deadline=None)
@given(
    size=st.integers(0, 3 * SMALL_TENSOR // 2),
    n=st.integers(1, 3),
    f64=st.booleans(),
    clip=st.sampled_from(sorted(CLIPS)),
    ints=st.sampled_from([None, *INTS]),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    where=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_fuzzed_cases_give_the_reference_sums(
    name: str, size: int, n: int, f64: bool, clip: str, ints: type | None, special: float | None, where: int,
    seed: int,
) -> None:  # fmt: skip
    spec = Spec(size, n, np.float64 if f64 else np.float32, clip, ints, special, where, seed=seed)
    _check(name, spec)


def test_the_reference_reducer_is_the_definition() -> None:
    from qdebug.capture.kernels.reference import reduce_sample

    plan, samples = make_case(Spec(size=300, n=2, clip="both"))
    got = get_reducer("reference").reduce(plan, samples)
    for (f, q), g in zip(samples, got, strict=True):
        assert_reference_sums([reduce_sample(plan, f, q)], [g])


def test_tuning_values_change_no_sum() -> None:
    """The batch's chunk size and the merged graph's Concat width are tuning: any value gives the same sums (the
    Concat width bit for bit); a merged model above ``max_merged_bytes`` is refused."""
    plan, samples = make_case(Spec(size=300, n=4, clip="both"))
    want = BatchedReducer().reduce(plan, samples)
    for chunk in (1, 301, 1000):  # numpy's float32 sums over fewer samples at once may round differently
        assert_reference_sums(want, BatchedReducer(chunk_elements=chunk).reduce(plan, samples))
    want = ingraph.InGraphReducer().reduce(plan, samples)
    got = ingraph.InGraphReducer(concat_fan_in=2).reduce(plan, samples)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w.cumulative.signal, g.cumulative.signal)
        np.testing.assert_array_equal(w.local.noise, g.local.noise)
    fm, qm, _ = ingraph._models_of(plan, *samples[0])
    with pytest.raises(ingraph.UnsupportedGraphError, match="merged model would be"):
        ingraph.build(fm, qm, plan.pairing, max_merged_bytes=1000)


def test_the_in_graph_reducer_reduces_in_onnx_runtime() -> None:
    """Its sums are read back from the merged session, not redone by the reference: float32 in-graph squares
    summed in float64 differ from the reference's float32 products in the last bits."""
    plan, samples = make_case(Spec(size=SMALL_TENSOR + 3))
    want = get_reducer("reference").reduce(plan, samples)
    got = get_reducer("ingraph").reduce(plan, samples)
    assert_reference_sums(want, got)
    assert not np.array_equal(want[0].cumulative.signal, got[0].cumulative.signal)


def test_an_unknown_or_unavailable_kernel_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KeyError, match="no reducer 'nope'"):
        get_reducer("nope")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        _fail_or_skip("no numba")


@pytest.mark.parametrize(
    "spec",
    [
        Spec(size=300, clip="both"),
        Spec(size=2049, ints=np.uint8),
        Spec(size=40, special=np.nan, where=1),
        Spec(size=40, special=np.inf, where=0),
    ],
    ids=repr,
)
def test_the_c_reducer_gives_the_compiled_backends_bits(spec: Spec) -> None:
    """The C kernel's reducer turns rows into sums, and hands NaN/Inf to the reference, exactly as the ``compiled``
    backend does: the same bits (so that backend can reduce through it)."""
    from qdebug.capture import compiled

    plan, samples = make_case(spec)
    got = _reducer("c").reduce(plan, samples)
    for (f, q), g in zip(samples, got, strict=True):
        want = compiled.reduce_sample_compiled(plan, f, q)
        for kind in ("cumulative", "local", "outputs"):
            for name in ("signal", "noise", "count", "max_abs", "nonfinite_reference", "nonfinite_test"):
                np.testing.assert_array_equal(getattr(getattr(want, kind), name), getattr(getattr(g, kind), name))
        np.testing.assert_array_equal(want.float_min, g.float_min)
        np.testing.assert_array_equal(want.float_max, g.float_max)
