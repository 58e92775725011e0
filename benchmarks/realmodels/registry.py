"""Typed view of ``registry.json``: which real models form the corpus, where each comes from, how to feed it.

Every entry names a pinned PyPI distribution (``package==version``, the wheel's file name and sha256), the path of
the ``.onnx`` inside it and the sha256 of that file once extracted, what the model is (task, architecture, opset,
node count, as measured with ``onnx``), the licence stated by the package, which coverage items of the corpus it
stands for, whether it is in the CI subset, and an :class:`InputSpec` per graph input: the model's declared shape
(dynamic dimensions by name), the concrete shape to use, and a :class:`Distribution` of realistic values.

The models themselves are never in the repository: they are cached under :func:`cache_dir`
(``$QDEBUG_CORPUS_DIR``, default ``~/.cache/qdebug/realmodels``), one folder per model.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
REGISTRY_JSON = Path(__file__).resolve().parent / "registry.json"
CACHE_ENV = "QDEBUG_CORPUS_DIR"
DEFAULT_CACHE = Path("~/.cache/qdebug/realmodels")


class Coverage(StrEnum):
    """The kinds of model the corpus must hold (issue 11, deliverable 1)."""

    CNN_DETECTOR_DYNAMIC = "cnn-detector-dynamic-dims"
    OCR_TRANSFORMER = "ocr-text-transformer"
    CRNN_LSTM = "crnn-lstm"
    AUDIO = "audio"
    INT_INPUT = "int-input-classifier"
    VIT_ENCODER = "vit-clip-image-encoder"
    SEGMENTATION_UNET = "segmentation-unet"
    LARGE = "at-least-50mb"
    # The microcontroller-class set (issue 37): small trained models a Deeploy target is meant for.
    KEYWORD_SPOTTING = "keyword-spotting"
    AUDIO_FRONTEND = "audio-frontend"
    TINY_IMAGE_CLASSIFIER = "tiny-image-classifier"
    TINY_DETECTOR = "tiny-detector"
    BYTE_CLASSIFIER = "byte-classifier"


class ModelSet(StrEnum):
    """Which corpus a model belongs to: the main one (issue 11) or the microcontroller-class one (issue 37)."""

    MAIN = "main"
    MCU = "mcu"


class DistKind(StrEnum):
    """How the values of one input are drawn (see ``data.py``)."""

    IMAGE = "image"  # synthetic picture with pixels in [0, scale], then (x - mean) / std per channel
    AUDIO = "audio"  # consecutive chunks of a synthetic 16 kHz speech/silence stream in [-1, 1]
    TOKENS = "tokens"  # token ids in [low, high), optionally framed by first/last special ids
    CONSTANT = "constant"  # every element equal to value (attention masks of ones)
    RECURRENT = "recurrent"  # the model's own output `source` of the previous sample (streaming state)
    UNIFORM = "uniform"  # uniform in [low, high)
    NORMAL = "normal"  # normal with mean `value` and standard deviation `spread`
    BYTES = "bytes"  # file-like byte content: the first/last `context` bytes, `value` pads (data_mcu.py)
    LOG_MEL = "log-mel"  # log-mel spectrogram frames of a speech stream (data_mcu.py)
    FBANK_LFR = "fbank-lfr"  # Kaldi-style log-mel fbank, low-frame-rate stacked, normalised per dim (data_mcu.py)
    WAKEWORD = "wakeword-features"  # openWakeWord's features: the `source` model's outputs on a stream (data_mcu.py)


class ImageStyle(StrEnum):
    """What the synthetic picture looks like."""

    NATURAL = "natural"  # smooth colour fields and a few shapes (photos)
    TEXT = "text"  # dark glyph-like strokes on a light background (text lines, captchas)


@dataclass(frozen=True)
class Distribution:
    """The values of one input; only the fields of its ``kind`` are set (the others stay ``None``)."""

    kind: DistKind
    scale: float | None = None  # IMAGE: pixel range [0, scale]
    mean: tuple[float, ...] | None = None  # IMAGE: per-channel mean subtracted after scaling
    std: tuple[float, ...] | None = None  # IMAGE: per-channel divisor
    style: ImageStyle | None = None  # IMAGE
    context: int | None = None  # AUDIO: samples of the previous chunk that lead each input
    sample_rate: int | None = None  # AUDIO
    low: float | None = None  # TOKENS / UNIFORM: inclusive lower bound
    high: float | None = None  # TOKENS / UNIFORM: exclusive upper bound
    first: int | None = None  # TOKENS: id at position 0 ([CLS])
    last: int | None = None  # TOKENS: id at the last position ([SEP])
    value: float | None = None  # CONSTANT: the value; NORMAL: the mean
    spread: float | None = None  # NORMAL: the standard deviation
    source: str | None = None  # RECURRENT: the output fed back; WAKEWORD: the corpus model that makes the features
    channels_last: bool | None = None  # IMAGE: NHWC (channels last) instead of NCHW
    mels: int | None = None  # LOG_MEL / FBANK_LFR: mel bands
    fft: int | None = None  # LOG_MEL: FFT length (samples)
    hop: int | None = None  # LOG_MEL / FBANK_LFR: frame hop (samples)
    stack: int | None = None  # FBANK_LFR: frames stacked into one (low frame rate)

    def value_range(self) -> tuple[float, float] | None:
        """The closed range the values fall in, when it is bounded and known without running the model."""
        if self.kind is DistKind.IMAGE:
            scale = self.scale if self.scale is not None else 1.0
            mean = self.mean or (0.0,)
            std = self.std or (1.0,)
            lows = [(0.0 - m) / s for m, s in zip(mean, std, strict=True)]
            highs = [(scale - m) / s for m, s in zip(mean, std, strict=True)]
            return min(lows), max(highs)
        if self.kind is DistKind.AUDIO:
            gain = self.scale if self.scale is not None else 1.0
            return -gain, gain
        if self.kind is DistKind.BYTES:
            return 0.0, float(self.value if self.value is not None else 255)
        if self.kind in (DistKind.TOKENS, DistKind.UNIFORM):
            assert self.low is not None and self.high is not None
            specials = [v for v in (self.first, self.last) if v is not None]
            top = self.high - 1 if self.kind is DistKind.TOKENS else self.high
            return min([self.low, *specials]), max([top, *specials])
        if self.kind is DistKind.CONSTANT:
            assert self.value is not None
            return self.value, self.value
        return None

    def describe(self) -> str:
        """One short human-readable phrase (README tables)."""
        k = self.kind
        if k is DistKind.IMAGE:
            lo, hi = self.value_range() or (0.0, 0.0)
            norm = "" if self.mean is None and self.std is None else f", (x-mean)/std → [{lo:.2f}, {hi:.2f}]"
            return f"{self.style} image, pixels in [0, {self.scale:g}]{norm}"
        if k is DistKind.AUDIO:
            gain = self.scale if self.scale is not None else 1.0
            span = f"[-{gain:g}, {gain:g}]"
            return f"{self.sample_rate} Hz speech/silence stream in {span}, {self.context}-sample context"
        if k is DistKind.BYTES:
            return f"bytes of a synthetic file: first and last {self.context} (0-255), {self.value:g} pads"
        if k is DistKind.LOG_MEL:
            return f"log-mel spectrogram ({self.mels} mels, FFT {self.fft}, hop {self.hop}) of a speech stream"
        if k is DistKind.FBANK_LFR:
            return f"{self.mels}-mel fbank × {self.stack} stacked frames (hop {self.hop}), per-dim normalised"
        if k is DistKind.WAKEWORD:
            return f"`{self.source}` features of a speech stream (openWakeWord's pipeline)"
        if k is DistKind.TOKENS:
            return f"token ids in [{self.low:g}, {self.high:g}), [{self.first}] … [{self.last}]"
        if k is DistKind.CONSTANT:
            return f"all {self.value:g}"
        if k is DistKind.RECURRENT:
            return f"previous sample's `{self.source}` (zeros first)"
        if k is DistKind.UNIFORM:
            return f"uniform in [{self.low:g}, {self.high:g})"
        return f"normal(mean {self.value:g}, std {self.spread:g})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": str(self.kind)}
        for name in _DIST_FIELDS:
            v = getattr(self, name)
            if v is not None:
                out[name] = list(v) if isinstance(v, tuple) else (str(v) if isinstance(v, StrEnum) else v)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Distribution:
        unknown = set(d) - {"kind", *_DIST_FIELDS}
        if unknown:
            raise ValueError(f"distribution: unknown field(s) {sorted(unknown)}")
        kw: dict[str, Any] = {k: v for k, v in d.items() if k != "kind"}
        for name in ("mean", "std"):
            if name in kw:
                kw[name] = tuple(float(x) for x in kw[name])
        if "style" in kw:
            kw["style"] = ImageStyle(kw["style"])
        return cls(kind=DistKind(d["kind"]), **kw)


_DIST_FIELDS = (
    "scale",
    "mean",
    "std",
    "style",
    "context",
    "sample_rate",
    "low",
    "high",
    "first",
    "last",
    "value",
    "spread",
    "source",
    "channels_last",
    "mels",
    "fft",
    "hop",
    "stack",
)


@dataclass(frozen=True)
class InputSpec:
    """One graph input: declared shape (dynamic dims by name, ``"?"`` when unnamed), concrete shape, values."""

    name: str
    dtype: str  # numpy dtype name: float32, int64, ...
    shape: tuple[int | str, ...]
    concrete: tuple[int, ...]
    distribution: Distribution

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "concrete": list(self.concrete),
            "distribution": self.distribution.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> InputSpec:
        return cls(
            name=d["name"],
            dtype=d["dtype"],
            shape=tuple(d["shape"]),
            concrete=tuple(int(x) for x in d["concrete"]),
            distribution=Distribution.from_dict(d["distribution"]),
        )


@dataclass(frozen=True)
class ModelEntry:
    """One corpus model: its source (pinned wheel + member), facts measured with onnx, inputs and licence."""

    name: str
    package: str
    version: str
    wheel: str  # file name pip downloads for package==version
    wheel_sha256: str
    wheel_size: int
    member: str  # path of the .onnx inside the wheel
    sha256: str  # of the extracted .onnx
    size: int  # bytes of the extracted .onnx
    task: str
    architecture: str
    opset: int  # of the default ONNX domain
    ir_version: int
    nodes: int  # top-level graph nodes
    producer: str
    licence: str  # as the package's metadata states it
    licence_note: str
    covers: tuple[Coverage, ...]
    ci: bool
    inputs: tuple[InputSpec, ...]
    notes: str = ""
    corpus_set: ModelSet = ModelSet.MAIN  # JSON "set" (absent: main)
    needs: tuple[str, ...] = ()  # corpus models whose cached files data.py runs to make this model's inputs

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def size_mb(self) -> float:
        return self.size / 1e6

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for name in _ENTRY_FIELDS:
            d[name] = getattr(self, name)
        d["covers"] = [str(c) for c in self.covers]
        d["inputs"] = [i.to_dict() for i in self.inputs]
        if self.corpus_set is not ModelSet.MAIN:  # the main set's entries stay as they were written
            d["set"] = str(self.corpus_set)
        if self.needs:
            d["needs"] = list(self.needs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelEntry:
        unknown = set(d) - {*_ENTRY_FIELDS, "covers", "inputs", "set", "needs"}
        if unknown:
            raise ValueError(f"model {d.get('name')!r}: unknown field(s) {sorted(unknown)}")
        kw = {name: d[name] for name in _ENTRY_FIELDS if name in d}
        return cls(
            **kw,
            covers=tuple(Coverage(c) for c in d["covers"]),
            inputs=tuple(InputSpec.from_dict(i) for i in d["inputs"]),
            corpus_set=ModelSet(d.get("set", ModelSet.MAIN)),
            needs=tuple(d.get("needs", ())),
        )


_ENTRY_FIELDS = (
    "name",
    "package",
    "version",
    "wheel",
    "wheel_sha256",
    "wheel_size",
    "member",
    "sha256",
    "size",
    "task",
    "architecture",
    "opset",
    "ir_version",
    "nodes",
    "producer",
    "licence",
    "licence_note",
    "ci",
    "notes",
)


@dataclass(frozen=True)
class Registry:
    """All corpus models, in registry order."""

    models: tuple[ModelEntry, ...]
    schema_version: int = SCHEMA_VERSION
    description: str = ""

    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def get(self, name: str) -> ModelEntry:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"no corpus model {name!r}; known: {', '.join(self.names())}")

    def select(
        self, only: Iterable[str] = (), ci: bool = False, corpus_set: ModelSet | None = None
    ) -> list[ModelEntry]:
        """The models named in ``only`` (whatever their set), else those of ``corpus_set``, restricted to the CI
        subset when ``ci``. Without a set: the main set (the 9 models of issue 11), or with ``ci`` every CI model."""
        if only:
            chosen = [self.get(n) for n in only]
        elif corpus_set is None and ci:
            chosen = list(self.models)
        else:
            wanted = corpus_set or ModelSet.MAIN
            chosen = [m for m in self.models if m.corpus_set is wanted]
        return [m for m in chosen if m.ci] if ci else chosen

    def with_needs(self, entries: Iterable[ModelEntry]) -> list[ModelEntry]:
        """``entries`` and, before them, the models their data generation runs (``needs``), each once."""
        out: dict[str, ModelEntry] = {}

        def add(m: ModelEntry, chain: tuple[str, ...]) -> None:
            if m.name in chain:
                raise ValueError(f"registry: {m.name!r} needs itself ({' → '.join((*chain, m.name))})")
            for n in m.needs:
                add(self.get(n), (*chain, m.name))
            out.setdefault(m.name, m)

        for m in entries:
            add(m, ())
        return list(out.values())

    def uncovered(self) -> list[Coverage]:
        """Coverage items no model stands for (empty for a complete corpus)."""
        have = {c for m in self.models for c in m.covers}
        return [c for c in Coverage if c not in have]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "description": self.description,
            "models": [m.to_dict() for m in self.models],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Registry:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"registry schema_version {d.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        models = tuple(ModelEntry.from_dict(m) for m in d["models"])
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError("registry: duplicate model names")
        unknown = sorted({n for m in models for n in m.needs} - set(names))
        if unknown:
            raise ValueError(f"registry: needs names no model: {', '.join(unknown)}")
        return cls(models=models, schema_version=SCHEMA_VERSION, description=d.get("description", ""))


def load_registry(path: Path = REGISTRY_JSON) -> Registry:
    """The corpus registry (``registry.json`` beside this module unless told otherwise)."""
    return Registry.from_dict(json.loads(path.read_text(encoding="utf-8")))


def cache_dir() -> Path:
    """Where the models and their data live: ``$QDEBUG_CORPUS_DIR`` or ``~/.cache/qdebug/realmodels``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def model_dir(entry: ModelEntry) -> Path:
    return cache_dir() / entry.name


def model_path(entry: ModelEntry) -> Path:
    """The cached ``.onnx`` of ``entry`` (it may not exist yet: see fetch.py)."""
    return model_dir(entry) / f"{entry.name}.onnx"


def calib_path(entry: ModelEntry) -> Path:
    return model_dir(entry) / "calib.npz"


def eval_path(entry: ModelEntry) -> Path:
    return model_dir(entry) / "eval.npz"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_cached(entry: ModelEntry) -> bool:
    """True when the cached file exists with the registry's size and sha256."""
    p = model_path(entry)
    return p.is_file() and p.stat().st_size == entry.size and sha256_of(p) == entry.sha256


@dataclass(frozen=True)
class ModelFacts:
    """What ``onnx`` says about a model file (compared with the registry by smoke.py)."""

    nodes: int
    opset: int
    ir_version: int
    producer: str
    inputs: dict[str, tuple[str, tuple[int | str, ...]]] = field(default_factory=dict)


def measure(path: Path) -> ModelFacts:
    """Node count, default-domain opset, IR version, producer and declared inputs of an ONNX file."""
    import onnx  # heavy; only the measuring paths need it

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    inputs: dict[str, tuple[str, tuple[int | str, ...]]] = {}
    for v in m.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        dims = tuple(d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in t.shape.dim)
        inputs[v.name] = (onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, dims)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)
    producer = f"{m.producer_name} {m.producer_version}".strip()
    return ModelFacts(len(m.graph.node), opset, m.ir_version, producer, inputs)


def main() -> int:
    """Print the coverage (item → models), licences and the CI subset; exit 1 when an item has no model."""
    reg = load_registry()
    for item in Coverage:
        names = [m.name for m in reg.models if item in m.covers]
        print(f"{item:24} {', '.join(names) or 'NONE'}")
    print()
    for m in reg.models:
        print(f"{m.name:16} {m.corpus_set:5} {m.requirement:44} {m.licence}")
    ci = reg.select(ci=True)
    ci_mb = sum(m.size for m in ci) / 1e6
    ci_wheels = sum({m.wheel: m.wheel_size for m in ci}.values()) / 1e6
    print(f"\nCI subset: {', '.join(m.name for m in ci)} ({ci_mb:.1f} MB of models, {ci_wheels:.1f} MB of wheels)")
    return 1 if reg.uncovered() else 0


if __name__ == "__main__":
    raise SystemExit(main())
