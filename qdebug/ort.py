"""The ONNX Runtime facade every part of qdebug that runs a model goes through (capture, the targets, regions,
tensor values, diagnostics): sessions with optimizations off so a QDQ model runs as written, tensors exposed as
outputs, ORT's log level, the process-wide CPU arena, and ORT's errors as one-line messages."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Sequence

import onnx

from qdebug.errors import ModelError

__all__ = [
    "expose_outputs",
    "make_session",
    "ort_errors",
    "ort_log_severity",
    "ort_message",
    "set_ort_log_severity",
    "shared_arena",
]

#: ONNX Runtime's default-logger severity as qdebug last set it (ORT's own default, 2 = warning, until then).
_SEVERITY = {"level": 2}


def set_ort_log_severity(level: int) -> None:
    """Set ONNX Runtime's default-logger severity (0 verbose … 4 fatal) for every session that does not set its own
    (ORT's quantizer's calibration sessions, plain inference sessions). The CLI sets 3: its C++ warnings (removed
    initializers, merged shapes) are noise between a user and qdebug's one-line messages."""
    import onnxruntime as ort

    ort.set_default_logger_severity(level)
    _SEVERITY["level"] = level


@contextlib.contextmanager
def ort_log_severity(level: int) -> Iterator[None]:
    """ORT's default-logger severity at ``level`` inside the block, then back to what qdebug had set (ORT has no
    getter, so qdebug keeps track)."""
    import onnxruntime as ort

    before = _SEVERITY["level"]
    ort.set_default_logger_severity(max(level, before))
    try:
        yield
    finally:
        ort.set_default_logger_severity(before)


def expose_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs also include ``names`` (types left to ORT)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    existing = {o.name for o in out.graph.output}
    for name in dict.fromkeys(names):
        if name not in existing:
            # An untyped ValueInfo is enough for ORT; com.microsoft Q/DQ outputs have no inferred type.
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            existing.add(name)
    return out


def ort_message(exc: BaseException) -> str:
    """ONNX Runtime's error as one readable line: no ``[ONNXRuntimeError] : 1 : FAIL :`` prefix, no C++ source
    location or signature, no path of the temporary file ORT was given."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    if "failed:" in text:  # "Load model from /tmp/... failed:<why>"
        text = text.split("failed:", 1)[1]
    return _drop_cpp_location(text).strip() or type(exc).__name__


def _drop_cpp_location(text: str) -> str:
    """``... Status Message: /onnxruntime_src/<file>:<line> <C++ signature>(<args>) <why>`` → ``... <why>`` (the
    signature's parentheses nest and the reason may contain some too, so they are matched, not split on)."""
    m = re.search(r"/onnxruntime_src/\S+:\d+ ", text)
    if m is None:
        return text
    start = text.find("(", m.end())
    if start < 0:  # no signature: drop the location only
        return text[: m.start()] + text[m.end() :]
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[: m.start()] + text[i + 1 :].lstrip()
    return text[: m.start()] + text[m.end() :]


_ARENA_LOCK = threading.Lock()
_ARENA: dict[str, bool] = {}  # "cpu": whether the process-wide CPU arena is registered (False: ORT refused it)


def shared_arena() -> bool:
    """Register, once per process, one CPU memory arena in ONNX Runtime's environment for sessions made with
    ``arena="shared"`` (ORT's ``session.use_env_allocators``); ``False`` if ORT refuses it (they then run
    arena-less).

    Why: the segments of a large model (:mod:`qdebug.capture.segmented`) are a dozen sessions run one after the
    other. Each with its own arena, their peaks would add up; arena-less, every tensor of every segment is fresh
    memory from the kernel on every sample, and glibc's heap fragments between segments. Sharing one arena, they
    reuse the same memory: fewer page faults and a lower peak at the same time per sample
    (``benchmarks/bench_segment_arena.py``, docs/benchmarks.md). The arena grows in steps of what is asked
    (``kSameAsRequested``) and is kept for the process's next capture: about one segment's working set."""
    import onnxruntime as ort

    with _ARENA_LOCK:
        if "cpu" not in _ARENA:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            try:  # max_mem 0 (no cap), extend by what is asked, ORT's default chunk and dead-bytes settings
                ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 1, -1, -1))
                _ARENA["cpu"] = True
            except Exception:  # e.g. an ORT build without it: segments then run arena-less, as before
                _ARENA["cpu"] = False
        return _ARENA["cpu"]


def make_session(
    model: onnx.ModelProto,
    providers: Sequence[str],
    *,
    optimize: bool = False,
    what: str | None = None,
    role: str | None = None,
    spin: bool = True,
    arena: bool | str = True,
    threads: int | None = None,
) -> object:
    """An ORT session with optimizations off (unless asked) and clear errors: ``what`` names the model's file, or
    ``role`` says which model it is (the :class:`ModelError`'s ``role``, for a caller that knows the file).
    ``spin=False`` stops its idle intra-op threads from busy-waiting (for sessions that run next to other work);
    ``arena=False`` returns freed tensors to the process heap instead of the session's arena; ``arena="shared"``
    uses the process's one shared arena (:func:`shared_arena`; for sessions run one after the other whose peaks
    should not add up, :mod:`qdebug.capture.segmented`); ``threads`` sets its intra-op threads (default: ORT's,
    one per core)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    # Fatal only: every error ORT logs is also raised, and becomes our one-line message; its own coloured log
    # lines on stderr would make it several.
    so.log_severity_level = 4
    if arena == "shared":
        arena = shared_arena()
        if arena:
            so.add_session_config_entry("session.use_env_allocators", "1")
    so.enable_cpu_mem_arena = bool(arena)
    if threads is not None:
        so.intra_op_num_threads = threads
    if not spin:  # idle intra-op threads sleep instead of spinning: another thread of ours needs the core
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=list(providers))
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        if role is not None and what is None:
            raise ModelError(f"ONNX Runtime cannot load it: {ort_message(exc)}", role=role) from exc
        name = what or f"the model {model.graph.name!r}"
        raise ModelError(f"{name}: ONNX Runtime cannot load it: {ort_message(exc)}") from exc


def ort_errors() -> tuple[type[Exception], ...]:
    """The exception classes ONNX Runtime raises from ``run`` (they share no base class but ``Exception``), plus
    the Python errors its bindings raise for inputs of the wrong type or shape."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "RuntimeException", "InvalidGraph", "NotImplemented", "EPFail")
    found = tuple(c for c in (getattr(state, n, None) for n in names) if isinstance(c, type))
    return (*found, RuntimeError, ValueError, TypeError)
