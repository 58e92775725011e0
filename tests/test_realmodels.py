"""The real-model corpus' own code: the registry's typed view of both sets, the MCU set's input generators, and the
gauntlet's Deeploy rules (issue 37). Nothing here reads the model cache: the models are never needed."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from benchmarks.realmodels import data_mcu, gauntlet_deeploy
from benchmarks.realmodels import registry as reg
from benchmarks.realmodels.data import _stream, make_samples
from benchmarks.realmodels.gauntlet import Status, judge_deeploy

MAIN = [
    "yolov8n-nudenet", "ppocrv4-rec", "ppocrv4-det", "ppocr-cls", "ddddocr-crnn", "silero-vad", "minilm-l3",
    "vit-s-focus", "u2netp",
]  # fmt: skip


def test_the_main_set_is_unchanged_and_the_default() -> None:
    r = reg.load_registry()
    assert [m.name for m in r.select()] == MAIN
    main_ci = r.select(ci=True, corpus_set=reg.ModelSet.MAIN)
    assert [m.name for m in main_ci] == ["yolov8n-nudenet", "ppocrv4-rec", "silero-vad"]
    # The CI subset is every set's CI models: one MCU model under 1 MB joins the main set's three.
    ci = r.select(ci=True)
    assert ci[:3] == main_ci and [(m.corpus_set, m.size < 1_000_000) for m in ci[3:]] == [(reg.ModelSet.MCU, True)]
    raw = json.loads(reg.REGISTRY_JSON.read_text(encoding="utf-8"))
    assert all("set" not in m for m in raw["models"] if m["name"] in MAIN)


def test_the_mcu_set_loads_typed() -> None:
    r = reg.load_registry()
    mcu = r.select(corpus_set=reg.ModelSet.MCU)
    assert len(mcu) >= 5
    assert all(m.corpus_set is reg.ModelSet.MCU and m.size <= 5_500_000 for m in mcu)
    assert {m.name for m in mcu}.isdisjoint(MAIN)
    assert "silero-vad" not in {m.name for m in mcu}
    covered = {c for m in mcu for c in m.covers}
    assert {reg.Coverage.KEYWORD_SPOTTING, reg.Coverage.TINY_IMAGE_CLASSIFIER, reg.Coverage.BYTE_CLASSIFIER} <= covered
    assert not r.uncovered()
    assert [m.name for m in r.select(["magika"])] == ["magika"]  # --only reaches any set
    kinds = {i.distribution.kind for m in mcu for i in m.inputs}
    assert {reg.DistKind.BYTES, reg.DistKind.LOG_MEL, reg.DistKind.FBANK_LFR, reg.DistKind.WAKEWORD} <= kinds


def test_registry_round_trips() -> None:
    r = reg.load_registry()
    again = reg.Registry.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r
    raw = json.loads(reg.REGISTRY_JSON.read_text(encoding="utf-8"))
    assert r.to_dict()["models"] == raw["models"]  # the file is exactly what the typed view writes


def test_needs_come_first_once_and_unknown_needs_are_refused() -> None:
    r = reg.load_registry()
    names = [m.name for m in r.with_needs([r.get("oww-alexa"), r.get("oww-hey-rhasspy")])]
    assert names == ["oww-melspec", "oww-embedding", "oww-alexa", "oww-hey-rhasspy"]
    raw = r.to_dict()
    raw["models"][-1]["needs"] = ["no-such-model"]
    with pytest.raises(ValueError, match="no-such-model"):
        reg.Registry.from_dict(raw)


def _spec(kind: str, concrete: list[int], dtype: str = "float32", **dist: Any) -> reg.InputSpec:
    d = {"name": "x", "dtype": dtype, "shape": concrete, "concrete": concrete, "distribution": {"kind": kind, **dist}}
    return reg.InputSpec.from_dict(d)


def _entry(*specs: reg.InputSpec) -> reg.ModelEntry:
    base = reg.load_registry().get("magika")
    from dataclasses import replace

    return replace(base, name="synthetic", inputs=specs)


def test_file_bytes_are_files_first_and_last_bytes_padded() -> None:
    e = _entry(_spec("bytes", [1, 64], "int32", context=32, value=256))
    a, b = make_samples(e, 24, seed=3)["x"], make_samples(e, 24, seed=3)["x"]
    assert a.shape == (24, 1, 64) and a.dtype == np.int32
    np.testing.assert_array_equal(a, b)  # deterministic per seed
    assert a.min() >= 0 and a.max() <= 256
    assert (a < 256).any(axis=-1).all()  # every sample has real bytes
    assert not np.array_equal(a, make_samples(e, 24, seed=4)["x"])


def test_log_mel_matches_dnsmos_scaling() -> None:
    d = reg.Distribution.from_dict({"kind": "log-mel", "mels": 20, "fft": 65, "hop": 16, "sample_rate": 16000})
    x = data_mcu.log_mel(d, (1, 50, 20), 3, np.random.default_rng(0), _stream)
    assert x.shape == (3, 1, 50, 20)
    # (power_to_db(ref=max, top_db=80) + 40) / 40 lies in [-1, 1] and reaches 1 at each clip's loudest bin.
    assert x.min() >= -1.0 - 1e-9 and np.allclose(x.reshape(3, -1).max(axis=1), 1.0)


def test_slaney_filters_are_librosa_shaped() -> None:
    f = data_mcu.slaney_filters(16000, 321, 120)
    assert f.shape == (120, 161) and (f >= 0).all()
    # 120 bands over 50 Hz bins: librosa too leaves some of the lowest bands empty; above them every band has weight
    # and the bands' peaks rise with the band index.
    assert (f.sum(axis=1)[10:] > 0).all()
    peaks = f[10:].argmax(axis=1)
    assert (np.diff(peaks) >= 0).all() and peaks[-1] > 150


def test_fbank_lfr_stacks_and_normalises() -> None:
    d = reg.Distribution.from_dict({"kind": "fbank-lfr", "mels": 8, "hop": 160, "stack": 5, "sample_rate": 16000})
    x = data_mcu.fbank_lfr(d, (1, 20, 40), 4, np.random.default_rng(1), _stream)
    assert x.shape == (4, 1, 20, 40)
    flat = x.reshape(-1, 40)
    assert np.allclose(flat.mean(axis=0), 0.0, atol=1e-6) and np.allclose(flat.std(axis=0), 1.0, atol=1e-3)
    # frame t's stacked slot k holds frame t+k-2: slot 2 of frame 1 is slot 3 of frame 0 (before normalising per
    # dim, so compare the order of values instead of the values).
    assert np.argsort(flat[1:30, 16:24], axis=0).tolist() == np.argsort(flat[:29, 24:32], axis=0).tolist()


def test_images_channels_last() -> None:
    e = _entry(_spec("image", [1, 12, 20, 3], scale=1.0, style="text", channels_last=True))
    x = make_samples(e, 2)["x"]
    assert x.shape == (2, 1, 12, 20, 3) and x.min() >= 0.0 and x.max() <= 1.0


# ---- the gauntlet's Deeploy rules -------------------------------------------------------------------------------


def _manifest(ran: bool, equal: float, diff: int) -> dict[str, Any]:
    run = {"ran": ran, "bit_exact": ran and equal == 1.0 and diff == 0, "num_samples": 2}
    run |= {"equal_fraction_vs_integer_onnx": equal, "max_diff_vs_integer_onnx": diff} if ran else {"error": "no gcc"}
    return {"deeploy": {"export": {"equal_fraction": 1.0, "max_lsb_diff": 0}, "run": {"Generic": run}}}


def test_an_ok_deeploy_build_must_be_bit_exact_on_the_host() -> None:
    status, _, figs = judge_deeploy(Status.OK, "", {}, _manifest(True, 1.0, 0), strict=False)
    assert status is Status.OK and figs["host_bit_exact"] is True
    status, reason, _ = judge_deeploy(Status.OK, "", {}, _manifest(True, 0.98, 3), strict=False)
    assert status is Status.DEFECT and "not bit-exact" in reason and "98.0000%" in reason
    status, reason, _ = judge_deeploy(Status.OK, "", {}, _manifest(False, 0.0, 0), strict=False)
    assert status is Status.DEFECT and "not run" in reason and "no gcc" in reason
    status, reason, _ = judge_deeploy(Status.OK, "", {}, {}, strict=False)
    assert status is Status.DEFECT and "no deeploy section" in reason


def test_mcu_refusals_must_name_an_op_deeploy_does_not_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gauntlet_deeploy, "deeploy_generic_ops", lambda: ("Add", "Conv", "Pad"))
    pad = "qdebug: error: Pad node 'a/b' cannot be exported to Deeploy: no integer form"
    sig = "qdebug: error: Sigmoid node 's' cannot be exported to Deeploy: Deeploy 0.2.1 has no Generic mapping"
    status, reason, figs = judge_deeploy(Status.REFUSED, pad, {}, {}, strict=True)
    assert status is Status.DEFECT and reason.startswith("export gap: refused Pad") and figs["deeploy_maps_op"]
    assert judge_deeploy(Status.REFUSED, pad, {}, {}, strict=False)[0] is Status.REFUSED  # the main set: unchanged
    status, reason, figs = judge_deeploy(Status.REFUSED, sig, {}, {}, strict=True)
    assert status is Status.REFUSED and reason == sig and figs == {"refused_op": "Sigmoid", "deeploy_maps_op": False}
    status, reason, _ = judge_deeploy(Status.REFUSED, "qdebug: error: no samples", {}, {}, strict=True)
    assert status is Status.DEFECT and "without naming an op" in reason
    assert judge_deeploy(Status.DEFECT, "exit 1", {}, {}, strict=True)[:2] == (Status.DEFECT, "exit 1")
    # Without Deeploy's environment the build refuses for that, and there is nothing to judge.
    monkeypatch.setattr(gauntlet_deeploy, "deeploy_generic_ops", lambda: None)
    env = "qdebug: error: no Deeploy environment at .venv-deeploy (create it with `make deeploy-env`)"
    assert judge_deeploy(Status.REFUSED, env, {}, {}, strict=True)[:2] == (Status.REFUSED, env)
