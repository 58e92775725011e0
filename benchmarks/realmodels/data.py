"""Realistic synthetic inputs for the corpus models: a calibration and an evaluation ``.npz`` per model.

Usage::

    .venv/bin/python benchmarks/realmodels/data.py                      # every model
    .venv/bin/python benchmarks/realmodels/data.py --ci --calib-samples 16 --eval-samples 8
    .venv/bin/python benchmarks/realmodels/data.py --only ppocrv4-rec --seed 3
    .venv/bin/python benchmarks/realmodels/data.py --set mcu            # the microcontroller-class set

Writes ``<cache>/<model>/calib.npz`` and ``eval.npz`` (atomically), laid out as qdebug reads them: one array per
graph input, shaped ``(N, *concrete shape)``. Values follow each input's :class:`Distribution` in registry.json:

- images are pictures, not noise: smooth colour fields with a few shapes (``natural``) or dark glyph strokes on a
  light background (``text``), pixels in ``[0, scale]``, then ``(x - mean) / std`` per channel as the package's own
  pre-processing does;
- audio is one continuous 16 kHz stream of voiced segments (harmonics of a gliding pitch, syllable envelope) and
  pauses over background noise, cut into consecutive chunks that each start with the previous chunk's tail;
- token ids are uniform over the vocabulary's word pieces between ``[CLS]`` and ``[SEP]``, masks are ones;
- a ``recurrent`` input (silero's LSTM state) is the model's own output for the previous sample, obtained by
  running the model over the samples in order in ONNX Runtime (so that model must be cached first);
- the microcontroller-class set's features (file bytes, log-mel and fbank spectrograms, openWakeWord's features
  made by its own feature models) come from ``data_mcu.py``.

Every array depends only on (model, seed, N): calibration uses ``seed``, evaluation ``seed + 1``, so the two
never share samples. Exit 0 on success, 1 when a model needed for a recurrent input is not cached.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.realmodels.registry import (
    DistKind,
    Distribution,
    ImageStyle,
    InputSpec,
    ModelEntry,
    ModelSet,
    cache_dir,
    calib_path,
    eval_path,
    is_cached,
    load_registry,
    model_path,
)

DEFAULT_CALIB = 32
DEFAULT_EVAL = 16
Arrays = dict[str, np.ndarray]


class DataGenError(Exception):
    """Data could not be made; one line naming the model."""


# ---- pictures ---------------------------------------------------------------------------------------------------


def _upsample(coarse: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear resize of ``(c, gh, gw)`` to ``(c, h, w)`` (a smooth field from a few random values)."""
    _, gh, gw = coarse.shape
    ys, xs = np.linspace(0, gh - 1, h), np.linspace(0, gw - 1, w)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, gh - 1), np.minimum(x0 + 1, gw - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = coarse[:, y0][:, :, x0] * (1 - fx) + coarse[:, y0][:, :, x1] * fx
    bottom = coarse[:, y1][:, :, x0] * (1 - fx) + coarse[:, y1][:, :, x1] * fx
    out: np.ndarray = top * (1 - fy) + bottom * fy
    return out


def _natural(rng: np.random.Generator, c: int, h: int, w: int) -> np.ndarray:
    """A photo-like picture in [0, 1]: a smooth colour field, a few flat or striped shapes, sensor noise."""
    # Channels of real photos are strongly correlated: a shared brightness field plus a weaker colour cast.
    light = _upsample(rng.random((1, *rng.integers(2, 6, size=2))), h, w)
    img = light + 0.3 * (_upsample(rng.random((c, *rng.integers(2, 5, size=2))), h, w) - 0.5)
    yy, xx = np.mgrid[0:h, 0:w]
    yy, xx = yy / max(h - 1, 1), xx / max(w - 1, 1)
    for _ in range(int(rng.integers(2, 7))):
        cy, cx = rng.random(2)
        ry, rx = rng.uniform(0.05, 0.35, size=2)
        if rng.random() < 0.5:
            mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
        else:
            mask = (np.abs(yy - cy) <= ry) & (np.abs(xx - cx) <= rx)
        colour = rng.random((c, 1))
        if rng.random() < 0.3:  # texture: stripes at a random angle and frequency
            angle, freq = rng.uniform(0, np.pi), rng.uniform(4, 30)
            stripes = 0.5 + 0.5 * np.sin(2 * np.pi * freq * (np.cos(angle) * xx + np.sin(angle) * yy))
            img[:, mask] = colour * stripes[mask][None, :]
        else:
            img[:, mask] = 0.25 * img[:, mask] + 0.75 * colour
    img += rng.normal(0.0, 0.02, img.shape)
    return np.clip(img, 0.0, 1.0)


def _text_line(rng: np.random.Generator, img: np.ndarray, top: int, bottom: int, ink: np.ndarray) -> None:
    """Draw glyph-like strokes (bars, hooks, dots) left to right between rows ``top`` and ``bottom``."""
    _, _, w = img.shape
    height = max(bottom - top, 2)
    thick = max(1, round(height * rng.uniform(0.08, 0.16)))
    x = int(rng.uniform(0.0, 0.08) * w)
    while x < w * 0.95:
        gw = max(2, int(height * rng.uniform(0.35, 0.8)))
        for _ in range(int(rng.integers(1, 4))):
            if rng.random() < 0.5:  # vertical stroke
                sx = x + int(rng.integers(0, gw))
                sy0 = top + int(rng.integers(0, max(height // 3, 1)))
                sy1 = bottom - int(rng.integers(0, max(height // 3, 1)))
                img[:, sy0:sy1, sx : sx + thick] = ink
            else:  # horizontal stroke
                sy = top + int(rng.integers(0, height))
                img[:, sy : sy + thick, x : x + gw] = ink
        x += gw + int(height * rng.uniform(0.1, 0.5)) + (int(height * 0.6) if rng.random() < 0.15 else 0)


def _text(rng: np.random.Generator, c: int, h: int, w: int) -> np.ndarray:
    """A text-line / document picture in [0, 1]: light uneven paper, dark strokes in one or more lines."""
    paper = rng.uniform(0.7, 1.0) + _upsample(rng.uniform(-0.08, 0.08, (1, 3, 4)), h, w)
    img = np.repeat(paper, c, axis=0)
    ink = (rng.uniform(0.0, 0.35) + rng.uniform(-0.05, 0.05, (c, 1, 1))).clip(0.0, 1.0)
    lines = 1 if h < 96 else int(rng.integers(2, max(3, h // 48)))
    pitch = h / lines
    for i in range(lines):
        margin = pitch * rng.uniform(0.1, 0.3)
        _text_line(rng, img, int(i * pitch + margin), int((i + 1) * pitch - margin), ink)
    img += rng.normal(0.0, 0.02, img.shape)
    return np.clip(img, 0.0, 1.0)


def _images(dist: Distribution, shape: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of NCHW-like ``shape`` (channels third from the end, or last when ``channels_last``),
    normalised as ``dist`` says."""
    h, w, c = shape[-3:] if dist.channels_last else (shape[-2], shape[-1], shape[-3])
    draw = _text if dist.style is ImageStyle.TEXT else _natural
    count = n * int(np.prod(shape[:-3], dtype=np.int64))
    pixels = np.stack([draw(rng, c, h, w) for _ in range(count)]) * (dist.scale or 1.0)
    mean = np.asarray(dist.mean or (0.0,), dtype=np.float64).reshape(-1, 1, 1)
    std = np.asarray(dist.std or (1.0,), dtype=np.float64).reshape(-1, 1, 1)
    out = (pixels - mean) / std
    if dist.channels_last:
        out = out.transpose(0, 2, 3, 1)
    return out.reshape((n, *shape))


# ---- audio ------------------------------------------------------------------------------------------------------


def _voiced(rng: np.random.Generator, length: int, sr: int) -> np.ndarray:
    """One voiced segment: harmonics of a gliding pitch under a syllable-rate envelope, peak in [0.05, 0.6]."""
    t = np.arange(length) / sr
    f0 = rng.uniform(90, 250) * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.5, 3.0) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    harm = sum(rng.uniform(0.4, 1.0) / k * np.sin(k * phase + rng.uniform(0, 2 * np.pi)) for k in range(1, 9))
    env = 0.5 * (1 - np.cos(2 * np.pi * rng.uniform(2.5, 6.0) * t)) ** 1.5
    sig = np.asarray(harm) * env
    return np.asarray(rng.uniform(0.05, 0.6) * sig / max(float(np.abs(sig).max()), 1e-9))


def _stream(rng: np.random.Generator, total: int, sr: int) -> np.ndarray:
    """A continuous signal of ``total`` samples: voiced segments and pauses over background noise, in [-1, 1]."""
    out = np.zeros(total)
    pos = 0
    while pos < total:
        seg = min(int(rng.uniform(0.15, 0.8) * sr), total - pos)
        if rng.random() < 0.6:
            out[pos : pos + seg] = _voiced(rng, seg, sr)
        pos += seg
    out += rng.normal(0.0, rng.uniform(0.001, 0.01), total)
    return np.clip(out, -1.0, 1.0)


def _audio(dist: Distribution, shape: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """Consecutive frames ``context + chunk`` long (the last axis) cut from one stream; frame i+1 follows frame i."""
    context = dist.context or 0
    chunk = shape[-1] - context
    frames = n * int(np.prod(shape[:-1], dtype=np.int64))
    stream = _stream(rng, frames * chunk + context, dist.sample_rate or 16000)
    idx = np.arange(frames)[:, None] * chunk + np.arange(shape[-1])[None, :]
    gain = dist.scale if dist.scale is not None else 1.0  # e.g. 32767: int16 PCM passed as float
    return (stream[idx] * gain).reshape((n, *shape))


# ---- everything else --------------------------------------------------------------------------------------------


def _draw(spec: InputSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of one non-recurrent input, shaped ``(n, *spec.concrete)`` in ``spec.dtype``."""
    d, shape = spec.distribution, spec.concrete
    if d.kind is DistKind.IMAGE:
        out = _images(d, shape, n, rng)
    elif d.kind is DistKind.AUDIO:
        out = _audio(d, shape, n, rng)
    elif d.kind is DistKind.TOKENS:
        assert d.low is not None and d.high is not None
        out = rng.integers(int(d.low), int(d.high), size=(n, *shape))
        if d.first is not None:
            out[..., 0] = d.first
        if d.last is not None:
            out[..., -1] = d.last
    elif d.kind is DistKind.CONSTANT:
        out = np.full((n, *shape), d.value)
    elif d.kind is DistKind.UNIFORM:
        out = rng.uniform(d.low or 0.0, 1.0 if d.high is None else d.high, size=(n, *shape))
    elif d.kind is DistKind.NORMAL:
        out = rng.normal(d.value or 0.0, 1.0 if d.spread is None else d.spread, size=(n, *shape))
    elif d.kind in _FEATURES:
        out = _features(spec, n, rng)
    else:
        raise DataGenError(f"input {spec.name!r}: {d.kind} inputs come from the model (see _rollout)")
    return out.astype(spec.dtype)


_FEATURES = frozenset({DistKind.BYTES, DistKind.LOG_MEL, DistKind.FBANK_LFR, DistKind.WAKEWORD})


def _features(spec: InputSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """The microcontroller-class set's feature inputs (``data_mcu.py``), imported only when one is asked for."""
    from benchmarks.realmodels import data_mcu

    d, shape = spec.distribution, spec.concrete
    try:
        if d.kind is DistKind.BYTES:
            return data_mcu.file_bytes(d, shape, n, rng)
        make = {
            DistKind.LOG_MEL: data_mcu.log_mel,
            DistKind.FBANK_LFR: data_mcu.fbank_lfr,
            DistKind.WAKEWORD: data_mcu.wakeword_features,
        }[d.kind]
        return make(d, shape, n, rng, _stream)
    except data_mcu.FeatureError as exc:
        raise DataGenError(f"input {spec.name!r}: {exc}") from None


def _rollout(entry: ModelEntry, arrays: Arrays, n: int) -> None:
    """Fill the recurrent inputs by running the model over the samples in order (state of sample i = output i-1)."""
    recurrent = [s for s in entry.inputs if s.distribution.kind is DistKind.RECURRENT]
    if not recurrent:
        return
    if not is_cached(entry):
        raise DataGenError(f"{entry.name}: its recurrent input needs the model; run fetch.py --only {entry.name}")
    import onnxruntime as ort  # only the streaming models need a session

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path(entry)), so, providers=["CPUExecutionProvider"])
    sources = [str(s.distribution.source) for s in recurrent]
    state = {s.name: np.zeros(s.concrete, dtype=s.dtype) for s in recurrent}
    for s in recurrent:
        arrays[s.name] = np.zeros((n, *s.concrete), dtype=s.dtype)
    for i in range(n):
        feed = {name: a[i] for name, a in arrays.items()} | state
        for s in recurrent:
            arrays[s.name][i] = state[s.name]
        outs = sess.run(sources, feed)
        state = {s.name: np.asarray(o, dtype=s.dtype).reshape(s.concrete) for s, o in zip(recurrent, outs, strict=True)}


def make_samples(entry: ModelEntry, n: int, seed: int = 0) -> Arrays:
    """``n`` samples of every input of ``entry``: ``{input name: array (n, *concrete)}``, reproducible per seed."""
    if n < 1:
        raise DataGenError(f"{entry.name}: need at least one sample, got {n}")
    model_key = zlib.crc32(entry.name.encode())  # a stable per-model stream (str hashes are salted per process)
    arrays: Arrays = {}
    for i, spec in enumerate(entry.inputs):
        if spec.distribution.kind is not DistKind.RECURRENT:
            arrays[spec.name] = _draw(spec, n, np.random.default_rng([seed, model_key, i]))
    _rollout(entry, arrays, n)
    return {s.name: arrays[s.name] for s in entry.inputs}


def _save_npz(path: Path, arrays: Arrays) -> None:
    """Write atomically: a reader never sees a half-written file, a failure leaves no temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".npz.part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


@dataclass(frozen=True)
class DataFiles:
    """The two files written for one model."""

    calib: Path
    eval: Path
    calib_samples: int
    eval_samples: int


def write_data(
    entry: ModelEntry, calib_samples: int = DEFAULT_CALIB, eval_samples: int = DEFAULT_EVAL, seed: int = 0
) -> DataFiles:
    """Write ``calib.npz`` (seed) and ``eval.npz`` (seed + 1) for ``entry`` into its cache folder."""
    _save_npz(calib_path(entry), make_samples(entry, calib_samples, seed))
    _save_npz(eval_path(entry), make_samples(entry, eval_samples, seed + 1))
    return DataFiles(calib_path(entry), eval_path(entry), calib_samples, eval_samples)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    reg = load_registry()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--only", nargs="+", metavar="NAME", choices=reg.names(), default=[], help="these models only")
    p.add_argument("--ci", action="store_true", help="the CI subset only")
    p.add_argument("--set", choices=[str(s) for s in ModelSet], help="this set of models (default: main)")
    p.add_argument("--calib-samples", type=int, default=DEFAULT_CALIB, metavar="N")
    p.add_argument("--eval-samples", type=int, default=DEFAULT_EVAL, metavar="N")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.calib_samples < 1 or args.eval_samples < 1:
        p.error("--calib-samples and --eval-samples must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    failed = 0
    reg = load_registry()
    for entry in reg.select(args.only, args.ci, ModelSet(args.set) if args.set else None):
        try:
            files = write_data(entry, args.calib_samples, args.eval_samples, args.seed)
        except (DataGenError, OSError) as exc:
            print(f"data: {exc}", file=sys.stderr)
            failed += 1
            continue
        size = (files.calib.stat().st_size + files.eval.stat().st_size) / 1e6
        print(f"{entry.name:16} calib {files.calib_samples:3} + eval {files.eval_samples:3} samples ({size:.1f} MB)")
    print(f"data in {cache_dir()}/<model>/calib.npz, eval.npz")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
