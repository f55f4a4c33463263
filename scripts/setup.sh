#!/usr/bin/env bash
# Set up what a command needs on a fresh machine, idempotently; each step is cached and says what it does.
#   scripts/setup.sh        (make setup, make demo): what the demo runs and nothing more:
#                           .venv/ with etj and its trainer (pinned torch/torchvision/DALI, matplotlib for
#                           the timeline), and the local control plane (etcd, apiserver, controller-manager,
#                           scheduler, kubectl, kwok) built from upstream Go modules into
#                           ~/.cache/etj/k8s-<version>-<hash>/, kubectl linked into .venv/bin.
#   scripts/setup.sh test   (make test): the above, plus what only the tests use: the dev tools (pytest,
#                           ruff, mypy, hypothesis, ...), helm, Kueue's controller, actionlint, versitygw and
#                           Debian's dataset-fashion-mnist.
# The control plane's compile is CPU-bound and pip's install is mostly download: a cold setup runs the two at
# once (the build needs only the system python3 and the test bed's stdlib-only toolchain module).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=${1:-demo}
case "$tier" in demo|test) ;; *) echo "usage: scripts/setup.sh [demo|test]" >&2; exit 2 ;; esac

say() { printf 'setup: %s\n' "$*" >&2; }

command -v python3 >/dev/null || { say "python3 (>= 3.11) is required"; exit 1; }
command -v go >/dev/null || { say "Go (>= 1.26) is required to build the local control plane"; exit 1; }

binaries=core; [ "$tier" = test ] && binaries=all
build_pid=""
if ! PYTHONPATH=testbed/src python3 -m etj_testbed.localcluster.toolchain check "$binaries"; then
  say "building the local control plane ($binaries) in the background while Python packages install"
  PYTHONPATH=testbed/src python3 -m etj_testbed.localcluster.toolchain build "$binaries" &
  build_pid=$!
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
# The stamp names the extras, so the test tier after a demo-only setup installs the dev tools.
extras='.[trainer,demo]'; [ "$tier" = test ] && extras='.[trainer,demo,dev]'
stamp=.venv/.etj-installed
want="$(cat pyproject.toml | sha256sum | cut -c1-16) $extras"
installed=$(cat "$stamp" 2>/dev/null || true)
# A test-tier venv serves the demo as it is.
[ "$tier" = demo ] && [ "$installed" = "${want%% *} .[trainer,demo,dev]" ] && want=$installed
if [ "$installed" != "$want" ]; then
  say "installing Python packages $extras (torch, DALI, kopf, ...; first time: a few GB, a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  # DALI moved from its CUDA 12 build to the CUDA 13 one (torch's); both install nvidia/dali, so the old
  # one must go first or the two overwrite each other's files.
  .venv/bin/python -m pip uninstall --quiet --yes nvidia-dali-cuda120 2>/dev/null || true
  .venv/bin/python -m pip install --progress-bar off -e "$extras" | grep -v '^Requirement already satisfied' || true
  .venv/bin/python -c 'import etj_operator, etj_trainer, etj_contract, etj_testbed' # fail here, not later, if the install broke
  echo "$want" > "$stamp"
fi

if [ -n "$build_pid" ]; then
  say "waiting for the control-plane build"
  wait "$build_pid" || { say "the control-plane build failed (its output is above)"; exit 1; }
fi
say "linking the local control plane's tools into .venv/bin"
if [ "$tier" = test ]; then .venv/bin/etj cluster build --all >/dev/null; else .venv/bin/etj cluster build >/dev/null; fi

if [ "$tier" = demo ]; then
  say "ready for the demo: export PATH=$PWD/.venv/bin:\$PATH"
  exit 0
fi

# What only the tests use, from here on.
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

say "ready for the tests: export PATH=$PWD/.venv/bin:\$PATH"
