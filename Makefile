# Every target creates .venv/ and installs what it needs, so each works on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

.PHONY: demo demo-local test lint typecheck unit bench install install-local clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[openai,anthropic,postgres,temporal,dev]'
	touch $(STAMP)

install: $(STAMP)

# The local model server (llama.cpp built for these CPUs: a native build crashes on the first
# decode) is a separate, slower install; pip caches the built wheel for the next time.
$(VENV)/.installed-local: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q -e '.[openai,anthropic,postgres,temporal,dev,local]'
	touch $@

install-local: $(VENV)/.installed-local

demo: install
	$(BIN)/python examples/propiedades/02_durabilidad.py

demo-local: install-local
	$(BIN)/python examples/local/durable_local.py

lint: install
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/mypy

unit: install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

test: lint install-local
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

bench: install
	$(BIN)/python benchmarks/bench_journal.py
	$(BIN)/python benchmarks/bench_step_parts.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
