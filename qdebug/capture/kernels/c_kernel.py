"""The compiled reduction's kernels built from C (``_reduce.c``) with the machine's C compiler, loaded with ctypes.

Why C beside numba (:mod:`qdebug.capture.kernels.numba_kernel`, the same kernels): numba's import and cache load
cost a process seconds and memory, so only a run long enough to pay that back could use it; the built library
loads in a millisecond and adds no measurable memory, so every run can reduce with the compiled pass from its first
sample (docs/benchmarks.md has the measurements).

The library is built once per machine, source and compiler flags (``-march=native``: the kernels are bound by memory
on large tensors but by arithmetic on cache-resident ones, and the build is for this machine only), the first time a
process needs it (on :class:`~qdebug.capture.compiled.WarmUp`'s background thread), into
``__pycache__`` next to this module or, if that is not writable, the user cache. It is written to a temporary file
that is renamed into place, so concurrent processes (Ray workers) never load a half-written one, and nothing is
left behind if the build fails or is interrupted. Without a C compiler (``$CC``, else ``cc``/``gcc``/``clang``) or if
the build fails, :mod:`qdebug.capture.compiled` uses numba when it is installed.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qdebug._cc import c_compiler
from qdebug.capture.kernels.base import KernelUnavailableError, register_reducer
from qdebug.capture.kernels.rows import KernelReducer

__all__ = [
    "CUM_SIGNAL",
    "LOC_SIGNAL",
    "REF_MAX",
    "REF_MIN",
    "SLOTS",
    "BuildError",
    "CKernels",
    "CallTable",
    "build",
    "built",
    "compiler",
    "load",
]

SOURCE = Path(__file__).with_name("_reduce.c")
#: No -ffast-math: NaN and Inf keep IEEE semantics (a non-finite value makes a sum non-finite, and the caller
#: redoes it); -ffp-contract=off keeps DequantizeLinear's float32 rounding out of fused multiply-adds.
FLAGS = ("-O3", "-std=c11", "-shared", "-fPIC", "-ffp-contract=off")
NATIVE = "-march=native"
ABI = 2

#: Slots of a row of :meth:`CKernels.activation_sums` (the same as the numba kernels').
CUM_SIGNAL, CUM_NOISE, CUM_MAX = 0, 1, 2
LOC_SIGNAL, LOC_NOISE, LOC_MAX = 3, 4, 5
REF_MIN, REF_MAX = 6, 7
SLOTS = 8

#: Element type codes of ``_reduce.c``.
_CODES: dict[np.dtype[Any], int] = {
    np.dtype(np.float32): 0,
    np.dtype(np.float64): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5,
}


#: The same codes by numpy's type number (a faster lookup, per tensor of every sample).
_NUMS = {dtype.num: code for dtype, code in _CODES.items()}


class BuildError(RuntimeError):
    """The library could not be built (no compiler, or the compiler failed); the message says which."""


def compiler() -> list[str] | None:
    """The C compiler command to build with (:func:`qdebug._cc.c_compiler`: ``$CC``, else ``cc``/``gcc``/``clang``)."""
    return c_compiler()


def _machine() -> str:
    """What ``-march=native`` depends on: the CPU's feature flags where Linux lists them, else its name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


@functools.cache
def library_name() -> str:
    """The built library's file name: a digest of the source, the flags, the platform and the CPU."""
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(" ".join((*FLAGS, NATIVE, sys.platform, platform.machine(), _machine())).encode())
    return f"qdebug_reduce-{key.hexdigest()[:16]}.so"


def _directories() -> list[Path]:
    """Where the library may live: ``__pycache__`` beside this module, then the user cache."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return [Path(__file__).with_name("__pycache__"), Path(cache) / "qdebug" / "kernels"]


def built() -> Path | None:
    """The library built for this source and machine, if it is there."""
    for d in _directories():
        path = d / library_name()
        if path.is_file():
            return path
    return None


def build() -> Path:
    """Build the library (see the module doc); :class:`BuildError` if there is no compiler or it fails."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (set $CC, or install gcc or clang)")
    errors = []
    for d in _directories():
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".qdebug_reduce-", suffix=".so", dir=d)
        except OSError as exc:
            errors.append(f"{d}: {exc.strerror or exc}")
            continue
        os.close(fd)
        try:
            _compile(cc, Path(tmp))
            os.replace(tmp, d / library_name())
        finally:
            if os.path.exists(tmp):  # failed or interrupted: nothing half-written stays
                os.unlink(tmp)
        if d == _directories()[0]:  # beside this source: builds of its earlier versions are never loaded again
            for old in d.glob("qdebug_reduce-*.so"):
                if old.name != library_name():
                    old.unlink(missing_ok=True)
        return d / library_name()
    raise BuildError(f"no writable directory for the built kernels ({'; '.join(errors)})")


def _compile(cc: list[str], out: Path) -> None:
    """Compile :data:`SOURCE` into ``out``, for this CPU if the compiler can (``-march=native``), else generic."""
    why = ""
    for flags in ((*FLAGS, NATIVE), FLAGS):
        cmd = [*cc, *flags, "-o", str(out), str(SOURCE), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            return
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    raise BuildError(f"{Path(cc[0]).name} could not build {SOURCE.name}: {why}")


def _pointer(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _flat(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous 1-D array (a view when it already is one)."""
    return np.ascontiguousarray(a).reshape(-1)


class CallTable:
    """A sample's activations as the tables of one ``qd_activations`` call: each activation's three tensors
    (reference, pre-Q/DQ, post-Q/DQ or its integers; kept alive here, the table points into them), sizes, element
    types, scale and clip bounds, zero point. :meth:`repoint` moves one entry to another array of the same dtype and
    shape, which is all a later sample of the same run needs when most of its tensors are the same arrays."""

    def __init__(self, calls: Sequence[tuple[Any, ...]]) -> None:
        self.kept: list[list[np.ndarray]] = []
        ptrs, sizes, types, params, zero_points = [], [], [], [], []
        for ref, pre, post, scale, zero_point, bounds, local in calls:
            arrays = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in (ref, pre, post)]
            if not arrays[0].size == arrays[1].size == arrays[2].size:
                raise ValueError("an activation's three tensors differ in size")
            self.kept.append(arrays)
            ptrs.append([a.ctypes.data for a in arrays])
            sizes.append(arrays[0].size)
            types.append([_NUMS.get(arrays[0].dtype.num, -1), _NUMS.get(arrays[2].dtype.num, -1), int(bool(local))])
            params.append([float(np.float32(scale)), *bounds])
            zero_points.append(zero_point)
        n = len(calls)
        self.ptrs = np.array(ptrs, np.int64).reshape(n, 3)
        self.tables = (
            self.ptrs,
            np.array(sizes, np.int64),
            np.array(types, np.int32).reshape(n, 3),
            np.array(params, np.float64).reshape(n, 5),
            np.array(zero_points, np.int32),
        )

    def repoint(self, j: int, at: int, a: np.ndarray) -> bool:
        """Point activation ``j``'s tensor ``at`` (0 reference, 1 pre-Q/DQ, 2 post-Q/DQ) at ``a``; ``False`` (and
        nothing changed) unless ``a`` is C-contiguous with the dtype and shape of the array it replaces."""
        old = self.kept[j][at]
        if a.dtype != old.dtype or a.shape != old.shape or not a.flags.c_contiguous:
            return False
        self.kept[j][at] = a
        self.ptrs[j, at] = _pointer(a)
        return True


class CKernels:
    """The loaded library, called like the numba kernel module (same functions, arguments and slots)."""

    CUM_SIGNAL, CUM_NOISE, CUM_MAX = CUM_SIGNAL, CUM_NOISE, CUM_MAX
    LOC_SIGNAL, LOC_NOISE, LOC_MAX = LOC_SIGNAL, LOC_NOISE, LOC_MAX
    REF_MIN, REF_MAX, SLOTS = REF_MIN, REF_MAX, SLOTS

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        if lib.qd_abi() != ABI or lib.qd_slots() != SLOTS:
            raise BuildError(f"{path} is not this version's kernel library")
        p, i64, i32, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_double
        lib.qd_activation.argtypes = [p, p, p, i64, ctypes.c_int, ctypes.c_int, f64, i32, f64, f64, f64, f64]
        lib.qd_activation.argtypes += [ctypes.c_int, p]
        lib.qd_batch.argtypes = [p, p, p, i64, i64, i64, ctypes.c_int, ctypes.c_int, f64, i32, f64, f64, f64, f64]
        lib.qd_batch.argtypes += [ctypes.c_int, p]
        lib.qd_pair.argtypes = [p, p, i64, ctypes.c_int, f64, f64, f64, f64, p]
        lib.qd_range.argtypes = [p, i64, ctypes.c_int, p]
        lib.qd_activations.argtypes = [i64, p, p, p, p, p, p]
        lib.qd_activations.restype = i64
        for f in (lib.qd_activation, lib.qd_batch, lib.qd_pair, lib.qd_range):
            f.restype = ctypes.c_int
        self._lib = lib

    @staticmethod
    def _code(a: np.ndarray) -> int:
        code = _CODES.get(a.dtype)
        if code is None:
            raise TypeError(f"the compiled reduction does not take {a.dtype} tensors")
        return code

    def _call(
        self, arrays: tuple[np.ndarray, np.ndarray, np.ndarray], dequant: tuple[float, int], bounds: tuple[float, ...],
        local: bool, out: np.ndarray,
    ) -> None:  # fmt: skip
        """One activation's row into ``out`` (``arrays``: reference, pre-Q/DQ, post-Q/DQ or its integers;
        ``dequant``: their scale and zero point; ``bounds``: the measured-through and fused-activation clips)."""
        ref, pre, post = (_flat(a) for a in arrays)
        if not ref.size == pre.size == post.size or out.dtype != np.float64 or not out.flags.c_contiguous:
            raise ValueError("an activation's three tensors differ in size, or its row is not float64")
        rc = self._lib.qd_activation(
            _pointer(ref), _pointer(pre), _pointer(post), ref.size, self._code(ref), self._code(post),
            *dequant, *bounds, int(bool(local)), _pointer(out),
        )  # fmt: skip
        if rc != 0:
            raise TypeError(f"the compiled reduction does not take {ref.dtype} with {post.dtype} tensors")

    def activations(self, calls: Sequence[tuple[Any, ...]], out: np.ndarray) -> None:
        """Every row of ``out`` (float64, ``(len(calls), SLOTS)``, zeroed) in one call: ``calls[j]`` is activation
        ``j``'s (reference, pre-Q/DQ, post-Q/DQ or its integers, scale, zero point, (mlo, mhi, plo, phi), local)."""
        self.run(CallTable(calls), out)

    def run(self, table: CallTable, out: np.ndarray) -> None:
        """:meth:`activations` from a :class:`CallTable` (one made for an earlier sample, re-pointed at this one's
        tensors where they are new arrays: the bound outputs of a run are the same arrays every sample)."""
        n = len(table.kept)
        if out.shape != (n, SLOTS) or out.dtype != np.float64 or not out.flags.c_contiguous:
            raise ValueError("the rows are a C-contiguous float64 (n, SLOTS) array")
        bad = self._lib.qd_activations(n, *(_pointer(t) for t in table.tables), _pointer(out))
        if bad >= 0:
            ref, _, post = table.kept[bad]
            raise TypeError(f"the compiled reduction does not take {ref.dtype} with {post.dtype} tensors")

    def activation_sums(self, ref, pre, post, mlo, mhi, plo, phi, local, out) -> None:  # type: ignore[no-untyped-def]
        """Fill ``out`` (float64, :data:`SLOTS`): cumulative (``ref`` vs ``post``, both clipped to ``[mlo, mhi]``),
        local when ``local`` (``pre`` clipped to ``[plo, phi]`` then ``[mlo, mhi]`` vs the clipped ``post``), and
        ``ref``'s min/max."""
        self._call((ref, pre, post), (1.0, 0), (mlo, mhi, plo, phi), local, out)

    def dequant_sums(self, ref, pre, ints, scale, zero_point, mlo, mhi, plo, phi, out) -> None:  # type: ignore[no-untyped-def]
        """:meth:`activation_sums` (local) with the post-Q/DQ tensor computed from its integers."""
        self._call((ref, pre, ints), (float(np.float32(scale)), int(zero_point)), (mlo, mhi, plo, phi), True, out)

    def pair_sums(self, x, y, xlo, xhi, lo, hi, out, at) -> None:  # type: ignore[no-untyped-def]
        """``out[at:at+3]`` = Σa², Σ(a−b)², max|a−b| (``a``: ``x`` clipped to ``[xlo, xhi]`` then ``[lo, hi]``;
        ``b``: ``y`` clipped to ``[lo, hi]``)."""
        x, y = _flat(x), _flat(y)
        if x.dtype != y.dtype or x.size != y.size:
            raise TypeError("pair_sums takes two tensors of one float type and size")
        self._lib.qd_pair(_pointer(x), _pointer(y), x.size, self._code(x), xlo, xhi, lo, hi, _pointer(out[at:]))

    def value_range(self, x, out, at) -> None:  # type: ignore[no-untyped-def]
        """``out[at]``, ``out[at+1]`` = min and max of ``x`` ignoring NaN."""
        x = _flat(x)
        self._lib.qd_range(_pointer(x), x.size, self._code(x), _pointer(out[at:]))

    def batch_activation_sums(self, ref, pre, post, mlo, mhi, plo, phi, local, out) -> None:  # type: ignore[no-untyped-def]
        """:meth:`activation_sums` for every sample of a batch: ``ref``, ``pre``, ``post`` are C-contiguous
        ``(outer, n, inner)`` arrays of one float type whose ``[:, i, :]`` is sample ``i``; ``out`` is
        ``(n, SLOTS)``."""
        self._batch((ref, pre, post), (1.0, 0), (mlo, mhi, plo, phi), local, out)

    def batch_dequant_sums(self, ref, pre, ints, scale, zero_point, mlo, mhi, plo, phi, out) -> None:  # type: ignore[no-untyped-def]
        """:meth:`batch_activation_sums` (local) with the post-Q/DQ tensor computed from its integers (only the C
        kernels have it)."""
        self._batch((ref, pre, ints), (float(np.float32(scale)), int(zero_point)), (mlo, mhi, plo, phi), True, out)

    def _batch(
        self, arrays: tuple[np.ndarray, np.ndarray, np.ndarray], dequant: tuple[float, int], bounds: tuple[float, ...],
        local: bool, out: np.ndarray,
    ) -> None:  # fmt: skip
        ref, pre, post = (np.ascontiguousarray(a) for a in arrays)
        if ref.ndim != 3 or pre.shape != ref.shape or post.shape != ref.shape or pre.dtype != ref.dtype:
            raise TypeError("a batch takes three (outer, n, inner) tensors of one shape")
        outer, n, inner = ref.shape
        if out.shape != (n, SLOTS) or out.dtype != np.float64 or not out.flags.c_contiguous:
            raise ValueError("a batch's rows are a C-contiguous float64 (n, SLOTS) array")
        rc = self._lib.qd_batch(
            _pointer(ref), _pointer(pre), _pointer(post), outer, n, inner, self._code(ref), self._code(post),
            *dequant, *bounds, int(bool(local)), _pointer(out),
        )  # fmt: skip
        if rc != 0:
            raise TypeError(f"the compiled reduction does not take {ref.dtype} with {post.dtype} tensors")


@functools.cache
def load() -> CKernels:
    """The library, built first if needed (:class:`BuildError` if it cannot be)."""
    path = built() or build()
    try:
        return CKernels(path)
    except OSError as exc:  # e.g. a library built for another CPU in a shared cache
        raise BuildError(f"{path} cannot be loaded: {exc}") from exc


def _reducer() -> KernelReducer:
    try:
        return KernelReducer("c", load())
    except BuildError as exc:
        raise KernelUnavailableError(f"c: {exc}") from exc


register_reducer("c", _reducer)
