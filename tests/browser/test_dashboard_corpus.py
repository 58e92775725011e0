"""The dashboard on a real corpus model (issue 38, deliverable 10), in Debian's chromium: YOLOv8n (``yolov8n-nudenet``
from ``.corpus/``, filled by ``make corpus-test``) quantized here with qdebug's library is the user's QDQ model;
float model, QDQ model and data are uploaded through the page, then in one page session: the suggestions carry
calibrated estimates; Download fixed model before any promotion gives the user's model back; Promote the top
suggestion: "before" names the user's model with the worst output SQNR qdebug's own ``debug`` reports for it, the
panel lists what changed, the suggestion says what it measured, and the downloaded model now differs; Run and
Promote are disabled while the promotion runs; the graph opens coloured by where the error is born and the grouped
heatmap labels its groups; closing the page releases the kernel. Screenshots: ``dashboard_corpus_*.png``."""

from __future__ import annotations

import base64
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from browser.conftest import REPO, assert_no_page_errors, checkout_env, free_port, notebook_copy, serve, start_voila
from browser.test_dashboard_voila import CLOSED_KERNEL_S, _kernels, _until, _upload

pytestmark = pytest.mark.slow

#: YOLOv8n (296 tensors at 320×320): its name scopes make the graph's groups (the C2f blocks, the detect head), and the
#: whole walk stays within the browser tests' budget on a 2-core machine.
MODEL = "yolov8n-nudenet"
CORPUS = REPO / ".corpus" / MODEL
#: Debug samples uploaded (the dashboard debugs on all of them, as the library check below does).
SAMPLES = 4
#: Calibration samples for the user's own quantization.
CALIB = 8
#: The page writes SQNRs with two decimals: the library's figure must round to what it shows.
DB_TOL = 0.01
HEAT = ".qd-heatmap:not([data-old])"

#: The grouped heatmap is drawn as wide as its column (its group labels are thinned for that width).
_HEAT_FILLS = (
    f"() => {{ const el = document.querySelector('{HEAT}'); const svg = el && el.querySelector('.main-svg');"
    " return svg && Math.abs(+svg.getAttribute('width') - el.parentElement.clientWidth) <= 2; }"
)

#: Records, from the page itself, whether Run and Promote were both disabled at some moment (a promotion of this
#: model may be over before a poll from the test would see it).
_WATCH_BUSY = """() => {
  const run = document.querySelector('.qd-dash-run'), promote = document.querySelector('.qd-app .qd-promote');
  window.__qdBothDisabled = false;
  const look = () => { if (run.disabled && promote.disabled) window.__qdBothDisabled = true; };
  const obs = new MutationObserver(look);
  for (const b of [run, promote]) obs.observe(b, {attributes: true, attributeFilter: ['disabled']});
}"""


def _corpus() -> Path:
    """The corpus model's folder; skipped locally, failed under CI=true when ``make corpus-test`` did not fill it."""
    if not ((CORPUS / f"{MODEL}.onnx").is_file() and (CORPUS / "eval.npz").is_file()):
        why = f"{MODEL} is not in {CORPUS.parent} (run `make corpus-test`)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why} (CI=true: the corpus browser test must run, not skip)")
        pytest.skip(why)
    return CORPUS


def _inputs(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """Float model, the user's QDQ model (qdebug's library, int8 per-channel weights), debug data, calibration."""
    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    corpus = _corpus()
    models = tmp_path / "models"
    models.mkdir()
    float_model = Path(shutil.copy(corpus / f"{MODEL}.onnx", models / f"{MODEL}.onnx"))
    data = models / "debug.npz"
    np.savez(data, **{k: v[:SAMPLES] for k, v in np.load(corpus / "eval.npz").items()})
    calib = models / "calib.npz"
    np.savez(calib, **{k: v[:CALIB] for k, v in np.load(corpus / "calib.npz").items()})
    user = models / f"{MODEL}.qdq.onnx"
    config = QuantConfig(weight_type="int8", per_channel=True, num_samples=CALIB)
    quantize(float_model, calib, config, user, check=False)
    return float_model, user, data, calib


def _outputs(model: bytes | str, data: Path) -> list[list[np.ndarray]]:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    arrays = dict(np.load(data))
    return [sess.run(None, {k: v[i] for k, v in arrays.items()}) for i in range(SAMPLES)]


def _same(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> bool:
    return all(np.array_equal(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _download(app: Any, tmp_path: Path, name: str, previous: bytes | None = None) -> Path:
    """Download fixed model: the model link's bytes, written to ``name``; with ``previous`` (what an earlier
    download gave), waits until the link offers other bytes (the earlier link stays until the new one replaces it)."""
    from playwright.sync_api import expect

    app.locator(".qd-export-fix").click()
    link = app.locator("a.qd-fix-download-model")
    expect(link).to_have_attribute("href", re.compile("^data:application/octet-stream;base64,"))
    if previous is not None:
        old = "data:application/octet-stream;base64," + base64.b64encode(previous).decode("ascii")
        expect(link).not_to_have_attribute("href", old)
    out = tmp_path / name
    out.write_bytes(base64.b64decode(link.get_attribute("href").split(",", 1)[1]))
    return out


def _estimates(texts: list[str]) -> list[float]:
    found = [float(m.group(1)) for t in texts for m in [re.search(r"est\. ([+-]\d+\.\d) dB at output", t)] if m]
    assert len(found) == len(texts), f"a suggestion without its estimate: {texts}"
    return found


def _upload_and_run(page: Any, files: tuple[Path, Path, Path], shot: str) -> Any:
    """Upload float model, the user's QDQ model and the data, as a user without access to the server's disk gives
    them; Run; wait until it is over. Returns the Run button."""
    from playwright.sync_api import expect

    float_model, user, data = files
    run = page.locator(".qd-dash-run")
    expect(run).to_be_visible()
    # the three files uploaded, as a user without access to the server's disk gives them
    page.locator(".qd-dash-source button", has_text="upload").click()
    _upload(page, ".qd-dash-upload", float_model)
    _upload(page, ".qd-dash-quant-upload", user)
    page.locator(".qd-dash-data-choice select").select_option(label="upload (.npz)")
    _upload(page, ".qd-dash-data-upload", data)
    page.screenshot(path=shot.format("1_form"), full_page=True)
    run.click()
    expect(page.locator(".qd-dash-ok")).to_contain_text("worst output SQNR", timeout=180_000)
    return run


def _check_graph_and_heatmap(page: Any, app: Any, shot: str) -> None:
    """(6) the graph opens coloured by where the error is born; the grouped heatmap labels the graph's groups."""
    from playwright.sync_api import expect

    page.locator(".lm-TabBar-tab", has_text="Graph").first.click()
    expect(app.locator(".qd-graph-colour button.mod-active")).to_have_text(re.compile("where the error is born"))
    expect(app.locator(".qd-graph .gtitle")).to_contain_text("where the error is born")
    note = app.locator(".qd-graph-note")
    expect(note).to_contain_text(re.compile(r"\d+ tensors in \d+ groups"))
    groups = int(re.search(r"tensors in (\d+) groups", note.inner_text()).group(1))  # type: ignore[union-attr]
    page.screenshot(path=shot.format("5_graph"), full_page=True)
    page.locator(".lm-TabBar-tab", has_text="Heatmap").first.click()
    page.locator(f"{HEAT} .main-svg").first.wait_for()
    page.evaluate("() => document.querySelectorAll('.qd-heatmap').forEach(e => e.dataset.old = 1)")
    app.locator(".qd-heatmap-groups input").click()
    page.locator(f"{HEAT} .xtick text").first.wait_for()
    page.wait_for_function(_HEAT_FILLS)  # a hidden tab's figure is resized once shown
    page.screenshot(path=shot.format("6_heatmap_grouped"), full_page=True)
    # one tick per graph group; a small group next to a bigger one keeps its tick but not its label (they would
    # overlap: qdebug.render.figures._group_axis), so the labels written are the bigger groups' names
    expect(page.locator(f"{HEAT} .xtitle")).to_contain_text(f"{groups} groups (as in the graph)")
    labels = [t.strip() for t in page.locator(f"{HEAT} .xtick text").all_text_contents()]
    assert all(labels) and len(set(labels)) == len(labels), f"blank or repeated group labels: {labels}"
    assert len(labels) >= groups // 2, f"{groups} graph groups, only {len(labels)} labelled: {labels}"
    assert not any(re.fullmatch(r"[\d.]+", t) for t in labels), f"positions, not names: {labels}"
    graph_names = {
        re.sub(r" \(\d+\)$", "", t.strip()) for t in app.locator(".qd-graph .textpoint text").all_text_contents()
    }
    assert {"model.4", "model.6", "model.22"} <= set(labels) & graph_names, (labels, graph_names)


def test_corpus_model_promote_download_views_close(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    import qdebug

    float_model, user, data, _ = _inputs(tmp_path)
    # What qdebug's own debug says of the user's model on the same samples: the page's "before" must say the same.
    lib_db = qdebug.debug(float_model, user, data, qdebug.DebugOptions(num_samples=SAMPLES)).min_output_sqnr_db
    assert lib_db is not None
    user_out = _outputs(str(user), data)

    nbdir = notebook_copy(tmp_path, "dashboard.ipynb")
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    env = {**checkout_env(tmp_path), "QDEBUG_DASHBOARD_WORKDIR": str(work), "QDEBUG_DASHBOARD_ROOT": str(tmp_path)}
    shot = str(screenshot_dir / "dashboard_corpus_{}.png")
    with serve(start_voila(nbdir / "dashboard.ipynb", port), port, cwd=nbdir, env=env) as server:
        page.set_viewport_size({"width": 1600, "height": 4000})  # Voila scrolls inside: a tall window shows it all
        page.goto(f"http://127.0.0.1:{port}/")
        run = _upload_and_run(page, (float_model, user, data), shot)
        app = page.locator(".qd-app")
        promote = app.locator(".qd-promote")
        expect(promote).to_be_enabled()  # the compile Run ends with is over
        expect(run).to_be_enabled()

        # (3) calibrated estimates: none at the uncalibrated ≥ 40 dB of old
        texts = [t.strip() for t in app.locator(".qd-suggestion-text").all_inner_texts()]
        assert texts, "no suggestion on the page"
        assert all(e < 40.0 for e in _estimates(texts)), texts
        top = texts[0].split(" (", 1)[0]
        page.screenshot(path=shot.format("2_run"), full_page=True)

        # (2) promoting nothing: the downloaded model is the user's model (same outputs)
        nothing = _download(app, tmp_path, "nothing.qdq.onnx")
        assert _same(_outputs(str(nothing), data), user_out)

        # (1) + (5): promote the top suggestion; Run and Promote disabled while it runs
        app.locator(".qd-suggestion input").first.check()
        page.evaluate(_WATCH_BUSY)
        promote.click()
        box = app.locator(".qd-before-after-box")
        expect(box).to_contain_text(f"before: your model ({user.name})")
        expect(box.locator(".qd-step-gain")).to_contain_text(re.compile(r"predicted [+-]\d+\.\d dB, measured [+-]\d"))
        expect(promote).to_be_enabled()
        assert page.evaluate("() => window.__qdBothDisabled"), "Run and Promote were never disabled together"
        before_cell = box.locator("table.qd-before-after tr", has_text="worst output SQNR").locator(".qd-before")
        shown = float(re.sub(r" dB$", "", before_cell.inner_text().strip()))
        assert abs(shown - lib_db) <= DB_TOL, f"page's before {shown} dB vs qdebug debug {lib_db:.4f} dB"
        changes = box.locator(".qd-changes").inner_text()
        assert top in changes, f"what changed does not name the promoted tensor {top!r}: {changes!r}"
        assert all(e < 40.0 for e in _estimates(app.locator(".qd-suggestion-text").all_inner_texts()))
        expect(app.locator("a.qd-fix-download-model")).to_have_count(0)  # no link to the model before the step
        box.scroll_into_view_if_needed()
        page.screenshot(path=shot.format("3_promoted"), full_page=True)

        # (2) after a promotion: the downloaded model loads in onnxruntime and its outputs differ from the user's
        fixed = _download(app, tmp_path, "fixed.qdq.onnx", previous=nothing.read_bytes())
        assert not _same(_outputs(str(fixed), data), user_out), "the fixed model answers as the user's model does"
        assert str(work) not in app.inner_text(), "the page shows the server's temporary folder"
        page.screenshot(path=shot.format("4_download"), full_page=True)

        # (3) the promoted tensor leaves the suggestions (it is 16-bit now); Undo shows it again with its measurement
        app.locator(".qd-undo").click()
        first = app.locator(".qd-suggestion-text", has_text=top).first
        expect(first).to_contain_text(re.compile(r"measured [+-]\d+\.\d dB.*\(predicted [+-]\d+\.\d dB\)"))
        expect(app.locator(".qd-fix-message")).to_contain_text("undone")
        expect(app.locator("a.qd-fix-download-model")).to_have_count(0)  # it offered the undone variant
        page.screenshot(path=shot.format("4b_undone"), full_page=True)

        _check_graph_and_heatmap(page, app, shot)
        assert_no_page_errors(page_errors, allowed=[r"\[anywidget\] Failed to initialize model"])

        # (7) closing the page releases its kernel
        assert _kernels(server)
        page.close(run_before_unload=True)
        _until(lambda: not _kernels(server), "the page's kernel shut down", timeout_s=CLOSED_KERNEL_S)
