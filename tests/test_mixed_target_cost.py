"""Issue 14 item 4: target-aware cost — the Pareto points a user picks compiled for QNN (onnxruntime-qnn, HTP
simulator), with partitions and CPU-fallback nodes; a point that splits the HTP graph is marked; each compiled point
also runs on the HTP simulator, its output SQNR vs float beside the CPU's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import builders
import onnx
import pytest
from conftest import SAMPLE_MODELS, assert_one_line_error
from test_qnn_fixes import require_qnn

from qdebug.errors import EXIT_TARGET, EXIT_USAGE
from qdebug.mixed.target_cost import TargetCost


def test_target_cost_marks_a_split_graph_and_round_trips() -> None:
    one = TargetCost("qnn", True, 1, 0)
    assert not one.splits and "SPLIT" not in one.describe()
    two = TargetCost("qnn", True, 2, 3, (("Softmax", 2), ("Convert", 1)))
    assert two.splits and two.describe().startswith("SPLIT: 2 partitions, 3 CPU nodes (Softmax 2")
    failed = TargetCost("qnn", False, 0, 0, error="boom")
    assert failed.splits and "boom" in failed.describe()
    ran = TargetCost("qnn", True, 1, 0, target_sqnr_db=31.5, cpu_sqnr_db=32.25, accuracy_samples=2, device="HTP")
    assert ran.describe_accuracy() == "31.50 dB (CPU 32.25 dB, 2 samples)" and ran.target_loss_db == 0.75
    same = TargetCost("qnn", True, 1, 0, target_sqnr_db=math.inf, cpu_sqnr_db=math.inf, accuracy_samples=1)
    assert same.target_loss_db == 0.0 and same.describe_accuracy().startswith("identical")
    broke = TargetCost("qnn", True, 1, 0, accuracy_error="TargetError: no HTP")
    assert broke.describe_accuracy() == "run failed: TargetError: no HTP" and one.describe_accuracy() == "-"
    for c in (one, two, failed, ran, same, broke):
        d = json.loads(json.dumps(c.to_dict(), allow_nan=False))
        assert d["splits"] == c.splits and TargetCost.from_dict(d) == c
    # A search result of schema 1 has no target-side accuracy: it reads as not run.
    old = {k: v for k, v in two.to_dict().items() if k not in ("target_sqnr_db", "cpu_sqnr_db", "accuracy_samples")}
    assert TargetCost.from_dict(old) == two and TargetCost.from_dict(old).target_sqnr_db is None


def test_compile_points_needs_a_target_and_a_valid_spec(tmp_path: Path, run_cli) -> None:
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    o = tmp_path / "o.json"
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--goal-sqnr", "90", "--compile-points", "front", "-o", o)
    assert_one_line_error(r, EXIT_USAGE, "--target")
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--goal-sqnr", "90", "--target", "qnn", "--compile-points",
                "best", "-o", o)  # fmt: skip
    assert_one_line_error(r, EXIT_USAGE, "--compile-points")
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--goal-sqnr", "90", "--target", "qnn", "--compile-points",
                "front", "--target-samples", "-1", "-o", o)  # fmt: skip
    assert_one_line_error(r, EXIT_USAGE, "--target-samples")
    assert not o.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("as_json", [False, True])
def test_search_compiles_the_front_for_qnn(tmp_path: Path, run_cli, as_json: bool) -> None:
    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    o = tmp_path / "o.json"
    args = ["search", "-f", tmp_path / "m.onnx", "--debug-samples", "4", "--target", "qnn", "--goal-near-all16",
            "0", "--max-steps", "2", "--compile-points", "front", "--target-samples", "2", "-o", o]  # fmt: skip
    r = run_cli(*args, *(["--json"] if as_json else []))
    assert r.code in (0, 10), r.stderr
    if not as_json:
        assert "target graph" in r.out and "partition" in r.out
        assert "on target vs float" in r.out and "(CPU " in r.out and "2 samples)" in r.out
        return
    d = json.loads(r.out)
    front = d["pareto"]
    assert front and all(p["target_cost"] is not None for p in front)  # every front point compiled
    for p in front:
        tc = p["target_cost"]
        assert tc["target"] == "qnn" and tc["ok"], tc
        assert tc["partitions"] >= 1
        assert tc["splits"] == (tc["partitions"] != 1 or tc["cpu_nodes"] > 0)
        # The compiled model ran on the HTP simulator over 2 debug samples: its worst output vs float, and the CPU
        # QDQ model's on the same samples (an 8-bit tiny CNN: both well above 20 dB, a few dB apart at most).
        assert tc["accuracy_samples"] == 2 and tc["accuracy_error"] is None and "HTP" in tc["device"]
        assert 20 < tc["target_sqnr_db"] < 80 and 20 < tc["cpu_sqnr_db"] < 80
        assert abs(tc["target_sqnr_db"] - tc["cpu_sqnr_db"]) < 6
    # The base point (all 8-bit) of this small CNN runs as one HTP partition.
    base = next(p for p in front if not p["promoted"] and p["label"] != "all16")
    assert base["target_cost"]["splits"] is False


def test_a_model_the_target_refuses_stops_the_search_before_it_starts(tmp_path: Path, run_cli) -> None:
    """A dynamic input dimension: QNN refuses to compile (found on the corpus' ppocr-cls, whose input is
    [-1, 3, ?, ?]). Said in one line before the search measures anything, not after."""
    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    onnx.save(builders.tiny_convnet(batch="N"), str(tmp_path / "m.onnx"))
    o = tmp_path / "o.json"
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--debug-samples", "2", "--target", "qnn", "--goal-sqnr", "90",
                "--compile-points", "front", "--no-target-fixes", "-o", o)  # fmt: skip
    assert_one_line_error(r, EXIT_TARGET, "qnn cannot compile this model's base quantization", "fixed input shapes")
    assert "Search curve" not in r.out and not o.exists()


def test_a_model_the_target_refuses_is_a_point_with_the_reason(tmp_path: Path) -> None:
    """compile_points itself records a point that does not compile (ok False, the reason, SPLIT) rather than
    raising: the search's measurements stay."""
    require_qnn()
    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.search import SearchGoal
    from qdebug.mixed.session import MixedPrecisionSession
    from qdebug.mixed.target_cost import compile_points, pick_points

    onnx.save(builders.tiny_convnet(batch="N"), str(tmp_path / "m.onnx"))
    with MixedPrecisionSession(tmp_path / "m.onnx", None, QuantConfig(num_samples=2, target="qnn"),
                               debug_options=DebugOptions(num_samples=2), workdir=tmp_path / "w") as s:  # fmt: skip
        result = s.search(SearchGoal(output_sqnr_db=0.0))
        out = compile_points(s, result, pick_points(result, "chosen"), "qnn", samples=2)
    tc = out.final.target_cost
    assert tc is not None and not tc.ok and tc.splits and "fixed input shapes" in (tc.error or "")
    assert tc.describe().startswith("compile failed:") and out.final.output_sqnr_db == result.final.output_sqnr_db


def test_the_targets_fixes_that_would_change_the_model_are_a_note_when_opted_out(tmp_path: Path, run_cli) -> None:
    """digits_cnn keeps BatchNormalization nodes that QNN's fixes fold (what `qdebug build` runs): with
    --no-target-fixes the search says so before it starts (on ppocr-cls the unfixed model's HTP and CPU were 22 dB
    apart at 16 bits, the fixed one's not), and searches the model as given."""
    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    o = tmp_path / "o.json"
    r = run_cli("search", "-f", SAMPLE_MODELS / "digits_cnn.onnx", "--calib", SAMPLE_MODELS / "digits_calib.npz",
                "--data", SAMPLE_MODELS / "digits_eval.npz", "--debug-samples", "2", "--target", "qnn", "--goal-sqnr",
                "0", "--compile-points", "chosen", "--target-samples", "0", "--no-target-fixes", "-o", o)  # fmt: skip
    assert r.code == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("qdebug: note: qnn's compatibility fixes")]
    assert len(notes) == 1 and "batchnorm_folding" in notes[0] and "--no-target-fixes" in notes[0], r.stderr
    assert "searched the model after" not in r.stderr + r.out
    assert "target graph" in r.out and o.is_file()
    doc = json.loads(o.read_text())
    assert doc["schema_version"] == 1 and "target_fixes" not in doc  # overrides of the model as given


def _digits_cnn_dynamic(path: Path) -> Path:
    """digits_cnn (4 standalone BatchNormalization nodes) with a symbolic batch dimension: both QNN fixes apply."""
    m = onnx.load(str(SAMPLE_MODELS / "digits_cnn.onnx"))
    for vi in (*m.graph.input, *m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(m, str(path))
    return path


def test_search_with_a_target_searches_the_fixed_model(tmp_path: Path, run_cli) -> None:
    """`search --target qnn` applies QNN's fixes first (static shapes, BatchNorm folding), searches and compiles that
    model, records the fixes in its result and its overrides, and `qdebug build --overrides` takes those overrides
    on the model as given (it applies the same fixes)."""
    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    model = _digits_cnn_dynamic(tmp_path / "dyn.onnx")
    o, w = tmp_path / "o.json", tmp_path / "work"
    data = ["--calib", SAMPLE_MODELS / "digits_calib.npz", "--data", SAMPLE_MODELS / "digits_eval.npz"]
    # 4 debug samples: base 34.12 dB, the second BatchNorm output promoted alone 34.80 dB (a goal one promotion meets)
    r = run_cli("search", "-f", model, *data, "--debug-samples", "4", "--target", "qnn", "--goal-sqnr", "34.5",
                "--strategy", "measured", "--measure-top", "2", "--max-steps", "3", "--compile-points", "front",
                "--target-samples", "0", "--workdir", w, "--json", "-o", o)  # fmt: skip
    assert r.code == 0, r.stderr
    assert "qdebug: note: searched the model after qnn's compatibility fixes (static_shapes" in r.stderr
    d = json.loads(r.out)
    assert d["schema_version"] == 4 and d["target_fixes"]["target"] == "qnn"
    assert d["target_fixes"]["changed"] == ["static_shapes", "batchnorm_folding"]
    # The dynamic batch dimension was fixed, so the front compiles (without the fixes QNN refuses it, test above).
    assert all(p["target_cost"]["ok"] and not p["target_cost"]["splits"] for p in d["pareto"])
    fixed = onnx.load(str(next(w.glob("dyn.qnn-fixed.onnx"))))
    assert not [n for n in fixed.graph.node if n.op_type == "BatchNormalization"]
    assert fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    assert onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"  # input untouched
    # The overrides name tensors of the searched (fixed) model and say so; build applies them to the given model.
    doc = json.loads(o.read_text())
    assert doc["schema_version"] == 2
    assert doc["target_fixes"] == {"target": "qnn", "fixes": d["target_fixes"]["changed"]}
    produced = {t for n in fixed.graph.node for t in n.output}
    assert doc["tensor_quant_overrides"] and set(doc["tensor_quant_overrides"]) <= produced | {"input"}
    b = run_cli("build", "-f", model, "--target", "qnn", "--precision", "uint8", "--overrides", o, *data,
                "--debug-samples", "2", "--bisect", "never", "--no-remedies", "-o", tmp_path / "B")  # fmt: skip
    assert b.code == 0, b.stderr
    assert "different model file" not in b.stderr and "no longer fit" not in b.stderr


def test_search_without_the_target_fixes_keeps_the_model_as_given(tmp_path: Path) -> None:
    """The engine side of --no-target-fixes: target_fixes=False (the default) leaves the float model as given; True
    switches the session to the fixed copy and the search result records the fixes."""
    require_qnn()
    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.search import SearchGoal
    from qdebug.mixed.session import MixedPrecisionSession
    from qdebug.mixed.target_fixes import search_target_fixes

    model = _digits_cnn_dynamic(tmp_path / "dyn.onnx")
    calib = SAMPLE_MODELS / "digits_calib.npz"
    cfg, opts, goal = (
        QuantConfig(num_samples=2, target="qnn"),
        DebugOptions(num_samples=2),
        SearchGoal(output_sqnr_db=0),
    )
    with MixedPrecisionSession(model, calib, cfg, debug_options=opts, workdir=tmp_path / "a") as s:
        given = s.search(goal)
        assert s.target_fixes is None and s.float_path == model
        assert s.overrides_origin() == (given_sha(model), None)
    with MixedPrecisionSession(model, calib, cfg, debug_options=opts, workdir=tmp_path / "b", target_fixes=True) as s:
        fixed = s.search(goal)
        assert s.float_path != model and s.float_sha256 == given_sha(model)
        # what every overrides file made here (search, remedies, the UI's export) names: the user's file, the fixes
        assert s.overrides_origin() == (given_sha(model), ("qnn", ("static_shapes", "batchnorm_folding")))
    assert given.target_fixes is None and search_target_fixes(given.to_dict()) is None
    assert fixed.target_fixes is not None and fixed.target_fixes.changed == ("static_shapes", "batchnorm_folding")
    assert search_target_fixes(json.loads(fixed.to_json())) == fixed.target_fixes
    # The base reports name different tensors: the folded Convs' own outputs are gone.
    assert {p.output_sqnr_db is not None for p in (given.final, fixed.final)} == {True}
    old = {k: v for k, v in given.to_dict().items() if k != "target_fixes"} | {"schema_version": 2}
    assert search_target_fixes(old) is None  # a schema-2 document reads as searched as given


def given_sha(path: Path) -> str:
    from qdebug.model_io import file_sha256

    return file_sha256(path)


def test_overrides_of_a_fused_gelu_need_the_record_to_build(tmp_path: Path, run_cli) -> None:
    """QNN's gelu_fusion makes the exact GELU one node: promoting its output converts its input for *that* node,
    which the model as given does not have. With the record (``target_fixes``, what `search --target` writes)
    `qdebug build --overrides` checks the file after its fixes and builds; the same overrides without it are refused
    before the fixes, naming the consumer the given model lacks."""
    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    from test_qnn_fixes import ln_gelu_block

    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.overrides import OverridesFile
    from qdebug.mixed.session import MixedPrecisionSession
    from qdebug.model_io import file_sha256

    model = tmp_path / "m.onnx"
    onnx.save(ln_gelu_block(), str(model))
    cfg = QuantConfig(num_samples=4, target="qnn")
    with MixedPrecisionSession(model, None, cfg, debug_options=DebugOptions(num_samples=2), workdir=tmp_path / "w",
                               target_fixes=True) as s:  # fmt: skip
        assert s.target_fixes is not None and s.target_fixes.changed == ("gelu_fusion",)
        gelu = next(n.name for n in s.float_proto.graph.node if n.op_type == "Gelu")
        plan = s.promote(["g"])  # the GELU's output
        fixes = (s.target_fixes.target, s.target_fixes.changed)
    assert any(e.convert is not None and gelu in e.convert.recv_nodes for _, es in plan.config.tensor_overrides
               for e in es)  # fmt: skip
    sha = file_sha256(model)
    OverridesFile.from_config(plan.config, model_sha256=sha, requested=["g"], target_fixes=fixes).save(
        tmp_path / "o.json"
    )
    OverridesFile.from_config(plan.config, model_sha256=sha, requested=["g"]).save(tmp_path / "plain.json")
    common = ["--target", "qnn", "--precision", "uint8", "--debug-samples", "2", "--bisect", "never", "--no-remedies"]
    ok = run_cli("build", "-f", model, *common, "--overrides", tmp_path / "o.json", "-o", tmp_path / "B")
    assert ok.code == 0, ok.stderr
    bad = run_cli("build", "-f", model, *common, "--overrides", tmp_path / "plain.json", "-o", tmp_path / "B2")
    assert_one_line_error(bad, EXIT_USAGE, f"recv_nodes ['{gelu}'] do not consume this tensor")
