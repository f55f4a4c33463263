# The two commands of the README quick start. Both set everything up first (idempotent, cached).
.PHONY: setup demo test lint crds

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/etj demo

test: setup lint
	.venv/bin/python -m pytest tests -q

lint:
	.venv/bin/ruff check operator/src trainer-image/src tests bench
	.venv/bin/mypy

crds:
	.venv/bin/etj crd generate
