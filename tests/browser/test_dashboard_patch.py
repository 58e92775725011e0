"""The dashboard on a QDQ model the user gave (issue 38), in Debian's chromium: the float model and the user's
quantized model typed as files on the server, Run, tick the first suggestion, Promote; the before/after names the
user's model as "before" with its own worst output SQNR, says which Q/DQ pairs the promotion patched and what was
predicted beside what was measured; **Download fixed model** offers the model and its recipe as links, and the
recipe rebuilds the same model through the CLI. Screenshot: ``test-output/screenshots/dashboard_patch.png``."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from browser.conftest import (
    assert_no_page_errors,
    dashboard_on_your_model,
)

pytestmark = pytest.mark.slow


def _outputs(model: bytes | str, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [sess.run(None, {"input": xi})[0] for xi in x]


def test_promote_your_model_then_download_it(
    page: Any, page_errors: list[str], screenshot_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    from qdebug.cli import main

    with dashboard_on_your_model(page, tmp_path) as (float_model, user, calib):
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
