"""Metrics: SQNR against hand computations, degenerate cases, properties, and the streaming reduction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qdebug.metrics import (
    METRICS,
    ErrorSums,
    SqnrStatus,
    Summary,
    cosine_similarity,
    max_abs_error,
    mse,
    reduce_pair,
    register_metric,
    sqnr_db,
    sqnr_from_energies,
)


def test_sqnr_db_matches_hand_computation() -> None:
    x = np.array([1.0, -2.0, 3.0, 0.5], dtype=np.float32)
    y = np.array([1.1, -2.0, 2.8, 0.5], dtype=np.float32)
    # Σx² = 1 + 4 + 9 + 0.25 = 14.25; Σ(x−y)² = 0.01 + 0 + 0.04 + 0 = 0.05 (in float32 arithmetic)
    signal = 14.25
    noise = float((np.float64(np.float32(1.0)) - np.float64(np.float32(1.1))) ** 2) + float(
        (np.float64(np.float32(3.0)) - np.float64(np.float32(2.8))) ** 2
    )
    assert noise == pytest.approx(0.05, rel=1e-5)
    assert sqnr_db(x, y) == pytest.approx(10 * math.log10(signal / noise), abs=1e-9)
    assert sqnr_db(x, y) == pytest.approx(24.5484, abs=1e-3)  # 10·log10(285)


def test_sqnr_db_widens_integers_before_subtracting() -> None:
    ref = np.array([200, 10], dtype=np.uint8)
    test = np.array([190, 20], dtype=np.uint8)  # uint8 arithmetic would wrap 10 − 20 to 246
    expected = 10 * math.log10((200**2 + 10**2) / (10**2 + 10**2))
    assert sqnr_db(ref, test) == pytest.approx(expected, abs=1e-12)


def test_sqnr_of_identical_is_plus_inf() -> None:
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    assert sqnr_db(x, x.copy()) == math.inf
    assert sqnr_from_energies(5.0, 0.0) == (math.inf, SqnrStatus.IDENTICAL)
    assert sqnr_from_energies(0.0, 0.0) == (math.inf, SqnrStatus.IDENTICAL)  # both all-zero: nothing lost


def test_all_zero_reference_with_noise_is_undefined() -> None:
    zeros = np.zeros(16, dtype=np.float32)
    noisy = np.full(16, 1e-3, dtype=np.float32)
    assert math.isnan(sqnr_db(zeros, noisy))
    assert sqnr_from_energies(0.0, 1e-3) == (None, SqnrStatus.UNDEFINED)
    sums = reduce_pair(zeros, noisy)
    assert sums.sqnr == (None, SqnrStatus.UNDEFINED)


def test_sqnr_db_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        sqnr_db(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="shape mismatch"):
        reduce_pair(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))


def test_other_metrics_by_hand() -> None:
    x = np.array([3.0, 4.0, 0.0])
    y = np.array([3.0, 2.0, 1.0])
    assert mse(x, y) == pytest.approx((0 + 4 + 1) / 3)
    assert max_abs_error(x, y) == 2.0
    assert cosine_similarity(x, y) == pytest.approx((9 + 8) / (5 * math.sqrt(14)))
    assert math.isnan(cosine_similarity(np.zeros(3), y))


def test_metric_registry() -> None:
    assert METRICS["sqnr_db"] is sqnr_db
    with pytest.raises(ValueError, match="already registered"):
        register_metric("sqnr_db", mse)
    register_metric("test_l1", lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).sum()))
    try:
        assert METRICS["test_l1"]([1.0, 2.0], [0.0, 0.0]) == 3.0
    finally:
        del METRICS["test_l1"]


# ------------------------------------------------------------------ properties
# Values on a 1e-3 grid in [-1e3, 1e3]: squares never underflow (a subnormal x has x² = 0 and no signal).
_finite = st.integers(-(10**6), 10**6).map(lambda i: i / 1000.0)
_vectors = hnp.arrays(np.float64, st.integers(2, 64), elements=_finite)


@settings(max_examples=60, deadline=None)
@given(x=_vectors, seed=st.integers(0, 2**16), k=st.floats(1e-3, 1e3))
def test_sqnr_is_scale_invariant(x: np.ndarray, seed: int, k: float) -> None:
    noise = np.random.default_rng(seed).standard_normal(x.shape) * 0.01
    y = x + noise
    if not np.any(x) or not np.any(x - y):
        return
    assert sqnr_db(k * x, k * y) == pytest.approx(sqnr_db(x, y), abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(x=_vectors, seed=st.integers(0, 2**16), a=st.floats(1e-4, 1.0), b=st.floats(1.01, 100.0))
def test_sqnr_is_monotonic_in_noise(x: np.ndarray, seed: int, a: float, b: float) -> None:
    if not np.any(x):
        return
    noise = np.random.default_rng(seed).standard_normal(x.shape)
    small, large = sqnr_db(x, x + a * noise), sqnr_db(x, x + a * b * noise)
    assert large < small
    # Exactly 20·log10(b) dB apart: noise energy scales with b².
    assert small - large == pytest.approx(20 * math.log10(b), abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(x=_vectors)
def test_sqnr_of_self_is_inf_property(x: np.ndarray) -> None:
    assert sqnr_db(x, x) == math.inf


# ------------------------------------------------------------------ streaming reduction
def _one_shot(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, int, float]:
    x = np.concatenate([p[0].astype(np.float64).ravel() for p in pairs])
    y = np.concatenate([p[1].astype(np.float64).ravel() for p in pairs])
    d = x - y
    return float(x @ x), float(d @ d), x.size, float(np.abs(d).max())


@pytest.mark.parametrize("sizes", [[1, 7, 100], [8192, 8193, 3], [150_000, 1_000_003]])
def test_reduce_and_merge_equal_one_shot_float64(sizes: list[int]) -> None:
    rng = np.random.default_rng(sum(sizes))
    pairs = []
    for n in sizes:
        x = (rng.standard_normal(n) * rng.uniform(0.1, 50)).astype(np.float32)
        y = (x + rng.standard_normal(n).astype(np.float32) * 0.01).astype(np.float32)
        pairs.append((x, y))
    merged = ErrorSums()
    for x, y in pairs:
        merged = merged.merge(reduce_pair(x, y))
    signal, noise, count, max_abs = _one_shot(pairs)
    # reduce_pair trades float64 for speed (float32 blocks): 1e-6 relative is ~4e-6 dB, 2500x below
    # the 0.01 dB the engine promises; a real accumulation bug is off by orders of magnitude more.
    assert merged.signal == pytest.approx(signal, rel=1e-6)
    assert merged.noise == pytest.approx(noise, rel=1e-6)
    assert merged.count == count
    assert merged.samples == len(sizes)
    assert merged.max_abs == pytest.approx(max_abs, rel=1e-7)
    assert merged.mse == pytest.approx(noise / count, rel=1e-6)
    value, status = merged.sqnr
    assert status is SqnrStatus.OK
    assert value == pytest.approx(10 * math.log10(signal / noise), abs=1e-5)


def test_merge_is_associative_and_order_independent() -> None:
    rng = np.random.default_rng(3)
    parts = [
        reduce_pair(a, a + rng.standard_normal(a.shape).astype(np.float32))
        for a in (rng.standard_normal(s).astype(np.float32) for s in (10, 20, 30))
    ]
    left = parts[0].merge(parts[1]).merge(parts[2])
    right = parts[2].merge(parts[0].merge(parts[1]))
    assert left.signal == pytest.approx(right.signal, rel=1e-15)
    assert left.noise == pytest.approx(right.noise, rel=1e-15)
    assert (left.count, left.samples, left.max_abs) == (right.count, right.samples, right.max_abs)


def test_reduce_pair_on_multidimensional_and_empty() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    s = reduce_pair(x, x + 1)
    assert s.signal == float(np.sum(np.arange(24.0) ** 2))
    assert s.noise == 24.0
    assert s.count == 24
    assert s.max_abs == 1.0
    empty = reduce_pair(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    assert (empty.count, empty.samples, empty.signal) == (0, 1, 0.0)


@pytest.mark.parametrize(
    ("ref_bad", "test_bad", "exp_ref", "exp_test"),
    [
        ([np.nan], [], 1, 0),
        ([], [np.inf, -np.inf], 0, 2),
        ([np.inf], [np.inf], 1, 1),  # inf − inf = NaN, and no RuntimeWarning escapes
    ],
)
def test_nonfinite_is_flagged(ref_bad: list[float], test_bad: list[float], exp_ref: int, exp_test: int) -> None:
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    y = x + 0.01
    x[: len(ref_bad)] = ref_bad
    y[: len(test_bad)] = test_bad
    s = reduce_pair(x, y)
    assert (s.nonfinite_reference, s.nonfinite_test) == (exp_ref, exp_test)
    assert s.sqnr == (None, SqnrStatus.NONFINITE)
    merged = reduce_pair(x[5:], y[5:]).merge(s)
    assert merged.sqnr == (None, SqnrStatus.NONFINITE)
    assert math.isnan(sqnr_db(x, y))
    assert sqnr_from_energies(math.nan, 1.0) == (None, SqnrStatus.NONFINITE)
    assert sqnr_from_energies(1.0, math.inf) == (None, SqnrStatus.NONFINITE)


def test_float32_overflow_of_finite_values_is_not_flagged() -> None:
    x = np.array([3e38, -3e38, 1.0], dtype=np.float32)
    y = np.array([-3e38, 3e38, 1.0], dtype=np.float32)  # x − y overflows float32, both are finite
    s = reduce_pair(x, y)
    assert (s.nonfinite_reference, s.nonfinite_test) == (0, 0)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert s.signal == pytest.approx(float(x64 @ x64), rel=1e-12)
    assert s.noise == pytest.approx(float((x64 - y64) @ (x64 - y64)), rel=1e-12)
    assert s.max_abs == pytest.approx(6e38, rel=1e-6)
    value, status = s.sqnr
    assert status is SqnrStatus.OK
    assert value == pytest.approx(10 * math.log10(2 * 9e76 / (2 * 36e76)), abs=1e-5)


def test_summary_excludes_inf_and_none_but_counts_them() -> None:
    s = Summary.of([10.0, math.inf, None, 30.0, None, 20.0])
    assert (s.count, s.infinite, s.undefined) == (3, 1, 2)
    assert s.mean == pytest.approx(20.0)
    assert s.std == pytest.approx(math.sqrt(200 / 3))
    assert (s.min, s.max) == (10.0, 30.0)
    empty = Summary.of([math.inf, None])
    assert (empty.count, empty.mean, empty.std, empty.min, empty.max) == (0, None, None, None, None)
    assert (empty.infinite, empty.undefined) == (1, 1)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


_pairs = st.integers(0, 20000).flatmap(
    lambda n: st.tuples(
        hnp.arrays(np.float64, n, elements=st.floats(allow_nan=True, allow_infinity=True, width=32)),
        hnp.arrays(np.float64, n, elements=st.floats(allow_nan=True, allow_infinity=True, width=32)),
    )
)


@settings(max_examples=150, deadline=None)
@given(pair=_pairs, zero_ref=st.booleans(), same=st.booleans())
def test_builtin_metrics_from_stats_equal_the_functions_bit_for_bit(
    pair: tuple[np.ndarray, np.ndarray], zero_ref: bool, same: bool
) -> None:
    """The weight pass computes the built-in whole-tensor metrics from one :class:`TensorStats` instead of calling
    them on the arrays (FROM_STATS): the same value, bit for bit, including NaN/±inf, empty, all-zero and identical
    tensors, and arrays longer than one dot block."""
    from qdebug.metrics import FROM_STATS, TensorStats

    x, y = pair
    if zero_ref:
        x = np.zeros_like(x)
    if same:
        y = x.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        stats = TensorStats.of(x, y, x - y)
        for name, fn in METRICS.items():
            if fn in FROM_STATS:
                assert _same(FROM_STATS[fn](stats), fn(x, y)), name
    assert set(FROM_STATS) == {sqnr_db, mse, max_abs_error, cosine_similarity}


_sums = st.floats(min_value=1e-30, max_value=1e30) | st.sampled_from([0.0, math.inf, math.nan])


@settings(max_examples=200, deadline=None)
@given(
    signal=st.lists(_sums, min_size=1, max_size=8),
    noise=st.lists(_sums, min_size=8, max_size=8),
    nonfinite=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_the_row_form_of_the_sqnr_rule_gives_the_scalar_forms_values(
    signal: list[float], noise: list[float], nonfinite: list[bool]
) -> None:
    """:func:`sqnr_row` (a sample's per-pair row) is :func:`sqnr_from_energies` element by element: the same case
    for every pair, the same dB to numpy's log10 rounding."""
    from qdebug.metrics import sqnr_row

    n = len(signal)
    s, d, bad = np.array(signal), np.array(noise[:n]), np.array(nonfinite[:n])
    row = sqnr_row(s, d, bad)
    for k in range(n):
        value, _ = sqnr_from_energies(signal[k], noise[k], bool(bad[k]))
        if value is None:
            assert math.isnan(row[k])
        else:
            assert row[k] == pytest.approx(value, rel=1e-15, abs=0)


def _matmul_pair(w: np.ndarray, wq: np.ndarray, scale: np.ndarray) -> tuple:
    """A float ``X @ W`` and its QDQ twin (``X`` through an int8 Q/DQ; ``W`` int8 per output channel, axis 1)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def model(nodes: list, inits: list) -> onnx.ModelProto:
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, w.shape[0]])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, w.shape[1]])], inits,
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)

    f = model([helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], [numpy_helper.from_array(w, "W")])
    q_inits = [
        numpy_helper.from_array(wq, "W_q"),
        numpy_helper.from_array(scale, "W_scale"),
        numpy_helper.from_array(np.zeros(w.shape[1], np.int8), "W_zp"),
        numpy_helper.from_array(np.array(0.01, np.float32), "X_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "X_zp"),
    ]
    q_nodes = [
        helper.make_node("QuantizeLinear", ["X", "X_scale", "X_zp"], ["X_q"], name="qx"),
        helper.make_node("DequantizeLinear", ["X_q", "X_scale", "X_zp"], ["X_dq"], name="dqx"),
        helper.make_node("DequantizeLinear", ["W_q", "W_scale", "W_zp"], ["W_dq"], name="dq", axis=1),
        helper.make_node("MatMul", ["X_dq", "W_dq"], ["Y"], name="mm"),
    ]
    return f, model(q_nodes, q_inits)


def test_an_all_zero_channel_is_identical_in_the_inspector_and_the_report() -> None:
    """An all-zero float channel that dequantizes to zeros lost nothing: +inf (IDENTICAL) by the one rule, in the
    inspector's per-channel bars and in the report's worst channel alike (the inspector used to show ``None``);
    an all-zero channel that dequantizes to something else is UNDEFINED (``None``) in both."""
    from qdebug.debugger import DebugOptions, debug
    from qdebug.metrics import channel_sqnr
    from qdebug.render import inspector

    scale = np.array([0.1, 0.05, 0.02], np.float32)
    wq = np.array([[0, 3, -7], [0, -2, 5], [0, 1, 9], [0, 4, 1]], np.int8)
    w = (wq.astype(np.float32) * scale).astype(np.float32)
    w[:, 2] += np.float32(0.004)  # channel 2 well off its grid: the worst channel
    per = inspector.channel_sqnr(w, wq.astype(np.float64) * scale.astype(np.float64), 1)
    assert per[0] == math.inf and all(p is not None and math.isfinite(p) for p in per[1:]) and per[2] < per[1]
    assert per == channel_sqnr(w, wq.astype(np.float64) * scale.astype(np.float64), 1)
    f, q = _matmul_pair(w, wq, scale)
    (got,) = debug(f, q, None, DebugOptions(num_samples=1)).weights
    assert got.worst_channel_sqnr_db == per[2]
    # every channel all-zero and reproduced: the weight is IDENTICAL, and so is every channel
    zeros = np.zeros_like(w)
    f, q = _matmul_pair(zeros, np.zeros_like(wq), scale)
    (got,) = debug(f, q, None, DebugOptions(num_samples=1)).weights
    assert (got.weight_sqnr_db, got.weight_status, got.worst_channel_sqnr_db) == (
        math.inf, SqnrStatus.IDENTICAL, math.inf,
    )  # fmt: skip
    assert inspector.channel_sqnr(zeros, np.zeros(w.shape), 1) == [math.inf] * 3
    # an all-zero float channel whose dequantized values are not zero: no signal to compare against
    assert inspector.channel_sqnr(zeros, np.full(w.shape, 0.1), 1) == [None] * 3
