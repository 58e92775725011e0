"""The sweeps behind docs/qnn.md, "Known HTP numeric behaviours": single ops (or the smallest region) built with
``onnx.helper``, compiled for the HTP and run on the simulator, against ONNX Runtime's CPU QDQ and float.

* ``reciprocal``: ``Reciprocal`` at uint8/uint16 for input grids ``[0, x_top]``; the HTP's output over float is
  ``x_top`` below 1.0 and 1 above; then ``Div(1, x)`` (the rewrite) on the same grids.
* ``conv_silu``: a 1×1 Conv 8→32 (uint8 weights, int32 bias) → ``x·Sigmoid(x)`` at uint16 for output sizes
  3…16, before and after the rewrite (the Sigmoid's output on uint8 ``[0, 1]``).
* ``hardsigmoid``: ``HardSigmoid(0.2x + 0.5)`` at uint8/uint16 for output grids ``[0, y_top]``, before and after
  the rewrite (the output grid ``[0, 1]``).
* ``log``: ``Log`` at uint8/uint16 for input grids ``[0, x_top]`` (x_top 1 … 9.15e9, oww-melspec's mel power),
  inputs log-uniform over the grid's top two decades; before and after the rewrite (``Log(x/c) + log c``).

Every row: SQNR (dB) of CPU-QDQ vs float, HTP vs float, HTP vs CPU-QDQ. A measurement report, not a test (the
assertions are in ``tests/test_htp_numerics.py``).

Usage::

    .venv/bin/python benchmarks/bench_htp_numerics.py [--only reciprocal,conv_silu,hardsigmoid,log] [--soc SM8550]
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdebug.ort import make_session
from qdebug.targets.htp_numerics import rewrite_qdq
from qdebug.targets.qnn_compile import compile_qnn
from qdebug.targets.qnn_options import QnnOptions
from qdebug.targets.qnn_session import qnn_session

GRIDS = {"uint8": (TensorProto.UINT8, 255), "uint16": (TensorProto.UINT16, 65535)}


def _qdq(name: str, lo: float, hi: float, act: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Q → DQ of ``name`` (read as ``<name>_dq``) on the asymmetric grid covering [lo, hi] and 0."""
    elem, qmax = GRIDS[act]
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / qmax
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), f"{name}_scale"),
        helper.make_tensor(f"{name}_zp", elem, [], [round(-lo / scale)]),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", [name, f"{name}_scale", f"{name}_zp"], [f"{name}_q"]),
        helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zp"], [f"{name}_dq"]),
    ]
    return nodes, inits


def _model(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x: np.ndarray, y_shape: list[int]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y_dq", TensorProto.FLOAT, y_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _db(ref: np.ndarray, x: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - x) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)


def measure(model: onnx.ModelProto, x: np.ndarray, ref: np.ndarray, options: QnnOptions) -> tuple[float, float, float]:
    """(CPU-QDQ vs float, HTP vs float, HTP vs CPU-QDQ)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(model, str(path))
        rep = compile_qnn(path, tmp, options)
        if not rep.ok or rep.compiled_model is None:
            raise SystemExit(f"compile failed: {rep.error}")
        htp = np.asarray(qnn_session(rep.compiled_model, options).run(["y_dq"], {"x": x})[0])
    cpu = np.asarray(make_session(model, ["CPUExecutionProvider"]).run(["y_dq"], {"x": x})[0])
    return _db(ref, cpu), _db(ref, htp), _db(cpu, htp)


def reciprocal() -> Iterator[tuple[str, onnx.ModelProto, np.ndarray, np.ndarray]]:
    """Reciprocal for input grids [0, x_top]."""
    for act in GRIDS:
        for top in (0.05, 0.1619, 0.25, 0.5, 0.9, 1.0, 1.5, 4.0):
            x = np.linspace(0.1 * top, top, 64, dtype=np.float32)[None]
            nodes, inits = _qdq("x", 0.0, top, act)
            nodes.append(helper.make_node("Reciprocal", ["x_dq"], ["y"], name="recip"))
            more = _qdq("y", 0.0, 1.01 / float(x.min()), act)
            yield f"Reciprocal {act} x_top={top}", _model(nodes + more[0], inits + more[1], x, [1, 64]), x, 1.0 / x


def conv_silu() -> Iterator[tuple[str, onnx.ModelProto, np.ndarray, np.ndarray]]:
    """1×1 Conv 8→32 → SiLU at uint16 for output sizes 3…16."""
    rng = np.random.default_rng(0)
    for hw in (3, 5, 6, 7, 9, 10, 12, 14, 16):
        x = np.abs(rng.standard_normal((1, 8, hw, hw))).astype(np.float32)
        w = (rng.standard_normal((32, 8)) / np.sqrt(8)).astype(np.float32)
        b = (rng.standard_normal(32) * 0.1).astype(np.float32)
        conv = np.einsum("oc,chw->ohw", w, x[0])[None] + b[None, :, None, None]
        silu = conv / (1.0 + np.exp(-conv))
        nodes, inits = _qdq("x", 0.0, float(x.max()), "uint16")
        w_lo, w_hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
        ws = (w_hi - w_lo) / 255
        bs = float(x.max()) / 65535 * ws
        inits += [
            numpy_helper.from_array(
                np.clip(np.round(w / ws) + round(-w_lo / ws), 0, 255).astype(np.uint8)[:, :, None, None], "w_q"
            ),
            numpy_helper.from_array(np.array(ws, np.float32), "w_s"),
            helper.make_tensor("w_z", TensorProto.UINT8, [], [round(-w_lo / ws)]),
            numpy_helper.from_array(np.round(b / bs).astype(np.int32), "b_q"),
            numpy_helper.from_array(np.array(bs, np.float32), "b_s"),
            helper.make_tensor("b_z", TensorProto.INT32, [], [0]),
        ]
        nodes += [
            helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"]),
            helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"]),
            helper.make_node("Conv", ["x_dq", "w", "b"], ["c"], kernel_shape=[1, 1]),
        ]
        for name, lo, hi, node in (
            ("c", conv.min(), conv.max(), None),
            ("s", 0.0, 1.0, helper.make_node("Sigmoid", ["c_dq"], ["s"], name="sigmoid")),
            ("y", silu.min(), silu.max(), helper.make_node("Mul", ["c_dq", "s_dq"], ["y"])),
        ):
            if node is not None:
                nodes.append(node)
            more = _qdq(name, float(lo), float(hi), "uint16")
            nodes, inits = nodes + more[0], inits + more[1]
        yield f"Conv1x1 8->32 -> SiLU uint16 {hw}x{hw}", _model(nodes, inits, x, [1, 32, hw, hw]), x, silu


def hardsigmoid() -> Iterator[tuple[str, onnx.ModelProto, np.ndarray, np.ndarray]]:
    """HardSigmoid for output grids [0, y_top]."""
    x = np.random.default_rng(0).uniform(-2.09, 1.18, (1, 64, 1, 1)).astype(np.float32)
    ref = np.clip(0.2 * x + 0.5, 0.0, 1.0)
    for act in GRIDS:
        for top in (0.7372, 0.9, 1.0):
            nodes, inits = _qdq("x", -2.0907, 1.1858, act)
            nodes.append(helper.make_node("HardSigmoid", ["x_dq"], ["y"], name="gate", alpha=0.2, beta=0.5))
            more = _qdq("y", 0.0, top, act)
            yield f"HardSigmoid {act} y_top={top}", _model(nodes + more[0], inits + more[1], x, [1, 64, 1, 1]), x, ref


def log() -> Iterator[tuple[str, onnx.ModelProto, np.ndarray, np.ndarray]]:
    """Log for input grids [0, x_top]."""
    rng = np.random.default_rng(0)
    for act in GRIDS:
        for top in (1.0, 100.0, 6e4, 6.55e4, 6.6e4, 7e4, 1e5, 1e6, 1e8, 9.15e9):
            x = np.exp(rng.uniform(np.log(top * 0.01), np.log(top), size=(1, 256))).astype(np.float32)
            ref = np.log(x)
            nodes, inits = _qdq("x", 0.0, top, act)
            nodes.append(helper.make_node("Log", ["x_dq"], ["y"], name="log"))
            more = _qdq("y", float(ref.min()) - 0.1, float(ref.max()) + 0.1, act)
            yield f"Log {act} x_top={top:g}", _model(nodes + more[0], inits + more[1], x, [1, 256]), x, ref


SWEEPS: dict[str, Callable[[], Iterator[tuple[str, onnx.ModelProto, np.ndarray, np.ndarray]]]] = {
    "reciprocal": reciprocal,
    "conv_silu": conv_silu,
    "hardsigmoid": hardsigmoid,
    "log": log,
}


def main() -> None:
    """Print one row per case: as quantized, and after :func:`rewrite_qdq` when it changes the model."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SWEEPS))
    ap.add_argument("--soc", default=None, help="QNN SoC (default: the provider's, HTP v68)")
    args = ap.parse_args()
    options = QnnOptions(soc=args.soc)
    print(f"{options.device_label()}; SQNR in dB")
    print("| case | CPU-QDQ vs float | HTP vs float | HTP vs CPU | after the rewrite: HTP vs float |")
    print("|---|---|---|---|---|")
    for name in args.only.split(","):
        for label, model, x, ref in SWEEPS[name]():
            cpu, htp, diff = measure(model, x, ref, options)
            fixed, done = rewrite_qdq(model)
            after = f"{measure(fixed, x, ref, options)[1]:.2f}" if done else "-"
            print(f"| {label} | {cpu:.2f} | {htp:.2f} | {diff:.2f} | {after} |", flush=True)


if __name__ == "__main__":
    main()
