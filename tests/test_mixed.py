"""Mixed precision end to end on real ONNX Runtime: suggest → promote → re-quantize → compare → search.

One module-scoped :class:`MixedPrecisionSession` on the digits transformer (uint8/uint8, MinMax, 128
calibration samples, debug on 64 held-out samples, top-1 on the 540-sample eval set) is shared by most tests,
so the base is quantized and debugged once. Suggestion roles are checked on a purpose-built chain whose damage
is known because the test puts it there.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import builders
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLE_MODELS, tree_hashes
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig, TensorOverride
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError
from qdebug.mixed.compare import Comparison
from qdebug.mixed.promote import PromotionPlan, promote
from qdebug.mixed.search import SearchGoal, SearchResult, search
from qdebug.mixed.session import Evaluation, MixedPrecisionSession
from qdebug.mixed.suggest import Role, Suggestion, analyse, suggest
from qdebug.quantizer import quantize
from qdebug.report import DebugReport

TRANSFORMER = SAMPLE_MODELS / "digits_transformer.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
EVAL = SAMPLE_MODELS / "digits_eval.npz"
BASE_CONFIG = QuantConfig(num_samples=128)  # uint8/uint8, MinMax, every calibration sample
DEBUG_OPTIONS = DebugOptions(ignore_data_keys=("label",), num_samples=64)
TOP = 8
# Measured (ORT 1.31.1, debug on 64 eval samples): base 30.09 dB → top-8 promoted 31.45 dB = +1.36 dB at the
# output. (Prefix search to base + 2 dB: 32.11 dB with 10 tensors, 8 re-quantizations.)
MIN_TOP8_GAIN_DB = 0.5


# --------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> MixedPrecisionSession:
    """The shared transformer session (base quantized and debugged on first use)."""
    return MixedPrecisionSession(
        TRANSFORMER,
        CALIB,
        BASE_CONFIG,
        debug_data=EVAL,
        eval_data=EVAL,
        debug_options=DEBUG_OPTIONS,
        workdir=tmp_path_factory.mktemp("mixed"),
    )


@pytest.fixture(scope="module")
def top8(session: MixedPrecisionSession) -> tuple[PromotionPlan, Evaluation]:
    """The top-8 suggestions promoted to uint16, re-quantized and measured."""
    plan = session.promote([s.tensor_name for s in session.suggest(TOP)])
    return plan, session.evaluate(plan, name="top8")


def _chain(seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    """x[1,16] → MatMul(W1) → h → Mul(0.37) → g → MatMul(W2) → m → Add(b) → y, and 64 inputs."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.5).astype(np.float32), "W1"),
        numpy_helper.from_array(np.array(0.37, np.float32), "s"),
        numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.5).astype(np.float32), "W2"),
        numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Mul", ["h", "s"], ["g"], name="mul"),
        helper.make_node("MatMul", ["g", "W2"], ["m"], name="mm2"),
        helper.make_node("Add", ["m", "b"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = rng.standard_normal((64, 1, 16)).astype(np.float32)
    return model, x


def _float_values(model: onnx.ModelProto, x: np.ndarray, tensor: str) -> np.ndarray:
    """One intermediate tensor of the float model over all samples (the tensor exposed as an output)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run([tensor], {"x": xi})[0] for xi in x])


def _chain_report(tmp_path: Path, damaged: str | None) -> DebugReport:
    """Quantize the chain (uint8) with ``damaged``'s range made 100× too wide, and debug it."""
    model, x = _chain()
    f = tmp_path / "chain.onnx"
    onnx.save(model, str(f))
    overrides: dict[str, list[TensorOverride]] = {}
    if damaged is not None:
        overrides = _damage(model, x, damaged)
    q = quantize(f, {"x": x}, QuantConfig(num_samples=64, tensor_overrides=overrides), tmp_path / "chain.qdq.onnx")
    return debug(f, q.model_path, {"x": x})


def _damage(model: onnx.ModelProto, x: np.ndarray, tensor: str) -> dict[str, list[TensorOverride]]:
    """An override making ``tensor``'s range 100× too wide (its 8-bit step 100× too coarse: ~40 dB lost)."""
    v = _float_values(model, x, tensor)
    return {tensor: [TensorOverride(rmin=float(100 * v.min()), rmax=float(100 * v.max()))]}


def _plain(ort_overrides: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """ORT's override dict with QuantType members as names and recv_nodes as sorted lists (comparable)."""

    def conv(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, set | frozenset):
            return sorted(v)
        return getattr(v, "name", v)

    return {t: [conv(e) for e in es] for t, es in ort_overrides.items()}


# --------------------------------------------------------------------------------------------- suggest


def test_suggest_is_deterministic_and_survives_json(session: MixedPrecisionSession) -> None:
    report = session.base.report
    first, second = suggest(report, top=None), suggest(report, top=None)
    assert first == second
    assert len(first) >= TOP
    reloaded = DebugReport.from_json(report.to_json())
    assert suggest(reloaded, top=None) == first
    assert analyse(reloaded) == analyse(report)
    assert session.suggest(TOP) == first[:TOP]


def test_ranks_roles_and_candidates(session: MixedPrecisionSession, top8: tuple[PromotionPlan, Evaluation]) -> None:
    roles = {r.value for r in Role}
    for report in (session.base.report, top8[1].report):
        ranked = analyse(report)
        assert [s.rank for s in ranked] == list(range(1, len(ranked) + 1))
        assert {s.role for s in ranked} <= roles
        for s in ranked:
            a = report.activation(s.tensor_name)
            assert a.quantized and a.quant_type == "uint8", s
            assert s.reason.startswith(s.role)
        chosen = suggest(report, top=None)
        assert [s.rank for s in chosen] == list(range(1, len(chosen) + 1))
        assert {s.role for s in chosen} == {Role.ORIGINATOR.value}
    # Once promoted, a tensor is no longer a candidate (it is 16-bit in the new report).
    after = {s.tensor_name for s in analyse(top8[1].report)}
    assert not after & set(top8[0].promoted)
    assert {top8[1].report.activation(t).quant_type for t in top8[0].promoted} == {"uint16"}


@pytest.mark.parametrize(("damaged", "downstream"), [("h", ("g", "m", "y")), ("m", ("y",))])
def test_damaged_tensor_is_the_originator(tmp_path: Path, damaged: str, downstream: tuple[str, ...]) -> None:
    clean = _chain_report(tmp_path, None)
    report = _chain_report(tmp_path, damaged)
    # The override really did the damage: ~40 dB (100× the step) lost at that tensor's own rounding.
    lost = clean.activation(damaged).local_sqnr_db - report.activation(damaged).local_sqnr_db  # type: ignore[operator]
    assert lost > 30.0
    ranked = analyse(report)
    by_name = {s.tensor_name: s for s in ranked}
    assert ranked[0].tensor_name == damaged
    assert ranked[0].role == Role.ORIGINATOR.value
    assert suggest(report, top=1)[0].tensor_name == damaged
    for t in downstream:
        a = report.activation(t)
        # High local SQNR, low cumulative: the damage came from upstream.
        assert a.local_sqnr_db is not None and a.cumulative_sqnr_db is not None
        assert a.local_sqnr_db > a.cumulative_sqnr_db + 15.0
        assert by_name[t].role == Role.INHERITOR.value, by_name[t].reason


# --------------------------------------------------------------------------------------------- promote


def test_plan_shows_requested_region_and_converts(top8: tuple[PromotionPlan, Evaluation]) -> None:
    plan, _ = top8
    assert len(plan.requested) == TOP
    assert set(plan.requested) <= set(plan.promoted)
    assert plan.added  # the fixer grows the region on this model (Add/LayerNorm need one type)
    assert set(plan.added) == set(plan.promoted) - set(plan.requested)
    assert plan.converts
    text = plan.describe()
    for t in plan.requested:
        assert f"  {t}: uint16  [requested]" in text
    for t in plan.added:
        assert f"  {t}: uint16  [region (fixer)]" in text
    for c in plan.converts:
        assert c.from_type != c.to_type and {c.from_type, c.to_type} == {"uint8", "uint16"}
        assert f"convert {c.tensor}: {c.from_type} -> {c.to_type}" in text
    assert json.loads(json.dumps(plan.to_dict()))["requested"] == list(plan.requested)


def test_promoted_model_runs_and_reports_types(
    session: MixedPrecisionSession, top8: tuple[PromotionPlan, Evaluation]
) -> None:
    plan, ev = top8
    sess = ort.InferenceSession(ev.quantization.model_path, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(TRANSFORMER), providers=["CPUExecutionProvider"])
    with np.load(EVAL) as z:
        xs = z["input"][:32]
    agree = 0
    for x in xs:
        (y,) = sess.run(None, {"input": x})
        (yf,) = ref.run(None, {"input": x})
        assert y.shape == (1, 10) and np.isfinite(y).all()
        agree += int(y.argmax() == yf.argmax())
    assert agree >= 30
    report = ev.report
    for t in plan.promoted:
        assert report.activation(t).quant_type == "uint16", t
    for c in plan.converts:
        a = report.activation(c.tensor)
        assert a.quant_type == c.from_type, c
        assert c.to_type in a.converted_to, (c, a.converted_to)


def test_plan_overrides_are_ort_fixer_output(top8: tuple[PromotionPlan, Evaluation]) -> None:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.execution_providers.qnn.mixed_precision_overrides_utils import (
        MixedPrecisionTensorQuantOverridesFixer,
    )
    from onnxruntime.quantization.tensor_quant_overrides import TensorQuantOverridesHelper

    plan, _ = top8
    helper_ = TensorQuantOverridesHelper({t: [{"quant_type": QuantType.QUInt16}] for t in plan.requested})
    fixer = MixedPrecisionTensorQuantOverridesFixer.create_from_model(helper_, onnx.load(TRANSFORMER), QuantType.QUInt8)
    fixer.apply(QuantType.QUInt8, False)
    assert _plain(plan.config.ort_overrides()) == _plain(helper_.get_dict())


def test_promote_bad_input(session: MixedPrecisionSession) -> None:
    session.base  # noqa: B018 - the base files exist before the snapshot
    before_files = tree_hashes(session.workdir)
    before_samples = tree_hashes(SAMPLE_MODELS)
    before_requant = session.requantizations
    weight = onnx.load(TRANSFORMER).graph.initializer[0].name
    real = "/embed/MatMul_output_0"
    typo = "/embed/MatMul_outpt_0"

    with pytest.raises(ConfigError) as exc:
        session.promote([typo])
    assert repr(typo) in str(exc.value) and "did you mean" in str(exc.value) and repr(real) in str(exc.value)

    with pytest.raises(ConfigError, match="weight") as exc:
        session.promote([weight])
    assert repr(weight) in str(exc.value)

    with pytest.raises(ConfigError) as exc:  # every problem at once, not the first one
        session.promote([typo, weight])
    assert repr(typo) in str(exc.value) and repr(weight) in str(exc.value)

    with pytest.raises(ConfigError, match=r"'qnn'.*int16"):
        promote(TRANSFORMER, [real], "int16", config=QuantConfig(target="qnn"))

    with pytest.raises(ConfigError, match="already uint8"):
        session.promote([real], "uint8")

    with pytest.raises(ConfigError, match="at least one tensor"):
        session.promote([])

    assert tree_hashes(session.workdir) == before_files
    assert tree_hashes(SAMPLE_MODELS) == before_samples
    assert session.requantizations == before_requant


def test_promote_keeps_range_overrides_of_the_base_config(tmp_path: Path) -> None:
    """A base config that overrides ranges: the fixer retypes/converts those tensors and the ranges survive."""
    model, x = _chain()
    f = tmp_path / "chain.onnx"
    onnx.save(model, str(f))
    damage = _damage(model, x, "h")
    base_cfg = QuantConfig(
        num_samples=64, tensor_overrides={**damage, "y": [TensorOverride(scale=0.05, zero_point=128)]}
    )
    s = MixedPrecisionSession(f, {"x": x}, base_cfg, workdir=tmp_path / "work")
    rmin, rmax = damage["h"][0].rmin, damage["h"][0].rmax
    assert s.suggest(1)[0].tensor_name == "h"

    fixed = s.promote(["h"])  # h joins a 16-bit region and keeps its (too wide) range
    h = fixed.config.overrides_dict["h"][0]
    assert (h.quant_type, h.rmin, h.rmax) == ("uint16", rmin, rmax)
    assert fixed.config.overrides_dict["y"] == base_cfg.overrides_dict["y"]
    assert QuantConfig.from_json(fixed.config.to_json()) == fixed.config  # plain numbers, not numpy arrays
    ev = s.evaluate(fixed)
    assert ev.report.activation("h").quant_type == "uint16"
    assert ev.report.activation("h").scale == pytest.approx((rmax - rmin) / 65535, rel=1e-6)  # type: ignore[operator]
    assert ev.comparison is not None and ev.comparison.min_output_delta_db is not None
    assert ev.comparison.min_output_delta_db > 20.0  # 16 bits give the coarse range its resolution back

    neighbour = s.promote(["g"])  # h stays 8-bit with its range and converts to 16 bits for the Mul
    h = neighbour.config.overrides_dict["h"][0]
    assert (h.quant_type, h.rmin, h.rmax) == ("uint8", rmin, rmax)
    assert h.convert is not None and h.convert.quant_type == "uint16"
    assert s.evaluate(neighbour).report.activation("h").converted_to == ("uint16",)

    # y's explicit scale/zero_point is an 8-bit encoding: moving y into a 16-bit region is refused, by name.
    with pytest.raises(ConfigError, match="'y' has an explicit scale/zero_point for uint8"):
        s.promote(["m"])


# --------------------------------------------------------------------------------------------- re-quantize


def test_requantize_reuses_calibration_and_loses_nothing(
    session: MixedPrecisionSession, top8: tuple[PromotionPlan, Evaluation], tmp_path: Path
) -> None:
    plan, ev = top8
    base_q = session.base.quantization
    assert not base_q.reused_calibration and base_q.calibration_seconds > 0
    assert ev.quantization.reused_calibration
    assert ev.quantization.calibration_seconds == 0
    assert ev.quantization.calibration_cache == base_q.calibration_cache
    produced = Path(ev.quantization.model_path).read_bytes()

    # The same plan.config and the cached ranges through the public quantize(): the same model.
    cached = quantize(
        TRANSFORMER, CALIB, plan.config, tmp_path / "cached.onnx", calibration_cache=base_q.calibration_cache
    )
    assert Path(cached.model_path).read_bytes() == produced

    # A fresh full quantization (calibrating again on the same data): the same ranges, hence the same model.
    fresh = quantize(TRANSFORMER, CALIB, plan.config, tmp_path / "fresh.onnx")
    assert not fresh.reused_calibration and fresh.calibration_seconds > 0
    assert json.loads(Path(fresh.calibration_cache).read_text()) == json.loads(
        Path(base_q.calibration_cache).read_text()
    )
    assert Path(fresh.model_path).read_bytes() == produced


def test_a_variant_reuses_the_weights_it_did_not_change(
    session: MixedPrecisionSession, top8: tuple[PromotionPlan, Evaluation]
) -> None:
    """The session's debug passes share a :class:`~qdebug.debugger.WeightCache`: a promotion re-quantizes activations
    (and the biases whose input scale moved), so most weights are not measured again, and every result is the one
    a plain debug pass of the variant gives."""
    _, ev = top8
    assert session.weights.hits > 0
    plain = debug(session.float_path, ev.quantization.model_path, EVAL, DEBUG_OPTIONS)
    assert ev.report.weights == plain.weights


# --------------------------------------------------------------------------------------------- before/after


def test_comparison_deltas_accuracy_and_json(
    session: MixedPrecisionSession, top8: tuple[PromotionPlan, Evaluation]
) -> None:
    _, ev = top8
    base = session.base.report
    cmp = ev.comparison
    assert cmp is not None
    assert [d.name for d in cmp.outputs] == [o.output_name for o in base.model_outputs]
    for d in cmp.outputs:
        assert d.before_db == base.output(d.name).cumulative_sqnr_db
        assert d.after_db == ev.report.output(d.name).cumulative_sqnr_db
        assert d.delta_db == pytest.approx(d.after_db - d.before_db)  # type: ignore[operator]
    assert cmp.min_output_delta_db == pytest.approx(ev.output_sqnr_db - session.base.output_sqnr_db)  # type: ignore[operator]
    assert len(cmp.cumulative) == len(base.activations)
    finite = 0
    for kind, attr in ((cmp.cumulative, "cumulative_sqnr_db"), (cmp.local, "local_sqnr_db")):
        for d in kind:
            b, a = getattr(base.activation(d.name), attr), getattr(ev.report.activation(d.name), attr)
            assert (d.before_db, d.after_db) == (b, a)
            if b is not None and a is not None and math.isfinite(a) and math.isfinite(b):
                assert d.delta_db == pytest.approx(a - b)
                finite += 1
            else:
                assert d.delta_db is None
    assert finite > 50

    acc = cmp.accuracy
    assert acc is not None and acc.num_samples == 540
    assert (
        acc.float_model == session.float_accuracy and acc.base == session.base.accuracy and acc.changed == ev.accuracy
    )
    assert all(0.9 < v <= 1.0 for v in (acc.float_model, acc.base, acc.changed))
    assert acc.drop_changed == pytest.approx(acc.float_model - acc.changed)

    text = cmp.to_json()
    assert Comparison.from_dict(json.loads(text)) == cmp
    assert json.loads(text)["schema_version"] == 1

    df = cmp.to_dataframe()
    assert list(df.columns) == [
        "tensor_name", "type_before", "type_after", "cumulative_before_db", "cumulative_after_db",
        "cumulative_delta_db", "local_before_db", "local_after_db", "local_delta_db",
    ]  # fmt: skip
    assert len(df) == len(cmp.cumulative)
    promoted = df[df.type_after == "uint16"].tensor_name
    assert set(promoted) >= set(top8[0].requested)


def test_recorded_gain_of_top8(session: MixedPrecisionSession, top8: tuple[PromotionPlan, Evaluation]) -> None:
    base_db, after_db = session.base.output_sqnr_db, top8[1].output_sqnr_db
    assert base_db is not None and after_db is not None
    gain = after_db - base_db
    print(f"\ntop-{TOP} promotion: output SQNR {base_db:.2f} dB -> {after_db:.2f} dB (gain {gain:+.2f} dB)")
    assert gain >= MIN_TOP8_GAIN_DB


# --------------------------------------------------------------------------------------------- search


@pytest.fixture(scope="module")
def prefix_result(session: MixedPrecisionSession) -> SearchResult:
    """The prefix search to base + 2 dB (max_steps high enough for a full bisection)."""
    goal = session.base.output_sqnr_db + 2.0  # type: ignore[operator]
    return search(session, SearchGoal(output_sqnr_db=goal, max_steps=16))


def test_prefix_search_reaches_a_goal_the_base_misses(
    session: MixedPrecisionSession, prefix_result: SearchResult
) -> None:
    r = prefix_result
    goal = r.goal.output_sqnr_db
    assert goal is not None
    base_db = session.base.output_sqnr_db
    assert base_db is not None and base_db < goal
    assert r.reached and r.stop_reason == "goal met"
    final = r.final
    assert final.chosen and final.output_sqnr_db is not None and final.output_sqnr_db >= goal
    assert [p.chosen for p in r.steps].count(True) == 1
    assert 0 < len(final.promoted) < len(analyse(session.base.report))
    # Every point but the base was a re-quantization (prefix search keeps all of them on the curve).
    assert r.requantizations == len(r.steps) - 1 + len(r.evaluated)
    assert r.steps[0].promoted == () and r.steps[0].output_sqnr_db == base_db
    costs = [p.cost_fraction_16bit for p in r.steps]
    assert costs == sorted(costs)
    sizes = [len(p.promoted) for p in r.steps]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    # The bisection's last miss is the prefix one shorter than the chosen one.
    before = next(p for p in r.steps if len(p.promoted) == len(final.promoted) - 1)
    assert before.output_sqnr_db is not None and before.output_sqnr_db < goal
    assert r.plan is not None and r.plan.requested == final.promoted
    print(f"\nprefix search: {base_db:.2f} -> {final.output_sqnr_db:.2f} dB with {len(final.promoted)} tensors, "
          f"{r.requantizations} re-quantizations")  # fmt: skip


def test_search_result_json(prefix_result: SearchResult) -> None:
    def refuse(token: str) -> None:
        raise AssertionError(f"non-strict JSON literal {token}")

    d = json.loads(prefix_result.to_json(), parse_constant=refuse)
    assert d["schema_version"] == 4 and d["target_fixes"] is None and d["holdout"] is None  # as given, none held out
    assert d["reached"] is True and d["requantizations"] == prefix_result.requantizations
    assert d["promoted"] == list(prefix_result.final.promoted)
    assert d["chosen_step"] == prefix_result.chosen_step
    assert [s["output_sqnr_db"] for s in d["steps"]] == [p.output_sqnr_db for p in prefix_result.steps]
    assert d["goal"]["output_sqnr_db"] == prefix_result.goal.output_sqnr_db
    assert list(prefix_result.to_dataframe().output_sqnr_db) == [p.output_sqnr_db for p in prefix_result.steps]


def test_max_steps_cutting_the_bisection_says_so(session: MixedPrecisionSession, prefix_result: SearchResult) -> None:
    # One step fewer than the full search: the same points but the last, so the bisection stops with a gap.
    full = len(prefix_result.steps) - 1
    r = search(session, SearchGoal(output_sqnr_db=prefix_result.goal.output_sqnr_db, max_steps=full - 1))
    assert r.reached and r.requantizations == full - 1
    sizes = {len(p.promoted) for p in r.steps}
    assert len(r.final.promoted) - 1 not in sizes  # a smaller set was never tried ...
    assert f"max_steps ({full - 1}) ended the bisection" in r.stop_reason  # ... and the result says so


def test_accuracy_goal_without_eval_data(tmp_path: Path) -> None:
    s = MixedPrecisionSession(
        TRANSFORMER, CALIB, BASE_CONFIG, debug_options=DebugOptions(num_samples=4), workdir=tmp_path
    )
    with pytest.raises(ConfigError, match="eval_data"):
        search(s, SearchGoal(max_accuracy_drop=0.01))
    assert list(tmp_path.iterdir()) == []  # refused before quantizing anything


def test_unreachable_goal(session: MixedPrecisionSession) -> None:
    r = search(session, SearchGoal(output_sqnr_db=80.0))
    assert not r.reached
    assert r.stop_reason
    assert r.requantizations == len(r.steps) - 1
    assert all(p.output_sqnr_db is not None and p.output_sqnr_db < 80.0 for p in r.steps)
    assert r.final.chosen


def test_greedy_search_few_steps(session: MixedPrecisionSession) -> None:
    goal = SearchGoal(output_sqnr_db=80.0, strategy="greedy", max_steps=2, candidates_per_step=2)
    r = search(session, goal)
    assert not r.reached and "max_steps" in r.stop_reason
    assert len(r.evaluated) == 4 and r.requantizations == len(r.evaluated)
    assert len(r.steps) == 3 and [len(p.promoted) for p in r.steps] == [0, 1, 2]
    # Each accepted step is the best of the candidates measured at that step.
    for step in r.steps[1:]:
        tried = [p for p in r.evaluated if p.step == step.step]
        assert step.output_sqnr_db == max(p.output_sqnr_db for p in tried)  # type: ignore[type-var]
    json.loads(r.to_json())


def test_suggestion_to_dict_is_json(session: MixedPrecisionSession) -> None:
    s: Suggestion = session.suggest(1)[0]
    d = json.loads(json.dumps(s.to_dict(), allow_nan=False))
    assert d["rank"] == 1 and d["tensor_name"] == s.tensor_name and d["role"] == "originator"


def test_requantize_to_16_bit_after_an_opset_conversion(tmp_path: Path) -> None:
    """Regression (ppocrv4-rec): a cache calibrated at opset 12 lacks the tensors ONNX's version converter makes
    when 16-bit types raise the opset to 21 (``probs_intermediate``); ORT's quantizer crashed on them. The cache is
    translated through the value-preserving views, and the result equals a fresh calibration's model."""
    model = tmp_path / "att.onnx"
    onnx.save(builders.opset12_attention(), model)
    data = {"x": np.random.default_rng(3).standard_normal((8, 1, 3, 8)).astype(np.float32)}
    base = quantize(model, data, QuantConfig(), tmp_path / "base.onnx")
    cache_before = Path(base.calibration_cache).read_bytes()
    u16 = QuantConfig(activation_type="uint16")
    reused = quantize(model, data, u16, tmp_path / "reused.onnx", calibration_cache=base.calibration_cache)
    assert reused.reused_calibration and reused.calibration_seconds == 0 and reused.warnings == ()
    assert Path(base.calibration_cache).read_bytes() == cache_before  # the user's cache is read, never rewritten
    fresh = quantize(model, data, u16, tmp_path / "fresh.onnx")
    assert Path(reused.model_path).read_bytes() == Path(fresh.model_path).read_bytes()
    names = {o for n in onnx.load(reused.model_path).graph.node for o in n.output}
    assert "probs_intermediate" in names  # the converter really made the tensor the old cache lacked
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["att.onnx", "base.onnx", "base.calib.json", "reused.onnx", "fresh.onnx", "fresh.calib.json"]
    )


def test_requantize_calibrates_again_when_the_cache_lacks_a_tensor(tmp_path: Path) -> None:
    """A cache that cannot name a tensor ORT calibrates (here: an entry removed) is not trusted: quantize calibrates
    again into its own temp folder, says so, leaves the user's cache untouched and gives the fresh model."""
    model = tmp_path / "att.onnx"
    onnx.save(builders.opset12_attention(), model)
    data = {"x": np.random.default_rng(3).standard_normal((8, 1, 3, 8)).astype(np.float32)}
    base = quantize(model, data, QuantConfig(), tmp_path / "base.onnx")
    raw = json.loads(Path(base.calibration_cache).read_text())
    del raw["data"]["scores"]
    partial = tmp_path / "partial.calib.json"
    partial.write_text(json.dumps(raw))
    before = partial.read_bytes()
    again = quantize(model, data, QuantConfig(), tmp_path / "again.onnx", calibration_cache=partial)
    assert (
        not again.reused_calibration
        and again.calibration_seconds > 0
        and len(again.warnings) == 1
        and str(partial) in again.warnings[0]
    )
    assert partial.read_bytes() == before
    assert Path(again.model_path).read_bytes() == Path(base.model_path).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["att.onnx", "base.onnx", "base.calib.json", "partial.calib.json", "again.onnx"]
    )


def test_search_candidates_cover_every_quantized_tensor(session: MixedPrecisionSession) -> None:
    """The last prefix of the search is every 8-bit tensor, views with no rounding of their own included (on the
    OCR transformer, Transpose/Slice left in 8 bits after promoted MatMuls kept "everything" far from all-16-bit)."""
    from qdebug.mixed.search_ranked import _candidates

    base = session.base.report
    order = _candidates(session.base, (), 1 << 30)
    eight_bit = {a.tensor_name for a in base.activations if a.quantized and not (a.quant_type or "").endswith("16")}
    assert set(order) == eight_bit and len(order) == len(eight_bit)
    ranked = {s.tensor_name for s in analyse(base)}
    last_ranked = max(i for i, t in enumerate(order) if t in ranked)
    tail = order[last_ranked + 1 :]  # the rest come after every ranked one, in graph order
    assert tail and not ranked & set(tail)
    topo = {a.tensor_name: a.topo_index for a in base.activations}
    assert [topo[t] for t in tail] == sorted(topo[t] for t in tail)


def test_promotion_reaches_the_tensors_an_opset_conversion_adds(tmp_path: Path, run_cli) -> None:
    """On an opset-12 model, promoting the Softmax output must promote what the Softmax really writes after ORT
    raises the opset (``probs_intermediate``, reshaped into ``probs``); the plan's overrides name that view's tensors
    and nodes, pass the CLI's overrides check against the user's model, and quantize to a uint16 Softmax."""
    from qdebug.mixed.overrides import OverridesFile
    from qdebug.model_io import file_sha256

    model = tmp_path / "att.onnx"
    onnx.save(builders.opset12_attention(), model)
    plan = promote(model, ["probs"])
    assert {"probs", "probs_intermediate"} <= set(plan.promoted)
    data = {"x": np.random.default_rng(3).standard_normal((8, 1, 3, 8)).astype(np.float32)}
    np.savez(tmp_path / "calib.npz", **data)
    ofile = OverridesFile.from_config(plan.config, model_sha256=file_sha256(model), requested=plan.requested)
    ofile.save(tmp_path / "o.json")
    result = run_cli("quantize", "-f", model, "--calib", tmp_path / "calib.npz", "--overrides", tmp_path / "o.json",
                     "-o", tmp_path / "p.onnx")  # fmt: skip
    assert result.code == 0, result.err
    q = onnx.load(tmp_path / "p.onnx")
    zps = {i.name: i.data_type for i in q.graph.initializer}
    softmax_q = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "probs_intermediate")
    assert zps[softmax_q.input[2]] == TensorProto.UINT16


def test_quantizer_view_is_made_once_per_model_and_each_caller_gets_its_own_copy(tmp_path: Path) -> None:
    """A search asks for the same view of the float model at every promote and re-quantization (issue 14: 3 s a step
    on MiniLM): it is memoized by the model's bytes and what decides ORT's opset, and handed out as copies."""
    from onnxruntime.quantization import QuantType

    qz = importlib.import_module("qdebug.ort_view")

    model = builders.tiny_convnet()  # opset below 21: 16-bit Q/DQ raise it
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    qz._VIEWS.clear()
    fresh = qz._make_view(model, "uint8", "uint16", None, False)
    assert fresh is not None and fresh.opset_import[0].version == 21
    first = qz.quantizer_view(model, "uint8", ["uint16", "uint8"])
    assert first == fresh and len(qz._VIEWS) == 1
    first.graph.node[0].name = "changed by the caller"
    # The same opset decision asked another way (an 8-bit default with a 16-bit override, the file instead of the
    # proto): the kept view, unchanged by what the first caller did to its copy.
    again = qz.quantizer_view(path, "uint8", ["uint8"], {"c1": [{"quant_type": QuantType.QUInt16}]})
    assert again == fresh and again is not first
    # An 8-bit view is another decision (ORT keeps the model as it is).
    assert qz.quantizer_view(model, "uint8", ["uint8"]) is None
    assert not qz._wants_16bit({"c1": [{"quant_type": QuantType.QUInt8, "convert": {"quant_type": QuantType.QUInt8}}]})
    assert qz._wants_16bit({"c1": [{"quant_type": QuantType.QUInt8, "convert": {"quant_type": QuantType.QInt16}}]})


def test_an_originators_16_bit_figure_is_a_signed_gain_and_the_tensors_figure_is_a_ceiling() -> None:
    """The reason's 16-bit figures are gains with their sign: the calibrated one at the output first, the saturated
    one at the tensor itself (share 1: 8 bits × 6.02 dB) named an uncalibrated ceiling, never as an SQNR."""
    from qdebug.mixed.suggest import classify
    from qdebug.report import ActivationResult, SqnrStatus

    a = ActivationResult("t", "Conv", "conv", 0, True, "uint8", 0.1, 0, 20.0, SqnrStatus.OK, 20.0, SqnrStatus.OK)
    s = classify(a, {"t": a}, 18.0, budget=10 ** (-2.0) * 4, ceiling_db=19.0)  # 4 tensors as noisy; 1 dB headroom
    assert s is not None and s.role == Role.ORIGINATOR.value
    assert f"est. +{s.estimated_output_gain_db:.2f} dB at the output" in s.reason
    assert 0 < s.estimated_output_gain_db <= 1.0
    assert "at most +48.2 dB at this tensor, an uncalibrated ceiling" in s.reason and "~48.2" not in s.reason
