"""Intra-op threads of a pipelined segmented run (issue 12, item 3; ``qdebug/capture/threads.py``).

Each mode runs ``qdebug.debug --capture auto`` in a fresh process; modes alternate over ``--rounds``:

``default``
    every segment session with ONNX Runtime's default threads (one per core), the trial off;
``one``
    every segment session with one intra-op thread (a core left to the reduction), the trial off;
``auto``
    as shipped: the trial times both on the run's own samples and keeps the faster (its note is printed).

Per-sample time is measured from the third sample on (the first makes the sessions and loads numba).

Usage::

    .venv/bin/python benchmarks/bench_segment_threads.py --models ppocrv4-rec ppocrv4-det yolov8n-nudenet \\
        vit-s-focus u2netp --samples 64 --rounds 2 --work /tmp/bpipe

``--work`` holds the quantized corpus models and data ``bench_realmodels.py`` writes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from child_runs import add_child_args, child_main, each_run, timed_debug  # noqa: E402

MODES = ("default", "one", "auto")


def child(model: str, n: int, mode: str, work: Path) -> dict[str, Any]:
    """One debug pass in this process with the segment sessions' threads fixed (``default``, ``one``) or tried."""
    from qdebug.capture import CaptureTuning, segmented

    tuning = CaptureTuning() if mode == "auto" else CaptureTuning(trial_min_remaining=1 << 30)  # else no trial
    if mode == "one":
        plain = segmented.make_session

        def one_thread(*args: Any, **kwargs: Any) -> Any:
            return plain(*args, **{**kwargs, "threads": 1})

        segmented.make_session = one_thread  # type: ignore[assignment]
    # the first samples make sessions and load numba
    rep, times = timed_debug(model, n, work, "auto", skip=2, tuning=tuning)
    cap = rep.meta.capture
    last = ((cap.reason or "") if cap else "").rsplit("; ", 1)[-1]
    return {**times, "segments": cap.segments if cap else 1, "note": last if "thread" in last else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    add_child_args(ap, ["ppocrv4-rec", "ppocrv4-det", "yolov8n-nudenet", "vit-s-focus", "u2netp"], 64)
    a = child_main(ap, argv, child)
    if a is None:
        return 0
    print("| model | segments | threads | per sample ms | wall s | trial |")
    print("|---|---|---|---|---|---|")
    for model, mode, r in each_run(__file__, a, a.modes):
        cells = [model, r["segments"], mode, f"{r['per_sample_ms']:.0f}", f"{r['wall_s']:.1f}", r["note"]]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
