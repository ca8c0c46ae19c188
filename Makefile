# gpualloc — the two commands a newcomer needs are `make run` and `make test`.
# Everything installs into .venv/ at the repo root (created when missing).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install run run-cluster test lint fmt protos protos-check bench loadtest demo fuzz chaos clean peers

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "gpualloc needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,agent,otlp,prometheus,loadtest,kube,cli]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install gpualloc with its dev toolchain

run: $(STAMP) ## start inventory + allocator in one process on 127.0.0.1:50051 (embedded store, demo inventory; web view on 127.0.0.1:8080, metrics on 127.0.0.1:9464 unless GPUALLOC_METRICS_LISTEN moves them)
	$(BIN)/gpualloc serve --demo

run-cluster: $(STAMP) ## `make run` on a local 3+3 Redis Cluster (loopback ports 7000-7005; stopped on exit)
	@url=$$(deploy/local/redis-cluster.sh start) && echo "redis cluster: $$url" && \
	  trap 'deploy/local/redis-cluster.sh stop' EXIT INT TERM && \
	  $(BIN)/gpualloc serve --demo --redis-url "$$url"

test: $(STAMP) peers ## run the whole test suite (starts its own Redis, Slurm, Chromium, kube-apiserver and Kueue; installs or builds them when missing, see README)
	.ci/test-deps
	$(BIN)/pytest

chaos: $(STAMP) ## kill a Redis Cluster primary mid-race, longer than in `make test` (figures printed)
	GPUALLOC_CHAOS_SECONDS=$${GPUALLOC_CHAOS_SECONDS:-60} GPUALLOC_CHAOS_THREADS=$${GPUALLOC_CHAOS_THREADS:-32} \
	  $(BIN)/pytest -p no:cacheprovider -s -q --timeout 900 tests/e2e/test_store_chaos.py $(ARGS)

lint: $(STAMP) protos-check ## ruff, mypy, import contracts, proto lint, generated code up to date
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(PY) protos/lint.py

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

protos: $(STAMP) ## regenerate the committed Python code from protos/**/*.proto
	$(PY) protos/generate.py

protos-check: $(STAMP) ## fail when the committed generated code is stale
	$(PY) protos/generate.py --check

bench: $(STAMP) peers ## benchmarks (solver with upstream's allocator beside it, quality, inventory, service, store, tenants, ghz; ARGS=slurm: the Slurm bridge, root); ARGS=--json for JSON
	$(PY) -m loadtest.bench $(ARGS)

loadtest: $(STAMP) ## ~30 s load smoke on loopback (embedded + Redis): ghz-format reports + PNGs in loadtest/out/
	$(PY) -m loadtest.smoke $(ARGS)

fuzz: $(STAMP) ## the RPC fuzzer at 10,000 requests (the suite runs 300): no INTERNAL/UNKNOWN, no late answer
	GPUALLOC_FUZZ_EXAMPLES=$${GPUALLOC_FUZZ_EXAMPLES:-10000} $(BIN)/pytest -s -p no:cacheprovider tests/integration/test_rpc_fuzz.py

demo: $(STAMP) ## the Slurm bridge and the Kueue sidecar sharing one allocator on the example cluster
	$(PY) -m services.bridges.demo

peers: ## build (or reuse from ~/.cache/gpualloc/peers) the Go peers the tests run: kube-apiserver, etcd, Kueue, ghz, grpcurl -> .peers/
	tools/peers/build.sh

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
