"""The dashboard on a QDQ model the user gave (issue 38), in Debian's chromium: the float model and the user's
quantized model typed as files on the server, Run, tick the first suggestion, Promote; the before/after names the
user's model as "before" with its own worst output SQNR, says which Q/DQ pairs the promotion patched and what was
predicted beside what was measured; **Download fixed model** offers the model and its recipe as links, and the
recipe rebuilds the same model through the CLI. Screenshot: ``test-output/screenshots/dashboard_patch.png``."""

from __future__ import annotations

import base64
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from browser.conftest import (
    SAMPLE_MODELS,
    assert_no_page_errors,
    checkout_env,
    free_port,
    notebook_copy,
    serve,
    start_voila,
)
from qdebug.config import QuantConfig
from qdebug.quantizer import quantize

pytestmark = pytest.mark.slow


def _outputs(model: bytes | str, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [sess.run(None, {"input": xi})[0] for xi in x]


def test_promote_your_model_then_download_it(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    from qdebug.cli import main

    models = tmp_path / "models"
    models.mkdir()
    float_model = Path(shutil.copy(SAMPLE_MODELS / "digits_cnn.onnx", models / "digits_cnn.onnx"))
    calib = Path(shutil.copy(SAMPLE_MODELS / "digits_calib.npz", models / "digits_calib.npz"))
    user = models / "mine.qdq.onnx"  # the user's own recipe: int8 per-channel weights
    quantize(float_model, calib, QuantConfig(weight_type="int8", per_channel=True, num_samples=32), user, check=False)
    nbdir = notebook_copy(tmp_path, "dashboard.ipynb")
    port = free_port()
    env = {
        **checkout_env(tmp_path),
        "QDEBUG_DASHBOARD_WORKDIR": str(tmp_path / "work"),
        "QDEBUG_DASHBOARD_ROOT": str(tmp_path),
    }
    (tmp_path / "work").mkdir()
    with serve(start_voila(nbdir / "dashboard.ipynb", port), port, cwd=nbdir, env=env):
        page.goto(f"http://127.0.0.1:{port}/")
        expect(page.locator(".qd-dash-run")).to_be_visible()
        page.locator(".qd-dash-source button", has_text="file on the server").click()
        path_box = page.locator(".qd-dash-model-path input")
        path_box.fill(str(float_model))
        path_box.press("Enter")
        page.locator(".qd-dash-quant input").fill(str(user))
        page.locator(".qd-dash-data-choice select").select_option(label="file on the server (.npz)")
        data_box = page.locator(".qd-dash-data input").first
        data_box.fill(str(calib))
        data_box.press("Enter")
        page.locator(".qd-dash-run").click()
        expect(page.locator(".qd-dash-ok")).to_contain_text("worst output SQNR")
        app = page.locator(".qd-app")
        suggestion = app.locator(".qd-suggestion-text").first
        expect(suggestion).to_contain_text("dB at output")
        assert "+48.2" not in suggestion.inner_text()
        app.locator(".qd-suggestion input").first.check()
        app.locator(".qd-promote").click()
        box = app.locator(".qd-before-after-box")
        expect(box).to_contain_text("re-gridded in your model")
        expect(box).to_contain_text("before: your model (mine.qdq.onnx)")
        expect(box.locator(".qd-step-gain")).to_contain_text(re.compile(r"predicted [+-]\d+\.\d dB, measured"))
        app.locator(".qd-export-fix").click()
        model_link = app.locator("a.qd-fix-download-model")
        recipe_link = app.locator("a.qd-fix-download-recipe")
        expect(model_link).to_have_attribute("href", re.compile("^data:application/octet-stream;base64,"))
        expect(recipe_link).to_have_attribute("href", re.compile("^data:application/json;base64,"))
        expect(app.locator(".qd-rebuild")).to_contain_text("--quant-model")
        box.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshot_dir / "dashboard_patch.png"), full_page=True)
        fixed = base64.b64decode(model_link.get_attribute("href").split(",", 1)[1])
        recipe = tmp_path / "recipe.json"
        recipe.write_bytes(base64.b64decode(recipe_link.get_attribute("href").split(",", 1)[1]))
    # the downloaded recipe rebuilds the downloaded model from the user's, through the CLI
    out = tmp_path / "rebuilt.qdq.onnx"
    assert main(["quantize", "-f", str(float_model), "--quant-model", str(user), "--overrides", str(recipe),
                 "-o", str(out)]) == 0  # fmt: skip
    x = np.load(calib)["input"][:4]
    for a, b in zip(_outputs(str(out), x), _outputs(fixed, x), strict=True):
        np.testing.assert_array_equal(a, b)
    assert_no_page_errors(page_errors)
