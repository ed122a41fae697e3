# The one entry point for humans and CI. `make demo` runs the demo, `make test` runs every check.
# Each target creates its own virtual environment and installs what it needs.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint unit integration controlplane test-versions clean

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
# (once, cached outside the repo) the devcluster's binaries, showing progress: the whole 1.37
# cluster with both kubelets.
controlplane: $(VENV)/.installed
	$(BIN)/podcert devcluster deps
	$(BIN)/podcert devcluster build --kube-version 1.37 --kubelets

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

# The older minors (1.35, 1.36) as whole devclusters with hollow kubelets and podcert's signer.
# Opt-in for now: building both cold takes about 20 more minutes on 2 shared cores.
test-versions: export PODCERT_KUBE_VERSIONS = 1.35 1.36
test-versions: controlplane
	$(BIN)/podcert devcluster build --kube-version 1.35 --kube-version 1.36 --kubelets
	$(call PYTEST,tests/integration/test_kube_versions.py)

clean:
	rm -rf $(VENV) .devcluster .mypy_cache .pytest_cache .ruff_cache
