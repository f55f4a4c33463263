# The two commands of the README quick start. Both set up first (idempotent, cached), each what it runs:
# `setup` what the demo needs, `setup-test` that plus the tools only the tests use (scripts/setup.sh).
.PHONY: setup setup-test demo test test-fast lint crds kind kind-install kind-kueue demo-kind e2e-kind kind-down release

setup:
	./scripts/setup.sh demo

setup-test:
	./scripts/setup.sh test

demo: setup
	.venv/bin/etj demo

# .venv/bin first on PATH: tests call etj, etj-train, kubectl, helm, hadolint and actionlint by name.
# Two pytest-xdist workers, each on a local cluster of its own (tests/conftest.py); a test file stays on one
# worker (--dist loadfile) so that its module-scoped beds start once. ETJ_TEST_WORKERS=0 runs it serially.
ETJ_TEST_WORKERS ?= 2
test: setup-test lint
	PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/python -m pytest tests -q --durations=20 \
	  $$([ "$(ETJ_TEST_WORKERS)" = 0 ] || echo "-n $(ETJ_TEST_WORKERS) --dist loadfile")

# The inner loop: lint and the pure decision tables (no control plane, no process worlds, no builds beyond
# the venv's). tests/fast_suite.txt lists what it runs and why; README's Development section has its time.
test-fast: setup-test lint
	PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/python -m pytest $$(grep -v '^\#' tests/fast_suite.txt) -q -m "not cluster and not slow" -p no:cacheprovider --durations=5

lint:
	.venv/bin/ruff check operator/src trainer-image/src contract/src testbed/src tests bench
	.venv/bin/mypy
	.venv/bin/lint-imports  # the architecture contracts in pyproject.toml [tool.importlinter]

crds:
	.venv/bin/etj crd generate

# A real kind cluster, offline, with the operator and CPU trainer images built from this checkout
# (scripts/kind.sh: docker, base images, Kubernetes from source, a kind node image, an image registry on the
# kind network; all cached under ~/.cache/etj/kind). docs/install-kind.md.
kind:
	./scripts/kind.sh up

# helm install of charts/etj into that cluster with the local operator image.
kind-install: kind
	./scripts/kind.sh install

# Kueue v0.17.0 on the kind cluster (its image built offline, its own chart) and the operator with
# kueue.enabled (docs/kueue.md, "Kueue on kind"). `setup-test` builds Kueue's binary.
kind-kueue: setup-test kind
	./scripts/kind.sh kueue

# The demo (`make demo`'s script, live table, timeline, accuracy against a fixed-size run) on kind.
demo-kind: setup-test kind-install
	./scripts/kind.sh demo

# The whole kind suite: tests/kind (smoke, node loss, store node loss, graceful delete, OOM and failed
# commands, the closed data plane) and tests/e2e in its installed mode. `make test` runs the smoke test
# only, and only where Docker is installed.
e2e-kind: setup-test kind-install
	./scripts/kind.sh e2e

# A release: the four images tagged VERSION and the chart naming them by digest, pushed to REGISTRY as an
# OCI artifact. `make release VERSION=x.y.z REGISTRY=host[:port]/namespace` (scripts/release.sh; the tag
# workflow .github/workflows/release.yaml does the same with provenance, SBOM and keyless signatures).
release: setup-test
	PATH="$(CURDIR)/.venv/bin:$$PATH" ./scripts/release.sh all

kind-down:
	./scripts/kind.sh down
