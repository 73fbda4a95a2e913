# nmo-rs: every entry point a developer, CI or a demo needs.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help
CRD_FILE := manifests/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml
DRAIN_RULE_CRD_FILE := manifests/crd/nodemaintenance.medik8s.io_nodedrainrules.yaml

.PHONY: help setup check-setup build test unit-test integration-test lint fmt crds cluster-up cluster-down companions real-node real-node-test deploy-local undeploy-local demo demo-real-node bench bench-scale test-arm64 images bundle check-bundle release

help: ## Show the targets and what they do
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: ## Install what the other targets need (apt packages, the amd64 and arm64 musl targets, clippy/rustfmt) when root; else name them and the one command that installs them
	@bash tests/setup.sh

check-setup: ## Report each requirement (installs nothing) and check README's list matches tests/setup.sh
	bash tests/setup.sh --check
	bash tests/setup.sh --check-readme README.md

build: setup ## Build every crate (debug)
	cargo build --workspace --all-targets

test: setup ## Run unit tests, then start the local control plane and run the integration tests
	bash tests/run-tests.sh

unit-test: setup ## Unit tests only (no cluster needed)
	cargo test --workspace --lib --bins

test-arm64: setup cluster-up ## The linux/arm64 images' webhook and controller (under qemu-aarch64) against the local plane: the arm64 stage of make test (builds the images when missing)
	bash tests/arm64.sh

integration-test: setup cluster-up ## Integration tests against the local control plane
	bash tests/run-tests.sh --integration-only

lint: setup ## cargo fmt --check, clippy with -D warnings, cargo machete (no unused dependency)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo machete

fmt: ## Format the code
	cargo fmt --all

crds: ## Regenerate the CRDs in manifests/crd/ from the Rust types
	cargo run -q -p nmo-shared --bin crdgen nodemaintenances > $(CRD_FILE)
	cargo run -q -p nmo-shared --bin crdgen nodedrainrules > $(DRAIN_RULE_CRD_FILE)
	@echo "wrote $(CRD_FILE) and $(DRAIN_RULE_CRD_FILE)"

cluster-up: setup ## Build (cached) and start the local control plane; kubeconfig in .cluster/kubeconfig
	bash tests/cluster/up.sh

companions: setup ## cert-manager, kube-state-metrics and Prometheus from their Go modules (cached), started against the local plane; Prometheus' URL in .cluster/prometheus.url
	bash tests/companions/up.sh

cluster-down: ## Stop every process of the local control plane (the real node and the companions too); checks the real node left nothing running, mounted or in a cgroup
	bash tests/cluster/down.sh

real-node: setup cluster-up ## One real node, real-1, joined to the local plane: containerd, the kubelet and kube-proxy (built from Go modules, cached) in namespaces of its own; our images imported (root)
	bash tests/node/up.sh

real-node-test: setup cluster-up ## The real-node stage of make test: manifests/base rolled out on real-1 by its kubelet, a maintenance through the webhook pod, two controllers, memory beside the limits, then everything removed
	bash tests/node/stage.sh

deploy-local: setup ## Build the images and run webhook + controller from them, with manifests/base's arguments, against the local cluster
	bash tests/deploy/deploy-local.sh

undeploy-local: ## Stop the locally running webhook and controller
	bash tests/deploy/deploy-local.sh --stop

demo: setup ## Local cluster + both services + a guided node maintenance
	bash tests/deploy/demo.sh

demo-real-node: setup ## The same guided maintenance, the services run as pods of manifests/base on the real node real-1 by its kubelet (root)
	DEMO_ON=real-node bash tests/deploy/demo.sh

bench: setup ## Performance figures: webhook reviews/s, latency and memory (allowed and denied creates), controller drain time and resume after a PDB is deleted, log writers, then bench-scale
	bash tests/bench.sh
	@echo "== log writers: ours against tracing-appender (shared/examples/log_writers.rs)"
	cargo run --release -q -p nmo-shared --example log_writers -- 200000 3
	bash tests/bench-scale.sh

bench-scale: setup ## Both services at 1,000 nodes and 30,000 pods on a plane of their own: memory, reviews/s, 100 maintenances at once, churn soak, then the fleet gates: 200 maintenances over 10 zones (1 per zone, max 10% unavailable) against the plane's floor, and a 30-min soak with the controller SIGKILLed and the API server restarted (fresh: 60-85 min on 2 cores; BENCH_SCALE_KEEP=1 keeps the plane for the next run)
	bash tests/bench-scale.sh

images: setup ## OCI image archives of both services in target/images/, each an image index for linux/amd64 and linux/arm64 (static musl binaries, FROM scratch, reproducible, no container daemon; the arm64 cross build adds about 5 min cold on 2 cores, docs/performance.md)
	bash tests/release/images.sh

bundle: setup ## Regenerate the OLM bundle in bundle/ from manifests/overlays/openshift (commit the result)
	bash tests/release/bundle.sh

check-bundle: setup ## Bundle drift check and Operator Framework validation (operator-verify, built and cached)
	bash tests/release/check-bundle.sh

release: setup ## Release VERSION=x.y.z into dist/: image archives, OLM bundle, install YAMLs pinned by digest, SHA256SUMS
	bash tests/release/release.sh "$(VERSION)"
