# Two entry points (see README): `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATARECON_DATA ?= $(abspath ../shared/data)
export DATARECON_DATA

.PHONY: venv demo test clean

# The test suite also exercises the optional Ray backend (extra `ray`) and DP-SGD targets (extra `dp`).
$(VENV)/.ray-extra: $(BIN)/datarecon
	$(BIN)/pip install -q -e ".[test,ray,dp]" torch==2.13.0
	touch $@

$(BIN)/datarecon: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]" torch==2.13.0
	touch $(BIN)/datarecon

venv: $(BIN)/datarecon

demo: venv
	$(BIN)/datarecon demo --out demo-out --overwrite

test: venv $(VENV)/.ray-extra
	@command -v chromium >/dev/null 2>&1 || echo "note: no chromium on PATH: the browser tests of the reports are skipped (apt-get install chromium)"
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo-out .pytest_cache
