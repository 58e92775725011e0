"""qdebug.render.target_table: the compile of each variant as one table (device, partitions, CPU nodes, the worst
output of target vs float, target vs CPU-QDQ and CPU-QDQ vs float) and the sentence on before's and after's devices."""

from __future__ import annotations

import html
import re

from qdebug.render.target_table import device_sentence, target_rows, target_table_html, worst_db
from qdebug.report import TargetAccuracy, TargetOutputAccuracy
from qdebug.targets.compile_report import CompileReport, FallbackNode
from qdebug.targets.recompile import RecompileResult


def _result(device: str, soc: str | None, *, cpu_nodes: int = 0, notes: tuple[str, ...] = ()) -> RecompileResult:
    fallback = (FallbackNode("LSTM", cpu_nodes, "not supported"),) if cpu_nodes else ()
    report = CompileReport("qnn", True, "m.qnn_ctx.onnx", 1.0, 2, 40, cpu_nodes, 2, fallback, device=device)
    acc = TargetAccuracy(
        target="qnn",
        device=device,
        num_samples=8,
        seconds_per_sample=0.25,
        outputs=(
            TargetOutputAccuracy("logits", 21.5, 30.25, 22.0),
            TargetOutputAccuracy("boxes", 18.75, None, 19.5),  # the worst HTP vs float and HTP vs CPU
        ),
    )
    return RecompileResult(report, acc, notes=notes, soc=soc)


def _cells(page: str, cls: str) -> list[str]:
    row = re.search(rf"<tr class='{cls}'>(.*?)</tr>", page)
    assert row is not None, cls
    return [html.unescape(c) for c in re.findall(r"<td class='qd-col\d'>(.*?)</td>", row.group(1))]


def test_worst_output_per_comparison() -> None:
    acc = _result("default SoC (HTP v68)", None).target_accuracy
    assert worst_db(acc, lambda o: o.target_vs_float_db) == 18.75
    assert worst_db(acc, lambda o: o.cpu_vs_float_db) == 30.25  # an output without the figure is left out
    assert worst_db(None, lambda o: o.target_vs_float_db) is None


def test_table_has_every_figure_per_column() -> None:
    before = _result("default SoC (HTP v68)", None)
    after = _result("default SoC (HTP v68)", None, cpu_nodes=3)
    page = target_table_html([before, after], ["before: your model (m.qdq.onnx)", "after"])
    assert "<th>before: your model (m.qdq.onnx)</th><th>after</th>" in html.unescape(page)
    assert _cells(page, "qd-t-device") == ["qnn default SoC (HTP v68)"] * 2
    assert _cells(page, "qd-t-partitions") == ["2", "2"]
    assert _cells(page, "qd-t-cpu") == ["0", "3 (LSTM×3)"]
    assert _cells(page, "qd-t-vs-float") == ["18.75 dB"] * 2
    assert _cells(page, "qd-t-vs-cpu") == ["19.50 dB"] * 2
    assert _cells(page, "qd-t-cpu-vs-float") == ["30.25 dB"] * 2
    assert _cells(page, "qd-t-samples")[0].startswith("8 (")
    assert "same device: default SoC (HTP v68)" in page and "<caption" not in page
    captioned = target_table_html([before], ["x"], "qnn: onnxruntime-qnn (HTP simulator)")
    assert "<caption class='qd-target-caption'>qnn: onnxruntime-qnn (HTP simulator)</caption>" in captioned
    assert [r[0] for r in target_rows([before])][:5] == [
        "qd-t-device", "qd-t-ok", "qd-t-partitions", "qd-t-nodes", "qd-t-cpu",
    ]  # fmt: skip


def test_different_devices_are_said_with_the_reason() -> None:
    why = "no --soc given and the QDQ model has 16-bit weights: compiled for SM8550 (HTP v73)"
    before = _result("default SoC (HTP v68)", None)
    after = _result("SM8550 (HTP v73)", "SM8550", notes=(why,))
    text = device_sentence(before, after)
    assert "different devices (before: default SoC (HTP v68), after: SM8550 (HTP v73))" in text and why in text
    page = target_table_html([before, after], ["before", "after"])
    assert "qd-target-device" in page and "#c92a2a" in page
    assert f"<li>after: {html.escape(why)}</li>" in page


def test_the_probe_flagged_tensors_and_where_it_starts() -> None:
    from dataclasses import replace

    from qdebug.report import TargetTensorDiff

    r = _result("d", None)
    assert r.target_accuracy is not None
    tensors = tuple(TargetTensorDiff(f"t{i}", i, "uint8", 3, 0.5, 20.0, "Conv", flagged=i > 0) for i in range(3))
    acc = replace(r.target_accuracy, tensors=tensors, first_divergent="t1")
    cells = _cells(target_table_html([r, replace(r, target_accuracy=acc)], ["a", "b"]), "qd-t-diverge")
    assert cells == ["-", "2 of 3; first: t1"]


def test_uncompiled_accuracy_and_json_round_trip() -> None:
    r = RecompileResult(_result("d", None).compile, None, soc="SM8650")
    assert _cells(target_table_html([r], ["this variant"]), "qd-t-vs-float") == ["not measured"]
    assert RecompileResult.from_dict(r.to_dict()) == r
    assert target_table_html([], []) == ""


def test_the_cpu_target_has_no_accelerator_rows() -> None:
    """The CPU target runs the whole graph: its table says 'nodes (all on the CPU)', no accelerator partitions or
    fallback; an accelerator's table keeps them."""
    report = CompileReport("cpu", True, "m.qdq.onnx", 0.1, 1, 40, 0, 0, device="x86_64", accelerator=False)
    page = target_table_html([RecompileResult(report, None), RecompileResult(report, None)], ["before", "after"])
    assert "accelerator" not in page and "fallback" not in page
    assert _cells(page, "qd-t-nodes") == ["40", "40"] and "<th>nodes (all on the CPU)</th>" in page
    assert "qd-t-partitions" not in page and "qd-t-cpu'" not in page
    assert CompileReport.from_dict(report.to_dict()).accelerator is False
    assert "accelerator partitions" in target_table_html([_result("default SoC (HTP v68)", None)], ["x"])
