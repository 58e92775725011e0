"""The rendering layer: how results look, in one place for every face (CLI, widgets, reports).

* :mod:`qdebug.render.bands` — the SQNR bands (20 / 40 dB) and their colours;
* :mod:`qdebug.render.fmt` — number formatting (dB with statuses spelled out, percentages, sizes);
* :mod:`qdebug.render.text` — text tables and the CLI's reports;
* :mod:`qdebug.render.figures` — plotly figures (pure data → ``go.Figure``; plotly, the ``ui`` extra, loads on
  the first figure);
* :mod:`qdebug.render.layout` — layered graph layout (grandalf, the ``ui`` extra, loads on first use);
* :mod:`qdebug.render.graph_view` and :mod:`qdebug.render.inspector` — the graph view and the inspector's data and
  figures; :mod:`qdebug.render.html` — the one-file HTML report.

A module here with a namesake in ``widgets/`` (``render/graph_view.py`` ↔ ``widgets/graph_view.py``,
``render/inspector.py`` ↔ ``widgets/inspector.py``) is the widget's pure half: its data and figures, testable without
a browser; the widget keeps only view state and events.

Nothing here imports a UI library at import time.
"""
