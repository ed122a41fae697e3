# The one entry point for humans and CI. `make demo` runs the demo, `make test` runs every check.
# Each target creates its own virtual environment and installs what it needs.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint unit integration controlplane image lock clean chart docs release

# Exactly the locked versions, every file checked against its hash, then podcert itself with
# nothing left to resolve (locks/README.md says what each lock holds). The editable install maps
# only the product's packages (the wheel's); the checkout-dev.pth line puts the checkout itself on
# the path, so that the development-only ones (devcluster, examples, bench) import here too.
$(VENV)/.installed: pyproject.toml locks/build.txt locks/dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r locks/build.txt
	$(BIN)/python -m pip install --quiet --require-hashes -r locks/dev.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	echo "$(CURDIR)" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/checkout-dev.pth"
	touch $@

# Refresh the locks after changing a dependency in pyproject.toml: `make lock` keeps every pin
# it can and adds what is new; `make lock UPGRADE=1` takes the newest versions the ranges allow.
# Resolved for every platform and Python >= 3.11, with the hashes of every file of each version.
UV_COMPILE = $(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command "make lock" $(if $(UPGRADE),--upgrade)

lock: $(VENV)/.installed
	$(UV_COMPILE) pyproject.toml --extra server --group dev -o locks/dev.txt
	$(UV_COMPILE) pyproject.toml --extra server --extra hsm --extra spire --constraint locks/dev.txt -o locks/runtime.txt
	$(UV_COMPILE) pyproject.toml --constraint locks/dev.txt -o locks/base.txt
	$(UV_COMPILE) locks/build.in -o locks/build.txt

demo: $(VENV)/.installed
	$(BIN)/podcert demo

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Regenerate the chart's generated files after editing values.yaml, Chart.yaml or the signer's
# policy reader: values.schema.json's `policy` and README.md (devcluster/chartfiles.py; a unit
# test fails while they are stale).
chart: $(VENV)/.installed
	$(BIN)/python -m devcluster.chartfiles

# The documentation site (docs/, Sphinx + MyST, docs/conf.py) into build/docs/html: warnings are
# errors (-W; --keep-going lists them all), every reference and link is checked (-n, MyST's
# heading anchors), and the environment is fresh (-E) because the reference pages are generated
# from the code as they are read (devcluster/docsite.py). The test command builds it first.
DOCS_OUT ?= build/docs

docs: $(VENV)/.installed
	$(BIN)/sphinx-build -W --keep-going -n -E -q -b html -d $(DOCS_OUT)/doctrees docs $(DOCS_OUT)/html

# Install what a real node needs from Debian (apt-get, only when something is missing), then build
# (once, cached outside the repo) the devcluster's binaries, showing progress: the whole cluster
# with both kubelets for each minor, 1.37 first, each minor in one go build (kube-proxy 1.37 with
# it, for the in-cluster tests' Services), and the tests' own Go programs (tests/interop:
# go-spiffe's conformance checker, the reference program, SPIRE's server and agent with only the
# plugins the federation tests configure), the Go and Java example workloads (examples/go,
# examples/java: javac alone, a JDK 17+ on PATH), helm for the chart's tests, CoreDNS, and
# podcert's image and the examples' (podman). Two lanes at once: Kubernetes' builds one after another, and
# beside them what builds apart from them.
controlplane: $(VENV)/.installed
	$(BIN)/podcert devcluster deps
	$(BIN)/podcert devcluster build --kube-version 1.37 --kube-version 1.36 --kube-version 1.35 --kubelets --interop --spire --helm --network --images

# Build podcert's image and the example pair's with podman from the Dockerfiles, then check them
# (devcluster/imagebuild.py). Installs podman and debootstrap from Debian when missing (as root)
# and makes the base image once; later builds are cached. The test command builds it too.
image: $(VENV)/.installed
	$(BIN)/podcert devcluster image

# The release artefacts of the version in the tree, into dist/: the wheel and the sdist, the image
# as an OCI archive, the chart package, a CycloneDX SBOM of each and SHA256SUMS
# (devcluster/release.py; docs/releasing.md says how a release is published).
release: $(VENV)/.installed
	$(BIN)/podcert devcluster release --out dist

# The suite in WORKERS processes (pytest-xdist): its integration tests mostly wait on real
# servers, so one process leaves the machine idle. A module runs whole in one worker (its fixtures
# start once), and the modules that hold the real node or the podman store (there is one of each)
# one after another in one worker, first (tests/conftest.py: MACHINE_MODULES; xdist's own
# reordering off). WORKERS=0 runs it in this process.
WORKERS ?= 2

# pytest exits 5 when it collected nothing: that is a broken suite, never a pass.
define PYTEST
	$(BIN)/python -m pytest $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --no-loadscope-reorder) $(1); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing the run" >&2; exit 1; fi; \
	exit $$rc
endef

unit: $(VENV)/.installed
	$(call PYTEST,-m "not integration")

integration: controlplane
	$(call PYTEST,-m integration)

test: lint docs controlplane
	$(call PYTEST,)

clean:
	rm -rf $(VENV) .devcluster .mypy_cache .pytest_cache .ruff_cache
