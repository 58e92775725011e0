"""The one-file HTML report (qdebug.render.html) and the commands that write it: ``qdebug report``,
``qdebug diagnose``, ``debug --html/--diagnose``, ``build --html``. The browser test
(tests/browser/test_html_report.py) opens the file offline; here the file's content is checked."""

from __future__ import annotations

import base64
import gzip
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CliResult, assert_one_line_error
from diag_models import per_channel_weight, scale_mismatch

from qdebug.debugger import DebugOptions, debug
from qdebug.diagnose import diagnose_models
from qdebug.findings import Diagnostics
from qdebug.mixed.suggest import suggest
from qdebug.render.html import HtmlOptions, plotly_bundle, report_html
from qdebug.render.html_plotly import CARTESIAN_BUNDLE, cartesian_only
from qdebug.report import DebugReport, TargetAccuracy, TargetOutputAccuracy

pytest.importorskip("plotly")


def _blob(page: str, element_id: str) -> str:
    m = re.search(rf'<script type="application/octet-stream" id="{element_id}">([^<]*)</script>', page)
    assert m is not None, element_id
    return gzip.decompress(base64.b64decode(m.group(1))).decode("utf-8")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("html")
    f, q = scale_mismatch()
    onnx.save(f, d / "f.onnx")
    onnx.save(q, d / "q.onnx")
    return d / "f.onnx", d / "q.onnx"


@pytest.fixture(scope="module")
def report(pair: tuple[Path, Path]) -> DebugReport:
    return debug(*pair, None, DebugOptions(num_samples=4))


@pytest.fixture(scope="module")
def diags(report: DebugReport, pair: tuple[Path, Path]) -> Diagnostics:
    return diagnose_models(report, *pair, max_samples=4)


def test_self_contained_with_every_section(report: DebugReport, diags: Diagnostics) -> None:
    import plotly.offline

    page = report_html(report, diagnostics=diags, suggestions=suggest(report))
    # Nothing is fetched: no external script, stylesheet, image or frame (plotly.js' own code holds URLs as text).
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    # The vendored 2-D bundle (heatmaps and scatter only here), a real plotly.js build of plotly.py's major version.
    js = _blob(page, "qd-plotly")
    assert js == gzip.decompress(CARTESIAN_BUNDLE.read_bytes()).decode("utf-8")
    full = plotly.offline.get_plotlyjs()
    major = re.compile(r'version:"(\d+)\.')
    assert "plotly.js (cartesian - minified)" in js[:200] and len(js) < len(full) / 3
    assert major.search(js)[1] == major.search(full)[1]  # type: ignore[index]
    figs = json.loads(_blob(page, "qd-figures"))
    assert [f["id"] for f in figs] == ["fig-layers", "fig-samples", "fig-graph"]
    graph = figs[2]["fig"]["data"]
    assert sorted(next(t for t in graph if t["name"] == "tensors")["customdata"]) == sorted(
        a.tensor_name for a in report.activations
    )
    for section in ("verdict", "outputs", "diagnostics", "suggestions", "worst", "provenance"):
        assert f'<section id="{section}"' in page
    assert '<section id="target"' not in page  # no target run, no empty section
    assert "scale mismatch" in page and "Verdict: " in page
    samples = figs[1]["fig"]["layout"]["yaxis"]  # whole sample numbers, not plotly's "0.5"
    assert samples["dtick"] == 1 and samples["tickformat"] == "d"
    assert all("width" not in f["fig"]["layout"] for f in figs)  # the page's width


def test_a_figure_outside_the_cartesian_bundle_gets_the_full_one() -> None:
    import plotly.graph_objects as go
    import plotly.offline

    assert cartesian_only([("a", "", go.Figure([go.Heatmap(z=[[1]]), go.Scatter(x=[1])]))])
    assert not cartesian_only([("a", "", go.Figure(go.Scatter3d(x=[1], y=[1], z=[1])))])
    assert gzip.decompress(base64.b64decode(plotly_bundle(False))).decode() == plotly.offline.get_plotlyjs()


def test_names_are_escaped_and_options_apply(report: DebugReport) -> None:
    evil = replace(report, meta=replace(report.meta, float_model="<script>alert(1)</script>.onnx"))
    page = report_html(evil, options=HtmlOptions(graph=False, samples_heatmap=False, title="T & <b>"))
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert "<title>T &amp; &lt;b&gt;</title>" in page
    assert [f["id"] for f in json.loads(_blob(page, "qd-figures"))] == ["fig-layers"]
    assert '<section id="diagnostics"' not in page  # none given: no section


def test_target_section_from_a_report_with_target_accuracy(report: DebugReport) -> None:
    acc = TargetAccuracy(
        target="qnn", device="htp-simulator", num_samples=4, seconds_per_sample=0.01,
        outputs=(TargetOutputAccuracy("y", 30.0, 53.0, 31.0),),
    )  # fmt: skip
    page = report_html(report.with_target_accuracy(acc), options=HtmlOptions(graph=False))
    target = page[page.index('<section id="target"') :]
    assert "htp-simulator" in target and "30.00 dB" in target and "53.00 dB" in target
    verdict = page[page.index('<section id="verdict"') : page.index('<section id="outputs"')]
    assert "On the target (htp-simulator) the worst output is at <b>30.00 dB</b>" in verdict


def test_graph_above_the_node_limit_uses_the_linear_layout(report: DebugReport) -> None:
    page = report_html(report, options=HtmlOptions(graph_max_nodes=2, samples_heatmap=False))
    graph = json.loads(_blob(page, "qd-figures"))[-1]["fig"]["data"]
    nodes = next(t for t in graph if t["name"] == "tensors")
    assert len(nodes["x"]) == len(report.activations)


# ---------------------------------------------------------------------------------------------- CLI
def test_report_command(run_cli: Callable[..., CliResult], report: DebugReport, tmp_path: Path) -> None:
    rj = report.save(tmp_path / "r.json")
    res = run_cli("report", rj, "-o", tmp_path / "r.html")
    assert res.code == 0, res.stderr
    assert "wrote" in res.out and "1 diagnostic(s)" in res.out  # report-only: the Concat's scales
    assert "scale mismatch" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_report_command_refuses_bad_use(run_cli: Callable[..., CliResult], report: DebugReport, tmp_path: Path) -> None:
    rj = report.save(tmp_path / "r.json")
    before = rj.read_bytes()
    assert_one_line_error(run_cli("report", rj, "-o", rj), 2, "r.json")
    assert rj.read_bytes() == before
    assert_one_line_error(run_cli("report", rj, "-o", tmp_path / "x.html", "-f", rj), 2, "--quant-model")
    (tmp_path / "bad.json").write_text("{}", encoding="utf-8")
    res = run_cli("report", tmp_path / "bad.json", "-o", tmp_path / "y.html")
    assert res.code != 0 and not (tmp_path / "y.html").exists()


def test_diagnose_command(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    f, q = per_channel_weight()
    onnx.save(f, tmp_path / "f.onnx")
    onnx.save(q, tmp_path / "q.onnx")
    args = ("diagnose", "-f", tmp_path / "f.onnx", "-q", tmp_path / "q.onnx", "--samples", "4")
    res = run_cli(*args, "-o", tmp_path / "d.json", "--html", tmp_path / "d.html")
    assert res.code == 0, res.stderr
    assert "per channel weight at W (MatMul)" in res.out and "fix:" in res.out
    saved = Diagnostics.from_dict(json.loads((tmp_path / "d.json").read_text(encoding="utf-8")))
    assert [d.tensor for d in saved.items] == ["W"] and saved.stats_samples == 4
    assert (tmp_path / "d.html").stat().st_size > 500_000  # plotly.js (the cartesian bundle, compressed) inside
    res = run_cli(*args, "--json", "--stats-samples", "0")
    assert res.code == 0 and json.loads(res.out)["stats_samples"] == 0


def test_debug_html_and_diagnose(run_cli: Callable[..., CliResult], pair: tuple[Path, Path], tmp_path: Path) -> None:
    res = run_cli("debug", "-f", pair[0], "-q", pair[1], "--samples", "4", "--diagnose", "--html", tmp_path / "r.html")
    assert res.code == 0, res.stderr
    assert "Diagnostics (why, and the fix to try): 1" in res.out and "HTML report written" in res.out
    assert '<section id="diagnostics"' in (tmp_path / "r.html").read_text(encoding="utf-8")
    assert_one_line_error(run_cli("debug", "-f", pair[0], "-q", pair[1], "--html", pair[1]), 2, "q.onnx")


def test_build_html_has_the_target_section(run_cli: Callable[..., CliResult], tiny_float: Path, tmp_path: Path) -> None:
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.random.default_rng(0).random((8, 1, 1, 6, 6), dtype=np.float32))
    out, page = tmp_path / "build", tmp_path / "build.html"
    res = run_cli(
        "build", "-f", tiny_float, "--target", "cpu", "--precision", "int8", "--calib", data, "--debug-samples", "4",
        "-o", out, "--html", page,
    )  # fmt: skip
    assert res.code == 0, res.stderr
    text = page.read_text(encoding="utf-8")
    target = text[text.index('<section id="target"') :]
    assert "Target: cpu (int8)" in target and "CPU check OK" in target
    assert "Compiled for " in target and "left on the CPU" in target  # the summary before the command's text


def test_long_axes_keep_at_most_max_ticks() -> None:
    """Hundreds of tensor-name labels on one axis stall the browser: the page keeps an even subset."""
    import plotly.graph_objects as go

    from qdebug.render.html_plotly import MAX_TICKS, thin_ticks

    names = [f"t{i}" for i in range(661)]
    fig = go.Figure(go.Heatmap(z=[list(range(661))]))
    fig.update_xaxes(tickmode="array", tickvals=list(range(661)), ticktext=names)
    thin = thin_ticks(fig)
    assert 20 <= len(thin.layout.xaxis.tickvals) <= MAX_TICKS
    assert list(thin.layout.xaxis.ticktext) == [names[v] for v in thin.layout.xaxis.tickvals]


def test_without_the_ui_extra_the_command_names_it_before_any_work(
    run_cli: Callable[..., CliResult], pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    import qdebug._lazy as lazy

    real = importlib.import_module

    def missing(name: str, *args: object) -> object:
        if name.split(".", maxsplit=1)[0] == "plotly":
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(lazy.importlib, "import_module", missing)
    r = run_cli(
        "debug",
        "-f",
        pair[0],
        "-q",
        pair[1],
        "--samples",
        "2",
        "-o",
        tmp_path / "r.json",
        "--html",
        tmp_path / "r.html",
    )
    assert_one_line_error(r, 6, "plotly", "qdebug[ui]")
    assert not (tmp_path / "r.json").exists()  # refused before the debug run
