# The two commands of the README quick start. Both set everything up first (idempotent, cached).
.PHONY: setup demo test lint crds kind kind-install kind-demo kind-down

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/etj demo

# .venv/bin first on PATH: tests call etj, etj-train, kubectl, helm, hadolint and actionlint by name.
test: setup lint
	PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/python -m pytest tests -q --durations=20

lint:
	.venv/bin/ruff check operator/src trainer-image/src contract/src testbed/src tests bench
	.venv/bin/mypy
	.venv/bin/lint-imports  # the architecture contracts in pyproject.toml [tool.importlinter]

crds:
	.venv/bin/etj crd generate

# A real kind cluster, offline, with the operator and CPU trainer images built from this checkout
# (scripts/kind.sh: docker, base images, Kubernetes from source, a kind node image; all cached under
# ~/.cache/etj/kind). Not part of `make test`.
kind:
	./scripts/kind.sh up

# helm install of charts/etj into that cluster with the local operator image; then the CPU demo job on it.
kind-install:
	./scripts/kind.sh install

kind-demo:
	./scripts/kind.sh demo

kind-down:
	./scripts/kind.sh down
