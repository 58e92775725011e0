"""Task metrics: what the quantized model's outputs are worth to the user's task, measured against the float model's
on the same samples (docs/metrics.md, "Task metrics").

SQNR says how far the numbers moved; a task metric says whether the answer changed: the same top-1 class, the same
embedding direction, the same decoded sequence, the same accuracy on labels — or the user's own function. Each is
a :class:`TaskMetric`, a *mergeable per-sample accumulator*::

    state = metric.start()
    for f_out, q_out, label in samples:          # one sample's outputs by name, float and quantized
        state = metric.update(state, f_out, q_out, label)
    metric.value(metric.merge(state, other_shard_state))

A state is a small mapping of sums, counts and extremes (its size depends on the model's outputs, never on the
number of samples), so shards merge exactly and memory stays flat. :func:`load_metric` turns a name, a
``"module:function"`` spec or a Python callable into a metric; :data:`TASK_METRICS` holds the built-ins.
:func:`qdebug.task_measure.measure_task` runs both models and returns a :class:`TaskScore`.

The metric type and its score (:class:`TaskMetric`, :class:`TaskScore`, :func:`merge_states`) are
:mod:`qdebug.task_score`; this module holds the built-ins and turns a spec into a metric, and its ``__all__`` re-exports
those names (the task-metric API of docs/metrics.md). Both are low floors: numpy, onnx and :mod:`qdebug.errors` only,
so the report, the engine, the search and the faces all read them.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qdebug.errors import ConfigError, DataError, ModelError
from qdebug.task_score import (
    MIN_PREFIX,
    SAMPLES,
    SEP,
    TASK_SCHEMA_VERSION,
    State,
    TaskMetric,
    TaskScore,
    merge_states,
)

__all__ = [
    "AUTO",
    "TASK_METRICS",
    "TASK_SCHEMA_VERSION",
    "MetricSpec",
    "State",
    "TaskMetric",
    "TaskScore",
    "builtin_names",
    "from_function",
    "load_metric",
    "merge_states",
    "pick_metric",
    "register_task_metric",
]

#: The spec that picks a built-in from the float model's outputs (:func:`pick_metric`).
AUTO = "auto"


#: What :func:`load_metric` accepts: a name, ``module:function``, a per-sample callable, or a metric.
MetricSpec = str | Callable[..., Any] | TaskMetric


# ------------------------------------------------------------------------------------------------ built-ins
def _key(kind: str, output: str) -> str:
    return f"{kind}{SEP}{output}"


def _pairs(
    name: str, fo: Mapping[str, np.ndarray], qo: Mapping[str, np.ndarray], fits: Callable[[np.ndarray], bool], want: str
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The (name, float, quant) outputs a built-in applies to (``fits`` of the float array): float and quant of one
    shape, floating point. None fits: a :class:`ConfigError` saying what the metric wanted and what there is."""
    found = []
    for out, raw in fo.items():
        f = np.asarray(raw)
        if out not in qo or not np.issubdtype(f.dtype, np.floating) or not fits(f):
            continue
        q = np.asarray(qo[out])
        if q.shape != f.shape:
            raise ModelError(f"task metric {name}: output {out!r} is {list(f.shape)} in the float model and "
                             f"{list(q.shape)} in the quantized one")  # fmt: skip
        found.append((out, f.astype(np.float64, copy=False), q.astype(np.float64, copy=False)))
    if not found:
        have = ", ".join(f"{n} {list(np.shape(a))} {np.asarray(a).dtype}" for n, a in fo.items()) or "none"
        raise ConfigError(f"task metric {name}: wants {want}; the model's outputs are: {have}")
    return found


def _scores(f: np.ndarray) -> bool:
    return f.ndim >= 1 and f.shape[-1] >= 2


def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` as rows of its last axis (a vector is one row)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim >= 1 else a.reshape(1, 1)


def _finite_rows(f: np.ndarray, q: np.ndarray) -> np.ndarray:
    ok: np.ndarray = np.isfinite(f).all(axis=1) & np.isfinite(q).all(axis=1)
    return ok


def _top1_update(state: State, fo: Mapping[str, np.ndarray], qo: Mapping[str, np.ndarray], label: Any) -> None:
    for out, f, q in _pairs("top1", fo, qo, _scores, "class scores [..., C] (C >= 2)"):
        fr, qr = _rows(f), _rows(q)
        # a row with NaN/Inf has no meaningful argmax: it disagrees (and is counted apart)
        ok = _finite_rows(fr, qr)
        agree = (np.argmax(fr, axis=1) == np.argmax(qr, axis=1)) & ok
        for kind, n in (("agree", agree.sum()), ("rows", fr.shape[0]), ("nonfinite", (~ok).sum())):
            state[_key(kind, out)] = state.get(_key(kind, out), 0.0) + float(n)


def _outputs_of(state: Mapping[str, float], kind: str) -> list[str]:
    return [k.split(SEP, 1)[1] for k in state if k.startswith(kind + SEP)]


def _ratio(state: Mapping[str, float], num: str, den: str, out: str) -> float:
    d = state.get(_key(den, out), 0.0)
    return state.get(_key(num, out), 0.0) / d if d else math.nan


def _worst(values: list[float], higher_is_better: bool = True) -> float:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan
    return min(finite) if higher_is_better else max(finite)


def _top1_value(state: Mapping[str, float]) -> float:
    return _worst([_ratio(state, "agree", "rows", o) for o in _outputs_of(state, "rows")])


def _top1_detail(state: Mapping[str, float]) -> dict[str, dict[str, float]]:
    return {
        o: {"agreement": _ratio(state, "agree", "rows", o), "rows": state[_key("rows", o)],
            "nonfinite_rows": state.get(_key("nonfinite", o), 0.0)}
        for o in _outputs_of(state, "rows")
    }  # fmt: skip


def _cosine_update(state: State, fo: Mapping[str, np.ndarray], qo: Mapping[str, np.ndarray], label: Any) -> None:
    for out, f, q in _pairs("cosine", fo, qo, lambda a: a.size > 0, "a floating-point output"):
        fr, qr = _rows(f), _rows(q)
        with np.errstate(all="ignore"):
            nf, nq = np.linalg.norm(fr, axis=1), np.linalg.norm(qr, axis=1)
            cos = np.einsum("ij,ij->i", fr, qr) / (nf * nq)
        # Zero vectors: two of them point the same way (1), one alone shares nothing (0); NaN/Inf rows count as 0.
        cos = np.where((nf == 0) & (nq == 0), 1.0, np.where((nf == 0) | (nq == 0), 0.0, cos))
        ok = _finite_rows(fr, qr) & np.isfinite(cos)
        cos = np.clip(np.where(ok, cos, 0.0), -1.0, 1.0)
        k_min = _key(MIN_PREFIX + "worst", out)
        state[k_min] = min(state.get(k_min, math.inf), float(cos.min()))
        for kind, n in (("sum", cos.sum()), ("rows", cos.shape[0]), ("nonfinite", (~ok).sum())):
            state[_key(kind, out)] = state.get(_key(kind, out), 0.0) + float(n)


def _cosine_value(state: Mapping[str, float]) -> float:
    return _worst([_ratio(state, "sum", "rows", o) for o in _outputs_of(state, "rows")])


def _cosine_detail(state: Mapping[str, float]) -> dict[str, dict[str, float]]:
    return {
        o: {"mean": _ratio(state, "sum", "rows", o), "worst": state[_key(MIN_PREFIX + "worst", o)],
            "rows": state[_key("rows", o)], "nonfinite_rows": state.get(_key("nonfinite", o), 0.0)}
        for o in _outputs_of(state, "rows")
    }  # fmt: skip


def _paths(a: np.ndarray) -> np.ndarray:
    """The argmax paths of a sequence output, one row per sequence: [T, C] is one sequence; [T, 1, C] (time-major,
    as CTC heads export) one sequence; any other [N, T, C] N sequences."""
    return _paths_mask(np.argmax(a, axis=-1))


def _sequence_update(state: State, fo: Mapping[str, np.ndarray], qo: Mapping[str, np.ndarray], label: Any) -> None:
    fits = lambda a: a.ndim in (2, 3) and a.shape[-1] >= 2  # noqa: E731 — one predicate, named where it is used
    for out, f, q in _pairs("sequence", fo, qo, fits, "sequence logits [T, C], [T, 1, C] or [N, T, C]"):
        fp, qp = _paths(f), _paths(q)
        same = fp == qp
        bad = ~(np.isfinite(f).all(axis=-1) & np.isfinite(q).all(axis=-1))
        same &= ~_paths_mask(bad)
        counts = (("pos_agree", same.sum()), ("positions", same.size), ("seq_agree", same.all(axis=1).sum()),
                  ("sequences", same.shape[0]))  # fmt: skip
        for kind, n in counts:
            state[_key(kind, out)] = state.get(_key(kind, out), 0.0) + float(n)


def _paths_mask(per_position: np.ndarray) -> np.ndarray:
    """A per-position array (the argmax's shape: [T], [T, 1] or [N, T]) as one row per sequence."""
    out: np.ndarray = per_position.reshape(1, -1) if per_position.ndim == 1 else per_position
    if out.shape[1] == 1 and out.shape[0] > 1:  # time-major with one sequence
        out = out.T
    return out


def _sequence_value(state: Mapping[str, float]) -> float:
    return _worst([_ratio(state, "pos_agree", "positions", o) for o in _outputs_of(state, "positions")])


def _sequence_detail(state: Mapping[str, float]) -> dict[str, dict[str, float]]:
    return {
        o: {"position_agreement": _ratio(state, "pos_agree", "positions", o),
            "sequence_agreement": _ratio(state, "seq_agree", "sequences", o),
            "positions": state[_key("positions", o)], "sequences": state[_key("sequences", o)]}
        for o in _outputs_of(state, "positions")
    }  # fmt: skip


def _accuracy_update(state: State, fo: Mapping[str, np.ndarray], qo: Mapping[str, np.ndarray], label: Any) -> None:
    out, f, q = _pairs("top1_accuracy", fo, qo, _scores, "class scores [..., C] (C >= 2)")[0]
    fr, qr = _rows(f), _rows(q)
    want = np.asarray(label).reshape(-1)
    if want.size != fr.shape[0]:
        raise DataError(f"task metric top1_accuracy: {want.size} label(s) for a sample whose output {out!r} "
                        f"holds {fr.shape[0]} row(s) of class scores")  # fmt: skip
    for kind, hits in (("float_hits", np.argmax(fr, axis=1) == want), ("quant_hits", np.argmax(qr, axis=1) == want)):
        state[_key(kind, out)] = state.get(_key(kind, out), 0.0) + float((hits & _finite_rows(fr, qr)).sum())
    state[_key("rows", out)] = state.get(_key("rows", out), 0.0) + float(fr.shape[0])


def _accuracy_value(state: Mapping[str, float]) -> float:
    return _worst([_ratio(state, "quant_hits", "rows", o) for o in _outputs_of(state, "rows")])


def _accuracy_detail(state: Mapping[str, float]) -> dict[str, dict[str, float]]:
    out = {}
    for o in _outputs_of(state, "rows"):
        f, q = _ratio(state, "float_hits", "rows", o), _ratio(state, "quant_hits", "rows", o)
        out[o] = {"accuracy": q, "float_accuracy": f, "drop": f - q, "rows": state[_key("rows", o)]}
    return out


#: The built-in task metrics by name (:func:`register_task_metric` adds one).
TASK_METRICS: dict[str, TaskMetric] = {
    m.name: m
    for m in (
        TaskMetric("top1", "top-1 agreement with the float model: the same argmax of the class axis (the last), "
                   "per row; the worst output's share", True, _top1_update, _top1_value, _top1_detail),
        TaskMetric("cosine", "cosine similarity of each embedding (a row of the last axis) with the float model's: "
                   "the mean, of the worst output (its worst row in the detail)", True, _cosine_update,
                   _cosine_value, _cosine_detail),
        TaskMetric("sequence", "per-position argmax agreement of sequence logits ([T, C], [T, 1, C], [N, T, C]; "
                   "whole-sequence exact agreement in the detail), for CTC/OCR heads", True, _sequence_update,
                   _sequence_value, _sequence_detail),
        TaskMetric("top1_accuracy", "top-1 accuracy of the quantized model on the labels (the float model's and "
                   "the drop in the detail)", True, _accuracy_update, _accuracy_value, _accuracy_detail,
                   needs_labels=True),
    )
}  # fmt: skip


def register_task_metric(metric: TaskMetric) -> None:
    """Add ``metric`` to :data:`TASK_METRICS` under its name (a name taken, ``auto``, or one with ``:``/``@`` is a
    :class:`ConfigError`: those spell other things in a spec)."""
    if metric.name in TASK_METRICS or metric.name == AUTO or any(c in metric.name for c in ":@"):
        raise ConfigError(f"task metric name {metric.name!r} is taken or holds ':'/'@'")
    TASK_METRICS[metric.name] = metric


# ------------------------------------------------------------------------------------------------ the user's own
@dataclass(frozen=True)
class _FunctionUpdate:
    """A user's per-sample function as an update: its return value summed and counted. A module-level class (not a
    closure) so that a metric from an importable function pickles (a Ray worker)."""

    fn: Callable[..., Any]
    spec: str
    labelled: bool

    def __call__(self, state: State, fo: Mapping[str, np.ndarray], qo: Mapping[str, np.ndarray], label: Any) -> None:
        n = int(state[SAMPLES])
        try:
            got = self.fn(dict(fo), dict(qo), label) if self.labelled else self.fn(dict(fo), dict(qo))
        except Exception as exc:  # the user's code: one line naming it and the sample (the traceback: --debug)
            raise ConfigError(f"task metric {self.spec}: raised {type(exc).__name__} on sample {n - 1}: {exc}") from exc
        if isinstance(got, np.ndarray) and got.size == 1:
            got = got.reshape(()).item()
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise ConfigError(f"task metric {self.spec}: returned {type(got).__name__} on sample {n - 1}, not a number")
        if not math.isfinite(float(got)):
            raise ConfigError(f"task metric {self.spec}: returned {float(got)} on sample {n - 1}; it must be finite")
        state["sum"] = state.get("sum", 0.0) + float(got)
        state["count"] = state.get("count", 0.0) + 1


def _mean(state: Mapping[str, float]) -> float:
    return state["sum"] / state["count"] if state.get("count") else math.nan


def _arity(fn: Callable[..., Any], spec: str) -> bool:
    """Whether ``fn`` takes a label: ``(float_outputs, quant_outputs)`` or ``(float_outputs, quant_outputs,
    label)``; anything else is a :class:`ConfigError` naming the spec."""
    want = "(float_outputs, quant_outputs) or (float_outputs, quant_outputs, label)"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task metric {spec}: its signature cannot be read ({exc}); it must take {want}") from exc
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in kinds]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    must = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty]
    if must or len(required) > 3 or (len(positional) < 2 and not varargs):
        got = f"({', '.join(p.name for p in params)})"
        raise ConfigError(f"task metric {spec}: takes {got}; it must take {want}")
    return len(positional) >= 3 or varargs


def from_function(fn: Callable[..., Any], name: str | None = None) -> TaskMetric:
    """A :class:`TaskMetric` of a per-sample function ``fn(float_outputs, quant_outputs[, label]) -> float`` (the
    outputs as dicts of name → array): the mean of its values. ``fn.higher_is_better = False`` says lower is better
    (an error, a distance); ``fn.__doc__``'s first line describes it."""
    spec = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    labelled = _arity(fn, spec)
    doc = (inspect.getdoc(fn) or "").strip().splitlines()
    return TaskMetric(
        name=spec,
        description=doc[0] if doc else f"the mean of {spec} per sample",
        higher_is_better=bool(getattr(fn, "higher_is_better", True)),
        update_fn=_FunctionUpdate(fn, spec, labelled),
        value_fn=_mean,
    )


def _import(spec: str) -> Any:
    """The object ``module:attribute`` names (one-line errors naming the spec)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError(f"task metric {spec!r}: write module:function (e.g. my_metrics:agreement)")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            raise ConfigError(f"task metric {spec}: no module named {exc.name!r} (is its folder on the import path? "
                              "the CLI adds the current folder)") from exc  # fmt: skip
        raise ConfigError(f"task metric {spec}: importing {module} failed: {exc}") from exc
    except Exception as exc:  # the user's module raised on import
        raise ConfigError(f"task metric {spec}: importing {module} raised {type(exc).__name__}: {exc}") from exc
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"task metric {spec}: module {module} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_metric(spec: MetricSpec, float_model: onnx.ModelProto | None = None) -> TaskMetric:
    """The :class:`TaskMetric` ``spec`` names:

    * a :class:`TaskMetric` — itself;
    * a built-in name (:data:`TASK_METRICS`: ``top1``, ``cosine``, ``sequence``, ``top1_accuracy``), optionally
      limited to some outputs: ``top1@logits`` or ``cosine@a,b``;
    * ``auto`` — the built-in :func:`pick_metric` chooses from ``float_model``'s outputs (needed then);
    * ``"module:function"`` — imported; a :class:`TaskMetric` there is used as it is, a function
      ``(float_outputs: dict[str, np.ndarray], quant_outputs: dict[str, np.ndarray]) -> float`` (per sample,
      averaged) or one with a third ``label`` parameter is wrapped (:func:`from_function`);
    * a Python callable of that signature — wrapped.

    Every problem is one :class:`ConfigError` line naming the spec (unknown name, missing module or function, wrong
    signature; a non-finite return when it runs)."""
    if isinstance(spec, TaskMetric):
        return spec
    if callable(spec):
        return from_function(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"task metric {spec!r}: give a built-in name ({', '.join(TASK_METRICS)}), auto, "
                          "module:function or a callable")  # fmt: skip
    spec = spec.strip()
    if spec == AUTO:
        if float_model is None:
            raise ConfigError("task metric auto picks from the float model's outputs: give the float model")
        metric, why = pick_metric(float_model)
        if metric is None:
            raise ConfigError(f"task metric auto: {why}; name one ({', '.join(TASK_METRICS)}) or module:function")
        return metric
    if ":" in spec:
        obj = _import(spec)
        if isinstance(obj, TaskMetric):
            return obj
        if not callable(obj):
            raise ConfigError(f"task metric {spec}: is a {type(obj).__name__}, not a function")
        return from_function(obj, spec)
    base, _, outs = spec.partition("@")
    if base not in TASK_METRICS:
        raise ConfigError(f"unknown task metric {spec!r}; built-in: {', '.join(TASK_METRICS)}, auto, or "
                          "module:function for your own")  # fmt: skip
    metric = TASK_METRICS[base]
    return metric.on([o for o in outs.split(",") if o]) if "@" in spec else metric


# ------------------------------------------------------------------------------------------------ auto
#: Output names that say "embedding" (a 2-D or 3-D float output so named is compared by direction, not argmax).
_EMBEDDING_WORDS = ("embed", "feature", "hidden", "pooler", "pooled", "vector", "descriptor", "encoding")
#: Ops whose output is an embedding rather than class scores.
_EMBEDDING_OPS = frozenset({"LpNormalization", "ReduceMean", "GlobalAveragePool", "ReduceL2"})
#: Ops whose output is class scores.
_SCORE_OPS = frozenset({"Softmax", "LogSoftmax", "Sigmoid"})


def _dims(value: onnx.ValueInfoProto) -> list[int | str] | None:
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def _is_float(value: onnx.ValueInfoProto) -> bool:
    elem = value.type.tensor_type.elem_type
    return elem in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                    onnx.TensorProto.BFLOAT16)  # fmt: skip


def _kind(value: onnx.ValueInfoProto, producer: str | None) -> tuple[str | None, str]:
    """The built-in one output calls for, and why."""
    dims = _dims(value)
    name, shape = value.name, "unknown shape" if dims is None else str(dims)
    if not _is_float(value):
        return None, f"output {name!r} is not floating point"
    if dims is None or len(dims) not in (2, 3):
        return None, f"output {name!r} has {shape}: neither [N, C]/[N, D] nor 3-D logits"
    embedding = any(w in name.lower() for w in _EMBEDDING_WORDS) or producer in _EMBEDDING_OPS
    if embedding and producer not in _SCORE_OPS:
        return "cosine", f"output {name!r} {shape} is an embedding (its name or its {producer or 'producer'})"
    if len(dims) == 3:
        return "sequence", f"output {name!r} {shape} is 3-D logits (a sequence of class scores)"
    return "top1", f"output {name!r} {shape} is class scores [N, C]"


def pick_metric(float_model: onnx.ModelProto) -> tuple[TaskMetric | None, str]:
    """The built-in that fits the float model's first output that one fits, and why: a 2-D float output of class
    scores → ``top1``; a float [N, D] embedding (named like one, or made by a normalisation or a pooling) →
    ``cosine``; 3-D logits → ``sequence``. ``(None, why)`` when none fits."""
    g = float_model.graph
    producer = {o: n.op_type for n in g.node for o in n.output}
    reasons = []
    for value in g.output:
        kind, why = _kind(value, producer.get(value.name))
        if kind is not None:
            metric = TASK_METRICS[kind]
            return (metric if len(g.output) == 1 else metric.on([value.name])), why
        reasons.append(why)
    return None, "; ".join(reasons) or "the model has no outputs"


def builtin_names() -> tuple[str, ...]:
    """The built-in names and ``auto``, for help texts."""
    return (*TASK_METRICS, AUTO)
