"""`qdebug suggest` and `qdebug search` in-process, on the sample transformer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SAMPLE_MODELS, assert_one_line_error, sha256

from qdebug.errors import EXIT_GATE, EXIT_OK, EXIT_USAGE
from qdebug.mixed.overrides import OverridesFile

TRANSFORMER = SAMPLE_MODELS / "digits_transformer.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
EVAL = SAMPLE_MODELS / "digits_eval.npz"


@pytest.fixture(scope="module")
def quant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from qdebug import QuantConfig, quantize

    out = tmp_path_factory.mktemp("cli_mixed") / "t.qdq.onnx"
    quantize(TRANSFORMER, CALIB, QuantConfig(), out)
    return out


def test_suggest_table_and_overrides_feed_quantize(quant: Path, tmp_path: Path, run_cli) -> None:
    before = {p: sha256(p) for p in (TRANSFORMER, quant)}
    o = tmp_path / "o.json"
    common = ["-f", TRANSFORMER, "-q", quant, "-d", EVAL, "--ignore-key", "label", "--max-samples", "32"]
    r = run_cli("suggest", *common, "--top", "4", "--promote-top", "2", "--overrides-out", o)
    assert r.code == EXIT_OK, r.stderr
    assert "Promotion candidates" in r.out and "originator" in r.out
    assert "promote 2 tensor(s) to uint16 (default uint8)" in r.out and "[requested]" in r.out
    ofile = OverridesFile.load(o)
    assert len(ofile.requested) == 2 and set(ofile.requested) <= set(ofile.tensors)
    assert ofile.model_sha256 == sha256(TRANSFORMER)
    # the file is what `quantize --overrides` consumes
    mixed = tmp_path / "mixed.onnx"
    r = run_cli("quantize", "-f", TRANSFORMER, "--calib", CALIB, "--overrides", o, "-o", mixed)
    assert r.code == EXIT_OK, r.stderr
    r = run_cli("debug", "-f", TRANSFORMER, "-q", mixed, "--samples", "2", "--json")
    acts = {a["tensor_name"]: a for a in json.loads(r.out)["activations"]}
    assert all(acts[t]["quant_type"] == "uint16" for t in ofile.requested)
    assert {p: sha256(p) for p in before} == before


def test_suggest_json_is_deterministic(quant: Path, run_cli) -> None:
    args = ["suggest", "-f", TRANSFORMER, "-q", quant, "-d", EVAL, "--ignore-key", "label", "--max-samples", "16"]
    a = run_cli(*args, "--json", "--all")
    b = run_cli(*args, "--json", "--all")
    assert a.code == b.code == EXIT_OK
    assert a.out == b.out
    doc = json.loads(a.out)
    roles = {s["role"] for s in doc["suggestions"]}
    assert roles <= {"originator", "amplifier", "inheritor", "clean"} and "originator" in roles
    assert [s["rank"] for s in doc["suggestions"]] == list(range(1, len(doc["suggestions"]) + 1))


def test_suggest_usage_errors(quant: Path, tmp_path: Path, run_cli) -> None:
    r = run_cli("suggest", "-f", TRANSFORMER, "-q", quant, "--samples", "2", "--overrides-out", tmp_path / "o.json")
    assert_one_line_error(r, EXIT_USAGE, "--promote-top")
    assert not (tmp_path / "o.json").exists()


def test_search_reaches_goal_and_writes_overrides(tmp_path: Path, run_cli) -> None:
    from qdebug import DebugOptions, QuantConfig, debug, quantize

    base = quantize(TRANSFORMER, CALIB, QuantConfig(), tmp_path / "base.onnx")
    base_db = debug(TRANSFORMER, base.model_path, EVAL, DebugOptions(ignore_data_keys=("label",), num_samples=32))
    goal = round(base_db.min_output_sqnr_db + 1.0, 2)  # a goal the 8-bit model misses
    o = tmp_path / "search.json"
    r = run_cli("search", "-f", TRANSFORMER, "--calib", CALIB, "-d", EVAL, "--debug-samples", "32",
                "--goal-sqnr", goal, "-o", o, "--workdir", tmp_path / "work")  # fmt: skip
    assert r.code == EXIT_OK, r.stderr
    assert "reached: goal met" in r.out and "<-" in r.out
    ofile = OverridesFile.load(o)
    assert ofile.requested and ofile.base_config is not None
    mixed = tmp_path / "mixed.onnx"
    assert run_cli("quantize", "-f", TRANSFORMER, "--calib", CALIB, "--overrides", o, "-o", mixed).code == EXIT_OK
    rep = debug(TRANSFORMER, mixed, EVAL, DebugOptions(ignore_data_keys=("label",), num_samples=32))
    assert rep.min_output_sqnr_db >= goal


def test_search_unreachable_goal_writes_nothing(tmp_path: Path, run_cli) -> None:
    o = tmp_path / "search.json"
    r = run_cli("search", "-f", TRANSFORMER, "--calib", CALIB, "--debug-samples", "8", "--goal-sqnr", "90",
                "--max-steps", "2", "-o", o)  # fmt: skip
    assert r.code == EXIT_GATE
    assert "NOT reached" in r.out
    assert not o.exists()


def test_search_needs_goal_and_eval_for_accuracy(tmp_path: Path, run_cli) -> None:
    r = run_cli("search", "-f", TRANSFORMER, "-o", tmp_path / "o.json")
    assert_one_line_error(r, EXIT_USAGE, "goal")
    r = run_cli("search", "-f", TRANSFORMER, "--max-accuracy-drop", "0.5", "-o", tmp_path / "o.json")
    assert_one_line_error(r, EXIT_USAGE, "--eval")
