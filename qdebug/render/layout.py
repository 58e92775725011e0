"""Layered (Sugiyama) positions for the model graph view, computed by grandalf.

The layout itself is grandalf's maintained Sugiyama implementation (ranking, dummy vertices for long edges,
crossing reduction by barycentre sweeps, Brandes–Köpf coordinates); this module only adapts names and edges to
grandalf's vertex/edge objects and places disconnected components side by side.

A simpler ``"longest_path"`` method is available as a fallback for very large graphs: every node's layer is
its longest distance from a source and nodes keep their topological (input) order inside a layer. It does no
crossing reduction, but it is linear in the size of the graph.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from qdebug._lazy import LazyModule

# grandalf is the ``ui`` extra: imported on the first Sugiyama layout (a missing one names the extra then).
_graphs, _layouts = LazyModule("grandalf.graphs"), LazyModule("grandalf.layouts")

Method = Literal["sugiyama", "longest_path"]

#: Horizontal/vertical spacing between node boxes (layout units; the figure scales them freely).
NODE_W = 10.0
NODE_H = 10.0
#: Gap between disconnected components placed side by side.
COMPONENT_GAP = 30.0


def _check(nodes: Sequence[Hashable], edges: Iterable[tuple[Hashable, Hashable]]) -> list[tuple[Hashable, Hashable]]:
    known = set(nodes)
    if len(known) != len(nodes):
        raise ValueError("layered_layout: node names must be unique")
    # Edges to unknown nodes (e.g. initializers that are not activations) and self-loops carry no layout information.
    return [(a, b) for a, b in edges if a in known and b in known and a != b]


@dataclass
class Drawing:
    """A layered drawing: node positions, each node's layer (rank) and each edge's route.

    ``routes[(a, b)]`` is the polyline from ``a`` to ``b`` through the dummy points grandalf placed on the
    layers the edge crosses (so a long edge bends around the nodes in between instead of crossing them).
    """

    pos: dict[Hashable, tuple[float, float]]
    ranks: dict[Hashable, int] = field(default_factory=dict)
    routes: dict[tuple[Hashable, Hashable], list[tuple[float, float]]] = field(default_factory=dict)


class _Route:
    """grandalf's edge "view": it receives the routed polyline of one edge."""

    def __init__(self) -> None:
        self.path: list[tuple[float, float]] = []

    def setpath(self, pts: list[Any]) -> None:
        self.path = [(float(x), float(y)) for x, y in pts]


def _sugiyama_drawing(nodes: Sequence[Hashable], edges: list[tuple[Hashable, Hashable]]) -> Drawing:
    verts = {n: _graphs.Vertex(n) for n in nodes}
    for v in verts.values():
        v.view = _layouts.VertexViewer(w=NODE_W, h=NODE_H)
    gedges = {(a, b): _graphs.Edge(verts[a], verts[b]) for a, b in dict.fromkeys(edges)}
    for e in gedges.values():
        e.view = _Route()
    g = _graphs.Graph(list(verts.values()), list(gedges.values()))
    out = Drawing(pos={})
    x_offset = 0.0
    for comp in g.C:
        layout = _layouts.SugiyamaLayout(comp)
        layout.xspace = NODE_W
        layout.yspace = NODE_H
        layout.init_all()
        # N=1.5: one down-and-up sweep plus one down sweep of crossing reduction (grandalf's default).
        layout.draw(N=1.5)
        xs = [v.view.xy[0] for v in comp.sV]
        lo, hi = min(xs), max(xs)
        for v in comp.sV:
            x, y = v.view.xy
            out.pos[v.data] = (float(x - lo + x_offset), float(y))
            out.ranks[v.data] = int(layout.grx[v].rank)
        for e in comp.sE:
            out.routes[(e.v[0].data, e.v[1].data)] = [(x - lo + x_offset, y) for x, y in e.view.path]
        x_offset += hi - lo + COMPONENT_GAP
    return out


def _sugiyama(nodes: Sequence[Hashable], edges: list[tuple[Hashable, Hashable]]) -> dict[Hashable, tuple[float, float]]:
    return _sugiyama_drawing(nodes, edges).pos


def _longest_path(
    nodes: Sequence[Hashable], edges: list[tuple[Hashable, Hashable]]
) -> dict[Hashable, tuple[float, float]]:
    preds: dict[Hashable, list[Hashable]] = {n: [] for n in nodes}
    succs: dict[Hashable, list[Hashable]] = {n: [] for n in nodes}
    for a, b in edges:
        preds[b].append(a)
        succs[a].append(b)
    # Kahn's algorithm, seeded in input order so that ties keep the caller's (topological) order.
    indeg = {n: len(preds[n]) for n in nodes}
    order: list[Hashable] = []
    ready = [n for n in nodes if indeg[n] == 0]
    while ready:
        n = ready.pop(0)
        order.append(n)
        for s in succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    order += [n for n in nodes if indeg[n] > 0]  # nodes on a cycle: append in input order
    layer: dict[Hashable, int] = {}
    for n in order:
        layer[n] = max((layer[p] + 1 for p in preds[n] if p in layer), default=0)
    slots: dict[int, int] = {}
    pos: dict[Hashable, tuple[float, float]] = {}
    for n in order:
        k = slots.get(layer[n], 0)
        slots[layer[n]] = k + 1
        pos[n] = (k * 2 * NODE_W, layer[n] * 2 * NODE_H + NODE_H / 2)
    return pos


def layered_layout(
    nodes: Sequence[Hashable],
    edges: Iterable[tuple[Hashable, Hashable]],
    method: Method = "sugiyama",
) -> dict[Hashable, tuple[float, float]]:
    """Positions ``{node: (x, y)}`` of a layered drawing of a directed graph; ``y`` grows with depth.

    ``nodes`` are unique hashable names (topological order preferred); ``edges`` are ``(source, target)``
    pairs — edges naming unknown nodes and self-loops are ignored, cycles are tolerated (grandalf inverts
    feedback edges). ``method="sugiyama"`` (default) uses grandalf's Sugiyama layout; ``"longest_path"`` is the
    linear-time fallback described in the module docstring. Every node gets a position.
    """
    nodes = list(nodes)
    if not nodes:
        return {}
    kept = _check(nodes, edges)
    if method == "sugiyama":
        return _sugiyama(nodes, kept)
    if method == "longest_path":
        return _longest_path(nodes, kept)
    raise ValueError(f"layered_layout: unknown method {method!r} (sugiyama|longest_path)")


def layered_drawing(nodes: Sequence[Hashable], edges: Iterable[tuple[Hashable, Hashable]]) -> Drawing:
    """:func:`layered_layout` (Sugiyama) with each node's rank and each edge's routed polyline (:class:`Drawing`).

    On a DAG every edge goes from a lower to a higher rank (grandalf inverts only edges that close a cycle).
    """
    nodes = list(nodes)
    if not nodes:
        return Drawing(pos={})
    return _sugiyama_drawing(nodes, _check(nodes, edges))


def chain_with_skips(n: int, skip_every: int = 3, skip_len: int = 4) -> tuple[list[str], list[tuple[str, str]]]:
    """A synthetic ``n``-node chain with a residual skip edge every ``skip_every`` nodes (for timing the layout)."""
    nodes = [f"t{i}" for i in range(n)]
    edges = [(nodes[i], nodes[i + 1]) for i in range(n - 1)]
    edges += [(nodes[i], nodes[i + skip_len]) for i in range(0, n - skip_len, skip_every)]
    return nodes, edges
