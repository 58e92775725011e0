"""A promotion of a QDQ model the user gave is a patch of that model (issue 38): patching nothing gives the model
back byte for byte (identical outputs), promoting one tensor changes only that tensor's Q/DQ pair (every other node
and initializer byte-identical, its 8-bit levels kept on the 16-bit grid), the session measures promotions that way,
and the recipe the dashboard downloads rebuilds the same model through ``qdebug quantize --quant-model``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE_MODELS
from onnx import numpy_helper

from qdebug.config import QuantConfig, make_overrides
from qdebug.debugger import DebugOptions
from qdebug.errors import ConfigError
from qdebug.mixed.overrides import OverridesFile
from qdebug.mixed.patch import QParams, patch_model, recipe_overrides, widened
from qdebug.mixed.session import MixedPrecisionSession
from qdebug.model_io import file_sha256, is_q
from qdebug.quantizer import quantize

FLOAT = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
OPTIONS = DebugOptions(num_samples=8, ignore_data_keys=("label",))


@pytest.fixture(scope="module")
def given(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's model: int8 per-channel weights (not qdebug's default), uint8 activations."""
    out = tmp_path_factory.mktemp("patch") / "user.qdq.onnx"
    cfg = QuantConfig(weight_type="int8", per_channel=True, num_samples=32)
    return Path(quantize(FLOAT, CALIB, cfg, out, check=False).model_path)


def _outputs(model: onnx.ModelProto | Path, n: int = 8) -> list[np.ndarray]:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.load(CALIB)["input"][:n]
    return [sess.run(None, {"input": xi})[0] for xi in x]


def _activations(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [n.input[0] for n in model.graph.node if is_q(n) and n.input[0] not in inits]


def test_patching_nothing_is_the_model_itself(given: Path) -> None:
    m = onnx.load(str(given))
    r = patch_model(m, ())
    assert r.patches == () and r.model.SerializeToString() == m.SerializeToString()
    for a, b in zip(_outputs(r.model), _outputs(given), strict=True):
        np.testing.assert_array_equal(a, b)
    assert "nothing changed" in r.describe()


def test_promoting_one_tensor_changes_only_its_pair(given: Path) -> None:
    m = onnx.load(str(given))
    t = _activations(m)[2]
    r = patch_model(m, make_overrides({t: [{"quant_type": "uint16"}]}))
    (p,) = r.patches
    assert p.tensor == t and p.before.quant_type == "uint8" and p.after.quant_type == "uint16"
    # the same range, every 8-bit level a 16-bit level
    assert p.after.range == pytest.approx(p.before.range, rel=1e-6)
    assert p.after.scale * 257 == pytest.approx(p.before.scale) and p.after.zero_point == p.before.zero_point * 257
    q_out = next(n.output[0] for n in m.graph.node if is_q(n) and n.input[0] == t)
    touched = {q_out} | {n.output[0] for n in m.graph.node if n.input and n.input[0] == q_out}
    old = {n.output[0]: n for n in m.graph.node}
    new = {n.output[0]: n for n in r.model.graph.node}
    assert old.keys() == new.keys()
    changed = {k for k in old if old[k].SerializeToString() != new[k].SerializeToString()}
    assert changed == touched  # the Q and its DQ nodes, nothing else
    for k in touched:
        assert new[k].domain == "com.microsoft"  # opset 17: ORT's 16-bit Q/DQ
        assert list(new[k].input[1:]) != list(old[k].input[1:])
    old_inits = {i.name: i.SerializeToString() for i in m.graph.initializer}
    new_inits = {i.name: i.SerializeToString() for i in r.model.graph.initializer}
    assert {k: new_inits[k] for k in old_inits} == old_inits  # every initializer kept as it was (shared ones too)
    zp = numpy_helper.to_array(next(i for i in r.model.graph.initializer if i.name == new[q_out].input[2]))
    assert zp.dtype == np.uint16 and m == onnx.load(str(given))  # the input proto was not modified
    _outputs(r.model)  # it runs


def test_widening_keeps_the_grid() -> None:
    assert widened(QParams(0.02, 0, "int8"), "int16") == QParams(0.02 * 128 / 32768, 0, "int16")
    w = widened(QParams(0.02, 37, "uint8"), "uint16")
    assert (w.zero_point, w.scale) == (37 * 257, pytest.approx(0.02 / 257))


def test_a_tensor_without_q_is_refused(given: Path) -> None:
    with pytest.raises(ConfigError, match="no QuantizeLinear on it"):
        patch_model(onnx.load(str(given)), make_overrides({"nope": [{"quant_type": "uint16"}]}))


@pytest.fixture(scope="module")
def session(given: Path, tmp_path_factory: pytest.TempPathFactory) -> MixedPrecisionSession:
    work = tmp_path_factory.mktemp("patch_session")
    return MixedPrecisionSession(
        FLOAT, CALIB, QuantConfig(), debug_data=CALIB, debug_options=OPTIONS, workdir=work, quant_model=given
    )


def test_session_promoting_nothing_reproduces_the_users_model(session: MixedPrecisionSession, given: Path) -> None:
    ev = session.evaluate(session.base_config, name="nothing")
    assert file_sha256(ev.quantization.model_path) == file_sha256(given)
    assert ev.output_sqnr_db == session.base.report.min_output_sqnr_db
    assert session.last_patch is not None and session.last_patch.patches == ()


def test_session_promotion_is_a_patch_and_the_recipe_rebuilds_it(
    session: MixedPrecisionSession, given: Path, tmp_path: Path, run_cli
) -> None:
    worst = min(session.base.report.activations, key=lambda a: a.local_sqnr_db or float("inf"))
    plan = session.promote([worst.tensor_name])
    ev = session.evaluate(plan, name="one")
    done = session.last_patch
    assert done is not None and worst.tensor_name in {p.tensor for p in done.patches}
    # every promoted tensor re-gridded, but one the user's model keeps in float (it stays float)
    assert {p.tensor for p in done.patches if p.after != p.before} == set(plan.promoted) - set(done.skipped)
    assert set(done.skipped) <= set(plan.promoted) and worst.tensor_name not in done.skipped
    before = [d.before_db for d in ev.comparison.outputs if d.before_db is not None]  # type: ignore[union-attr]
    assert min(before) == pytest.approx(session.base.report.min_output_sqnr_db)
    # the recipe: the patches' exact parameters, for the user's QDQ model
    ofile = OverridesFile(
        recipe_overrides(done.patches),
        model_sha256=file_sha256(FLOAT),
        base_config=session.base_config,
        quant_model_sha256=file_sha256(given),
    )
    recipe = ofile.save(tmp_path / "recipe.json")
    assert json.loads(recipe.read_text())["quant_model_sha256"] == file_sha256(given)
    out = tmp_path / "rebuilt.qdq.onnx"
    r = run_cli("quantize", "-m", FLOAT, "--quant-model", given, "--overrides", recipe, "-o", out)
    assert r.code == 0, r.stderr
    assert out.read_bytes() == Path(ev.quantization.model_path).read_bytes()
    for a, b in zip(_outputs(out), _outputs(Path(ev.quantization.model_path)), strict=True):
        np.testing.assert_array_equal(a, b)
    # a recipe for another QDQ model is refused, naming the file
    other = tmp_path / "other.json"
    OverridesFile(ofile.overrides, ofile.model_sha256, ofile.base_config, quant_model_sha256="0" * 64).save(other)
    r = run_cli("quantize", "-m", FLOAT, "--quant-model", given, "--overrides", other, "-o", tmp_path / "x.onnx")
    assert r.code != 0 and "another quantized model" in r.stderr and not (tmp_path / "x.onnx").exists()


def test_the_plan_leaves_out_what_your_model_keeps_in_float(session: MixedPrecisionSession) -> None:
    """A tensor the fixer adds that the user's model keeps in float is left out of the plan with a sentence, so the
    plan shown (and the suggestions) claim only what the patch does: it then skips nothing."""
    quantized = session.given_quantized
    assert all(s.tensor_name in quantized for s in session.suggest(None))
    plans = [session.promote([a.tensor_name]) for a in session.base.report.activations if a.tensor_name in quantized]
    plan = next(p for p in plans if p.float_in_model)  # digits: a BatchNormalization's or Add's output is float
    assert not set(plan.float_in_model) & quantized
    claimed = {*plan.promoted, *(c.tensor for c in plan.converts), *(t for t, _ in plan.overrides)}
    assert claimed <= quantized and not claimed & set(plan.float_in_model)
    text = plan.describe()
    assert f"left out: {plan.float_in_model[0]}" in text and "float in your model" in text
    assert plan.to_dict()["float_in_model"] == list(plan.float_in_model)
    session.evaluate(plan, name="float_left_out")
    done = session.last_patch
    assert done is not None and done.skipped == () and "not quantized in your model" not in done.describe()
    assert {p.tensor for p in done.patches} == {*plan.promoted, *(c.tensor for c in plan.converts)}


def test_convert_range_round_trips_and_reaches_ort() -> None:
    ofile = OverridesFile.from_dict({
        "schema_version": 1,
        "tensor_quant_overrides": {
            "t": [{"quant_type": "QUInt16", "convert": {"quant_type": "QUInt8", "rmin": -1.0, "rmax": 2.5}}]
        },
    })  # fmt: skip
    (entry,) = dict(ofile.overrides)["t"]
    assert entry.convert is not None and (entry.convert.rmin, entry.convert.rmax) == (-1.0, 2.5)
    assert OverridesFile.from_json(ofile.to_json()) == ofile
    ort_conv = ofile.to_ort()["t"][0]["convert"]
    assert float(ort_conv["rmin"]) == -1.0 and ort_conv["rmax"].dtype == np.float32
    with pytest.raises(Exception, match="rmin and rmax must be given together"):
        OverridesFile.from_dict({"schema_version": 1, "tensor_quant_overrides": {
            "t": [{"quant_type": "QUInt16", "convert": {"quant_type": "QUInt8", "rmin": -1.0}}]}})  # fmt: skip


def test_quant_model_needs_overrides(given: Path, tmp_path: Path, run_cli) -> None:
    r = run_cli("quantize", "-f", FLOAT, "--quant-model", given, "-o", tmp_path / "x.onnx")
    assert r.code != 0 and "--quant-model needs --overrides" in r.stderr and not (tmp_path / "x.onnx").exists()


def test_compiled_files_zip(tmp_path: Path) -> None:
    import zipfile

    from widgets.session_steps import zip_folder

    assert zip_folder(tmp_path / "none", tmp_path / "a.zip") is None
    (tmp_path / "c" / "sub").mkdir(parents=True)
    (tmp_path / "c" / "model_ctx.onnx").write_bytes(b"ctx")
    (tmp_path / "c" / "sub" / "net.c").write_text("int main(){}")
    z = zip_folder(tmp_path / "c", tmp_path / "c.zip")
    assert z is not None and sorted(zipfile.ZipFile(z).namelist()) == ["model_ctx.onnx", "sub/net.c"]


def _weight_pairs(quant: Path) -> list:
    from qdebug.pairing import pair_models

    return [p for p in pair_models(onnx.load(str(FLOAT)), onnx.load(str(quant))).weights if p.kind == "weight"]


@pytest.fixture(scope="module")
def per_tensor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user model with per-tensor int8 weights: a per-channel remedy has work to do."""
    out = tmp_path_factory.mktemp("patch-pt") / "pt.qdq.onnx"
    cfg = QuantConfig(weight_type="int8", per_channel=False, num_samples=32)
    return Path(quantize(FLOAT, CALIB, cfg, out, check=False).model_path)


def test_per_channel_remedy_patches_one_weight(per_tensor: Path) -> None:
    from qdebug.mixed.patch_remedies import per_channel_weights

    m, fm = onnx.load(str(per_tensor)), onnx.load(str(FLOAT))
    pair = next(p for p in _weight_pairs(per_tensor) if p.consumer_op == "Conv")
    r = per_channel_weights(m, fm, [pair.weight_name])
    assert len(r.changes) == 1 and "per channel on axis 0" in r.changes[0]
    old = {n.output[0]: n.SerializeToString() for n in m.graph.node}
    new = {n.output[0]: n for n in r.model.graph.node}
    changed = {k for k in old if new[k].SerializeToString() != old[k]}
    assert changed == {next(n.output[0] for n in m.graph.node if n.name == pair.dq_node)}  # only its DQ
    dq = new[next(iter(changed))]
    w = numpy_helper.to_array(next(i for i in fm.graph.initializer if i.name == pair.weight_name))
    inits = {i.name: numpy_helper.to_array(i) for i in r.model.graph.initializer}
    scale, q = inits[dq.input[1]], inits[dq.input[0]]
    assert scale.shape == (w.shape[0],) and q.dtype == np.int8
    deq = (q.astype(np.float32) * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
    old_inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    old_dq = next(n for n in m.graph.node if n.name == pair.dq_node)
    old_deq = old_inits[old_dq.input[0]].astype(np.float32) * old_inits[old_dq.input[1]]
    assert np.abs(deq - w).max() <= np.abs(old_deq - w).max()  # per channel is at least as close
    assert per_channel_weights(r.model, fm, [pair.weight_name]).changes == ()  # per channel already: nothing to do
    _outputs(r.model)


def test_float_fallback_remedy_runs_the_node_in_float(per_tensor: Path) -> None:
    from qdebug.mixed.patch_remedies import keep_in_float

    m, fm = onnx.load(str(per_tensor)), onnx.load(str(FLOAT))
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")  # feeds the graph output through its Q/DQ pair
    r = keep_in_float(m, fm, [gemm.name])
    node = next(n for n in r.model.graph.node if n.name == gemm.name)
    floats = {i.name for i in fm.graph.initializer}
    assert any(i in floats for i in node.input)  # its weight is the float model's again
    assert node.output[0] == r.model.graph.output[0].name  # it writes the graph output itself, no Q/DQ after it
    assert not any(n.input and n.input[0] == node.output[0] and is_q(n) for n in r.model.graph.node)
    out_f = ort.InferenceSession(str(FLOAT)).run(None, {"input": np.load(CALIB)["input"][0]})[0]
    a, b = _outputs(r.model, 1)[0], _outputs(m, 1)[0]
    assert np.abs(a - out_f).mean() <= np.abs(b - out_f).mean()
    with pytest.raises(ConfigError, match="no node of that name"):
        keep_in_float(m, fm, ["nope"])


def test_remedy_recipe_rebuilds_through_the_cli(per_tensor: Path, tmp_path: Path, run_cli) -> None:
    from qdebug.mixed.given import read_recipe
    from qdebug.mixed.patch_remedies import channel_axis, keep_in_float, per_channel_weights
    from qdebug.mixed.recipe import patch_recipe

    m, fm = onnx.load(str(per_tensor)), onnx.load(str(FLOAT))
    w = next(p for p in _weight_pairs(per_tensor) if p.consumer_op == "Conv").weight_name
    gemm = next(n.name for n in m.graph.node if n.op_type == "Gemm")
    made = keep_in_float(per_channel_weights(m, fm, [w]).model, fm, [gemm]).model
    ofile = patch_recipe((), read_recipe(m).config, per_channel={w: channel_axis(fm, w)}, float_nodes=[gemm],
                         model_sha256=file_sha256(FLOAT), quant_model_sha256=file_sha256(per_tensor))  # fmt: skip
    recipe = ofile.save(tmp_path / "r.json")
    out = tmp_path / "rebuilt.onnx"
    r = run_cli("quantize", "-f", FLOAT, "--quant-model", per_tensor, "--overrides", recipe, "-o", out)
    assert r.code == 0, r.stderr
    assert "per channel" in r.out + r.stdout and "runs in float" in r.out + r.stdout
    for a, b in zip(_outputs(out), _outputs(made), strict=True):
        np.testing.assert_array_equal(a, b)
