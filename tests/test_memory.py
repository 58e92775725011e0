"""Bounded memory: the capture phase's peak does not grow with the number of samples.

tracemalloc sees numpy's allocations (inputs, copies, reductions) but not the output buffers ONNX
Runtime allocates itself, so the process RSS is also sampled after every sample through the public
``progress`` hook: keeping each sample's tensors alive would add ~8 MiB per sample.
"""

from __future__ import annotations

import tracemalloc

import builders
import onnx
import pytest
from conftest import save

from qdebug.capture import capture
from qdebug.capture.tuning import CaptureTuning
from qdebug.config import QuantConfig
from qdebug.data import SyntheticData
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models
from qdebug.quantizer import quantize

MIB = 1 << 20


@pytest.fixture(scope="module")
def big_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    root = tmp_path_factory.mktemp("memory")
    f = save(builders.big_activations(), root / "big.onnx")  # x, m, s, y: 1 MiB each per sample
    q = root / "big.qdq.onnx"
    quantize(f, None, QuantConfig(num_samples=2), q)
    return onnx.load(str(f)), onnx.load(str(q))


def _capture_peak(fm: onnx.ModelProto, qm: onnx.ModelProto, n: int, path: str) -> tuple[int, int]:
    pairing = pair_models(fm, qm)
    source = SyntheticData(input_specs(fm), n, seed=0)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = capture(fm, qm, pairing, source, path=path, batch=None if path == "auto" else 1)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert result.num_samples == n
    assert result.per_sample.shape == (n, len(pairing.activations))
    return peak, len(pairing.activations)


@pytest.mark.parametrize("path", ["graph", "fetch", "compiled"])
def test_capture_peak_memory_does_not_grow_with_samples(big_pair, path: str) -> None:
    fm, qm = big_pair
    peak4, n_acts = _capture_peak(fm, qm, 4, path)
    peak64, _ = _capture_peak(fm, qm, 64, path)
    assert n_acts >= 3  # x, the Mul/Add outputs, y (ORT may fold the Relu into the Q)
    # tracemalloc does see the numpy side: at least one sample's 1 MiB input was traced.
    assert peak4 > 1 * MIB, peak4
    # Keeping every sample's tensors (ORT's recipe) would make this ~16×; streaming keeps it flat.
    assert peak64 < 1.5 * peak4, (peak4 / MIB, peak64 / MIB)


def test_auto_capture_memory_is_bounded_by_its_batch(big_pair) -> None:
    """``auto`` batches this model (its input has a batch axis): a batch's tensors at once, capped by the tuning's
    bytes per batch, and then flat — more samples mean more batches, not larger ones."""
    fm, qm = big_pair
    peak64, _ = _capture_peak(fm, qm, 64, "auto")
    peak192, _ = _capture_peak(fm, qm, 192, "auto")
    assert peak64 < 1.5 * CaptureTuning().batch_bytes, peak64 / MIB
    assert peak192 < 1.2 * peak64, (peak64 / MIB, peak192 / MIB)


def _rss_during(fm: onnx.ModelProto, qm: onnx.ModelProto, n: int, path: str, seed: int) -> list[int]:
    psutil = pytest.importorskip("psutil")
    proc, pairing = psutil.Process(), pair_models(fm, qm)
    rss: list[int] = []
    capture(fm, qm, pairing, SyntheticData(input_specs(fm), n, seed=seed), path=path,
            batch=None if path == "auto" else 1, progress=lambda i, n: rss.append(proc.memory_info().rss))  # fmt: skip
    assert len(rss) == n
    return rss


@pytest.mark.parametrize("path", ["graph", "fetch", "compiled"])
def test_capture_rss_does_not_grow_with_samples(big_pair, path: str) -> None:
    fm, qm = big_pair
    _rss_during(fm, qm, 2, path, seed=1)  # warm up ORT's arenas
    rss = _rss_during(fm, qm, 64, path, seed=2)
    growth = max(rss) - rss[0]
    # Retaining the tensors of 63 more samples would add ~500 MiB; allow allocator noise only.
    assert growth < 32 * MIB, growth / MIB


def test_auto_capture_rss_is_flat_beyond_its_batch(big_pair) -> None:
    """``auto``'s batches hold a batch's tensors (bounded by the tuning), so its RSS reaches its level within the
    first batches and stays there: 256 samples take no more than 64 beyond allocator noise (retaining the tensors
    of 192 more samples would add 1.5 GiB)."""
    fm, qm = big_pair
    _rss_during(fm, qm, 64, "auto", seed=1)  # warm up ORT's arenas at the batch's shapes
    at64 = max(_rss_during(fm, qm, 64, "auto", seed=2))
    at256 = max(_rss_during(fm, qm, 256, "auto", seed=3))
    assert at256 - at64 < 64 * MIB, (at64 / MIB, at256 / MIB)
