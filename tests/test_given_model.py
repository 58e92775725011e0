"""A QDQ model the user gave stays the model under comparison (issue 15, item 6): its settings and calibration
ranges are read from its Q/DQ parameters, re-quantizing with them reproduces it, and a promotion is measured
against it — on a model with int8 per-channel symmetric weights and uint8 activations, which qdebug's defaults
(uint8 per-tensor weights) would not reproduce."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SAMPLE_MODELS
from onnx import numpy_helper

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions
from qdebug.errors import ModelError
from qdebug.mixed.given import range_of, read_recipe
from qdebug.mixed.session import MixedPrecisionSession
from qdebug.model_io import is_q
from qdebug.quantizer import quantize

FLOAT = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
#: The user's recipe: what qdebug's default (uint8 per-tensor weights) is not.
USER = QuantConfig(weight_type="int8", per_channel=True, num_samples=32)
OPTIONS = DebugOptions(num_samples=8, ignore_data_keys=("label",))


def _act_params(path: str | Path) -> dict[str, tuple[float, int]]:
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return {
        n.input[0]: (float(inits[n.input[1]]), int(inits[n.input[2]]))
        for n in m.graph.node
        if is_q(n) and n.input[0] not in inits
    }


@pytest.fixture(scope="module")
def given(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("given") / "user.qdq.onnx"
    return Path(quantize(FLOAT, CALIB, USER, out, check=False).model_path)


def test_recipe_reads_the_models_settings(given: Path) -> None:
    r = read_recipe(given)
    c = r.config
    assert (c.activation_type, c.weight_type, c.per_channel, c.activation_symmetric, c.weight_symmetric) == (
        "uint8",
        "int8",
        True,
        False,
        True,
    )
    assert set(_act_params(given)) <= set(r.ranges)


@pytest.mark.parametrize(("scale", "zp", "qtype", "sym"), [(0.02, 37, "uint8", False), (0.5, 0, "int8", True)])
def test_range_maps_back_to_the_same_grid(scale: float, zp: int, qtype: str, sym: bool) -> None:
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    lo, hi = range_of(scale, zp, qtype, sym)
    qmin, qmax = {"uint8": (np.uint8(0), np.uint8(255)), "int8": (np.int8(-128), np.int8(127))}[qtype]
    z, s = compute_scale_zp(np.float32(lo), np.float32(hi), qmin, qmax, symmetric=sym)
    assert float(s) == pytest.approx(scale, rel=1e-6)
    assert int(z) == zp


def test_float_model_has_no_recipe() -> None:
    with pytest.raises(ModelError, match="no QuantizeLinear"):
        read_recipe(FLOAT)


def test_session_keeps_the_given_model_as_base(given: Path, tmp_path: Path) -> None:
    s = MixedPrecisionSession(
        FLOAT, CALIB, QuantConfig(), debug_data=CALIB, debug_options=OPTIONS, workdir=tmp_path, quant_model=given
    )
    seen: list[str] = []
    s.progress = lambda done, total, msg: seen.append(msg)
    assert s.base_config.weight_type == "int8" and s.base_config.per_channel
    base = s.base
    assert Path(base.quantization.model_path) == given  # "before" is the user's model, not a re-quantization
    # Re-quantizing with the read settings and ranges reproduces the user's activation grid exactly …
    again = s.evaluate(s.base_config, name="again")
    mine, theirs = _act_params(again.quantization.model_path), _act_params(given)
    assert mine.keys() == theirs.keys()
    for name, (scale, zp) in theirs.items():
        assert mine[name][1] == zp, name
        assert mine[name][0] == pytest.approx(scale, rel=1e-6), name
    assert again.output_sqnr_db == pytest.approx(base.report.min_output_sqnr_db, abs=0.05)
    # … so a promotion is measured against the user's model and changes only what it promotes.
    worst = min(base.report.activations, key=lambda a: a.local_sqnr_db or float("inf"))
    ev = s.apply(s.promote([worst.tensor_name]))
    assert ev.comparison is not None
    before = [d.before_db for d in ev.comparison.outputs if d.before_db is not None]
    assert min(before) == pytest.approx(base.report.min_output_sqnr_db)
    assert any("debugging sample" in m for m in seen) and any("re-quantizing" in m for m in seen)
    assert given.is_file()  # the user's file is only read
