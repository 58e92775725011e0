"""Exposing a quantized activation's integers instead of its post-Q/DQ floats (issue 12, ``qdebug/capture/dequant.py``).

Three measurements, each against its own peer in the same run:

``ort``
    The quantized model alone, one sample, in ONNX Runtime (optimizations off, as qdebug runs it): plain (the
    floor), exposing every pre-Q/DQ and post-Q/DQ tensor (as before), and exposing the pre-Q/DQ tensors and the
    integers instead of the post-Q/DQ floats (as segmented runs now do). Median of ``--repeats`` runs.
``debug``
    ``qdebug.debugger`` with ``--capture auto`` in a fresh process per run, with the integers exposed (``ints``) and
    without (``floats``: :func:`qdebug.capture.dequant.find_specs` finds nothing), alternating over ``--rounds``:
    per-sample time after the first sample, and the peak.
``kernel``
    The compiled reduction of one quantized activation (48 M elements in 48 tensors): two passes (the kernel
    before, :func:`pair_sums` twice), the fused pass on floats (:func:`both_sums`), the fused pass on integers
    (:func:`dequant_sums`).

Usage::

    .venv/bin/python benchmarks/bench_dequant.py --models ppocrv4-rec ppocrv4-det vit-s-focus yolov8n-nudenet \\
        u2netp --samples 16 --work /tmp/bpipe

``--work`` holds the quantized corpus models and data ``bench_realmodels.py`` writes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from child_runs import add_child_args, child_main, each_run, timed_debug  # noqa: E402


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def ort_side(model: str, work: Path, repeats: int) -> dict[str, Any]:
    """The quantized model's inference: plain, exposing floats, exposing integers."""
    import onnx
    from bench_realmodels import prepare

    from qdebug.capture.dequant import find_specs
    from qdebug.capture.kernels.reference import ReductionPlan
    from qdebug.ort import expose_outputs, make_session
    from qdebug.pairing import pair_models

    fp, qp, data = prepare(model, work, 8)
    fm, qm = onnx.load(fp), onnx.load(qp)
    pairing = pair_models(fm, qm)
    plan, specs = ReductionPlan.of(pairing), find_specs(qm, pairing)
    with np.load(data) as z:
        sample = {k: z[k][0] for k in z.files}
    ints = list(dict.fromkeys(specs[n].ints if n in specs else n for n in plan.quant_names))
    row: dict[str, Any] = {
        "model": model,
        "swapped": len(specs),
        "quantized": sum(a.quantized for a in pairing.activations),
    }
    plain: Any = make_session(qm, ["CPUExecutionProvider"])
    row["floor_ms"] = _median_ms(lambda: plain.run(None, sample), repeats)
    for label, names in (("floats", list(plan.quant_names)), ("ints", ints)):
        sess: Any = make_session(expose_outputs(qm, names), ["CPUExecutionProvider"])
        row[f"{label}_mb"] = sum(v.nbytes for v in sess.run(names, sample)) / 2**20
        row[f"{label}_ms"] = _median_ms(lambda s=sess, n=names: s.run(n, sample), repeats)
        del sess
    return row


def debug_child(model: str, n: int, mode: str, work: Path) -> dict[str, Any]:
    """One ``auto`` debug pass in this process, with the integers exposed or not."""
    from qdebug.capture import fetch

    if mode == "floats":
        fetch.find_specs = lambda *args: {}  # type: ignore[assignment]
    rep, times = timed_debug(model, n, work, "auto")
    cap = rep.meta.capture
    return {**times, "note": (cap.segment_note or "") if cap else ""}


def kernel_side(k: Any, size: int) -> dict[str, float]:
    """The three compiled passes of kernels ``k`` over one quantized activation's tensors: 48 M elements in all, as
    tensors of ``size`` elements (small ones show the per-call cost)."""
    rng = np.random.default_rng(0)
    count = 48_000_000 // size
    ints = [rng.integers(0, 256, size).astype(np.uint8) for _ in range(min(count, 48))]
    posts = [(q.astype(np.int32) - 128).astype(np.float32) * np.float32(0.02) for q in ints]
    refs = [p + np.float32(0.01) * rng.standard_normal(p.size).astype(np.float32) for p in posts]
    pres = [p + np.float32(0.005) for p in posts]
    row, inf, repeat = np.zeros(k.SLOTS), np.inf, count // len(ints)  # small tensors: the same few, many times

    def two() -> None:
        for _ in range(repeat):
            for r, x, p in zip(refs, pres, posts, strict=True):
                k.pair_sums(r, p, -inf, inf, -inf, inf, row, k.CUM_SIGNAL)
                k.pair_sums(x, p, -inf, inf, -inf, inf, row, k.LOC_SIGNAL)
                k.value_range(r, row, k.REF_MIN)

    def fused() -> None:
        for _ in range(repeat):
            for r, x, p in zip(refs, pres, posts, strict=True):
                k.activation_sums(r, x, p, -inf, inf, -inf, inf, True, row)

    def from_ints() -> None:
        for _ in range(repeat):
            for r, x, q in zip(refs, pres, ints, strict=True):
                k.dequant_sums(r, x, q, 0.02, 128, -inf, inf, -inf, inf, row)

    inf4 = (-inf, inf, -inf, inf)
    calls = [(r, x, q, 0.02, 128, inf4, True) for r, x, q in zip(refs, pres, ints, strict=True)]
    per_call = 200  # a sample of 200 activations, one call (the C kernels' bulk entry, what a run uses)
    groups = [calls[i : i + per_call] for i in range(0, len(calls), per_call)] * repeat
    rows = [np.zeros((len(g), k.SLOTS)) for g in groups]

    def bulk() -> None:
        for g, out in zip(groups, rows, strict=True):
            k.activations(g, out)

    parts = [("two passes", two), ("fused", fused), ("fused, integers", from_ints)]
    parts += [("fused, integers, one call per 200 tensors", bulk)] if hasattr(k, "activations") else []
    return {name: _median_ms(f, 5) for name, f in parts}


def kernel_table() -> None:
    """The C kernels against numba's, per pass and tensor size, and what loading each costs a fresh process."""
    import subprocess

    import qdebug.capture.kernels.numba_kernel as numba_kernels
    from qdebug.capture import compiled
    from qdebug.capture.kernels import c_kernel

    kernels = {"C": c_kernel.load(), "numba": numba_kernels}
    compiled.warm_up()  # numba's kernels compiled or loaded from its cache before timing
    numba_kernels.dequant_sums(
        *(np.zeros(17, np.float32),) * 2, np.zeros(17, np.uint8), 1.0, 0, 0, 1, 0, 1, np.zeros(8)
    )
    print("\n| pass over 48 M elements | tensor size | C ms | numba ms |\n|---|---|---|---|")
    for size in (1_000_000, 4_000):
        got = {name: kernel_side(k, size) for name, k in kernels.items()}
        for part in got["C"]:
            numba_ms = f"{got['numba'][part]:.1f}" if part in got["numba"] else "—"
            print(f"| {part} | {size:,} | {got['C'][part]:.1f} | {numba_ms} |", flush=True)
    code = (
        "import time; import numpy as np, onnxruntime, qdebug.debugger, qdebug.capture\n"
        "def rss():\n"
        "    return [int(x.split()[1]) / 1024 for x in open('/proc/self/status') if x.startswith('VmRSS')][0]\n"
        "r, t = rss(), time.perf_counter()\n"
        "from qdebug.capture.kernels import {mod}\n"
        "z = np.zeros(17, np.float32)\n"
        "{mod}{load}.activation_sums(z, z, z, -1.0, 1.0, -1.0, 1.0, True, np.zeros(8))\n"
        "print(time.perf_counter() - t, rss() - r)"
    )
    print("\n| kernels (qdebug imported) | first call in a fresh process s | RSS added MB |\n|---|---|---|")
    for name, mod, load in (("C", "c_kernel", ".load()"), ("numba", "numba_kernel", "")):
        cmd = [sys.executable, "-c", code.format(mod=mod, load=load)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        seconds, mb = (float(v) for v in out.stdout.split())
        print(f"| {name} | {seconds:.3f} | {mb:.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--parts", nargs="+", choices=("ort", "debug", "kernel"), default=["ort", "debug", "kernel"])
    add_child_args(ap, ["ppocrv4-rec", "ppocrv4-det", "vit-s-focus", "yolov8n-nudenet", "u2netp"], 16)
    a = child_main(ap, argv, debug_child)
    if a is None:
        return 0
    if "ort" in a.parts:
        print(
            "\n| model | integers exposed / quantized | floor ms | floats exposed ms (MB) | integers exposed ms (MB) |"
        )
        print("|---|---|---|---|---|")
        for model in a.models:
            r = ort_side(model, a.work, a.repeats)
            print(
                f"| {model} | {r['swapped']} / {r['quantized']} | {r['floor_ms']:.1f} | {r['floats_ms']:.1f} "
                f"({r['floats_mb']:.0f}) | {r['ints_ms']:.1f} ({r['ints_mb']:.0f}) |",
                flush=True,
            )
    if "debug" in a.parts:
        print(f"\n`auto`, N = {a.samples}, fresh process per run\n")
        print("| model | exposed | per sample ms | wall s | peak MB |")
        print("|---|---|---|---|---|")
        for model, mode, r in each_run(__file__, a, ("floats", "ints")):
            print(
                f"| {model} | {mode} | {r['per_sample_ms']:.0f} | {r['wall_s']:.1f} | {r['peak_mb']:.0f} |", flush=True
            )
    if "kernel" in a.parts:
        kernel_table()
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
