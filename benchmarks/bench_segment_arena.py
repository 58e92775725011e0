"""Segment sessions with one shared ONNX Runtime arena vs none (issue 12): per sample, CPU, page faults, peak.

A segmented model (``qdebug/capture/segmented.py``) runs as a dozen sessions, one after the other, every sample.
``heap`` is how they ran before: arena-less, every tensor of every segment fresh memory from the kernel each
sample. ``shared`` is how they run now: one arena registered in ORT's environment, used by every segment
(``qdebug.ort.shared_arena``). Each mode runs ``qdebug.debugger`` with ``--capture numpy`` (so the
reduction is the same in both) in a fresh process; modes alternate over ``--rounds``.

Usage::

    .venv/bin/python benchmarks/bench_segment_arena.py --models u2netp vit-s-focus ppocrv4-det ppocrv4-rec \\
        yolov8n-nudenet --samples 12 --work /tmp/bpipe

``--work`` holds the quantized corpus models and data ``bench_realmodels.py`` writes.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from child_runs import add_child_args, child_main, each_run, timed_debug  # noqa: E402

MODES = ("heap", "shared")


def child(model: str, n: int, mode: str, work: Path) -> dict[str, Any]:
    """One debug pass in this process, with the segment sessions arena-less (``heap``) or sharing one arena."""
    from qdebug.capture import segmented

    if mode == "heap":  # the segments as they were: no arena at all
        plain = segmented.make_session

        def arena_less(*args: Any, **kwargs: Any) -> Any:
            return plain(*args, **{**kwargs, "arena": False})

        segmented.make_session = arena_less  # type: ignore[assignment]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    rep, times = timed_debug(model, n, work, "numpy")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cap = rep.meta.capture
    return {
        **times,
        "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "minflt": r1.ru_minflt - r0.ru_minflt,
        "segments": cap.segments if cap else 1,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_child_args(ap, ["u2netp", "vit-s-focus", "ppocrv4-det", "ppocrv4-rec"], 12)
    a = child_main(ap, argv, child)
    if a is None:
        return 0
    print("| model | segments | arena | per sample ms | user s | sys s | minor faults | peak MB |")
    print("|---|---|---|---|---|---|---|---|")
    for model, mode, r in each_run(__file__, a, MODES):
        print(
            f"| {model} | {r['segments']} | {mode} | {r['per_sample_ms']:.0f} | {r['user_s']:.2f} | "
            f"{r['sys_s']:.2f} | {r['minflt']:,} | {r['peak_mb']:.0f} |",
            flush=True,
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
