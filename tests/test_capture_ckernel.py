"""The compiled reduction's kernels — C (``qdebug/capture/kernels/_reduce.c`` through
:mod:`qdebug.capture.kernels.c_kernel`) and numba (:mod:`qdebug.capture.kernels.numba_kernel`), the same functions
and slots — give the reference definition's sums on every case they handle (fuzzed: sizes around the lanes, clips,
NaN/Inf, both float types, the four integer types of a post-Q/DQ tensor, batches) and flag for the reference what
they cannot count; the C library is built atomically with nothing left behind when the compiler fails; and ``auto``
reduces with it from the first sample, without importing numba. gcc and numba are part of ``make test``'s install:
these tests fail, not skip, without them. (``tests/test_reducer.py`` checks both on whole samples too.)"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qdebug.capture.kernels import c_kernel
from qdebug.metrics import reduce_pairs, value_ranges

INF = np.inf
BOUNDS = [(-INF, INF, -INF, INF), (-1.0, 2.0, 0.0, 6.0), (0.0, INF, -INF, 1.5)]


@pytest.fixture(scope="module")
def kernels() -> tuple[c_kernel.CKernels, object]:
    return c_kernel.load(), importlib.import_module("qdebug.capture.kernels.numba_kernel")


def _reference_row(
    ref: np.ndarray, pre: np.ndarray, post: np.ndarray, bounds: tuple[float, ...], local: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The reference definition's row (kernel slots) and its non-finite counts per comparison: cumulative ``ref``
    vs ``post`` both clipped to ``[mlo, mhi]``; local ``pre`` clipped to ``[plo, phi]`` then ``[mlo, mhi]`` vs the
    clipped ``post``; the raw ``ref``'s finite range."""
    mlo, mhi, plo, phi = bounds
    post_c = np.clip(post, mlo, mhi)
    cum = reduce_pairs([np.clip(ref, mlo, mhi)], [post_c])
    loc = reduce_pairs([np.clip(np.clip(pre, plo, phi), mlo, mhi)], [post_c])
    lo, hi = value_ranges([ref])
    row = np.array([cum.signal[0], cum.noise[0], cum.max_abs[0], loc.signal[0], loc.noise[0], loc.max_abs[0], lo[0],
                    hi[0]])  # fmt: skip
    nonfinite = np.array([cum.nonfinite_reference[0] + cum.nonfinite_test[0],
                          loc.nonfinite_reference[0] + loc.nonfinite_test[0] if local else 0])  # fmt: skip
    return row, nonfinite


def _as_reference(want: tuple[np.ndarray, np.ndarray], got: np.ndarray, local: bool) -> None:
    """A kernel's row is the reference's: where the reference counts NaN/Inf the kernel's sums are not finite (the
    caller hands them to the reference); elsewhere its sums agree to float32-product rounding; a finite range is the
    reference's exactly (a non-finite one, ±Inf in the tensor, is redone by the caller)."""
    row, nonfinite = want
    for at, bad in ((0, nonfinite[0]), (3, nonfinite[1])):
        if at == 3 and not local:
            continue
        if bad:
            assert not np.isfinite(got[at : at + 2]).all(), (at, got)
        else:
            np.testing.assert_allclose(got[at : at + 2], row[at : at + 2], rtol=2e-6, atol=1e-30)
            np.testing.assert_allclose(got[at + 2], row[at + 2], rtol=1e-6, atol=1e-6)
    if np.isfinite(got[6:8]).all() and np.isfinite(row[6:8]).all():
        np.testing.assert_array_equal(got[6:8], row[6:8])


def _kernel(kernels: tuple[c_kernel.CKernels, object], which: str) -> Any:
    return kernels[0] if which == "c" else kernels[1]


@pytest.mark.parametrize("which", ["c", "numba"])
@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 70),
    f64=st.booleans(),
    bounds=st.sampled_from(BOUNDS),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    seed=st.integers(0, 2**16),
)
def test_the_kernels_give_the_reference_sums(
    kernels: tuple[c_kernel.CKernels, object], which: str, size: int, f64: bool, bounds: tuple[float, ...],
    special: float | None, seed: int,
) -> None:  # fmt: skip
    k = _kernel(kernels, which)
    rng = np.random.default_rng(seed)
    dtype = np.float64 if f64 else np.float32
    ref = (rng.standard_normal(size) * 3).astype(dtype)
    pre, post = ((ref + rng.standard_normal(size) * s).astype(dtype) for s in (0.1, 0.2))
    if special is not None and size:
        (ref, pre, post)[seed % 3][seed % size] = special
    for local in (True, False):
        got = np.zeros(c_kernel.SLOTS)
        k.activation_sums(ref, pre, post, *bounds, local, got)
        _as_reference(_reference_row(ref, pre, post, bounds, local), got, local)
    got = np.zeros(c_kernel.SLOTS)
    k.pair_sums(ref, post, -1.0, 1.0, -INF, 0.5, got, 3)  # a = ref clipped to [-1, 1] then (-inf, 0.5]
    k.value_range(ref, got, 6)
    clipped, nonfinite = _reference_row(ref, ref, post, (-INF, 0.5, -1.0, 1.0), True)  # its local slots
    _as_reference((np.concatenate([np.zeros(3), clipped[3:]]), np.array([0, nonfinite[1]])), got, True)


@pytest.mark.parametrize("which", ["c", "numba"])
@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(0, 5000),
    itype=st.sampled_from([np.uint8, np.int8, np.uint16, np.int16]),
    scale=st.floats(1e-6, 10.0),
    seed=st.integers(0, 2**16),
)
def test_integers_give_the_sums_of_their_dequantized_floats(
    kernels: tuple[c_kernel.CKernels, object], which: str, size: int, itype: type, scale: float, seed: int
) -> None:
    """Bit for bit the kernel's own sums of the dequantized floats (the dequantization feeds the float pass the same
    float32 values in the same lanes), and the reference's to float32-product rounding."""
    k = _kernel(kernels, which)
    rng, info = np.random.default_rng(seed), np.iinfo(itype)
    ints = rng.integers(info.min, info.max + 1, size).astype(itype)
    zero_point = int(rng.integers(info.min, info.max + 1))
    scale32 = np.float32(scale)
    post = (ints.astype(np.int32) - np.int32(zero_point)).astype(np.float32) * scale32
    ref = (post + rng.standard_normal(size).astype(np.float32) * scale32).astype(np.float32)
    pre = (ref + rng.standard_normal(size).astype(np.float32) * scale32 / 4).astype(np.float32)
    on_ints, on_floats = np.zeros(c_kernel.SLOTS), np.zeros(c_kernel.SLOTS)
    k.dequant_sums(ref, pre, ints, float(scale32), zero_point, *BOUNDS[1], on_ints)
    k.activation_sums(ref, pre, post, *BOUNDS[1], True, on_floats)
    np.testing.assert_array_equal(on_ints, on_floats)
    _as_reference(_reference_row(ref, pre, post, BOUNDS[1], True), on_ints, True)


@pytest.mark.parametrize("which", ["c", "numba"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_batch_gives_each_sample_the_reference_row(
    kernels: tuple[c_kernel.CKernels, object], which: str, dtype: type
) -> None:
    k = _kernel(kernels, which)
    rng = np.random.default_rng(3)
    bounds = (-1.0, 1.0, -INF, INF)
    for outer, n, inner in ((1, 1, 5), (3, 4, 17), (2, 7, 64)):
        ref, pre, post = (rng.standard_normal((outer, n, inner)).astype(dtype) for _ in range(3))
        for local in (True, False):
            got = np.zeros((n, c_kernel.SLOTS))
            k.batch_activation_sums(ref, pre, post, *bounds, local, got)
            for i in range(n):
                want = _reference_row(ref[:, i].ravel(), pre[:, i].ravel(), post[:, i].ravel(), bounds, local)
                _as_reference(want, got[i], local)
        if which == "numba":  # the C kernels only: integers
            continue
        ints = rng.integers(-128, 128, (outer, n, inner)).astype(np.int8)
        dequantized = (ints.astype(np.int32) - 3).astype(np.float32) * np.float32(0.05)
        on_ints, on_floats = np.zeros((n, c_kernel.SLOTS)), np.zeros((n, c_kernel.SLOTS))
        k.batch_dequant_sums(ref, pre, ints, 0.05, 3, *bounds, on_ints)
        k.batch_activation_sums(ref, pre, dequantized.astype(dtype), *bounds, True, on_floats)
        np.testing.assert_array_equal(on_ints, on_floats)


def test_types_it_does_not_take_are_a_type_error(kernels: tuple[c_kernel.CKernels, object]) -> None:
    c, _ = kernels
    x16, row = np.zeros(4, np.float16), np.zeros(c_kernel.SLOTS)
    with pytest.raises(TypeError, match="float16"):
        c.activation_sums(x16, x16, x16, *BOUNDS[0], True, row)
    x32 = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="float32 with float64"):
        c.activation_sums(x32, x32, np.zeros(4), *BOUNDS[0], True, row)


def _no_temp_files(d: Path) -> bool:
    return not list(d.glob(".qdebug_reduce-*"))


def test_the_build_is_atomic_and_a_failed_one_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_kernel, "_directories", lambda: [tmp_path / "cache"])
    monkeypatch.setenv("CC", "false")  # a "compiler" that fails every build
    with pytest.raises(c_kernel.BuildError, match=r"false could not build _reduce\.c"):
        c_kernel.build()
    assert _no_temp_files(tmp_path / "cache") and c_kernel.built() is None
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(c_kernel.BuildError, match="no C compiler found"):
        c_kernel.build()
    monkeypatch.setenv("CC", "gcc -Wall")  # a command with arguments, as $CC often is
    assert c_kernel.compiler() == [str(shutil.which("gcc")), "-Wall"]
    monkeypatch.delenv("CC")
    path = c_kernel.build()
    assert path.parent == tmp_path / "cache" and c_kernel.built() == path and _no_temp_files(path.parent)
    assert c_kernel.CKernels(path).path == path


def test_an_unwritable_cache_falls_through_to_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")  # mkdir under a file fails
    monkeypatch.setattr(c_kernel, "_directories", lambda: [blocked / "sub", tmp_path / "second"])
    assert c_kernel.build().parent == tmp_path / "second"
    monkeypatch.setattr(c_kernel, "_directories", lambda: [blocked / "sub"])
    with pytest.raises(c_kernel.BuildError, match="no writable directory"):
        c_kernel.build()


def test_the_library_name_follows_the_source_and_the_machine() -> None:
    name = c_kernel.library_name()
    assert name.startswith("qdebug_reduce-") and name.endswith(".so") and c_kernel.built() is not None
    assert c_kernel.built() == c_kernel.load().path  # conftest built it before any test


def test_auto_reduces_with_the_c_kernel_from_the_first_sample_without_numba(
    tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """A user's run, in its own process: the compiled pass from sample 0, said in the capture line, and numba's
    ~125 MB never loaded."""
    code = (
        "import sys; from qdebug.cli import main; "
        f"rc = main(['debug', '-f', {str(tiny_float)!r}, '-q', {str(tiny_quant('u8'))!r}, '--samples', '12', "
        "'--batch', '1']); print('numba' in sys.modules); sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "capture: compiled backend (auto:" in out and "the compiled C kernel reduced from the first sample" in out
    assert out.strip().endswith("False")


def test_one_call_per_sample_gives_each_activations_row(kernels: tuple[c_kernel.CKernels, object]) -> None:
    """The bulk entry a run uses (:meth:`CKernels.activations`) gives, row for row, what one call per activation
    gives — floats and integers, local or not, non-contiguous tensors copied — and names a type it does not take."""
    c, _ = kernels
    rng = np.random.default_rng(5)
    calls, want = [], []
    for j, size in enumerate((1, 17, 300, 4099)):
        ref, pre = (rng.standard_normal(2 * size).astype(np.float32)[::2] for _ in range(2))  # strided views
        ints = rng.integers(0, 256, size).astype(np.uint8)
        post = (ints.astype(np.int32) - 7).astype(np.float32) * np.float32(0.03)
        bounds = BOUNDS[j % 3]
        for call in ((ref, pre, ints, 0.03, 7, bounds, True), (ref, post, post, 1.0, 0, bounds, j % 2 == 0)):
            row = np.zeros(c_kernel.SLOTS)
            if call[2].dtype == np.uint8:
                c.dequant_sums(*call[:5], *bounds, row)
            else:
                c.activation_sums(call[0], call[1], call[2], *bounds, call[6], row)
            calls.append(call)
            want.append(row)
    got = np.zeros((len(calls), c_kernel.SLOTS))
    c.activations(calls, got)
    np.testing.assert_array_equal(got, np.array(want))
    x16 = np.zeros(3, np.float16)
    with pytest.raises(TypeError, match="float16"):
        c.activations([(x16, x16, x16, 1.0, 0, BOUNDS[0], True)], np.zeros((1, c_kernel.SLOTS)))
