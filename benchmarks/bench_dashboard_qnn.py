"""The dashboard's QNN compile table on a corpus model (issue 38, 4), without a browser: the models made ready as Run
makes them (``prepare_models``: QNN's compatibility fixes, qdebug's quantization), the debugger on ``--debug-samples``
of ``eval.npz``, Run's compile (``compile_current``), then a promotion of the top suggestion and its compile. Prints
each compile's seconds, the compiles asked for (one per variant, plus one when after needed another SoC), both
columns' device and figures. Every number is measured; run::

    .venv/bin/python benchmarks/bench_dashboard_qnn.py --model ppocr-cls [--debug-samples 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

CORPUS = Path.home() / ".cache" / "qdebug" / "realmodels"


def _row(label: str, r: Any) -> str:
    from qdebug.render.target_table import worst_db

    acc = r.target_accuracy
    figures = [
        worst_db(acc, lambda o: o.target_vs_float_db),
        worst_db(acc, lambda o: o.target_vs_cpu_db),
        worst_db(acc, lambda o: o.cpu_vs_float_db),
    ]
    text = " / ".join("n/a" if v is None else f"{v:.2f}" for v in figures)
    n = 0 if acc is None else acc.num_samples
    return (
        f"{label}: {r.compile.device}, ok={r.ok}, partitions {r.compile.accelerator_partitions}, CPU nodes "
        f"{r.compile.cpu_nodes}, HTP vs float / HTP vs CPU-QDQ / CPU-QDQ vs float (worst output, dB) {text}, "
        f"{n} samples"
    )


def main() -> None:
    """Measure and print."""
    from qdebug.build_inputs import resolve_config
    from qdebug.debugger import DebugOptions
    from qdebug.targets.base import BuildOptions
    from qdebug.targets.prepare import prepare_models
    from widgets.app import DebuggerApp
    from widgets.session import QuantDebugger

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="ppocr-cls")
    ap.add_argument("--debug-samples", type=int, default=16)
    args = ap.parse_args()
    folder = CORPUS / args.model
    calib, evald = folder / "calib.npz", folder / "eval.npz"
    with tempfile.TemporaryDirectory(prefix="bench-dash-qnn-") as tmp:
        run = Path(tmp)
        config = resolve_config("qnn", "uint8")
        t0 = time.perf_counter()
        ready = prepare_models(folder / f"{args.model}.onnx", None, BuildOptions("qnn", "uint8"), config, calib, run)
        opts = DebugOptions(num_samples=args.debug_samples)
        dbg = QuantDebugger(ready.float_model, ready.quant_model, data=calib, config=ready.config, debug_data=evald,
                            debug_options=opts, workdir=run / "session")  # fmt: skip
        print(f"prepare + debug: {time.perf_counter() - t0:.1f} s")
        calls: list[Any] = []
        real = dbg.recompile

        def counted(target: str, options: Any = None, step: int | None = None) -> Any:
            calls.append((None if options is None else options.soc, step))
            return real(target, options, step)

        dbg.recompile = counted  # type: ignore[method-assign]
        app = DebuggerApp(dbg, export_path=run / "overrides.json", target="qnn")
        t0 = time.perf_counter()
        app.compile_current()
        print(f"Run's compile (compile + HTP simulator): {time.perf_counter() - t0:.1f} s")
        app.promotion = [dbg.suggestions(1)[0].tensor_name]
        t0 = time.perf_counter()
        app.on_promote_clicked()
        print(f"promote (patch/re-quantize + re-debug + compile + HTP simulator): {time.perf_counter() - t0:.1f} s")
        print(f"compiles asked for (soc, step): {calls}")
        for (_, step), r in sorted(app.compiled_by_step.items()):
            print(_row(f"step {step}", r))
        dbg.close()


if __name__ == "__main__":
    main()
