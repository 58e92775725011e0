"""A mixed-precision point on the HTP: a fixed float model (``<out>/<name>.float.onnx`` from ``qdebug build``) with the
last ``--fraction`` of its activations promoted to uint16 through ORT's fixer, quantized for QNN, compiled and run on
the HTP simulator; the output SQNR of CPU-QDQ and HTP vs float, and the tensors the per-tensor probe flags.
``--rewrite`` applies :func:`qdebug.targets.htp_numerics.rewrite_qdq` before compiling.

This is the measurement behind docs/qnn.md's paragraph on ppocr-cls's 8↔16 boundaries (a report, not a test)::

    C=~/.cache/qdebug/realmodels/ppocr-cls
    qdebug build -f $C/ppocr-cls.onnx --target qnn --precision uint8 --calib $C/calib.npz --data $C/eval.npz -o out/
    .venv/bin/python benchmarks/bench_htp_mixed_point.py out/ppocr-cls.float.onnx $C/calib.npz $C/eval.npz \\
        --fraction 0.38 --soc SM8550 --samples 4   # then --samples 16, and --rewrite
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import onnx

from qdebug.config import QuantConfig
from qdebug.data import open_data
from qdebug.graph_index import GraphIndex
from qdebug.mixed.promote import promote
from qdebug.model_io import input_specs
from qdebug.quantizer import quantize
from qdebug.targets.htp_numerics import rewrite_qdq
from qdebug.targets.qnn_accuracy import htp_accuracy
from qdebug.targets.qnn_compile import compile_qnn
from qdebug.targets.qnn_options import QnnOptions


def main() -> None:
    """Quantize, compile, measure; print the outputs and the flagged tensors."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("float_model")
    ap.add_argument("calib")
    ap.add_argument("data")
    ap.add_argument("--fraction", type=float, default=0.38, help="share of activations promoted, from the end")
    ap.add_argument("--soc", default=None)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rewrite", action="store_true")
    args = ap.parse_args()
    fmodel = onnx.load(args.float_model)
    acts = set(GraphIndex(fmodel).activations())
    ordered = [o for n in fmodel.graph.node for o in n.output if o in acts]
    chosen = ordered[len(ordered) - int(len(ordered) * args.fraction) :]
    base = QuantConfig(target="qnn")
    cfg = promote(args.float_model, chosen, "uint16", config=base).config if chosen else base
    opts = QnnOptions(soc=args.soc)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        quantize(args.float_model, args.calib, cfg, work / "q.onnx", check=False)
        if args.rewrite:
            fixed, done = rewrite_qdq(onnx.load(work / "q.onnx"))
            onnx.save(fixed, work / "q.onnx")
            print(f"rewritten: {', '.join(done) or 'nothing'}")
        rep = compile_qnn(work / "q.onnx", work, opts)
        if not rep.ok or rep.compiled_model is None:
            raise SystemExit(f"compile failed: {rep.error}")
        data = open_data(args.data, input_specs(fmodel), num_samples=args.samples)
        acc = htp_accuracy(args.float_model, work / "q.onnx", rep.compiled_model, data, out_dir=work, options=opts)
    print(f"{len(chosen)}/{len(ordered)} activations in uint16 ({opts.device_label()}, {args.samples} samples)")
    for o in acc.outputs:
        print(
            f"{o.output_name}: CPU-QDQ vs float {o.cpu_vs_float_db:.2f} dB, HTP vs float {o.target_vs_float_db:.2f} dB"
        )
    for t in acc.tensors:
        if t.flagged:
            print(f"  flagged {t.tensor_name} ({t.op_type}, {t.quant_type}): excess {t.excess_noise_ratio:.1f}x")


if __name__ == "__main__":
    main()
