"""Inputs of the microcontroller-class corpus models (issue 37) that are features, not raw pictures or audio.

Each follows the package's own pre-processing, computed in numpy (no librosa, no torchaudio) from the synthetic
speech stream of ``data.py``, so calibration sees the ranges a user's pipeline produces:

- ``bytes`` (Magika): a synthetic file of one of a dozen kinds (source code, JSON, CSV, HTML, prose, PNG, ZIP, PDF,
  ELF, gzip, random bytes), whitespace stripped at both ends, its first and last ``context`` bytes, padded with
  ``value`` (256) where the file is shorter;
- ``log-mel`` (DNSMOS P.808): librosa's ``melspectrogram`` (centred Hann STFT, Slaney mel filters, power 2), then
  ``(power_to_db(ref=max, top_db=80) + 40) / 40``, frames × mels;
- ``fbank-lfr`` (FunASR's FSMN-VAD): Kaldi's log-mel fbank (25 ms Povey window, pre-emphasis 0.97, HTK mels from
  20 Hz) of int16-scaled audio, ``stack`` frames stacked around each frame (low frame rate, n = 1), each dimension
  normalised over the stream (FunASR's CMVN file is not in the cache); consecutive samples are consecutive chunks;
- ``wakeword-features`` (openWakeWord): the corpus' own feature models run in ONNX Runtime, as openWakeWord does:
  ``oww-melspec`` on int16-scaled audio, ``x / 10 + 2``, windows of 76 frames every 8 frames; for ``oww-embedding``
  as the source, those windows through the embedding model, 16 consecutive embeddings per sample.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from benchmarks.realmodels.registry import DistKind, Distribution, ModelEntry, is_cached, load_registry, model_path

Stream = Callable[[np.random.Generator, int, int], np.ndarray]

OWW_WINDOW = 76  # mel frames per embedding window (openWakeWord)
OWW_STEP = 8  # mel frames between windows: one embedding per 80 ms
OWW_HOP = 160  # samples per mel frame
INT16 = 32767.0


class FeatureError(Exception):
    """Features could not be made (a feature model is not cached); one line naming the model."""


# ---- bytes ------------------------------------------------------------------------------------------------------

_WORDS = tuple(
    [
        "the",
        "data",
        "model",
        "value",
        "input",
        "output",
        "file",
        "read",
        "write",
        "return",
        "import",
        "class",
        "def",
        "self",
        "if",
        "else",
        "for",
        "while",
        "in",
        "not",
        "and",
        "or",
        "none",
        "true",
        "false",
        "list",
        "dict",
        "int",
        "float",
        "str",
        "print",
        "error",
        "open",
        "close",
        "path",
        "name",
        "size",
        "type",
        "test",
        "run",
        "load",
        "save",
    ]
)


def _prose(rng: np.random.Generator, n: int) -> bytes:
    words = rng.choice(_WORDS, size=max(n // 5, 1))
    lines = [" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, len(words), 12)]
    return "\n".join(lines).encode()


def _code(rng: np.random.Generator, n: int) -> bytes:
    out = ["import os", "import sys", ""]
    while sum(map(len, out)) < n:
        name = "_".join(rng.choice(_WORDS, size=2))
        body = [f"    {rng.choice(_WORDS)} = {name}({rng.integers(0, 99)})", f"    return {rng.choice(_WORDS)}"]
        out += [f"def {name}(x, y={rng.integers(0, 9)}):", *body, ""]
    return "\n".join(out).encode()


def _json(rng: np.random.Generator, n: int) -> bytes:
    items: list[str] = []
    while sum(map(len, items)) < n:
        items.append(f'  {{"{rng.choice(_WORDS)}": {rng.integers(0, 1000)}, "name": "{rng.choice(_WORDS)}"}}')
    return ("[\n" + ",\n".join(items) + "\n]\n").encode()


def _csv(rng: np.random.Generator, n: int) -> bytes:
    rows = ["id,name,value,score"]
    while sum(map(len, rows)) < n:
        rows.append(f"{len(rows)},{rng.choice(_WORDS)},{rng.integers(0, 10**6)},{rng.random():.4f}")
    return "\n".join(rows).encode()


def _html(rng: np.random.Generator, n: int) -> bytes:
    body = "".join(f'<p class="{rng.choice(_WORDS)}">{_prose(rng, 80).decode()}</p>\n' for _ in range(n // 100 + 1))
    return f"<!DOCTYPE html>\n<html><head><title>t</title></head><body>\n{body}</body></html>\n".encode()


def _compressed(rng: np.random.Generator, n: int) -> bytes:
    return zlib.compress(_prose(rng, n) + rng.integers(0, 256, n // 4, dtype=np.uint8).tobytes(), 6)


def _png(rng: np.random.Generator, n: int) -> bytes:
    ihdr = b"\x00\x00\x00\rIHDR" + int(rng.integers(16, 2048)).to_bytes(4, "big") * 2 + b"\x08\x06\x00\x00\x00"
    idat = b"\x00\x00\x00\x00IDAT" + _compressed(rng, n)
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat + b"\x00\x00\x00\x00IEND\xaeB`\x82"


def _zip(rng: np.random.Generator, n: int) -> bytes:
    name = f"{rng.choice(_WORDS)}.txt".encode()
    head = b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + bytes(16) + len(name).to_bytes(2, "little") + b"\x00\x00" + name
    tail = b"PK\x01\x02\x14\x03\x14\x00" + bytes(38) + name + b"PK\x05\x06" + bytes(18)
    return head + _compressed(rng, n) + tail


def _pdf(rng: np.random.Generator, n: int) -> bytes:
    objs = "".join(f"{i} 0 obj\n<< /Type /Page /Length {rng.integers(10, 999)} >>\nendobj\n" for i in range(1, 6))
    stream = b"stream\n" + _compressed(rng, n) + b"\nendstream\n"
    return b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n" + objs.encode() + stream + b"trailer\n<< /Root 1 0 R >>\n%%EOF\n"


def _elf(rng: np.random.Generator, n: int) -> bytes:
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00\x3e\x00\x01\x00\x00\x00" + bytes(40)
    code = rng.choice(np.frombuffer(b"\x48\x89\xe5\x8b\x45\xfc\x5d\xc3\x00\x00\xff\x0f\x1f\x44", np.uint8), size=n)
    return header + code.tobytes() + b"\x00.text\x00.data\x00.bss\x00.symtab\x00"


def _gzip(rng: np.random.Generator, n: int) -> bytes:
    return b"\x1f\x8b\x08\x00" + bytes(4) + b"\x00\x03" + _compressed(rng, n)


def _random(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


FILE_KINDS: tuple[Callable[[np.random.Generator, int], bytes], ...] = (
    _prose, _code, _json, _csv, _html, _png, _zip, _pdf, _elf, _gzip, _random,
)  # fmt: skip


def file_bytes(dist: Distribution, shape: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` Magika inputs: per file the first and last ``context`` bytes after stripping whitespace, padded."""
    context = dist.context or shape[-1] // 2
    pad = int(dist.value if dist.value is not None else 256)
    count = n * int(np.prod(shape[:-1], dtype=np.int64))
    out = np.full((count, 2 * context), pad, dtype=np.int64)
    for i in range(count):
        make = FILE_KINDS[int(rng.integers(len(FILE_KINDS)))]
        content = make(rng, int(np.exp(rng.uniform(np.log(64), np.log(20000))))).strip()
        beg = np.frombuffer(content[:context], dtype=np.uint8)
        end = np.frombuffer(content[-context:], dtype=np.uint8)
        out[i, : len(beg)] = beg
        out[i, 2 * context - len(end) :] = end
    return out.reshape((n, *shape))


# ---- spectrograms -----------------------------------------------------------------------------------------------


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Hz → mel on librosa's default (Slaney) scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = 3.0 * hz / 200.0
    log_part = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) / (np.log(6.4) / 27.0)
    out: np.ndarray = np.where(hz >= 1000.0, log_part, mel)
    return out


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), 200.0 * mel / 3.0)
    return out


def slaney_filters(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """librosa.filters.mel(sr, n_fft, n_mels) with its defaults (fmin 0, fmax sr/2, Slaney scale and norm)."""
    fft_hz = np.fft.rfftfreq(n_fft, 1.0 / sr)  # librosa.fft_frequencies: an odd n_fft stops short of sr/2
    pts = _slaney_hz(np.linspace(_slaney_mel(np.array(0.0)), _slaney_mel(np.array(sr / 2.0)), n_mels + 2))
    fdiff = np.diff(pts)
    ramps = pts[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    out: np.ndarray = weights * (2.0 / (pts[2:] - pts[:-2]))[:, None]
    return out


def _frames(signal: np.ndarray, length: int, hop: int, count: int) -> np.ndarray:
    idx = np.arange(count)[:, None] * hop + np.arange(length)[None, :]
    out: np.ndarray = signal[idx]
    return out


def log_mel(dist: Distribution, shape: tuple[int, ...], n: int, rng: np.random.Generator, stream: Stream) -> np.ndarray:
    """``n`` DNSMOS inputs ``(frames, mels)``: each an independent clip of the speech stream (see module doc)."""
    sr, n_fft, hop, n_mels = dist.sample_rate or 16000, dist.fft or 321, dist.hop or 160, dist.mels or shape[-1]
    frames = shape[-2]
    count = n * int(np.prod(shape[:-2], dtype=np.int64))
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann, as scipy's get_window
    filters = slaney_filters(sr, n_fft, n_mels)
    out = np.empty((count, frames, n_mels))
    for i in range(count):
        audio = stream(rng, frames * hop, sr)  # 9 s less one hop, as speechmos cuts its 9.01 s segment
        padded = np.pad(audio, n_fft // 2, mode="reflect")  # librosa's center=True
        spec = np.abs(np.fft.rfft(_frames(padded, n_fft, hop, frames) * window, axis=1)) ** 2
        db = 10.0 * np.log10(np.maximum(spec @ filters.T, 1e-10))
        db = np.maximum(db - db.max(), -80.0)  # power_to_db(ref=np.max, top_db=80)
        out[i] = (db + 40.0) / 40.0
    return out.reshape((n, *shape))


def _htk_filters(sr: int, n_fft: int, n_mels: int, low_hz: float = 20.0) -> np.ndarray:
    """Kaldi's triangular mel bins (HTK mel scale, not normalised) over the FFT bins below Nyquist."""

    def mel(f: np.ndarray) -> np.ndarray:
        out: np.ndarray = 1127.0 * np.log1p(f / 700.0)
        return out

    centres = np.linspace(mel(np.array(low_hz)), mel(np.array(sr / 2.0)), n_mels + 2)
    bins = mel(np.arange(n_fft // 2 + 1) * sr / n_fft)
    left, centre, right = centres[:-2, None], centres[1:-1, None], centres[2:, None]
    up = (bins[None, :] - left) / (centre - left)
    down = (right - bins[None, :]) / (right - centre)
    out: np.ndarray = np.maximum(0.0, np.minimum(up, down))
    return out


def fbank_lfr(
    dist: Distribution, shape: tuple[int, ...], n: int, rng: np.random.Generator, stream: Stream
) -> np.ndarray:
    """``n`` FSMN-VAD inputs ``(frames, mels × stack)``, consecutive chunks of one stream (see module doc)."""
    sr, hop, n_mels, stack = dist.sample_rate or 16000, dist.hop or 160, dist.mels or 80, dist.stack or 5
    frames, win, n_fft = shape[-2], 400, 512
    total = n * int(np.prod(shape[:-2], dtype=np.int64)) * frames
    audio = stream(rng, (total - 1) * hop + win, sr) * (1 << 15)  # FunASR scales to the int16 range
    x = _frames(audio, win, hop, total)
    x = x - x.mean(axis=1, keepdims=True)  # Kaldi: remove DC, pre-emphasis, Povey window
    x = np.concatenate([x[:, :1] * (1 - 0.97), x[:, 1:] - 0.97 * x[:, :-1]], axis=1)
    x = x * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / (win - 1))) ** 0.85
    power = np.abs(np.fft.rfft(x, n=n_fft, axis=1)) ** 2
    fbank = np.log(np.maximum(power @ _htk_filters(sr, n_fft, n_mels).T, np.finfo(np.float32).eps))
    left = (stack - 1) // 2  # LFR: the first frame repeated to the left, then `stack` frames per output frame
    padded = np.concatenate([np.repeat(fbank[:1], left, axis=0), fbank, np.repeat(fbank[-1:], stack, axis=0)])
    lfr = np.concatenate([padded[k : k + total] for k in range(stack)], axis=1)
    lfr = (lfr - lfr.mean(axis=0)) / np.maximum(lfr.std(axis=0), 1e-6)
    out: np.ndarray = lfr.reshape((n, *shape))
    return out


# ---- openWakeWord -----------------------------------------------------------------------------------------------


def _session(entry: ModelEntry) -> object:
    if not is_cached(entry):
        raise FeatureError(f"{entry.name} makes the features; run fetch.py --only {entry.name}")
    import onnxruntime as ort  # only the feature models need a session

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(model_path(entry)), so, providers=["CPUExecutionProvider"])


def _oww_mel(melspec: ModelEntry, frames: int, rng: np.random.Generator, stream: Stream) -> np.ndarray:
    """``frames`` consecutive openWakeWord mel frames ``(frames, 32)`` of one int16-scaled speech stream."""
    audio = (stream(rng, (frames + 3) * OWW_HOP, 16000) * INT16).astype(np.float32)[None, :]
    sess = _session(melspec)
    (spec,) = sess.run(None, {melspec.inputs[0].name: audio})  # type: ignore[attr-defined]
    mel = np.asarray(spec).reshape(-1, np.asarray(spec).shape[-1])[:frames] / 10.0 + 2.0
    if mel.shape[0] < frames:
        raise FeatureError(f"{melspec.name} gave {mel.shape[0]} frames for {frames} wanted")
    return mel


def _windows(mel: np.ndarray, count: int) -> np.ndarray:
    return np.stack([mel[i * OWW_STEP : i * OWW_STEP + OWW_WINDOW] for i in range(count)])[..., None]


def wakeword_features(
    dist: Distribution, shape: tuple[int, ...], n: int, rng: np.random.Generator, stream: Stream
) -> np.ndarray:
    """``n`` inputs made by the corpus model ``dist.source``: mel windows, or 16-embedding sequences."""
    reg = load_registry()
    source = reg.get(str(dist.source))
    if source.inputs[0].distribution.kind is DistKind.AUDIO:  # the source is the melspectrogram model
        mel = _oww_mel(source, OWW_WINDOW + OWW_STEP * (n - 1), rng, stream)
        return _windows(mel, n).reshape((n, *shape)).astype(np.float32)
    melspec = reg.get(str(source.inputs[0].distribution.source))  # the source is the embedding model
    per_sample = shape[-2]
    count = n + per_sample - 1  # sample i = embeddings i .. i + 15: the buffer after i more 80 ms chunks
    mel = _oww_mel(melspec, OWW_WINDOW + OWW_STEP * (count - 1), rng, stream)
    sess = _session(source)
    windows = _windows(mel, count).astype(np.float32)
    name = source.inputs[0].name
    emb = np.concatenate([np.asarray(sess.run(None, {name: w[None]})[0]).reshape(1, -1) for w in windows])  # type: ignore[attr-defined]
    seqs = np.stack([emb[i : i + per_sample] for i in range(n)])
    return seqs.reshape((n, *shape)).astype(np.float32)
