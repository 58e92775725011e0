"""Run Deeploy's generated Generic code with qdebug's host kernels: the figures of docs/deeploy.md
("Running the generated code").

    .venv/bin/python benchmarks/bench_deeploy_host.py [--out DIR]

1. Deeploy's reference networks (tests/data/deeploy_reference) generated for Generic and run: equal elements vs
   Deeploy's golden outputs.
2. ``digits_cnn`` built for Deeploy (``qdebug build --target deeploy``), its Generic code run on all 540 eval digits:
   from ``network.generic.onnx`` (what the build uses) and from ``network.onnx`` as exported (the miscompiled
   residual Add); equality vs the integer network and vs CPU QDQ, top-1.

Needs gcc and the Deeploy environment (``make gcc deeploy-env``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx

from qdebug.build import BuildOptions, build
from qdebug.targets.deeploy_env import generate
from qdebug.targets.deeploy_host import check_generated, compile_generated, run_generated

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "data" / "deeploy_reference"
SAMPLES = REPO / "sample_models"


def reference_networks(work: Path) -> None:
    """Each reference network: generated for Generic, run once on its inputs.npz, compared with outputs.npz."""
    print("| network | equal to Deeploy's golden outputs |\n| --- | --- |")
    for net in sorted(p for p in REFERENCE.iterdir() if (p / "network.onnx").is_file()):
        res = generate(net, work / net.name, "Generic")
        if not res.ok or res.float_buffers:
            print(f"| {net.name} | not run: {'float buffers' if res.ok else 'Deeploy rejects it'} |")
            continue
        model = onnx.load(str(net / "network.onnx"))
        inits = {i.name for i in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in inits]
        with np.load(net / "inputs.npz") as z:
            sample = dict(zip(names, (z[k] for k in z.files), strict=False))
        with np.load(net / "outputs.npz") as z:
            golden = [z[k].reshape(-1).astype(np.int64) for k in z.files]
        got = run_generated(compile_generated(work / net.name, work), res.io, [sample])[0]
        flat = [got[o.name].reshape(-1) for o in model.graph.output]
        equal = sum(int((g == r).sum()) for g, r in zip(flat, golden, strict=True))
        total = sum(r.size for r in golden)
        print(f"| {net.name} | {equal}/{total} |")


def digits_cnn(out: Path) -> None:
    """Build digits_cnn for Deeploy, then run its Generic code on the 540 eval digits from both networks."""
    res = build(
        SAMPLES / "digits_cnn.onnx",
        out,
        BuildOptions("deeploy", "int8"),
        data=SAMPLES / "digits_calib.npz",
        eval_data=SAMPLES / "digits_eval.npz",
    )
    top1 = res.manifest.top1
    assert top1 is not None
    print(f"\nbuild: top-1 float {top1.float_model:.2%}, QDQ {top1.qdq_model:.2%}, compiled {top1.compiled_model:.2%}")
    with np.load(SAMPLES / "digits_eval.npz") as z:
        x, labels = z["input"], z["label"]
    samples = [{"input": x[i]} for i in range(len(x))]
    dep = out / "deeploy"
    qdq = out / res.manifest.files["qdq_model"]
    codegen = res.manifest.target_details["deeploy"]["codegen"]["Generic"]
    networks = [Path(codegen["network"]).name]  # what the build generated the Generic code from
    if codegen["generic_add_terms_rewritten"]:
        networks.append("network.onnx")  # the export as is, int32 RequantShift Add terms included
    for network in networks:
        gen = out / f"gen-{network}"
        g = generate(dep / network, gen, "Generic", inputs_npz=dep / "inputs.npz")
        run = check_generated(dep, gen, g.io, qdq, samples)
        with tempfile.TemporaryDirectory() as work:
            outs = run_generated(compile_generated(gen, work), g.io, _stored(dep, samples, qdq))
        hits = sum(int(np.argmax(o["logits"])) == int(labels[i]) for i, o in enumerate(outs))
        print(
            f"{network}: {run.num_samples} samples, vs integer network {run.equal_fraction_vs_integer_onnx:.2%} "
            f"(max {run.max_diff_vs_integer_onnx}), vs CPU QDQ {run.equal_fraction_vs_qdq:.2%} "
            f"(max {run.max_lsb_vs_qdq} LSB), top-1 {hits / len(outs):.2%}, compile {run.compile_seconds:.2f} s, "
            f"run {run.run_seconds:.2f} s, {len(run.compiler_warnings)} gcc warnings"
        )


def _stored(dep: Path, samples: list[dict[str, np.ndarray]], qdq: Path) -> list[dict[str, np.ndarray]]:
    from qdebug.targets.deeploy_host import integer_samples

    return integer_samples(onnx.load(str(qdq)), onnx.load(str(dep / "network.onnx")), samples)


def main() -> None:
    """Print both tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="build folder (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-deeploy-host-") as tmp:
        reference_networks(Path(tmp))
        digits_cnn(args.out or Path(tmp) / "build")


if __name__ == "__main__":
    main()
