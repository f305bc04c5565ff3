# Two entry points (see README): `make demo` and `make test`.
# `make test-torch TORCH=2.14.1` runs the suite on another torch release of the declared range.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATARECON_DATA ?= $(abspath ../shared/data)
export DATARECON_DATA

.PHONY: venv demo test test-slow test-all test-torch clean

# The suite runs on every core (pytest-xdist). `make test` leaves out the long end-to-end and
# science tests marked `slow` (reproductions, audits, README examples, fault trials, browser checks)
# and spreads the rest test by test (--dist load); `make test-slow` runs exactly those, a file per
# worker (--dist loadfile: a file's expensive fixture, e.g. one smoke reproduction, is built once),
# and `make test-all` both (CI: .ci/run). Each prints its 15 slowest tests. (--dist loadgroup would
# group by xdist_group marks, but with pytest 9.2 and pytest-xdist 3.8 it did not group at all.)
WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS) --durations=15

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

# `source .venv/bin/activate` exports the data folder make reads MNIST and CIFAR-10 from (unless the shell
# sets DATARECON_DATA itself), so the README's commands find them in a new shell; rewritten on every call.
venv: $(BIN)/datarecon
	@grep -v '# datarecon: the data folder' $(BIN)/activate > $(BIN)/activate.tmp
	@echo 'export DATARECON_DATA="$${DATARECON_DATA:-$(DATARECON_DATA)}"  # datarecon: the data folder' \
	    >> $(BIN)/activate.tmp
	@mv $(BIN)/activate.tmp $(BIN)/activate

demo: venv
	$(BIN)/datarecon demo --out demo-out --overwrite

test: venv $(VENV)/.ray-extra
	$(PYTEST) --dist load -m "not slow"

test-slow: venv $(VENV)/.ray-extra
	@command -v chromium >/dev/null 2>&1 || echo "note: no chromium on PATH: the browser tests of the reports are skipped (apt-get install chromium)"
	$(PYTEST) --dist loadfile -m slow

test-all: test test-slow

# A second venv beside the checkout (not in it: a CUDA build of torch is ~6 GB), built once per
# release; pip must keep the requested torch, else the target fails. Not part of `make test` / CI.
TORCH ?= 2.14.1
TORCH_VENV ?= $(abspath ..)/venv-torch$(subst .,,$(TORCH))

$(TORCH_VENV)/.installed-$(TORCH): pyproject.toml
	test -x $(TORCH_VENV)/bin/python || $(PY) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install -q --upgrade pip
	$(TORCH_VENV)/bin/pip install -q -e ".[test,ray,dp]" torch==$(TORCH)
	touch $@

test-torch: $(TORCH_VENV)/.installed-$(TORCH)
	$(TORCH_VENV)/bin/python -c "import sys, torch; v = torch.__version__.split('+')[0]; \
	    sys.exit(0 if v == '$(TORCH)' else f'error: {v} installed in $(TORCH_VENV), not torch $(TORCH)')"
	PYTHONPATH=$(abspath src) $(TORCH_VENV)/bin/python -m pytest -q -n $(WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) demo-out .pytest_cache
