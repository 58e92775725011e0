"""Calibration and debug data: ``.npz`` files, folders of them, and seeded synthetic inputs.

Conventions (see ``docs/data.md``):

* An ``.npz`` holds one array per model input, keyed by the input's name, shaped ``(N, *input_shape)``:
  N samples, each exactly one model input. Convenience: an array of the input's *own* rank whose first
  (batch) axis is 1 or dynamic in the model is split along that axis into N batch-1 samples.
* A folder is read as the sorted ``*.npz`` files in it, one after the other (one file in memory at a time).
* Synthetic data is generated per sample from ``(seed, index)``, so sample *i* is the same whatever N is.

Every sample is validated against the model (names, dtypes, shapes, finiteness) with an error naming
the file and the input. The same :class:`DataSource` is iterated for the float and the quantized
pass, so both see identical samples.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from qdebug.cancel import check_cancelled
from qdebug.errors import ConfigError, DataError, InputFileError
from qdebug.io import check_input, open_input
from qdebug.model_io import InputSpec

Sample = dict[str, np.ndarray]

#: Default for dynamic dimensions nobody specified: the first (batch) axis becomes 1, any other 32.
DEFAULT_BATCH_DIM = 1
DEFAULT_OTHER_DIM = 32
#: Synthetic samples when nobody said how many.
SYNTHETIC_SAMPLES = 8


class DataSource(Protocol):
    """A re-iterable, sized sequence of model-input samples."""

    description: str

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Sample]: ...


def resolve_shapes(
    specs: Sequence[InputSpec], input_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every input: user-given shapes first, then the documented defaults."""
    input_shapes = dict(input_shapes or {})
    names = {s.name for s in specs}
    unknown = sorted(set(input_shapes) - names)
    if unknown:
        raise DataError(f"input shape given for unknown input(s) {unknown}; the model has {sorted(names)}")
    out: dict[str, tuple[int, ...]] = {}
    for s in specs:
        if s.name in input_shapes:
            shape = tuple(int(d) for d in input_shapes[s.name])
            if len(shape) != len(s.shape) or any(
                isinstance(m, int) and m != d for m, d in zip(s.shape, shape, strict=True)
            ):
                raise DataError(f"input {s.name!r}: shape {list(shape)} does not fit the model's {list(s.shape)}")
            if any(d <= 0 for d in shape):
                raise DataError(f"input {s.name!r}: shape {list(shape)} has non-positive dimensions")
            out[s.name] = shape
        else:
            out[s.name] = tuple(
                d if isinstance(d, int) else (DEFAULT_BATCH_DIM if i == 0 else DEFAULT_OTHER_DIM)
                for i, d in enumerate(s.shape)
            )
    return out


def _check_sample_shape(spec: InputSpec, shape: tuple[int, ...], where: str) -> None:
    if len(shape) != len(spec.shape) or any(
        isinstance(m, int) and m != d for m, d in zip(spec.shape, shape, strict=True)
    ):
        raise DataError(
            f"{where}: input {spec.name!r} samples have shape {list(shape)}, the model expects "
            f"{[d if isinstance(d, int) else '?' for d in spec.shape]}"
        )


def split_samples(spec: InputSpec, arr: np.ndarray, where: str) -> np.ndarray:
    """View ``arr`` as ``(N, *sample_shape)`` for ``spec`` (see the module docstring)."""
    if arr.dtype == object:
        raise DataError(f"{where}: input {spec.name!r} is an object array; store plain numeric arrays")
    if arr.dtype != spec.dtype:
        raise DataError(
            f"{where}: input {spec.name!r} has dtype {arr.dtype}, the model expects {spec.dtype} "
            f"(convert with .astype(np.{spec.dtype}))"
        )
    rank = len(spec.shape)
    if arr.ndim == rank + 1:
        out = arr
    elif arr.ndim == rank and rank > 0 and (spec.shape[0] == 1 or not isinstance(spec.shape[0], int)):
        out = arr.reshape((arr.shape[0], 1, *arr.shape[1:]))
    else:
        raise DataError(
            f"{where}: input {spec.name!r} has shape {list(arr.shape)}; expected (N, *{list(spec.shape)}) "
            "or, for a batch-1 input, N rows along the batch axis"
        )
    _check_sample_shape(spec, tuple(out.shape[1:]), where)
    return out


def _check_finite(name: str, arr: np.ndarray, where: str, offset: int = 0) -> None:
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1))
        raise DataError(f"{where}: input {name!r} holds NaN/Inf (sample {offset + int(bad[0][0])})")


def _member(npz: Any, name: str, where: str) -> np.ndarray:
    """One member of an open ``.npz``, which must be a numpy array (a member that is not is returned as bytes)."""
    value = npz[name]
    if not isinstance(value, np.ndarray):
        raise InputFileError(f"{where}: member {name!r} is not a numpy array")
    return value


def _npz_problem(exc: BaseException) -> str:
    """What went wrong reading an ``.npz``, in words a user acts on (zipfile's and numpy's own texts name their
    internals: 'File is not a zip file', 'Bad CRC-32')."""
    if isinstance(exc, zipfile.BadZipFile):
        return "not a zip archive, or a damaged one; save it with np.savez"
    if isinstance(exc, EOFError):
        return "the file ends early: it was cut short"
    if isinstance(exc, (NotImplementedError, RuntimeError)):  # encrypted or deflate64 members zipfile cannot read
        return "compressed or encrypted in a way numpy cannot read; save it with np.savez or np.savez_compressed"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return "it cannot be read"


def _read_npz(path: Path, specs: Sequence[InputSpec], ignore: Sequence[str]) -> dict[str, np.ndarray]:
    where = str(path)
    try:
        # np.load leaks its file handle when the zip is corrupt: own the handle here (opened without blocking)
        with open_input(path) as fh:
            try:
                loaded = np.load(fh, allow_pickle=False)
            except ValueError as exc:  # neither zip nor .npy: numpy then tries (and refuses) to unpickle it
                raise InputFileError(f"{where}: not an .npz file (neither a zip archive nor a numpy array)") from exc
            if not isinstance(loaded, np.lib.npyio.NpzFile):  # a bare .npy array under an .npz name
                raise InputFileError(
                    f"{where}: holds a single unnamed array, not an .npz archive of named inputs; "
                    "save with np.savez(path, <input name>=array)"
                )
            with loaded as npz:
                keys = list(npz.files)
                names = {s.name for s in specs}
                missing = sorted(names - set(keys))
                extra = sorted(set(keys) - names - set(ignore))
                if missing or extra:
                    parts = []
                    if missing:
                        parts.append(f"missing input(s) {missing}")
                    if extra:
                        parts.append(f"unknown array(s) {extra}")
                    raise DataError(f"{where}: {'; '.join(parts)}; the model's inputs are {sorted(names)}")
                arrays = {s.name: split_samples(s, _member(npz, s.name, where), where) for s in specs}
    except DataError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise DataError(f"{where}: holds pickled objects, which qdebug never loads; save plain arrays") from exc
        raise InputFileError(f"{where}: not a readable .npz file (an array in it is damaged)") from exc
    except (OSError, zipfile.BadZipFile, EOFError, NotImplementedError, RuntimeError) as exc:
        raise InputFileError(f"{where}: not a readable .npz file ({_npz_problem(exc)})") from exc
    except MemoryError as exc:  # a member header that claims an absurd shape
        raise InputFileError(f"{where}: an array in it claims more memory than this machine has") from exc
    counts = {n: a.shape[0] for n, a in arrays.items()}
    if len(set(counts.values())) > 1:
        raise DataError(f"{where}: inputs hold different numbers of samples: {counts}")
    for n, a in arrays.items():
        _check_finite(n, a, where)
    return arrays


class NpzData:
    """Samples from one ``.npz`` file (validated on construction)."""

    def __init__(self, path: str | Path, specs: Sequence[InputSpec], ignore: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.specs = list(specs)
        self.ignore = tuple(ignore)
        self._arrays = _read_npz(self.path, self.specs, ignore)
        self._n = next(iter(self._arrays.values())).shape[0] if self._arrays else 0
        if self._n == 0:
            raise DataError(f"{self.path}: holds no samples")
        self.description = f"{self.path} ({self._n} samples)"

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Sample]:
        for i in range(self._n):
            yield {n: np.ascontiguousarray(a[i]) for n, a in self._arrays.items()}


class NpzFolderData:
    """Samples from the sorted ``*.npz`` files of a folder, one file in memory at a time."""

    def __init__(self, folder: str | Path, specs: Sequence[InputSpec], ignore: Sequence[str] = ()) -> None:
        self.folder = Path(folder)
        self.specs = list(specs)
        self.ignore = tuple(ignore)
        self.files = sorted(self.folder.glob("*.npz"))
        if not self.files:
            raise DataError(f"{self.folder}: folder holds no .npz files")
        self._counts = []
        for f in self.files:  # validate everything up front, so a bad file fails before any work
            arrays = _read_npz(f, self.specs, self.ignore)
            self._counts.append(next(iter(arrays.values())).shape[0] if arrays else 0)
            del arrays
        self._n = sum(self._counts)
        if self._n == 0:
            raise DataError(f"{self.folder}: the .npz files hold no samples")
        self.description = f"{self.folder}/ ({len(self.files)} files, {self._n} samples)"

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Sample]:
        for f in self.files:
            arrays = _read_npz(f, self.specs, self.ignore)
            n = next(iter(arrays.values())).shape[0]
            for i in range(n):
                # a copy, not a view: a view would keep the whole file's arrays alive while the next file is read
                # (a capture reads ahead across the boundary), so two files' samples were in memory at once
                yield {k: a[i].copy() for k, a in arrays.items()}
            del arrays


class ArrayData:
    """Samples from in-memory arrays keyed by input name (same layout rules as an ``.npz``)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], specs: Sequence[InputSpec]) -> None:
        names = {s.name for s in specs}
        if set(arrays) != names:
            raise DataError(f"data has arrays {sorted(arrays)}, the model's inputs are {sorted(names)}")
        self._arrays = {s.name: split_samples(s, np.asarray(arrays[s.name]), "data") for s in specs}
        counts = {n: a.shape[0] for n, a in self._arrays.items()}
        if len(set(counts.values())) > 1:
            raise DataError(f"data: inputs hold different numbers of samples: {counts}")
        for n, a in self._arrays.items():
            _check_finite(n, a, "data")
        self._n = next(iter(counts.values())) if counts else 0
        if self._n == 0:
            raise DataError("data holds no samples")
        self.description = f"in-memory arrays ({self._n} samples)"

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Sample]:
        for i in range(self._n):
            yield {n: np.ascontiguousarray(a[i]) for n, a in self._arrays.items()}


class SyntheticData:
    """Seeded random inputs from the model's input spec; sample *i* depends only on (seed, i).

    Floats: ``uniform`` in [0, 1) or standard ``normal``. Integers: uniform in [0, ``int_high``)
    clipped to the dtype (safe for indices into small tables). Booleans: fair coin.
    """

    def __init__(
        self,
        specs: Sequence[InputSpec],
        num_samples: int,
        seed: int = 0,
        distribution: str = "uniform",
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        int_high: int = 16,
    ) -> None:
        if num_samples < 1:
            raise DataError(f"synthetic data needs at least one sample, got {num_samples}")
        if distribution not in ("uniform", "normal"):
            raise DataError(f"unknown synthetic distribution {distribution!r}; use 'uniform' or 'normal'")
        self.specs = list(specs)
        self.shapes = resolve_shapes(self.specs, input_shapes)
        self.num_samples = num_samples
        self.seed = seed
        self.distribution = distribution
        self.int_high = int_high
        self.description = f"synthetic {distribution} (seed {seed}, {num_samples} samples)"

    def __len__(self) -> int:
        return self.num_samples

    def sample(self, index: int) -> Sample:
        """The sample at ``index`` (deterministic)."""
        rng = np.random.default_rng([self.seed, index])
        out: Sample = {}
        for s in self.specs:
            shape = self.shapes[s.name]
            if np.issubdtype(s.dtype, np.floating):
                v = rng.random(shape) if self.distribution == "uniform" else rng.standard_normal(shape)
                out[s.name] = v.astype(s.dtype)
            elif s.dtype == np.bool_:
                out[s.name] = rng.random(shape) < 0.5
            elif np.issubdtype(s.dtype, np.integer):
                hi = min(self.int_high, int(np.iinfo(s.dtype).max) + 1)
                out[s.name] = rng.integers(0, hi, size=shape).astype(s.dtype)
            else:
                raise DataError(f"input {s.name!r}: cannot synthesise data of dtype {s.dtype}")
        return out

    def __iter__(self) -> Iterator[Sample]:
        for i in range(self.num_samples):
            yield self.sample(i)


class Limited:
    """The first ``n`` samples of another source."""

    def __init__(self, source: DataSource, n: int) -> None:
        self.source = source
        self.n = min(n, len(source))
        self.description = f"{source.description}, first {self.n}"

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Sample]:
        for i, s in enumerate(self.source):
            if i >= self.n:
                return
            yield s


class Window:
    """Samples ``start`` to ``stop`` (exclusive) of another source: e.g. the held-out samples after a debug set."""

    def __init__(self, source: DataSource, start: int, stop: int) -> None:
        if not 0 <= start < stop <= len(source):
            raise DataError(
                f"{source.description}: holds {len(source)} samples; samples {start + 1}-{stop} were asked for"
            )
        self.source, self.start, self.stop = source, start, stop
        self.description = f"{source.description}, samples {start + 1}-{stop}"

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[Sample]:
        for i, s in enumerate(self.source):
            if i >= self.stop:
                return
            if i >= self.start:
                yield s


def open_data(
    data: str | Path | Mapping[str, np.ndarray] | DataSource | None,
    specs: Sequence[InputSpec],
    *,
    num_samples: int | None = None,
    seed: int = 0,
    distribution: str = "uniform",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    ignore: Sequence[str] = (),
) -> DataSource:
    """Open any supported data spec; ``None`` means synthetic data (``num_samples`` of it, default 8).

    ``num_samples`` also caps a file or folder to its first N samples.
    """
    source: DataSource
    if data is None:
        return SyntheticData(specs, num_samples or SYNTHETIC_SAMPLES, seed, distribution, input_shapes)
    if isinstance(data, str | Path):
        p = check_input(data, folder=True)  # a folder of .npz files is data too
        if p.is_dir():
            source = NpzFolderData(p, specs, ignore)
        elif p.suffix.lower() != ".npz":
            raise InputFileError(f"{p}: data must be an .npz file or a folder of them")
        else:
            source = NpzData(p, specs, ignore)
    elif isinstance(data, Mapping):
        source = ArrayData(data, specs)
    else:
        source = data
        if len(source) == 0:
            raise DataError(f"{source.description}: holds no samples")
    if num_samples is not None and num_samples < len(source):
        return Limited(source, num_samples)
    return source


class OrtReader:
    """Adapter from a :class:`DataSource` to ONNX Runtime's ``CalibrationDataReader`` protocol."""

    def __init__(self, source: DataSource) -> None:
        self.source = source
        self._it: Iterator[Sample] | None = None
        self._start, self._end = 0, len(source)

    def __len__(self) -> int:
        return len(self.source)

    def get_next(self) -> dict[str, Any] | None:
        """Next sample, or ``None`` at the end (ORT's contract)."""
        check_cancelled()  # ORT's calibration asks for one sample at a time: a Cancel stops it between two
        if self._it is None:
            self._it = self._ranged()
        return next(self._it, None)

    def _ranged(self) -> Iterator[Sample]:
        for i, s in enumerate(self.source):
            if i >= self._end:
                return
            if i >= self._start:
                yield s

    def rewind(self) -> None:
        """Start again from the first sample."""
        self._it = None

    def set_range(self, start_index: int, end_index: int) -> None:
        """Restrict to ``[start_index, end_index)`` (used by ORT's strided calibration)."""
        self._start, self._end = start_index, end_index
        self._it = None

    # ORT iterates readers with ``for`` in places.
    def __iter__(self) -> Iterator[Sample]:
        return self._ranged()

    def __next__(self) -> Sample:
        s = self.get_next()
        if s is None:
            raise StopIteration
        return s


def as_ort_reader(source: DataSource) -> Any:
    """A real ``CalibrationDataReader`` subclass instance (ORT checks ``isinstance``)."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(OrtReader, CalibrationDataReader):  # type: ignore[misc]
        pass

    return _Reader(source)


def read_labels(path: str | Path, label_key: str, n: int | None = None, num_classes: int | None = None) -> np.ndarray:
    """The label array ``label_key`` of a labelled ``.npz``: one class index per sample (``n``: the expected count),
    each a whole number in ``[0, num_classes)`` (:func:`label_problems`); else a :class:`DataError` naming the file
    and the array. Every top-1 reads its labels here, so a set that cannot be scored is refused before any work
    by asking the same question first (:func:`qdebug.evaluate.check_eval_set`)."""
    with open_input(path) as fh, np.load(fh, allow_pickle=False) as npz:
        if label_key not in npz.files:
            others = f" (it holds {sorted(npz.files)}; --label-key names another)" if npz.files else ""
            raise DataError(f"{path}: no label array {label_key!r}{others}")
        try:
            labels = np.asarray(npz[label_key]).reshape(-1)
        except ValueError as exc:  # pickled objects, which are never loaded
            raise DataError(f"{path}: label array {label_key!r} cannot be read ({exc})") from exc
    problems = label_problems(labels, num_classes)
    if n is not None and labels.shape[0] != n:
        problems.insert(0, f"{labels.shape[0]} labels for {n} samples")
    if problems:
        raise DataError(f"{path}: label array {label_key!r}: {'; '.join(problems)}")
    return labels


def label_problems(labels: np.ndarray, num_classes: int | None = None) -> list[str]:
    """Why ``labels`` cannot be the class indices top-1 compares an argmax with: not numbers, NaN or infinite, not
    whole numbers, negative, or ``num_classes`` or more (each with how many and the first)."""
    if labels.dtype == bool or not np.issubdtype(labels.dtype, np.number) or np.iscomplexobj(labels):
        return [f"holds {labels.dtype} values, not class indices"]
    finite = np.isfinite(labels)
    whole = np.where(finite, labels, 0)
    checks = [
        (~finite, "NaN or infinite"),
        (whole != np.floor(whole), "not whole numbers"),
        (finite & (labels < 0), "negative"),
    ]
    if num_classes is not None:
        checks.append((finite & (labels >= num_classes), f"{num_classes} or more"))
    problems = []
    for mask, what in checks:
        if mask.any():
            i = int(np.argmax(mask))
            problems.append(f"{int(mask.sum())} of {labels.size} are {what} (first: {labels[i].item()} at sample {i})")
    if problems:
        classes = "" if num_classes is None else f" 0..{num_classes - 1} (the model scores {num_classes} classes)"
        problems.append(f"labels are class indices{classes}")
    return problems


class RangeReader(Protocol):
    """Reads samples ``[start, stop)`` of a source by itself, in another process or on another machine: what a
    distributed capture ships to each worker instead of the samples (docs/scale.md)."""

    def read(self, start: int, stop: int) -> Iterator[tuple[int, Sample]]:
        """``(index, sample)`` for every index in ``[start, stop)``, in order."""
        ...


class _NpzRange:
    """One ``.npz``: the worker opens it and takes its rows (validated again: the file is read where it runs)."""

    def __init__(self, path: Path, specs: Sequence[InputSpec], ignore: Sequence[str]) -> None:
        self.path, self.specs, self.ignore = path, list(specs), tuple(ignore)

    def read(self, start: int, stop: int) -> Iterator[tuple[int, Sample]]:
        arrays = _read_npz(self.path, self.specs, self.ignore)
        for i in range(start, stop):
            yield i, {n: np.ascontiguousarray(a[i]) for n, a in arrays.items()}


class _FolderRange:
    """A folder of ``.npz`` files: the worker opens only the files that hold its samples."""

    def __init__(self, files: Sequence[Path], counts: Sequence[int], specs: Sequence[InputSpec], ignore: Sequence[str]):
        self.files, self.counts, self.specs, self.ignore = list(files), list(counts), list(specs), tuple(ignore)

    def read(self, start: int, stop: int) -> Iterator[tuple[int, Sample]]:
        first = 0
        for f, n in zip(self.files, self.counts, strict=True):
            lo, hi = max(start, first), min(stop, first + n)
            if lo < hi:
                arrays = _read_npz(f, self.specs, self.ignore)
                for i in range(lo, hi):
                    yield i, {k: np.ascontiguousarray(a[i - first]) for k, a in arrays.items()}
            first += n


class _IndexedRange:
    """A source whose sample *i* is computed (synthetic: regenerated from the seed) or held (in-memory arrays)."""

    def __init__(self, sample: Any) -> None:
        self.sample = sample

    def read(self, start: int, stop: int) -> Iterator[tuple[int, Sample]]:
        for i in range(start, stop):
            yield i, self.sample(i)


class _ArrayRows:
    """Row ``i`` of in-memory arrays (a picklable callable: the arrays travel once per worker)."""

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = dict(arrays)

    def __call__(self, i: int) -> Sample:
        return {n: np.ascontiguousarray(a[i]) for n, a in self.arrays.items()}


def range_reader(source: DataSource) -> RangeReader:
    """A reader of ``source``'s samples by index range for another process: ``.npz`` files and folders are
    reopened there, synthetic samples regenerated from ``(seed, index)``, in-memory arrays copied once. Another
    kind of :class:`DataSource` cannot be read by range: :class:`~qdebug.errors.ConfigError`."""
    if isinstance(source, Limited):
        return range_reader(source.source)  # the caller never asks past the limit
    if isinstance(source, NpzData):
        return _NpzRange(source.path, source.specs, source.ignore)
    if isinstance(source, NpzFolderData):
        return _FolderRange(source.files, source._counts, source.specs, source.ignore)
    if isinstance(source, SyntheticData):
        return _IndexedRange(source.sample)
    if isinstance(source, ArrayData):
        return _IndexedRange(_ArrayRows(source._arrays))
    raise ConfigError(
        f"{source.description}: a {type(source).__name__} cannot be split across workers; "
        "give an .npz file, a folder of them, arrays or synthetic data"
    )
