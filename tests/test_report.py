"""DebugReport: strict JSON that round-trips +inf and None, DataFrames, ordering and lookups."""

from __future__ import annotations

import io
import json
import math
from dataclasses import fields, replace
from pathlib import Path

import builders
import numpy as np
import pytest
from conftest import save

from qdebug.debugger import DebugOptions, debug
from qdebug.errors import InputFileError
from qdebug.metrics import Summary
from qdebug.render.text import print_divergence
from qdebug.report import (
    ActivationResult,
    DebugReport,
    OutputResult,
    PerSample,
    ReportMeta,
    Summaries,
    TargetAccuracy,
    TargetTensorDiff,
    WeightResult,
    decode_number,
    encode_number,
)


def _act(name: str, local: float | None, cum: float | None, **kw) -> ActivationResult:
    status = lambda v: "undefined" if v is None else ("identical" if v == math.inf else "ok")  # noqa: E731
    base = dict(
        tensor_name=name, producer_op="Conv", producer_node=f"{name}_node", topo_index=len(name), quantized=True,
        quant_type="uint8", scale=0.02, zero_point=128, local_sqnr_db=local, local_status=status(local),
        cumulative_sqnr_db=cum, cumulative_status=status(cum), mse=1e-4, max_abs_error=0.01, float_min=-1.5,
        float_max=2.5, elements=36, worst_sample=1, converted_to=("uint16",),
    )  # fmt: skip
    base.update(kw)
    return ActivationResult(**base)


def _report() -> DebugReport:
    acts = (
        _act("a", 40.0, 38.5),
        _act("b", math.inf, math.inf, converted_to=()),
        _act("c", None, None, quantized=False, quant_type=None, scale=None, zero_point=None,
             local_status="not_quantized", worst_sample=None, float_min=None, float_max=None),
        _act("d", 12.25, None, cumulative_status="nonfinite", nonfinite_float=3, fused_activation="Relu"),
    )  # fmt: skip
    weights = (
        WeightResult("w", "conv", "Conv", "weight", "int8", 4, 45.5, "ok", 41.0, 0.002, 36, (4, 1, 3, 3)),
        WeightResult("s", "mul", "Mul", "weight", "uint8", 1, math.inf, "identical", None, 0.0, 1, ()),
        WeightResult("n", "max", "Max", "weight", "uint16", 1, None, "nonfinite", None, None, 8, (1, 8)),
    )
    outs = (OutputResult("y", 30.0, "ok", 1e-3, 0.1, 0), OutputResult("z", None, "undefined"))
    per_sample = PerSample(("a", "b", "c", "d"), np.array([[38.0, np.inf, np.nan, 1.0], [39.0, np.inf, np.nan, 2.0]]))
    summaries = Summaries(
        local=Summary.of([a.local_sqnr_db for a in acts if a.quantized]),
        cumulative=Summary.of([a.cumulative_sqnr_db for a in acts]),
        weight=Summary.of([w.weight_sqnr_db for w in weights]),
        output=Summary.of([o.cumulative_sqnr_db for o in outs]),
    )
    meta = ReportMeta("f.onnx", "q.onnx", "0" * 64, "1" * 64, 2, "synthetic", "0.1.0", "1.31.1", 0.5, 1, ("w1",))
    return DebugReport(acts, weights, outs, summaries, per_sample, PerSample(("y", "z"), np.zeros((2, 2))), meta)


def _strict(text: str) -> dict:
    def refuse(c: str) -> None:
        raise AssertionError(f"non-strict JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


def _assert_equal(a: DebugReport, b: DebugReport) -> None:
    assert a.activations == b.activations
    assert a.weights == b.weights
    assert a.model_outputs == b.model_outputs
    assert a.summary == b.summary
    assert a.meta == b.meta
    for pa, pb in ((a.per_sample, b.per_sample), (a.per_sample_outputs, b.per_sample_outputs)):
        assert pa.tensor_names == pb.tensor_names
        np.testing.assert_array_equal(pa.values, pb.values)  # NaN == NaN, inf == inf


def test_json_round_trip_preserves_inf_and_none(tmp_path: Path) -> None:
    rep = _report()
    text = rep.to_json()
    d = _strict(text)
    b = next(a for a in d["activations"] if a["tensor_name"] == "b")
    assert b["local_sqnr_db"] == "inf" and b["cumulative_sqnr_db"] == "inf"
    c = next(a for a in d["activations"] if a["tensor_name"] == "c")
    assert c["local_sqnr_db"] is None and c["local_status"] == "not_quantized" and c["float_min"] is None
    assert d["weights"][1]["weight_sqnr_db"] == "inf" and d["weights"][2]["weight_sqnr_db"] is None
    assert d["per_sample"]["values"][0] == [38.0, "inf", None, 1.0]
    assert d["summary"]["cumulative"] == {
        "count": 1, "mean": 38.5, "std": 0.0, "min": 38.5, "max": 38.5, "infinite": 1, "undefined": 2,
    }  # fmt: skip
    back = DebugReport.from_json(text)
    _assert_equal(back, rep)
    assert back.activation("b").local_sqnr_db == math.inf
    assert back.activation("a").converted_to == ("uint16",)
    assert back.weights[0].shape == (4, 1, 3, 3)
    rep.save(tmp_path / "sub" / "r.json")
    _assert_equal(DebugReport.load(tmp_path / "sub" / "r.json"), rep)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["r.json"]  # no temp file left behind


def test_encode_decode_numbers() -> None:
    assert [encode_number(v) for v in (1.5, math.inf, -math.inf, math.nan, None, 3)] == [
        1.5, "inf", "-inf", None, None, 3,
    ]  # fmt: skip
    assert [decode_number(v) for v in (1.5, "inf", "-inf", None, 2)] == [1.5, math.inf, -math.inf, None, 2.0]


def test_real_report_round_trip_and_strict_json(tmp_path: Path) -> None:
    f, q = builders.zero_tensors()
    rep = debug(save(f, tmp_path / "f.onnx"), save(q, tmp_path / "q.onnx"), None, DebugOptions(num_samples=3))
    text = rep.to_json()
    d = _strict(text)
    assert "Infinity" not in text and "NaN" not in text
    assert d["schema_version"] == 4  # 4: task score; 3: target divergence; 2: metrics, meta.capture (all still read)
    _assert_equal(DebugReport.from_json(text), rep)
    assert DebugReport.from_dict(d).activation("diff").cumulative_sqnr_db is None


def test_to_dataframe() -> None:
    rep = _report()
    df = rep.to_dataframe()
    assert len(df) == len(rep.activations) == 4
    # every field as a column; the metrics mapping is spread into metric.<name> columns (none in this report)
    assert list(df.columns) == [f.name for f in fields(ActivationResult) if f.name != "metrics"]
    assert list(df["tensor_name"]) == ["a", "b", "c", "d"]
    assert df.loc[1, "local_sqnr_db"] == math.inf
    assert df.loc[2, "local_status"] == "not_quantized"
    assert df.loc[0, "cumulative_sqnr_db"] == 38.5
    wdf = rep.weights_dataframe()
    assert list(wdf["weight_name"]) == ["w", "s", "n"] and "worst_channel_sqnr_db" in wdf.columns
    odf = rep.outputs_dataframe()
    assert list(odf["output_name"]) == ["y", "z"]
    ps = rep.per_sample.to_dataframe()
    assert ps.shape == (2, 4) and list(ps.columns) == ["a", "b", "c", "d"] and ps.index.name == "sample"


def test_dataframe_of_a_real_report(tiny_float: Path, tiny_quant) -> None:
    rep = debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=2))
    df = rep.to_dataframe()
    assert len(df) == 7
    assert list(df["tensor_name"]) == ["x", "r1", "c2", "a1", "gap", "flat", "y"]
    assert list(df["topo_index"]) == sorted(df["topo_index"])
    assert {"tensor_name", "local_sqnr_db", "cumulative_sqnr_db", "quant_type", "scale"} <= set(df.columns)


def test_worst_ordering_and_lookups() -> None:
    rep = _report()
    # undefined/non-finite first (they need attention), then ascending dB, +inf last
    assert [a.tensor_name for a in rep.worst("cumulative", 10)] == ["c", "d", "a", "b"]
    assert [a.tensor_name for a in rep.worst("local", 10)] == ["d", "a", "b"]  # 'c' is not quantized
    assert [w.weight_name for w in rep.worst("weight", 2)] == ["n", "w"]
    with pytest.raises(ValueError, match="unknown kind"):
        rep.worst("output")
    with pytest.raises(KeyError):
        rep.activation("nope")
    assert rep.output("y").cumulative_sqnr_db == 30.0
    assert rep.min_output_sqnr_db is None  # 'z' is undefined
    ok = replace(rep, model_outputs=(rep.model_outputs[0], OutputResult("z2", 25.0, "ok")))
    assert ok.min_output_sqnr_db == 25.0
    assert rep.activation("d").flagged and not rep.activation("a").flagged


def test_schema_version_and_garbage(tmp_path: Path) -> None:
    d = _report().to_dict()
    d["schema_version"] = 99
    with pytest.raises(InputFileError, match="schema_version 99"):
        DebugReport.from_dict(d)
    p = tmp_path / "r.json"
    p.write_text("{not json")
    with pytest.raises(InputFileError, match=str(p)):
        DebugReport.load(p)
    p.write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(InputFileError, match="not a qdebug debug report"):
        DebugReport.load(p)
    with pytest.raises(InputFileError):
        DebugReport.load(tmp_path / "missing.json")


def test_target_accuracy_from_before_schema_3_reads_as_the_lsb_rule() -> None:
    # A schema-2 report: per-tensor LSB figures only, first_divergent decided by "> lsb_threshold LSB".
    old = {
        "target": "qnn", "device": "default SoC (HTP v68)", "num_samples": 4, "seconds_per_sample": 0.01,
        "outputs": [
            {"output_name": "y", "target_vs_float_db": 20.0, "cpu_vs_float_db": 35.0, "target_vs_cpu_db": 20.1}
        ],
        "tensors": [
            {"tensor_name": "a", "topo_index": 0, "quant_type": "uint16", "max_lsb": 3, "fraction_differ": 0.5,
             "sqnr_db": 50.0},
            {"tensor_name": "b", "topo_index": 1, "quant_type": "uint16", "max_lsb": 0, "fraction_differ": 0.0,
             "sqnr_db": "inf"},
        ],
        "lsb_threshold": 1, "first_divergent": "a", "probe_single_partition": True, "notes": [],
    }  # fmt: skip
    acc = TargetAccuracy.from_dict(old)
    assert acc.divergence_rule == "lsb" and acc.first_divergent == "a"
    assert [t.tensor_name for t in acc.flagged] == ["a"]
    assert acc.tensors[0].excess_noise_ratio is None and acc.tensors[1].sqnr_db == math.inf
    # Written again, it is a schema-3 dict that keeps the rule it was decided by.
    again = TargetAccuracy.from_dict(json.loads(json.dumps(acc.to_dict())))
    assert again == acc and again.to_dict()["divergence_rule"] == "lsb"
    out = io.StringIO()
    print_divergence(acc, out)
    assert "2 quantized activations compared, 1 differ by more than 1 LSB on the target; first: a" in out.getvalue()


def test_target_accuracy_prints_where_the_divergence_starts() -> None:
    t = TargetTensorDiff(
        "a", 0, "uint16", 900, 0.9, 20.0, op_type="Relu", cpu_vs_float_db=35.0, target_vs_float_db=19.9,
        excess_noise_ratio=31.6, sqnr_drop_db=15.1, flagged=True,
    )  # fmt: skip
    acc = TargetAccuracy(
        "qnn", "dev", 4, 0.01, (), (t,), first_divergent="a", divergence_starts=("a",),
        divergence_ops=(("BatchNormalization", 1), ("Relu", 1)),
        first_divergent_nodes=(("BatchNormalization", "bn"), ("Relu", "relu")),
    )  # fmt: skip
    assert TargetAccuracy.from_dict(json.loads(json.dumps(acc.to_dict()))) == acc
    out = io.StringIO()
    print_divergence(acc, out)
    text = out.getvalue()
    assert "1 flagged" in text and "divergence starts at a (Relu): vs float CPU-QDQ 35.00 dB, target 19.90 dB" in text
    assert "the target adds 31.6x the quantization error; max 900 LSB; 1 start(s)" in text
    assert "computed by: BatchNormalization bn -> Relu relu" in text
    assert "by op: BatchNormalization 1, Relu 1" in text
