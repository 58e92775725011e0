"""How the graph view and the grouped heatmap group real models (issue 38): per debug report, the tensors, how they
were grouped (name scope / graph structure), the collapsed graph's groups, how many are ×N repeated blocks, and
the grouped heatmap's labelled ticks (the same number by construction: both read ``Grouping.labels()``).

    qdebug debug --float-model M.onnx --quant-model M.qdq.onnx --data eval.npz --output M.json
    .venv/bin/python benchmarks/bench_graph_groups.py M.json [...] [--labels]
"""

from __future__ import annotations

import argparse

from qdebug.render import figures
from qdebug.render import graph_view as gv
from qdebug.report import DebugReport


def main() -> None:
    """Print one line per report (and with ``--labels`` each group's label and size)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--labels", action="store_true")
    args = ap.parse_args()
    print("| report | tensors | grouped by | groups | ×N | heatmap labelled ticks |\n|---|---|---|---|---|---|")
    for path in args.reports:
        df = DebugReport.load(path).to_dataframe().sort_values("topo_index", kind="stable")
        rows = {str(r["tensor_name"]): r for r in df.to_dict("records")}
        names = list(rows)
        edges = [(str(i), n) for n in names for i in (rows[n].get("inputs") or ()) if str(i) in rows]
        g = gv.group_tensors(names, edges, {n: str(r["producer_op"]) for n, r in rows.items()},
                             sizes={n: int(r["elements"]) for n, r in rows.items()},
                             scopes={n: str(r["producer_node"]) for n, r in rows.items()})  # fmt: skip
        heat = figures.layer_heatmap(df, None, "h", 40, None, g.labels())
        reps = sum(1 for x in g.groups if x.parts)
        ticks = sum(1 for t in heat.layout.xaxis.ticktext if t)
        print(f"| {path} | {len(names)} | {g.method} | {len(g.groups)} | {reps} | {ticks} of {len(g.groups)} |")
        if args.labels:
            for x in g.groups:
                print(f"|   {x.label} | {len(x.members)} |")


if __name__ == "__main__":
    main()
