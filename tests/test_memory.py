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


def _capture_peak(fm: onnx.ModelProto, qm: onnx.ModelProto, n: int) -> tuple[int, int]:
    pairing = pair_models(fm, qm)
    source = SyntheticData(input_specs(fm), n, seed=0)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = capture(fm, qm, pairing, source)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert result.num_samples == n
    assert result.per_sample.shape == (n, len(pairing.activations))
    return peak, len(pairing.activations)


def test_capture_peak_memory_does_not_grow_with_samples(big_pair) -> None:
    fm, qm = big_pair
    peak4, n_acts = _capture_peak(fm, qm, 4)
    peak64, _ = _capture_peak(fm, qm, 64)
    assert n_acts >= 3  # x, the Mul/Add outputs, y (ORT may fold the Relu into the Q)
    # tracemalloc does see the numpy side: at least one sample's 1 MiB input was traced.
    assert peak4 > 1 * MIB, peak4
    # Keeping every sample's tensors (ORT's recipe) would make this ~16×; streaming keeps it flat.
    assert peak64 < 1.5 * peak4, (peak4 / MIB, peak64 / MIB)


def test_capture_rss_does_not_grow_with_samples(big_pair) -> None:
    psutil = pytest.importorskip("psutil")
    fm, qm = big_pair
    proc = psutil.Process()
    pairing = pair_models(fm, qm)
    capture(fm, qm, pairing, SyntheticData(input_specs(fm), 2, seed=1))  # warm up ORT's arenas
    rss: list[int] = []
    capture(fm, qm, pairing, SyntheticData(input_specs(fm), 64, seed=2),
            progress=lambda i, n: rss.append(proc.memory_info().rss))  # fmt: skip
    assert len(rss) == 64
    growth = max(rss) - rss[0]
    # Retaining the tensors of 63 more samples would add ~500 MiB; allow allocator noise only.
    assert growth < 32 * MIB, growth / MIB
