"""Deeploy export of MiniLM-L3's encoder region (the corpus's smallest transformer; docs/deeploy.md, "MiniLM").

The region is what a PULP MCU would run: from the embedding LayerNorm's output and the additive attention-mask
bias (both float, computed on the host) to the last encoder LayerNorm's output (mean pooling stays on the host).
It is cut with :mod:`qdebug.region` exactly as ``qdebug build --extract-inputs ... --extract-outputs ...`` does,
its inputs computed by the float model on the corpus data, quantized for target ``deeploy`` (int8, calibrated on
calib.npz), zero-centred and snapped as the build does, exported with ``deeploy_export.export`` on eval.npz, and
this prints:

- the output bit-exactness (all eval samples) of the integer network vs the QDQ model on ONNX Runtime CPU;
- per op family, the *local* deviation (every integer node fed ONNX Runtime's own quantized inputs);
- the output SQNR vs float of the QDQ model and of the integer network (``evaluate_integer``).

Usage (needs the corpus in ~/.cache/qdebug/realmodels/minilm-l3)::

    .venv/bin/python benchmarks/bench_deeploy_minilm.py [--local-samples 4] [--keep DIR]

``--keep DIR`` writes the export (``network.onnx``, ``inputs.npz``, ``outputs.npz``) there, for
``deeploy_env.generate``.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_deeploy_transformer import _session, _sqnr, local_stats  # noqa: E402

from qdebug import quantize  # noqa: E402
from qdebug.config import QuantConfig  # noqa: E402
from qdebug.data import open_data  # noqa: E402
from qdebug.model_io import input_specs  # noqa: E402
from qdebug.region import Region, extract_region, probe, region_data  # noqa: E402
from qdebug.targets import deeploy_export as de  # noqa: E402
from qdebug.targets.deeploy_snap import snap_scales_for_deeploy  # noqa: E402
from qdebug.targets.deeploy_zero_centre import zero_centre_operands  # noqa: E402
from qdebug.targets.model_fixes import fix_static_shapes  # noqa: E402

CORPUS = Path.home() / ".cache" / "qdebug" / "realmodels" / "minilm-l3"
P = "/model/model.0/auto_model/"
#: the encoder region: embedding LayerNorm output + additive mask bias -> last encoder LayerNorm output
REGION = Region((P + "embeddings/LayerNorm/LayerNormalization_output_0", P + "Mul_1_output_0"), ("onnx::Shape_422",))


def _family_of(t: str, prod: dict[str, onnx.NodeProto], consts: set[str]) -> str:
    """The family of Q output ``t`` (by the op that feeds its Q)."""
    return _family(prod.get(prod[t].input[0]), consts, prod)


def _family(p: onnx.NodeProto | None, consts: set[str], prod: dict[str, onnx.NodeProto]) -> str:
    if p is None:
        return "input"
    if p.op_type == "Mul" and "intermediate" in p.name:
        return "GELU (Erf chain → RequantizediGELU)"
    if p.op_type in ("MatMul", "Add", "Mul", "Div"):
        const = any(t in consts or (t in prod and prod[t].input[0] in consts) for t in p.input)
        return f"{p.op_type} ({'with a constant' if const else 'of two activations'})"
    return p.op_type


def _region(tmp: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    model = onnx.load(str(CORPUS / "minilm-l3.onnx"))
    specs = input_specs(model)
    calib, ev = (open_data(CORPUS / f, specs) for f in ("calib.npz", "eval.npz"))
    what = "minilm-l3.onnx"
    first = probe(model, next(iter(calib)), (*REGION.inputs, *REGION.outputs), what)
    sub, _ = fix_static_shapes(extract_region(model, REGION, first, what))  # as the build's static_shapes fix
    path = tmp / "encoder.float.onnx"
    onnx.save(sub, str(path))
    return path, region_data(model, calib, REGION, what), region_data(model, ev, REGION, what)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--local-samples", type=int, default=4)
    ap.add_argument("--platform", default="Generic", choices=sorted(de.PLATFORM_FORMS))
    ap.add_argument("--keep", type=Path, help="write the export here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        fpath, calib, ev = _region(tmp)
        cfg = QuantConfig(activation_type="int8", weight_type="int8", target="deeploy")
        qdq0 = onnx.load(str(quantize(fpath, calib, cfg, tmp / "e.qdq.onnx").model_path))
        centred, changed = zero_centre_operands(qdq0)
        qdq, rep = snap_scales_for_deeploy(centred)
        print(f"zero-centred {len(changed)} tensor groups; snapped {len(rep.snapped)} requantizations")
        n = len(next(iter(ev.values())))
        res = de.export(qdq, tmp / "out", data=ev, num_samples=n, verbose=False, platform=args.platform)
        net = onnx.load(str(tmp / "out" / "network.onnx"))
        if args.keep:
            shutil.copytree(tmp / "out", args.keep, dirs_exist_ok=True)
        print(
            f"encoder output, {res.num_samples} eval samples: {res.equal_fraction:.2%} equal, "
            f"max {res.max_lsb_diff} LSB"
        )
        ops = collections.Counter(nd.op_type for nd in net.graph.node)
        print("integer network:", dict(sorted(ops.items())))
        xs = [{k: v[i] for k, v in ev.items()} for i in range(min(args.local_samples, n))]
        print(f"\nlocal deviation per op family ({len(xs)} eval samples):")
        print("| op family | elements | equal | max LSB |\n| --- | --- | --- | --- |")
        for fam, (eq, tot, mx) in sorted(
            local_stats(qdq, net, xs, lambda t, prod, consts: _family(prod.get(prod[t].input[0]), consts, prod)).items()
        ):
            print(f"| {fam} | {tot} | {eq / tot:.2%} | {mx} |")
        _accuracy(fpath, qdq, net, ev, n)


def _accuracy(fpath: Path, qdq: onnx.ModelProto, net: onnx.ModelProto, ev: dict[str, np.ndarray], n: int) -> None:
    flt, q_sess = _session(onnx.load(str(fpath))), _session(qdq)
    acts = de._input_activations(qdq)
    dq = next(nd for nd in qdq.graph.node if nd.output[0] == qdq.graph.output[0].name)
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer}
    s_out, zp_out = float(consts[dq.input[1]]), int(consts[dq.input[2]])
    out = net.graph.output[0].name
    f_o, q_o, i_o = [], [], []
    for i in range(n):
        x = {k: v[i] for k, v in ev.items()}
        f_o.append(flt.run(None, x)[0])
        q_o.append(q_sess.run(None, x)[0])
        qin = {}
        for k, a in acts.items():
            qin[k] = np.clip(np.rint(x[k] / a.scale) + a.zero_point, -128, 127).astype(np.int64) - a.offset
        i_o.append(s_out * (de.evaluate_integer(net, qin)[out].astype(np.float64) - zp_out))
    f, q, it = (np.concatenate(v).astype(np.float64) for v in (f_o, q_o, i_o))
    print(
        f"\nencoder output SQNR vs float ({n} eval samples): QDQ {_sqnr(f, q):.2f} dB, integer network "
        f"{_sqnr(f, it):.2f} dB; integer network vs QDQ {_sqnr(q, it):.2f} dB"
    )


if __name__ == "__main__":
    main()
