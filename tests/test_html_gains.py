"""Issue 17, item 1: gains measured by ``qdebug search`` carried into the HTML report's suggestions, beside the
predicted ones (:mod:`qdebug.mixed.gains`, ``qdebug report --search``, ``qdebug search --html``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import builders
import onnx
import pytest
from conftest import assert_one_line_error
from diag_models import scale_mismatch

from qdebug.debugger import DebugOptions, debug
from qdebug.errors import EXIT_INPUT_FILE, EXIT_OK
from qdebug.mixed.gains import MeasuredGains
from qdebug.mixed.suggest import suggest

pytest.importorskip("plotly")


def _point(step: int, promoted: list[str], db: float, label: str = "", chosen: bool = False) -> dict[str, Any]:
    return {"step": step, "promoted": promoted, "cost_fraction_16bit": 0.1 * len(promoted), "num_16bit_tensors": 1,
            "output_sqnr_db": db, "accuracy": None, "chosen": chosen, "seconds": 0.1, "label": label,
            "num_converts": 0}  # fmt: skip


def _search_doc(a: str, b: str, c: str) -> dict[str, Any]:
    """A search result as ``qdebug search --json`` prints it: base 20 dB; ``a`` and the group ``(b, c)`` measured
    alone; a prefix of one tensor (``c``) and of two; the all-16-bit point; one remedy."""
    cand = {"name": "layernorm@x", "kind": "layernorm", "tensors": [b, c], "estimated_output_gain_db": 2.0,
            "topo_index": 1}  # fmt: skip
    alone = {"name": a, "kind": "tensor", "tensors": [a], "estimated_output_gain_db": 1.5, "topo_index": 0}
    measured = [
        {"candidate": alone, "predicted_gain_db": 1.5, "measured_gain_db": 3.0, "output_sqnr_db": 23.0},
        {"candidate": cand, "predicted_gain_db": 2.0, "measured_gain_db": 0.25, "output_sqnr_db": 20.25},
    ]
    remedy = {"kind": "per_channel_weights", "description": "per-channel weights", "tensors": ["w"],
              "output_sqnr_db": 21.0, "gain_db": 1.0, "recommended": True, "error": None}  # fmt: skip
    return {
        "schema_version": 1,
        "steps": [_point(0, [], 20.0, "base"), _point(1, [a, b], 26.0, "prefix 2", chosen=True)],
        "evaluated": [_point(-1, [], 40.0, "all16"), _point(2, [c], 20.5, "prefix 1"), _point(3, [a], 23.0)],
        "sensitivity": {"base_output_sqnr_db": 20.0, "measured": measured},
        "remedies": [remedy],
        "reached": False,
        "stop_reason": "max_steps (3)",
    }


def test_gains_of_a_search_result_round_trip() -> None:
    g = MeasuredGains.from_search_dict(_search_doc("a", "b", "c"))
    # alone (sensitivity), each member of a measured group, and a one-tensor point not otherwise measured
    assert g.base_output_sqnr_db == 20.0
    assert g.per_tensor() == {"a": 3.0, "b": 0.25, "c": 0.25}
    assert {t.tensor: t.group_size for t in g.tensors} == {"a": 1, "b": 2, "c": 2}
    # every promotion set once (the all-16-bit recipe is not one), cheapest first, with its gain over the base
    assert [(s.tensors, s.gain_db, s.chosen) for s in g.sets] == [
        (("c",), 0.5, False), (("a",), 3.0, False), (("a", "b"), 6.0, True)
    ]  # fmt: skip
    assert g.remedies[0].gain_db == 1.0 and g.remedies[0].recommended
    assert g.reached is False and g.stop_reason == "max_steps (3)"
    assert MeasuredGains.from_dict(json.loads(json.dumps(g.to_dict()))) == g
    assert list(g.to_dataframe()["measured_gain_db"]) == [3.0, 0.25, 0.25]
    with pytest.raises(Exception, match="not a search result"):
        MeasuredGains.from_search_dict({"tensors": []})


def test_html_shows_predicted_and_measured_side_by_side() -> None:
    from qdebug.render.html import report_html
    from qdebug.render.html_sections import _first_fix

    f, q = scale_mismatch()
    report = debug(f, q, None, DebugOptions(num_samples=4))
    sugg = suggest(report)
    assert len(sugg) >= 2
    a, b = sugg[0].tensor_name, sugg[1].tensor_name
    gains = MeasuredGains.from_search_dict(_search_doc(a, b, "z"))
    page = report_html(report, suggestions=sugg, measured_gains=gains)
    section = page[page.index('<section id="suggestions"') :]
    section = section[: section.index("</section>")]
    row_a = re.search(rf"<tr><td>1</td><td><code>{re.escape(a)}</code>.*?</tr>", section)
    assert row_a is not None
    assert f"{sugg[0].estimated_output_gain_db:.2f} dB" in row_a[0] and "+3.00 dB (alone)" in row_a[0]
    assert "+0.25 dB (with its group of 2 (layernorm@x))" in section
    for heading in ("Promoted alone: predicted and measured", "Promotion sets measured", "Remedies measured"):
        assert heading in section
    assert "+6.00 dB" in section and "prefix 2 (chosen)" in section and "per-channel weights" in section
    assert "Goal <b>not reached</b> (max_steps (3))" in section
    # The summary at the top names the first fix to try with both gains — unless the verdict is already good.
    verdict = page[page.index('<section id="verdict"') :].split("</section>")[0]
    assert "Verdict: good" in verdict and "First fix" not in verdict
    first = _first_fix(sugg, gains)
    assert f"First fix to try: store <code>{a}</code>" in first
    assert f"predicted {sugg[0].estimated_output_gain_db:+.2f} dB" in first and "measured +3.00 dB" in first


def test_search_html_and_report_search(tmp_path: Path, run_cli: Any) -> None:
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    res = run_cli("search", "-f", tmp_path / "m.onnx", "--debug-samples", "4", "--strategy", "measured",
                  "--measure-top", "2", "--goal-near-all16", "0", "--max-steps", "3", "--json",
                  "-o", tmp_path / "o.json", "--html", tmp_path / "s.html")  # fmt: skip
    assert res.code in (EXIT_OK, 10), res.stderr  # 10: the goal was missed; the page is written either way
    doc = json.loads(res.out)
    measured = {t: m["measured_gain_db"] for m in doc["sensitivity"]["measured"] for t in m["candidate"]["tensors"]}
    assert measured
    page = (tmp_path / "s.html").read_text(encoding="utf-8")
    assert "Promoted alone: predicted and measured" in page
    assert any(f"{v:+.2f} dB" in page for v in measured.values() if v is not None)

    (tmp_path / "search.json").write_text(res.out, encoding="utf-8")
    rj = tmp_path / "r.json"
    f, q = scale_mismatch()
    debug(f, q, None, DebugOptions(num_samples=4)).save(rj)
    ok = run_cli("report", rj, "--search", tmp_path / "search.json", "-o", tmp_path / "r.html")
    assert ok.code == EXIT_OK, ok.stderr
    assert "Measured by qdebug search" in (tmp_path / "r.html").read_text(encoding="utf-8")
    bad = run_cli("report", rj, "--search", rj, "-o", tmp_path / "x.html")
    assert_one_line_error(bad, EXIT_INPUT_FILE, "r.json", "not a search result")  # an input of the wrong kind: 3
    assert not (tmp_path / "x.html").exists()
