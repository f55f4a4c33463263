#!/usr/bin/env bash
# Set up everything etj needs on a fresh machine, idempotently (Debian/Ubuntu: also the dataset-fashion-mnist package):
#   .venv/ with etj (operator + trainer, pinned torch/torchvision/DALI), then the local control plane
#   built from upstream Go modules into ~/.cache/etj/k8s-<version>-<hash>/ and kubectl + helm linked
#   into .venv/bin, so `export PATH=$PWD/.venv/bin:$PATH` gives you etj, kubectl and helm.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*" >&2; }

command -v python3 >/dev/null || { say "python3 (>= 3.11) is required"; exit 1; }
command -v go >/dev/null || { say "Go (>= 1.26) is required to build the local control plane"; exit 1; }

if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.etj-installed
want=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing Python packages (torch, DALI, kopf, ...; first time: a few GB, a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  # DALI moved from its CUDA 12 build to the CUDA 13 one (torch's); both install nvidia/dali, so the old
  # one must go first or the two overwrite each other's files.
  .venv/bin/python -m pip uninstall --quiet --yes nvidia-dali-cuda120 2>/dev/null || true
  .venv/bin/python -m pip install --progress-bar off -e '.[trainer,dev]' | grep -v '^Requirement already satisfied' || true
  .venv/bin/python -c 'import etj_operator, etj_trainer, etj_contract, etj_testbed' # fail here, not later, if the install broke
  echo "$want" > "$stamp"
fi

# Fashion-MNIST (the recipe benchmark and its smoke test) ships as a Debian package: the original idx files.
if ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then
  if command -v apt-get >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    say "installing dataset-fashion-mnist (Debian package, ~30 MB)"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    say "no apt-get: the Fashion-MNIST tests will be skipped (install Debian's dataset-fashion-mnist)"
  fi
fi

say "building or reusing the local control plane (cached by version)"
.venv/bin/etj cluster build >/dev/null
# Kueue's controller (tests/kueue, docs/kueue.md), built from its Go module like the control plane and cached
# by version; a cold build compiles ~1,400 packages (docs/kueue.md has the times). ETJ_KUEUE=0 skips it and
# the Kueue tests.
if [ "${ETJ_KUEUE:-1}" != 0 ]; then
  say "building or reusing Kueue's controller (cached by version)"
  .venv/bin/python -m etj_testbed.cli kueue build >/dev/null
fi
# actionlint lints .github/workflows in the tests; built from its Go module like the control plane.
actionlint_version=v1.7.7
tools="${ETJ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/etj}/tools-actionlint-$actionlint_version"
if [ ! -x "$tools/actionlint" ]; then
  say "building actionlint $actionlint_version"
  GOBIN="$tools" GOFLAGS=-mod=mod go install "github.com/rhysd/actionlint/cmd/actionlint@$actionlint_version"
fi
ln -sf "$tools/actionlint" .venv/bin/actionlint
# versitygw: a real S3-compatible server (posix backend) for the object-store checkpoint tests
# (tests/trainer/s3server.py finds it here); built from its Go module like the control plane.
versitygw_version=v1.8.0
s3tools="${ETJ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/etj}/tools-versitygw-$versitygw_version"
if [ ! -x "$s3tools/versitygw" ]; then
  say "building versitygw $versitygw_version (S3 server for tests)"
  GOBIN="$s3tools" GOFLAGS=-mod=mod go install "github.com/versity/versitygw/cmd/versitygw@$versitygw_version"
fi

say "ready: export PATH=$PWD/.venv/bin:\$PATH"
