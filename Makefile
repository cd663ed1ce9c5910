# Every target creates .venv/ and installs what it needs, so each works on a fresh machine.
# pyproject.toml declares compatible ranges; requirements.lock pins the versions tests run with
# (`make lock` regenerates it); `make test-newest` runs the tests on the newest versions the ranges admit.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCK := requirements.lock
EXTRAS := openai,anthropic,postgres,temporal,ui,docs,mcp,encryption,schedules,pydantic-ai,openai-agents,peers,dev
HASH := $(shell cat pyproject.toml $(LOCK) | sha256sum | cut -c1-12)
CORE := $(VENV)/.core-$(HASH)
STAMP := $(VENV)/.installed-$(HASH)
NEWEST := .venv-newest
# The LiteLLM proxy (header tests) lives in a venv of its own: litellm[proxy] pins rich<14.
LITELLM := .venv-litellm
LITELLM_STAMP := $(LITELLM)/.installed-$(shell cat requirements-litellm.lock | sha256sum | cut -c1-12)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

.PHONY: demo demo-local test test-newest lint typecheck unit bench docs install install-local lock clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The demo needs only cuaderno's own runtime dependencies: no SDK, no dev tools.
$(CORE): $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/pip install -q -c $(LOCK) -e .
	touch $@

$(STAMP): $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/pip install -q -c $(LOCK) -e '.[$(EXTRAS)]'
	touch $@

install: $(STAMP)

# The local model server (llama.cpp built for these CPUs: a native build crashes on the first
# decode) is a separate, slower install; pip caches the built wheel for the next time.
$(VENV)/.local-$(HASH): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q -c $(LOCK) -e '.[$(EXTRAS),local]'
	touch $@

install-local: $(VENV)/.local-$(HASH)

$(LITELLM_STAMP): requirements-litellm.lock
	$(PY) -m venv $(LITELLM)
	$(LITELLM)/bin/pip install -q --upgrade pip
	$(LITELLM)/bin/pip install -q -r requirements-litellm.lock
	touch $@

demo: $(CORE)
	$(BIN)/python examples/propiedades/02_durabilidad.py

demo-local: install-local
	$(BIN)/python examples/local/durable_local.py

lint: install
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/mypy

unit: install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

test: lint install-local $(LITELLM_STAMP)
	CUADERNO_LITELLM_PYTHON=$(CURDIR)/$(LITELLM)/bin/python $(BIN)/python -m pytest -q -n 2 --dist loadgroup

# The tests again in a fresh venv with the newest versions pyproject's ranges admit (no lock):
# what an application that installs cuaderno beside its own packages gets today.
test-newest:
	rm -rf $(NEWEST)
	$(PY) -m venv $(NEWEST)
	$(NEWEST)/bin/pip install -q --upgrade pip
	$(NEWEST)/bin/pip install -q --upgrade -e '.[$(EXTRAS)]'
	$(NEWEST)/bin/pip list --format=freeze | grep -iE '^(pydantic|typer|rich|opentelemetry-api|zstandard|rfc8785|openai|anthropic|psycopg|temporalio)=='
	$(NEWEST)/bin/python -m pytest -q -n 2 --dist loadgroup -m "not local_model and not litellm_proxy" -p no:cacheprovider

lock: $(BIN)/python
	$(BIN)/python scripts/lock.py '$(EXTRAS),local' > $(LOCK).new && mv $(LOCK).new $(LOCK)

# The docs site (mkdocs-material + mkdocstrings), built strictly: a broken link or reference fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python benchmarks/bench_journal.py
	$(BIN)/python benchmarks/bench_step_parts.py

clean:
	rm -rf $(VENV) $(NEWEST) $(LITELLM) .pytest_cache .mypy_cache .ruff_cache
