# The two commands of the README's quick start are `make run` and `make test`; the rest serve them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall when the dependency list changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=
# The suite runs in TEST_WORKERS processes (pytest-xdist), a file's tests in one of them; each process that
# needs one starts its own local control plane and nats-server. Its tests mostly wait on processes and
# timers, so more workers than cores pay: 3 on 2 cores. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: help venv binaries run test test-unit test-integration test-e2e test-no-cluster test-cluster test-real faults lint lint-code lint-chart compat fmt crds cluster-up cluster-down cluster-shell

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP) ## create .venv and install the project with test extras

binaries: ## build (once, cached by version) kube-apiserver, etcd, kwok, helm, kubeconform, ...
	@bash hack/build-binaries.sh >/dev/null

run: venv ## serve examples/disagg.yaml on http://127.0.0.1:8000 (mocker when there is no GPU)
	$(BIN)/dynamo-run examples/disagg.yaml

test: venv ## the whole suite: unit, integration (real apiserver, kwok, nats), e2e, faults, then the real-node tier (hack/test.sh)
	@XDIST="$(XDIST)" bash hack/test.sh $(PYTEST_ARGS)

test-no-cluster: venv ## every test that needs no control-plane binary (make test runs them while those build)
	$(BIN)/python -m pytest -q $(XDIST) -m "not control_plane and not real_node" $(PYTEST_ARGS)

test-cluster: venv binaries ## the tests that need the control-plane binaries (local cluster, helm, kubeconform)
	$(BIN)/python -m pytest -q $(XDIST) -m "control_plane and not real_node" $(PYTEST_ARGS)

test-unit: venv ## pure tests only, no servers
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

test-integration: venv binaries ## tests against the real local control plane and nats-server
	$(BIN)/python -m pytest -q $(XDIST) tests/integration $(PYTEST_ARGS)

test-e2e: venv ## dynamo-run driven by the official openai client
	$(BIN)/python -m pytest -q $(XDIST) tests/e2e $(PYTEST_ARGS)

faults: venv binaries ## the fault suite: one row per fault (what was done, bound, time to a clear answer, lost), then the faults on real pods
	FAULTS_TABLE=.faults/table.json FAULTS_MARKDOWN=docs/faults.md $(BIN)/python -m pytest -q $(XDIST) tests/faults $(PYTEST_ARGS)
	FAULTS_TABLE=.faults/real-table.json FAULTS_MARKDOWN=$(CURDIR)/docs/faults.md $(BIN)/python -m tests.support.realnode run \
		--dir .cluster-real-test -- $(BIN)/python -m pytest -q -p no:cacheprovider tests/real/test_faults_pods.py $(PYTEST_ARGS)

lint: lint-code lint-chart ## ruff, formatting, types (mypy), import contracts, CRD drift, helm lint + kubeconform, hadolint

lint-code: venv ## ruff, formatting, types (mypy), import contracts and cycles, CRD drift, complexity, module size, Markdown links
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python hack/check-import-cycles.py
	$(BIN)/python -m dynamo_api.crdgen --check
	$(BIN)/python hack/check-complexity.py
	$(BIN)/python hack/check-size.py
	$(BIN)/python hack/check-links.py

lint-chart: venv binaries ## helm lint + kubeconform of the chart, hadolint of the Dockerfiles
	bash hack/lint-chart.sh

compat: venv ## check our use of SGLang against the oldest and newest release of the window (no torch)
	bash hack/sglang-compat.sh

fmt: venv ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

crds: venv ## regenerate the CRD YAML from the pydantic models
	$(BIN)/python -m dynamo_api.crdgen

# make cluster-up REAL=1: the real-node cluster (containerd, kubelet, kube-proxy, CoreDNS in namespaces of
# its own; tests/support/realnode.py), with the images built here and the operator installed by Helm.
REAL ?=
cluster-up: venv binaries ## start the local control plane in .cluster/ (kwok nodes; REAL=1: a real node, the operator helm-installed)
	@if [ -n "$(REAL)" ]; then $(BIN)/python -m tests.support.realnode up --helm; \
	else $(BIN)/python -m tests.support.cluster up; fi

cluster-shell: ## a shell inside the real-node cluster (kubectl, helm, KUBECONFIG); runs standard input when it is not a terminal
	@$(BIN)/python -m tests.support.realnode shell

cluster-down: ## stop the local cluster started by cluster-up (either kind)
	@$(BIN)/python -m tests.support.realnode down
	@$(BIN)/python -m tests.support.cluster down

test-real: venv binaries ## the real-node tier alone: helm install, the examples as real pods (builds the images when missing)
	$(BIN)/python -m tests.support.realnode run --dir .cluster-real-test -- $(BIN)/python -m pytest -q -p no:cacheprovider tests/real $(PYTEST_ARGS)

image-operator: venv ## build the operator image with buildah (root, no registry) and run it
	bash hack/build-operator-image.sh

image-runtime: ## build the CPU runtime image (mocker, no CUDA) with buildah and serve a disagg graph in it
	FLAVOUR=cpu bash hack/build-runtime-image.sh

image-runtime-cuda: ## build the CUDA runtime image (SGLang, torch, NIXL as images/gpu-lock.txt pins them; several GB; not in CI)
	FLAVOUR=cuda bash hack/build-runtime-image.sh

# make soak SOAK_MINUTES=30: the soak of docs/soak.md (not in CI; tests/e2e/test_soak.py runs 2 minutes of it).
SOAK_MINUTES ?= 30
SOAK_ARGS ?=
.PHONY: soak
soak: venv ## the soak: disagg graph on the mocker, mixed traffic, a fault every 30-60 s, one table (SOAK_MINUTES=30)
	$(BIN)/python -m tests.soak --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

.PHONY: bench bench-peers bench-trace image-operator image-runtime image-runtime-cuda
bench: venv binaries ## benchmark scenarios on the mocker and the local control plane (< 10 min); JSON in .bench/
	$(BIN)/python -m tests.bench.scenarios --json-out .bench/scenarios.json

# Extra flags for our frontend in the comparison (none: its defaults, one serving process).
PEERS_FRONTEND_ARGS ?=
bench-peers: venv ## our frontend + mocker vs NVIDIA Dynamo 1.6.1's (installed once into a cached venv), same workloads
	$(BIN)/python -m tests.bench.peers --dynamo-venv "$$(bash hack/install-dynamo-peer.sh)" \
		--frontend-args "$(PEERS_FRONTEND_ARGS)" $(PEERS_ARGS)

# The Mooncake FAST'25 conversation trace (github.com/kvcache-ai/Mooncake, FAST25-release/traces/) and flags
# for the replay (python -m tests.bench.trace_replay --help), e.g. TRACE_ARGS="--count 100 --speedup 8".
TRACE ?= /work/shared/traces/mooncake-conversation.jsonl
TRACE_ARGS ?=
bench-trace: venv ## a Mooncake trace window replayed open loop through ours and NVIDIA Dynamo 1.6.1 (mocker, kv routing); JSON in .bench/
	@venv=$$(bash hack/install-dynamo-peer.sh) || { echo "Dynamo 1.6.1 did not install: ours only" >&2; venv=; }; \
	$(BIN)/python -m tests.bench.trace_replay --trace "$(TRACE)" $${venv:+--dynamo-venv "$$venv"} \
		--json-out .bench/trace.json $(TRACE_ARGS)
