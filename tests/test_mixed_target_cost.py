"""Issue 14 item 4: target-aware cost — the Pareto points a user picks compiled for QNN (onnxruntime-qnn, HTP
simulator), with partitions and CPU-fallback nodes; a point that splits the HTP graph is marked."""

from __future__ import annotations

import json
from pathlib import Path

import builders
import onnx
import pytest
from conftest import assert_one_line_error
from test_qnn_fixes import require_qnn

from qdebug.errors import EXIT_USAGE
from qdebug.mixed.target_cost import TargetCost


def test_target_cost_marks_a_split_graph_and_round_trips() -> None:
    one = TargetCost("qnn", True, 1, 0)
    assert not one.splits and "SPLIT" not in one.describe()
    two = TargetCost("qnn", True, 2, 3, (("Softmax", 2), ("Convert", 1)))
    assert two.splits and two.describe().startswith("SPLIT: 2 partitions, 3 CPU nodes (Softmax 2")
    failed = TargetCost("qnn", False, 0, 0, error="boom")
    assert failed.splits and "boom" in failed.describe()
    for c in (one, two, failed):
        d = json.loads(json.dumps(c.to_dict()))
        assert d["splits"] == c.splits and TargetCost.from_dict(d) == c


def test_compile_points_needs_a_target_and_a_valid_spec(tmp_path: Path, run_cli) -> None:
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    o = tmp_path / "o.json"
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--goal-sqnr", "90", "--compile-points", "front", "-o", o)
    assert_one_line_error(r, EXIT_USAGE, "--target")
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--goal-sqnr", "90", "--target", "qnn", "--compile-points",
                "best", "-o", o)  # fmt: skip
    assert_one_line_error(r, EXIT_USAGE, "--compile-points")
    assert not o.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("as_json", [False, True])
def test_search_compiles_the_front_for_qnn(tmp_path: Path, run_cli, as_json: bool) -> None:
    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    o = tmp_path / "o.json"
    args = ["search", "-f", tmp_path / "m.onnx", "--debug-samples", "4", "--target", "qnn", "--goal-near-all16",
            "0", "--max-steps", "2", "--compile-points", "front", "-o", o]  # fmt: skip
    r = run_cli(*args, *(["--json"] if as_json else []))
    assert r.code in (0, 10), r.stderr
    if not as_json:
        assert "target graph" in r.out and ("partition" in r.out)
        return
    d = json.loads(r.out)
    front = d["pareto"]
    assert front and all(p["target_cost"] is not None for p in front)  # every front point compiled
    for p in front:
        tc = p["target_cost"]
        assert tc["target"] == "qnn" and tc["ok"], tc
        assert tc["partitions"] >= 1
        assert tc["splits"] == (tc["partitions"] != 1 or tc["cpu_nodes"] > 0)
    # The base point (all 8-bit) of this small CNN runs as one HTP partition.
    base = next(p for p in front if not p["promoted"] and p["label"] != "all16")
    assert base["target_cost"]["splits"] is False
