"""The compiled reduction's C kernels (``qdebug/capture/kernels/_reduce.c`` through
:mod:`qdebug.capture.kernels.c_kernel`): the
numba kernels' sums on every case they handle (fuzzed: sizes around the lanes, clips, NaN/Inf, both float types,
the four integer types of a post-Q/DQ tensor, batches), built atomically with nothing left behind when the compiler
fails, and what ``auto`` does with them: the compiled pass from the first sample, without importing numba. gcc and
numba are part of ``make test``'s install: these tests fail, not skip, without them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qdebug.capture.kernels import c_kernel

INF = np.inf
BOUNDS = [(-INF, INF, -INF, INF), (-1.0, 2.0, 0.0, 6.0), (0.0, INF, -INF, 1.5)]


@pytest.fixture(scope="module")
def kernels() -> tuple[c_kernel.CKernels, object]:
    import qdebug.capture.kernels.numba_kernel as numba_kernels

    return c_kernel.load(), numba_kernels


def _same(want: np.ndarray, got: np.ndarray) -> None:
    """The same NaN pattern; finite values equal to float64 summation order (the lanes are the same, the final
    sum of 16 lanes may be ordered differently)."""
    np.testing.assert_array_equal(np.isnan(want), np.isnan(got))
    np.testing.assert_allclose(want, got, rtol=1e-12, atol=0)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 70),
    f64=st.booleans(),
    bounds=st.sampled_from(BOUNDS),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    seed=st.integers(0, 2**16),
)
def test_the_c_kernels_give_numbas_sums(
    kernels: tuple[c_kernel.CKernels, object], size: int, f64: bool, bounds: tuple[float, ...], special: float | None,
    seed: int,
) -> None:  # fmt: skip
    c, nb = kernels
    rng = np.random.default_rng(seed)
    dtype = np.float64 if f64 else np.float32
    ref = (rng.standard_normal(size) * 3).astype(dtype)
    pre, post = ((ref + rng.standard_normal(size) * s).astype(dtype) for s in (0.1, 0.2))
    if special is not None and size:
        (ref, pre, post)[seed % 3][seed % size] = special
    for local in (True, False):
        want, got = np.zeros(c_kernel.SLOTS), np.zeros(c_kernel.SLOTS)
        nb.activation_sums(ref, pre, post, *bounds, local, want)  # type: ignore[attr-defined]
        c.activation_sums(ref, pre, post, *bounds, local, got)
        _same(want, got)
    want, got = np.zeros(c_kernel.SLOTS), np.zeros(c_kernel.SLOTS)
    nb.pair_sums(ref, post, -1.0, 1.0, -INF, 0.5, want, 2)  # type: ignore[attr-defined]
    c.pair_sums(ref, post, -1.0, 1.0, -INF, 0.5, got, 2)
    nb.value_range(ref, want, 6)  # type: ignore[attr-defined]
    c.value_range(ref, got, 6)
    _same(want, got)


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(0, 5000),
    itype=st.sampled_from([np.uint8, np.int8, np.uint16, np.int16]),
    scale=st.floats(1e-6, 10.0),
    seed=st.integers(0, 2**16),
)
def test_integers_give_the_sums_of_their_dequantized_floats(
    kernels: tuple[c_kernel.CKernels, object], size: int, itype: type, scale: float, seed: int
) -> None:
    """Bit for bit: the block-wise dequantization feeds the float pass the same float32 values in the same lanes."""
    c, nb = kernels
    rng, info = np.random.default_rng(seed), np.iinfo(itype)
    ints = rng.integers(info.min, info.max + 1, size).astype(itype)
    zero_point = int(rng.integers(info.min, info.max + 1))
    scale32 = np.float32(scale)
    post = (ints.astype(np.int32) - np.int32(zero_point)).astype(np.float32) * scale32
    ref = (post + rng.standard_normal(size).astype(np.float32) * scale32).astype(np.float32)
    pre = (ref + rng.standard_normal(size).astype(np.float32) * scale32 / 4).astype(np.float32)
    on_ints, on_floats, numba_ints = (np.zeros(c_kernel.SLOTS) for _ in range(3))
    c.dequant_sums(ref, pre, ints, float(scale32), zero_point, *BOUNDS[1], on_ints)
    c.activation_sums(ref, pre, post, *BOUNDS[1], True, on_floats)
    np.testing.assert_array_equal(on_ints, on_floats)
    nb.dequant_sums(ref, pre, ints, float(scale32), zero_point, *BOUNDS[1], numba_ints)  # type: ignore[attr-defined]
    _same(numba_ints, on_ints)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_batch_gives_numbas_rows(kernels: tuple[c_kernel.CKernels, object], dtype: type) -> None:
    c, nb = kernels
    rng = np.random.default_rng(3)
    for outer, n, inner in ((1, 1, 5), (3, 4, 17), (2, 7, 64)):
        ref, pre, post = (rng.standard_normal((outer, n, inner)).astype(dtype) for _ in range(3))
        for local in (True, False):
            want, got = np.zeros((n, c_kernel.SLOTS)), np.zeros((n, c_kernel.SLOTS))
            nb.batch_activation_sums(ref, pre, post, -1.0, 1.0, -INF, INF, local, want)  # type: ignore[attr-defined]
            c.batch_activation_sums(ref, pre, post, -1.0, 1.0, -INF, INF, local, got)
            _same(want, got)
        ints = rng.integers(-128, 128, (outer, n, inner)).astype(np.int8)  # the C kernels only: integers
        dequantized = (ints.astype(np.int32) - 3).astype(np.float32) * np.float32(0.05)
        on_ints, on_floats = np.zeros((n, c_kernel.SLOTS)), np.zeros((n, c_kernel.SLOTS))
        c.batch_dequant_sums(ref, pre, ints, 0.05, 3, -1.0, 1.0, -INF, INF, on_ints)
        c.batch_activation_sums(ref, pre, dequantized.astype(dtype), -1.0, 1.0, -INF, INF, True, on_floats)
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
