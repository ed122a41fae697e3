# The one entry point for humans and CI. `make demo` runs the demo, `make test` runs every check.
# Each target creates its own virtual environment and installs what it needs.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint unit integration controlplane clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	$(BIN)/python -m pip install --quiet -e . --group dev
	touch $@

demo: $(VENV)/.installed
	$(BIN)/podcert demo

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Install what a real node needs from Debian (apt-get, only when something is missing), then build
# (once, cached outside the repo) the devcluster's binaries, showing progress: the whole cluster
# with both kubelets for each minor, 1.37 first (1.35 reuses much of 1.36's Go build cache).
controlplane: $(VENV)/.installed
	$(BIN)/podcert devcluster deps
	$(BIN)/podcert devcluster build --kube-version 1.37 --kube-version 1.36 --kube-version 1.35 --kubelets

# pytest exits 5 when it collected nothing: that is a broken suite, never a pass.
define PYTEST
	$(BIN)/python -m pytest $(1); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing the run" >&2; exit 1; fi; \
	exit $$rc
endef

unit: $(VENV)/.installed
	$(call PYTEST,-m "not integration")

integration: controlplane
	$(call PYTEST,-m integration)

test: lint controlplane
	$(call PYTEST,)

clean:
	rm -rf $(VENV) .devcluster .mypy_cache .pytest_cache .ruff_cache
