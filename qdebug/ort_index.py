"""Indexed name lookups inside ONNX Runtime's QDQ quantizer, for the duration of qdebug's own ``quantize_static``.

ORT's quantizer finds things by scanning: ``find_by_name`` walks the initializer list for every tensor it looks up
and ``ONNXModel.replace_input_of_all_nodes`` walks every node for every tensor it quantizes, so inserting Q/DQ is
O(nodes × tensors) — most of a re-quantization's time on the corpus (docs/mixed_precision.md, cost per step). Each
look-up touches every protobuf element, which costs about the same however the Python loop is written; only not
touching them helps. :func:`indexed_quantizer` swaps in name → element maps for those helpers while it is entered
and restores ORT's own functions on exit (exceptions included). The model ORT writes is byte for byte the one it
writes without it (``tests/test_ort_index.py``).

How a map stays true: a protobuf repeated field is watched through its length and its last element (upb hands out
one Python object per element, so ``is`` tells elements apart). Elements appended since the last look-up are
indexed; any other change (a removal, ``ClearField``, another container) rebuilds the map. A node's inputs change
only through ``ONNXModel.replace_node_input`` on ORT's QDQ path, which is wrapped to log the edit (its QOperator
classes assign ``node.input[i]`` directly: :mod:`qdebug.quantizer` enters this for QDQ only); a name's consumers
are a superset, each checked before it is changed. Not followed: an element renamed in place once in its field (a
found element is checked, so its old name is answered right, but its new name is not found) — ORT's quantizer names
tensors before adding them. What this relies on — the bodies of the replaced functions, protobuf's upb backend, the
ORT release whose QDQ path was read — is checked before anything is swapped (:func:`unavailable`); if any differs,
ORT runs unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: ORT releases whose QDQ quantizer was read for the assumptions above and whose output
#: ``tests/test_ort_index.py`` compared byte for byte. A new release runs ORT's own functions until it is added.
VERIFIED_ORT = ("1.31.1",)

#: sha256 of the source of each function replaced or wrapped (``module:qualname``): a release that changes one
#: keeps ORT's own (the replacement would no longer mean the same).
_SOURCES = {
    "quant_utils:find_by_name": "40cf7740b42609de15240e14403a0f99868e548fcd1a62ebea431e985cfb2c47",
    "onnx_model:ONNXModel.replace_input_of_all_nodes": (
        "dc01c5a634a1e3c1742af4364c2840153550d8721af4025dd4eff1cd3a6dd6a5"
    ),
    "onnx_model:ONNXModel.replace_node_input": "161a2ad57d6b1ee74565d9dbf6b96b11c6b511edfd2c9696e53e1b544770010a",
    "onnx_model:ONNXModel.get_initializer": "9246321687c546d498dfc0d6c59fa7673a38d6cddee6c5dd3a9bb3963864f28d",
}
#: Modules that call ``find_by_name`` by their own global name on the QDQ path (``from .quant_utils import ...``).
_CALLERS = ("onnx_model", "base_quantizer", "qdq_quantizer")

_LOG = logging.getLogger(__name__)
_LOCK = threading.Lock()


class _Listing:
    """A map key → elements (in the field's order) of one protobuf repeated field, brought up to date on
    :meth:`sync`. ``keys`` gives an element's keys (an initializer's name; a node's input names)."""

    def __init__(self, field: Any, keys: Callable[[Any], Iterable[str]]) -> None:
        self.field, self.keys = field, keys
        self.map: dict[str, list[Any]] = {}
        self.members: set[int] = set()  # ids of the indexed elements (alive: the map holds them)
        self.size, self.last, self.edits_seen = 0, None, 0

    def sync(self, edits: list[tuple[Any, str]]) -> None:
        """Index what was appended since the last call (or everything again after any other change), then the
        logged input edits of this field's elements."""
        field, n = self.field, len(self.field)
        appended = n >= self.size and (self.size == 0 or field[self.size - 1] is self.last)
        if not appended:
            self.map, self.members, self.size, self.edits_seen = {}, set(), 0, len(edits)
        for i in range(self.size, n):
            item = field[i]
            self.members.add(id(item))
            for key in self.keys(item):
                self.map.setdefault(key, []).append(item)
        self.size, self.last = n, field[n - 1] if n else None
        for node, new in edits[self.edits_seen :]:
            if id(node) in self.members:
                self.map.setdefault(new, []).append(node)
        self.edits_seen = len(edits)


class _State:
    """The maps of one :func:`indexed_quantizer` (outermost entry to last exit) and what to put back after it."""

    def __init__(self) -> None:
        self.listings: dict[tuple[int, str], _Listing] = {}
        self.edits: list[tuple[Any, str]] = []  # (node, new input name) from replace_node_input
        self.saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, ORT's value) to put back

    def listing(self, field: Any, kind: str) -> _Listing:
        key = (id(field), kind)
        found = self.listings.get(key)
        if found is None or found.field is not field:
            found = self.listings[key] = _Listing(field, _by_name if kind == "name" else _by_input)
        found.sync(self.edits)
        return found


def _by_name(item: Any) -> tuple[str]:
    return (item.name,)


def _by_input(node: Any) -> Any:
    return node.input


_STATE: _State | None = None
_DEPTH = 0


def _modules() -> dict[str, Any]:
    from onnxruntime.quantization import base_quantizer, onnx_model, qdq_quantizer, quant_utils

    return {"quant_utils": quant_utils, "onnx_model": onnx_model, "base_quantizer": base_quantizer,
            "qdq_quantizer": qdq_quantizer}  # fmt: skip


def _resolve(mods: dict[str, Any], where: str) -> Any:
    module, _, qualname = where.partition(":")
    obj: Any = mods[module]
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part)
    return obj.__func__ if isinstance(obj, staticmethod) else obj


def source_digest(fn: Any) -> str:
    """sha256 of a function's source text (what :data:`_SOURCES` pins)."""
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


def unavailable() -> str | None:
    """Why :func:`indexed_quantizer` would leave ORT unchanged here, or ``None`` when it swaps in the maps."""
    import importlib

    import onnxruntime

    api_implementation = importlib.import_module("google.protobuf.internal.api_implementation")  # (no stubs)

    if onnxruntime.__version__ not in VERIFIED_ORT:
        return f"onnxruntime {onnxruntime.__version__} is not one whose quantizer was verified ({VERIFIED_ORT})"
    if api_implementation.Type() != "upb":
        return f"protobuf's {api_implementation.Type()} implementation (the maps rely on upb's element identity)"
    try:
        mods = _modules()
        for where, digest in _SOURCES.items():
            if source_digest(_resolve(mods, where)) != digest:
                return f"ORT's {where} changed"
        for name in _CALLERS:
            if mods[name].find_by_name is not mods["quant_utils"].find_by_name:
                return f"ORT's {name} no longer calls quant_utils.find_by_name"
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return f"ORT's quantizer has changed ({exc})"
    return None


@contextlib.contextmanager
def indexed_quantizer() -> Iterator[bool]:
    """While entered, ORT's quantizer looks names up in maps (module docstring); yields whether it does. Nested and
    concurrent entries share one set of maps; ORT's functions are restored when the last one exits."""
    global _STATE, _DEPTH  # noqa: PLW0603 — one swap for the whole process: ORT's functions are module globals
    with _LOCK:
        if _DEPTH == 0:
            why = unavailable()
            if why is not None:
                _LOG.debug("ORT's quantizer runs without indexed look-ups: %s", why)
            else:
                _STATE = _install()
        _DEPTH += 1
        active = _STATE is not None
    try:
        yield active
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _STATE is not None:
                _restore(_STATE)
                _STATE = None


def _restore(state: _State) -> None:
    for owner, attr, value in reversed(state.saved):
        setattr(owner, attr, value)


def _install() -> _State:
    """Swap the indexed helpers in; the returned state remembers what to put back."""
    import onnx

    mods = _modules()
    onnx_model_cls = mods["onnx_model"].ONNXModel
    ort_find = mods["quant_utils"].find_by_name
    ort_replace_node_input = inspect.getattr_static(onnx_model_cls, "replace_node_input").__func__
    repeated = type(onnx.ModelProto().graph.node)
    state = _State()

    def find_by_name(item_name: Any, item_list: Any) -> Any:
        if type(item_list) is not repeated:  # a Python list (new_nodes): ORT's scan
            return ort_find(item_name, item_list)
        hits = state.listing(item_list, "name").map.get(item_name)
        if not hits:
            return None
        # the first element of that name, unless it was renamed in place since (not done on ORT's path): scan
        return hits[0] if hits[0].name == item_name else ort_find(item_name, item_list)

    def replace_node_input(node: Any, old_input_name: Any, new_input_name: Any) -> None:
        ort_replace_node_input(node, old_input_name, new_input_name)
        state.edits.append((node, new_input_name))

    def replace_input_of_all_nodes(self: Any, old_input_name: Any, new_input_name: Any) -> None:
        nodes = self.model.graph.node
        if len(nodes):  # ORT asserts this in replace_node_input, once per node
            assert isinstance(old_input_name, str) and isinstance(new_input_name, str)
        for node in list(state.listing(nodes, "input").map.get(old_input_name, ())):
            if old_input_name in node.input:  # the map is a superset: an input may have been replaced since
                replace_node_input(node, old_input_name, new_input_name)

    def get_initializer(self: Any, name: Any) -> Any:
        return find_by_name(name, self.model.graph.initializer)

    swaps: list[tuple[Any, str, Any]] = [(mods[m], "find_by_name", find_by_name) for m in _CALLERS]
    swaps += [
        (onnx_model_cls, "replace_node_input", staticmethod(replace_node_input)),
        (onnx_model_cls, "replace_input_of_all_nodes", replace_input_of_all_nodes),
        (onnx_model_cls, "get_initializer", get_initializer),
    ]
    try:
        for owner, attr, value in swaps:
            state.saved.append((owner, attr, inspect.getattr_static(owner, attr)))
            setattr(owner, attr, value)
    except BaseException:  # never leave ORT half swapped
        _restore(state)
        raise
    return state
