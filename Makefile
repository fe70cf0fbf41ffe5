# eni-operator developer entry points. `make help` lists them.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# The EC2 emulator used by the tests (moto's server mode), pinned.
MOTO_VERSION := 5.2.5
VENV := $(CURDIR)/.venv
MOTO_SERVER := $(VENV)/bin/moto_server
MOTO_STAMP := $(VENV)/.moto-$(MOTO_VERSION)

IMAGE ?= eni-operator:dev
ARGS ?=

# Tests that need the emulator find it here.
export ENI_OPERATOR_MOTO_SERVER := $(MOTO_SERVER)

.PHONY: help build test lint fmt crds image run e2e e2e-local bench venv

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 12

build: ## Build everything (debug)
	cargo build --workspace --locked

test: venv lint ## fmt check + clippy -D warnings + all tests (incl. the CRD drift check)
	cargo test --workspace --locked

lint: ## fmt check + clippy -D warnings
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

fmt: ## Format the code
	cargo fmt --all

crds: ## Regenerate manifests/00-crd-ciliumnodes.yaml from the Rust types
	cargo run --locked -q -p crd-gen

image: ## Build the container image $(IMAGE)
	docker build -t $(IMAGE) .

run: ## Run the operator against the current KUBECONFIG (extra flags: ARGS="...")
	cargo run --locked --release -p eni-operator --bin eni-operator -- $(ARGS)

e2e: ## End-to-end suite on a kind cluster (see e2e/README.md)
	@if [[ -f e2e/run-kind.sh ]]; then bash e2e/run-kind.sh $(ARGS); \
	else echo "e2e/run-kind.sh is not there yet (e2e issue)"; exit 1; fi

e2e-local: venv ## End-to-end suite against the current KUBECONFIG and EC2_ENDPOINT (see e2e/README.md)
	@if [[ -f e2e/run-local.sh ]]; then bash e2e/run-local.sh $(ARGS); \
	else echo "e2e/run-local.sh is not there yet (e2e issue)"; exit 1; fi

# Debug profile on purpose: the paused tokio clock needs tokio's test-util feature, which the
# debug test builds already compile; a release build would rebuild every dependency with it
# (~13 min on 2 cores) for a run that takes about a minute in debug. See docs/benchmarks.md.
# BENCH_SCENARIO=burst|churn|scale-down|shared-account runs one scenario.
BENCH_SCENARIO ?= all
bench: ## Scale benchmark; rewrites the results in docs/benchmarks.md (smoke run: ARGS=--quick)
	cargo run --locked --example bench -- --scenario $(BENCH_SCENARIO) --out docs/benchmarks.md --plot docs/burst.png --shared-plot docs/shared-account.png $(ARGS)

venv: $(MOTO_STAMP) ## Python venv with the pinned moto server (EC2 emulator)

$(MOTO_STAMP):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check 'moto[server]==$(MOTO_VERSION)'
	$(MOTO_SERVER) --help > /dev/null
	touch $@
