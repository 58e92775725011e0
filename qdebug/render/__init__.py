"""The rendering layer: how results look, in one place for every face (CLI, widgets, reports).

* :mod:`qdebug.render.bands` — the SQNR bands (20 / 40 dB) and their colours;
* :mod:`qdebug.render.fmt` — number formatting (dB with statuses spelled out, percentages, sizes);
* :mod:`qdebug.render.text` — text tables and the CLI's reports;
* :mod:`qdebug.render.figures` — plotly figures (pure data → ``go.Figure``; plotly, the ``ui`` extra, loads on
  the first figure);
* :mod:`qdebug.render.layout` — layered graph layout (grandalf, the ``ui`` extra, loads on first use).

Nothing here imports a UI library at import time.
"""
