"""The model graph view: tensors collapsed into groups (name scopes, or blocks of the graph when names carry
no scope), a layered drawing of what is visible, the path of the worst tensor back to the inputs, and the
plotly figure of it.

Pure functions of the report's tensors and edges (no widget, no file): a view widget keeps only which groups
are expanded and which tensor is selected, and calls :func:`graph_view` and :func:`graph_view_figure`.

**Groups.** :func:`group_tensors` first tries the names: ``/model.22/cv2.0/conv/Conv_output_0`` has the scope
path ``model.22 / cv2.0 / conv``, ``encoder.layer.3.attention.output`` has ``encoder / layer.3 / attention``.
The biggest group is split by its next scope level while that keeps at most ``max_groups`` groups, so a
YOLO opens as its ``model.N`` blocks and a BERT as its ``layer.N`` blocks. Names without a scope (PaddleOCR's
``p2o.Add.12``, ``swish_14.tmp_0``) fall back to the graph structure: the topological order is cut into
contiguous blocks at the places where the fewest tensors cross (the residual block boundaries). Groups whose
edges would form a cycle are merged, so the collapsed graph is a DAG and its layered drawing respects every edge.
Then runs of consecutive groups that are the same block (same ops, sizes and wiring, each fed by the previous
one: a transformer's layers, a stage's bottlenecks) become one ``×N`` group whose parts expand one by one.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from qdebug._lazy import LazyModule
from qdebug.render.bands import GREY, HIGHLIGHT, SQNR_COLORSCALE, SQNR_HIGH, SQNR_LOW, Z_MAX, Z_MIN, sqnr_color
from qdebug.render.fmt import fmt_db_text
from qdebug.render.layout import Drawing, layered_drawing

if TYPE_CHECKING:
    import plotly.graph_objects as go
else:
    go = LazyModule("plotly.graph_objects")

#: Collapsed views aim at no more groups than this (a few dozen readable boxes).
MAX_GROUPS = 40
#: Graph figures get 48 px per layer up to this height (px), then 10 px per layer (and smaller markers).
MAX_HEIGHT = 2400
#: Blocks of fewer tensors are not merged into ×N groups.
MIN_REPEAT = 4
#: Node kinds in the figure's ``customdata``: ``[kind, id]``.
GROUP, TENSOR = "group", "tensor"
#: Metrics the view colours by; the SQNR ones use the anchored bands, the error ones a log scale.
SQNR_METRICS = ("local_sqnr_db", "cumulative_sqnr_db")
ERROR_METRICS = ("mse", "max_abs_error")
_NUM_SUFFIX = re.compile(r"^\d+$")
_BLOCK_DOT = re.compile(r"\.\d+\.")
_ERROR_SCALE: list[list[float | str]] = [[0.0, "#fff5f0"], [0.5, "#fb6a4a"], [1.0, "#67000d"]]


def scope_path(name: str) -> tuple[str, ...]:
    """The scope of a tensor name, outermost first (empty when the name carries none).

    ``/model.22/cv2.0/conv/Conv_output_0`` → ``("model.22", "cv2.0", "conv")``;
    ``encoder.layer.3.attention.output.dense`` → ``("encoder", "layer.3", "attention", "output")``;
    ``p2o.Add.12`` and ``swish_14.tmp_0`` → ``()``.
    """
    if "/" in name:
        return tuple(p for p in name.split("/")[:-1] if p)
    if not _BLOCK_DOT.search(name):
        return ()
    parts: list[str] = []
    for p in name.split("."):
        if _NUM_SUFFIX.match(p) and parts:
            parts[-1] = f"{parts[-1]}.{p}"  # layer.3 is one scope, not two
        else:
            parts.append(p)
    return tuple(parts[:-1])


@dataclass(frozen=True)
class Group:
    """Tensors drawn as one box while collapsed. ``key`` is unique; ``members`` are in topological order.

    A group of ``N`` structurally identical consecutive blocks (transformer layers, repeated bottlenecks) has
    those blocks as ``parts``: expanding it draws each part as a box of its own, expanding a part its tensors.
    """

    key: str
    label: str
    members: tuple[str, ...]
    parts: tuple[Group, ...] = ()


@dataclass(frozen=True)
class Grouping:
    """A partition of the tensors into groups; ``method`` says how ("name scope", "graph structure", "none")."""

    groups: tuple[Group, ...]
    method: str
    of: Mapping[str, str] = field(default_factory=dict)  # tensor -> group key
    part_of: Mapping[str, str] = field(default_factory=dict)  # tensor -> part key (tensors of a ×N group only)

    def group(self, key: str) -> Group:
        """The group or part with that key (KeyError otherwise)."""
        for g in self.groups:
            if g.key == key:
                return g
            for p in g.parts:
                if p.key == key:
                    return p
        raise KeyError(key)

    def finest(self) -> dict[str, str]:
        """``{tensor: key}`` of the smallest box holding each tensor (its part in a ×N group, else its group)."""
        return {**self.of, **self.part_of}


def _by_scope(names: Sequence[str], max_groups: int) -> dict[tuple[str, ...], list[str]] | None:
    """Scope prefix → tensors, refining the biggest group one level at a time while ≤ ``max_groups``."""
    paths = {n: scope_path(n) for n in names}
    if sum(1 for p in paths.values() if p) < 0.5 * len(names):
        return None
    common = 0  # a prefix every scoped name shares (e.g. "model/model.0/auto_model") separates nothing
    scoped = [p for p in paths.values() if p]
    while all(len(p) > common and p[common] == scoped[0][common] for p in scoped):
        common += 1
    groups: dict[tuple[str, ...], list[str]] = {(): list(names)}
    depth: dict[tuple[str, ...], int] = {(): common}
    final: set[tuple[str, ...]] = set()
    while True:
        open_ = [k for k in groups if k not in final]
        if not open_:
            break
        key = max(open_, key=lambda k: len(groups[k]))
        d = depth[key]
        split: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for n in groups[key]:
            p = paths[n]
            split[(*key, p[d]) if len(p) > d else (*key, "")].append(n)
        if len(split) <= 1 and all(len(paths[n]) > d for n in groups[key]):
            depth[key] = d + 1  # one child only: look one level deeper, same group
            continue
        room = max_groups - (len(groups) - 1)
        if len(split) <= 1 or room < 2 or (room < len(split) <= 8):
            final.add(key)
            continue
        del groups[key]
        if len(split) > max(8, room):  # e.g. 60 layers under one scope: runs of consecutive layers
            final.update(_runs(split, room, groups))
            continue
        for k, members in split.items():
            groups[k] = members
            depth[k] = d + 1
            if k[-1] == "":
                final.add(k)  # tensors directly in the parent scope
    if len(groups) < 2:
        return None
    return groups


def _runs(
    split: Mapping[tuple[str, ...], list[str]], room: int, into: dict[tuple[str, ...], list[str]]
) -> list[tuple[str, ...]]:
    """Put ``split``'s children (in order of first appearance) into at most ``room`` runs of consecutive
    children; returns the new keys (``(*parent, "first … last")``)."""
    items = [(k, ms) for k, ms in split.items() if k[-1] != ""]
    keys = [k for k in split if k[-1] == ""]  # the parent's own tensors stay apart (inputs, glue)
    for k in keys:
        into[k] = split[k]
    size = math.ceil(len(items) / max(1, room - len(keys)))
    for i in range(0, len(items), size):
        run = items[i : i + size]
        first, last = run[0][0], run[-1][0]
        k = first if len(run) == 1 else (*first[:-1], f"{first[-1] or '·'} … {last[-1] or '·'}")
        into[k] = [m for _, ms in run for m in ms]
        keys.append(k)
    return keys


def _cut_widths(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[int]:
    """``w[i]``: edges crossing the cut between positions i-1 and i of the topological order."""
    at = {n: i for i, n in enumerate(names)}
    diff = [0] * (len(names) + 1)
    for a, b in edges:
        i, j = at[a], at[b]
        if i < j:
            diff[i + 1] += 1
            diff[j + 1] -= 1
    out, run = [], 0
    for d in diff[:-1]:
        run += d
        out.append(run)
    return out


def _by_structure(names: Sequence[str], edges: Sequence[tuple[str, str]], max_groups: int) -> list[list[str]]:
    """Contiguous blocks of the topological order, cut where the fewest edges cross (block boundaries)."""
    n = len(names)
    size = max(4, math.ceil(n / max(2, max_groups - 4)))
    widths = _cut_widths(names, edges)
    blocks: list[list[str]] = []
    start = 0
    while start < n:
        if n - start <= size * 3 // 2:
            blocks.append(list(names[start:]))
            break
        lo, hi = start + max(1, size // 2), min(n - 1, start + size * 3 // 2)
        cut = min(range(lo, hi + 1), key=lambda i: (widths[i], abs(i - start - size)))
        blocks.append(list(names[start:cut]))
        start = cut
    return blocks


def _ops_label(members: Sequence[str], ops: Mapping[str, str]) -> str:
    top = Counter(ops.get(m, "?") for m in members).most_common(3)
    return " ".join(f"{op}×{k}" for op, k in top)


def _sccs(keys: Sequence[str], succ: Mapping[str, set[str]]) -> dict[str, int]:
    """Strongly connected components (Tarjan, iterative): ``{key: component id}``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comp: dict[str, int] = {}

    def enter(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)

    for root in keys:
        if root in index:
            continue
        enter(root)
        work = [(root, iter(sorted(succ.get(root, ()))))]
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    enter(nxt)
                    work.append((nxt, iter(sorted(succ.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                x = ""
                while x != v:
                    x = stack.pop()
                    on.discard(x)
                    comp[x] = index[v]
    return comp


def _condense(groups: list[Group], of: dict[str, str], edges: Sequence[tuple[str, str]]) -> list[Group]:
    """Merge groups on a cycle of the group graph so the collapsed graph is a DAG."""
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        if of[a] != of[b]:
            succ[of[a]].add(of[b])
    comp = _sccs([g.key for g in groups], succ)
    merged: dict[int, list[Group]] = defaultdict(list)
    for g in groups:
        merged[comp[g.key]].append(g)
    out = []
    for parts in merged.values():
        if len(parts) == 1:
            out.append(parts[0])
        else:
            members = tuple(m for p in parts for m in p.members)
            main = max(parts, key=lambda p: len(p.members))
            label = f"{main.label} (+{len(parts) - 1} merged)"
            out.append(Group(" + ".join(p.key for p in parts), label, members))
    return out


def _signature(
    g: Group, preds: Mapping[str, Sequence[str]], ops: Mapping[str, str], sizes: Mapping[str, int]
) -> tuple[Any, ...]:
    """What makes two blocks "the same": each member's op, its size (elements) and where its inputs come from (a
    member of the block, by position, or outside it), in topological order. The size keeps two Conv+SiLU stages
    of different widths apart: the same ops, not the same block."""
    at = {m: i for i, m in enumerate(g.members)}
    return tuple(
        (ops.get(m, "?"), sizes.get(m), tuple(sorted(at.get(p, -1) for p in preds.get(m, ())))) for m in g.members
    )


def _repeat_label(run: Sequence[Group]) -> str:
    first, last = run[0].label.split(" … ")[0], run[-1].label.split(" … ")[-1]
    return f"{first} … {last} ×{len(run)}"


def merge_repeats(
    groups: Sequence[Group],
    edges: Sequence[tuple[str, str]],
    ops: Mapping[str, str],
    sizes: Mapping[str, int] | None = None,
) -> list[Group]:
    """Runs of ≥ 2 consecutive groups (topological order) with the same signature (ops, sizes and internal
    wiring), each fed by the one before it, become one ×N group whose ``parts`` are those groups (a transformer's
    layers, a stage's repeated bottlenecks). Groups under :data:`MIN_REPEAT` tensors are left alone: two
    Conv+SiLU stages of equal size are one op each, not a repeated block."""
    sizes = sizes or {}
    preds: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        preds[b].append(a)
    sigs = [_signature(g, preds, ops, sizes) if len(g.members) >= MIN_REPEAT else None for g in groups]
    out: list[Group] = []
    i = 0
    while i < len(groups):
        j = i + 1
        while j < len(groups) and sigs[j] is not None and sigs[j] == sigs[i]:
            prev = set(groups[j - 1].members)
            if not any(p in prev for m in groups[j].members for p in preds.get(m, ())):
                break  # identical but not chained (e.g. two parallel heads): not a repetition
            j += 1
        run = groups[i:j]
        if len(run) >= 2:
            members = tuple(m for g in run for m in g.members)
            out.append(Group(" + ".join(g.key for g in run) + " ×", _repeat_label(run), members, tuple(run)))
        else:
            out.append(groups[i])
        i = j
    return out


def group_tensors(
    names: Sequence[str],
    edges: Sequence[tuple[str, str]],
    ops: Mapping[str, str] | None = None,
    max_groups: int = MAX_GROUPS,
    sizes: Mapping[str, int] | None = None,
) -> Grouping:
    """Partition ``names`` (topological order) into at most about ``max_groups`` groups (module docstring).

    ``edges`` are ``(input, tensor)`` pairs between names; ``ops`` names each tensor's producer op (for the
    labels of structural blocks and for matching repeated blocks), ``sizes`` its element count (also for the
    matching). Consecutive identical blocks become one ×N group (:func:`merge_repeats`). Graphs no bigger than
    ``max_groups`` are not grouped (``method="none"``).
    """
    names = list(names)
    ops = ops or {}
    known = set(names)
    edges = [(a, b) for a, b in edges if a in known and b in known and a != b]
    if len(names) <= max_groups:
        return Grouping(tuple(Group(n, n, (n,)) for n in names), "none", {n: n for n in names})
    scoped = _by_scope(names, max_groups)
    groups: list[Group] = []
    if scoped is not None:
        method = "name scope"
        for key, members in scoped.items():
            label = "/".join(p for p in key if p) or "(top level)"
            if (not key or key[-1] == "") and len(members) <= max(3, len(names) // 20):
                # a scope's own few tensors (inputs, outputs, glue between blocks) stand alone: grouped, they
                # would sit before and after the blocks at once and merge everything into one cycle
                groups.extend(Group(m, m, (m,)) for m in members)
            else:
                groups.append(Group(label, label, tuple(members)))
    else:
        method = "graph structure"
        for i, block in enumerate(_by_structure(names, edges, max_groups)):
            bkey = f"block {i + 1}"
            groups.append(Group(bkey, f"{bkey}: {_ops_label(block, ops)}", tuple(block)))
    of = {m: g.key for g in groups for m in g.members}
    groups = _condense(groups, of, edges)
    order = {n: i for i, n in enumerate(names)}
    groups.sort(key=lambda g: min(order[m] for m in g.members))
    groups = [Group(g.key, g.label, tuple(sorted(g.members, key=order.__getitem__))) for g in groups]
    groups = merge_repeats(groups, edges, ops, sizes)
    of = {m: g.key for g in groups for m in g.members}
    part_of = {m: p.key for g in groups for p in g.parts for m in p.members}
    return Grouping(tuple(groups), method, of, part_of)


def worst_path(
    names: Sequence[str], edges: Sequence[tuple[str, str]], values: Mapping[str, float | None], start: str | None = None
) -> list[str]:
    """From ``start`` (default: the tensor with the lowest value) back to a graph input, each step to the input
    with the lowest value (the one that carries the most damage). Returned input first."""
    preds: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        preds[b].append(a)

    def key(n: str) -> float:
        v = values.get(n)
        return math.inf if v is None or math.isnan(v) else v

    if start is None:
        finite = [n for n in names if key(n) < math.inf]
        if not finite:
            return []
        start = min(finite, key=key)
    path, seen = [start], {start}
    while preds[path[-1]]:
        nxt = min((p for p in preds[path[-1]] if p not in seen), key=key, default=None)
        if nxt is None:
            break
        path.append(nxt)
        seen.add(nxt)
    return path[::-1]


def find_tensors(names: Sequence[str], query: str, limit: int = 20) -> list[str]:
    """Tensors whose name contains ``query`` (case-insensitive); exact matches first."""
    q = query.strip().lower()
    if not q:
        return []
    hits = [n for n in names if q in n.lower()]
    hits.sort(key=lambda n: (n.lower() != q, len(n)))
    return hits[:limit]


@dataclass
class GraphView:
    """What is drawn: visible nodes (collapsed groups and tensors of expanded groups), their edges and drawing.

    ``kind[node]`` is :data:`GROUP` or :data:`TENSOR`; ``members[node]`` the tensors a node stands for;
    ``edges`` the visible edges (every one is a tensor flowing from one node to the next); ``drawing`` their
    layered drawing (:func:`qdebug.render.layout.layered_drawing`).
    """

    nodes: list[str]
    kind: dict[str, str]
    members: dict[str, tuple[str, ...]]
    edges: list[tuple[str, str]]
    drawing: Drawing
    grouping: Grouping

    def node_of(self, tensor: str) -> str:
        """The visible node that shows ``tensor`` (itself, its collapsed part of a ×N group, or its group)."""
        if self.kind.get(tensor) == TENSOR:
            return tensor
        part = self.grouping.part_of.get(tensor)
        return part if part is not None and part in self.kind else self.grouping.of.get(tensor, tensor)


def graph_view(
    names: Sequence[str], edges: Sequence[tuple[str, str]], grouping: Grouping, expanded: set[str] | frozenset[str]
) -> GraphView:
    """The visible graph: each group collapsed to one node unless its key is in ``expanded`` (then its tensors
    are drawn), edges mapped onto visible nodes (duplicates and edges inside a collapsed group dropped)."""
    kind: dict[str, str] = {}
    members: dict[str, tuple[str, ...]] = {}
    rep: dict[str, str] = {}

    def show(g: Group) -> None:
        if g.key in expanded and g.parts:
            for p in g.parts:
                show(p)
        elif g.key in expanded or len(g.members) == 1:
            for m in g.members:
                kind[m], members[m], rep[m] = TENSOR, (m,), m
        else:
            kind[g.key], members[g.key] = GROUP, g.members
            for m in g.members:
                rep[m] = g.key

    for g in grouping.groups:
        show(g)
    vis_edges = list(dict.fromkeys((rep[a], rep[b]) for a, b in edges if a in rep and b in rep and rep[a] != rep[b]))
    nodes = list(kind)
    return GraphView(nodes, kind, members, vis_edges, layered_drawing(nodes, vis_edges), grouping)


def _metric_value(row: Mapping[str, Any], metric: str) -> float | None:
    v = row.get(metric)
    if v is None or isinstance(v, str):
        return None
    f = float(v)
    return None if math.isnan(f) else f


def _worst(vals: Sequence[float | None], metric: str) -> float | None:
    known = [v for v in vals if v is not None]
    if not known:
        return None
    return min(known) if metric in SQNR_METRICS else max(known)


def _colours(values: Sequence[float | None], metric: str) -> list[str] | list[float | None]:
    if metric in SQNR_METRICS:
        return [sqnr_color(v) for v in values]
    return [None if v is None or v <= 0 else math.log10(v) for v in values]


def _fmt_metric(v: float | None, metric: str) -> str:
    if metric in SQNR_METRICS:
        return fmt_db_text(v)
    return "n/a" if v is None else f"{v:.3g}"


@dataclass(frozen=True)
class _NodeTexts:
    hover: list[str]
    labels: list[str]
    values: list[float | None]


def _node_texts(view: GraphView, rows: Mapping[str, Mapping[str, Any]], metric: str) -> _NodeTexts:
    hover, labels, values = [], [], []
    for node in view.nodes:
        mem = view.members[node]
        worst = _worst([_metric_value(rows.get(m, {}), metric) for m in mem], metric)
        values.append(worst)
        if view.kind[node] == GROUP:
            group = view.grouping.group(node)
            label = group.label
            ops = Counter(str(rows.get(m, {}).get("producer_op", "?")) for m in mem).most_common(4)
            repeat = f" in {len(group.parts)} identical blocks" if group.parts else ""
            hover.append(
                f"<b>{label}</b><br>{len(mem)} tensors{repeat}: "
                + ", ".join(f"{o}×{k}" for o, k in ops)
                + f"<br>worst {metric}: {_fmt_metric(worst, metric)}<br><i>click to expand</i>"
            )
            short = label if len(label) <= 34 else label[:33] + "…"
            labels.append(f"{short} ({len(mem)})")
        else:
            r = rows.get(node, {})
            hover.append(
                f"<b>{node}</b><br>op: {r.get('producer_op')} ({r.get('producer_node')})"
                f"<br>type: {r.get('quant_type') or 'float'}"
                f"<br>local: {fmt_db_text(_metric_value(r, 'local_sqnr_db'))}"
                f"<br>cumulative: {fmt_db_text(_metric_value(r, 'cumulative_sqnr_db'))}"
                + ("" if metric in SQNR_METRICS else f"<br>{metric}: {_fmt_metric(worst, metric)}")
            )
            labels.append(str(r.get("producer_op", "")))
    return _NodeTexts(hover, labels, values)


def _path_lines(view: GraphView, path: Sequence[str]) -> tuple[list[float | None], list[float | None]]:
    """The worst path mapped onto visible nodes, drawn along the edges' routes."""
    seq: list[str] = []
    for t in path:
        n = view.node_of(t)
        if n in view.kind and (not seq or seq[-1] != n):
            seq.append(n)
    xs: list[float | None] = []
    ys: list[float | None] = []
    for a, b in itertools.pairwise(seq):
        pts = view.drawing.routes.get((a, b)) or [view.drawing.pos[a], view.drawing.pos[b]]
        xs += [p[0] for p in pts] + [None]
        ys += [p[1] for p in pts] + [None]
    if len(seq) == 1:
        x, y = view.drawing.pos[seq[0]]
        xs, ys = [x], [y]
    return xs, ys


def graph_view_figure(
    view: GraphView,
    rows: Mapping[str, Mapping[str, Any]],
    metric: str = "cumulative_sqnr_db",
    selected: str | None = None,
    path: Sequence[str] = (),
    label_limit: int = 150,
) -> go.Figure:
    """The figure of a :class:`GraphView`: ``rows`` maps each tensor to its report row (a dict of
    ``DebugReport.to_dataframe()`` columns). Top to bottom, one layer per rank; edges follow their routes.

    Nodes are coloured by ``metric`` (a group by its worst member: lowest SQNR, highest error); SQNR metrics use
    the anchored bands, ``mse`` / ``max_abs_error`` a log10 red scale. Every node's ``customdata`` is
    ``[kind, id]`` (:data:`GROUP` + group key, or :data:`TENSOR` + tensor name). Traces: ``edges``, ``path``
    (``path``, the worst tensor's way back to the inputs), ``nodes``, ``selected`` (a ring on the node showing
    ``selected``, not clickable). Labels (group names, op types of tensors) up to ``label_limit`` nodes.
    """
    if metric not in SQNR_METRICS + ERROR_METRICS:
        raise ValueError(f"graph_view_figure: unknown metric {metric!r} ({', '.join(SQNR_METRICS + ERROR_METRICS)})")
    pos = view.drawing.pos
    # Coordinates go in as float arrays (NaN breaks a line): plotly validates arrays in one copy, lists element by
    # element, which was a third of an "expand all" on a 374-tensor model.
    pts: list[tuple[float, float]] = []
    for e in view.edges:
        pts += view.drawing.routes.get(e) or [pos[e[0]], pos[e[1]]]
        pts.append((math.nan, math.nan))
    exy = np.array(pts, dtype=float).reshape(-1, 2)
    texts = _node_texts(view, rows, metric)
    ranks = max(view.drawing.ranks.values(), default=0) + 1
    height = int(max(min(MAX_HEIGHT, 60 + 48 * ranks), 420, 40 + 10 * ranks))  # ≥ 10 px per layer
    # Markers never overlap the next layer: overlapping markers are how a click on one tensor selected its
    # neighbour (issue 15: 364 layers squeezed into 360 px). Zooming in spreads the layers, not the markers.
    cap = max(4.0, 0.8 * (height - 40) / ranks)
    sizes = np.array([min(cap, 12 if view.kind[n] == TENSOR else 14 + 3 * math.sqrt(len(view.members[n])))
                      for n in view.nodes], dtype=float)  # fmt: skip
    symbols = ["circle" if view.kind[n] == TENSOR else "square" for n in view.nodes]
    show = len(view.nodes) <= label_limit
    marker: dict[str, Any] = {"size": sizes, "symbol": symbols, "line": {"width": 1, "color": "#495057"}}
    if metric in SQNR_METRICS:
        marker["color"] = _colours(texts.values, metric)
        scale = {"color": [Z_MIN], "colorscale": SQNR_COLORSCALE, "cmin": Z_MIN, "cmax": Z_MAX, "showscale": True,
                 "colorbar": {"title": {"text": "dB"}, "tickvals": [0, SQNR_LOW, SQNR_HIGH, Z_MAX]}}  # fmt: skip
    else:
        logs = [v for v in _colours(texts.values, metric) if isinstance(v, float)]
        lo, hi = (min(logs), max(logs)) if logs else (0.0, 1.0)
        marker.update(color=[GREY if v is None else v for v in _colours(texts.values, metric)])
        marker.update(colorscale=_ERROR_SCALE, cmin=lo, cmax=hi if hi > lo else lo + 1)
        if any(v is None for v in texts.values):  # a mix of numbers and grey names is not allowed by plotly
            marker["color"] = [lo if v is None else v for v in _colours(texts.values, metric)]
        scale = {"color": [lo], "colorscale": _ERROR_SCALE, "cmin": lo, "cmax": marker["cmax"], "showscale": True,
                 "colorbar": {"title": {"text": f"log10 {metric}"}}}  # fmt: skip
    px, py = _path_lines(view, path)
    traces = [
        go.Scatter(x=exy[:, 0], y=exy[:, 1], mode="lines", name="edges", hoverinfo="skip", showlegend=False,
                   line={"width": 1, "color": "#adb5bd"}),
        go.Scatter(x=px, y=py, mode="lines+markers" if len(px) == 1 else "lines", name="path", hoverinfo="skip",
                   showlegend=False, line={"width": 4, "color": "#e8590c"}, opacity=0.6),
        go.Scatter(
            x=np.array([pos[n][0] for n in view.nodes], dtype=float),
            y=np.array([pos[n][1] for n in view.nodes], dtype=float), name="nodes",
            mode="markers+text" if show else "markers", text=texts.labels if show else None,
            textposition="middle right", textfont={"size": 10}, customdata=[[view.kind[n], n] for n in view.nodes],
            hovertext=texts.hover, hoverinfo="text", marker=marker, showlegend=False,
        ),
        go.Scatter(x=[None], y=[None], mode="markers", name="scale", hoverinfo="skip", showlegend=False,
                   marker=scale),
        go.Scatter(x=[], y=[], mode="markers", name="selected", hoverinfo="skip", showlegend=False,
                   marker={"size": 26, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": HIGHLIGHT}}),
    ]  # fmt: skip
    fig = go.Figure(traces)
    if selected:
        ring_at(fig, view, selected)
    fig.update_layout(
        xaxis={"visible": False}, yaxis={"visible": False, "autorange": "reversed"},
        hovermode="closest", plot_bgcolor="white", dragmode="pan",
        height=height, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        title={"text": f"{len(view.nodes)} nodes ({view.grouping.method}); colour: worst {metric}",
               "font": {"size": 13}},
    )  # fmt: skip
    return fig


def ring_at(fig: go.Figure, view: GraphView, tensor: str) -> str | None:
    """Move the ``selected`` ring of ``fig`` onto the node showing ``tensor`` (its group when collapsed);
    returns that node (``None``: the tensor is not in the view, the ring is hidden)."""
    node = view.node_of(tensor)
    ring = next(t for t in fig.data if t.name == "selected")
    if node not in view.drawing.pos:
        ring.x, ring.y = [], []
        return None
    x, y = view.drawing.pos[node]
    ring.x, ring.y = [x], [y]
    return node


def ranks_respect_edges(view: GraphView) -> list[tuple[str, str]]:
    """Visible edges that do not go strictly down a rank (empty for a correct layered drawing)."""
    r = view.drawing.ranks
    return [(a, b) for a, b in view.edges if not r[a] < r[b]]


__all__ = [
    "GROUP",
    "MAX_GROUPS",
    "TENSOR",
    "GraphView",
    "Group",
    "Grouping",
    "find_tensors",
    "graph_view",
    "graph_view_figure",
    "group_tensors",
    "merge_repeats",
    "ranks_respect_edges",
    "ring_at",
    "scope_path",
    "worst_path",
]
