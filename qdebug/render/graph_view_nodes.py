"""What the graph view shows (:mod:`qdebug.render.graph_view`): the visible nodes — collapsed groups, and the tensors
of expanded ones — with their edges and layered drawing (:func:`graph_view`), the path of the worst tensor back to
the inputs (:func:`worst_path`), the tensor search (:func:`find_tensors`) and the drawing's check
(:func:`ranks_respect_edges`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qdebug.render.graph_view_groups import Group, Grouping
from qdebug.render.layout import Drawing, layered_drawing

#: Node kinds in the figure's ``customdata``: ``[kind, id]``.
GROUP, TENSOR = "group", "tensor"


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


def ranks_respect_edges(view: GraphView) -> list[tuple[str, str]]:
    """Visible edges that do not go strictly down a rank (empty for a correct layered drawing)."""
    r = view.drawing.ranks
    return [(a, b) for a, b in view.edges if not r[a] < r[b]]
