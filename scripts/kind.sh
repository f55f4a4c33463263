#!/usr/bin/env bash
# A real kind cluster running etj's own images, offline: `make kind` (or scripts/kind.sh [up|down|images]).
#
# Idempotent, from a bare Debian machine with root. Every step is skipped when its result is cached:
#   1. apt-get install docker.io mmdebstrap (if missing); start dockerd (if not running), with the OCI runtime
#      wrapper scripts/kind/runc-wrapper as default runtime only where `docker run --privileged` fails;
#   2. a Debian bookworm base image (mmdebstrap --variant=minbase + docker import: no registry is needed)
#      and a Python base on it;
#   3. the operator image (Dockerfile) and the CPU trainer image (trainer-image/Dockerfile.cpu), built from
#      the repository's Dockerfiles with only PYTHON_IMAGE changed (where the PyTorch index is unreachable:
#      Dockerfile.cpu-debian, torch from Debian forky, else TORCH_INDEX=PyPI); the small store image
#      (trainer-image/Dockerfile.store) on a Debian forky base made the same way, skipped (stores then run the trainer image) when Debian's torch is not the trainer's;
#   4. kind (go install sigs.k8s.io/kind), Kubernetes (kubelet, kubeadm, kubectl, control plane, kube-proxy,
#      etcd) from the control plane's pinned Go module, CoreDNS, kube-network-policies, crictl and
#      local-path-provisioner from theirs, their images, and a kind node image assembled from them;
#   5. `kind create cluster`: a control plane, one on-demand and two spot workers (labels as in
#      .github/workflows/e2e-kind.yaml), then `kind load docker-image` of the operator and trainer images.
# The last line of stdout is the kubeconfig path. Progress goes to stderr. Cache: ${ETJ_CACHE_DIR:-~/.cache/etj}/kind.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIND_DIR="$ROOT/scripts/kind"
CACHE=${ETJ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/etj}
KCACHE="$CACHE/kind"
KIND_VERSION=${ETJ_KIND_VERSION:-v0.31.0}
KUBERNETES_VERSION=v1.36.3            # the control plane's version (testbed/.../toolchain/go.mod pins v0.36.3)
HELM_VERSION=v3.21.4                  # helm.sh/helm/v3 in the same go.mod
DEBIAN_SUITE=bookworm
COREDNS_VERSION=v1.14.3               # kubeadm v1.36 names v1.14.2, which the package proxy here does not serve
KNP_VERSION=v0.8.0                    # sigs.k8s.io/kube-network-policies
CRICTL_VERSION=v1.34.0
LPP_VERSION=v0.0.30                   # github.com/rancher/local-path-provisioner
ETCD_IMAGE_TAG=3.6.8-0                # kubeadm v1.36's DefaultEtcdVersion; the binary is the go.mod's etcd v3.6.8
PAUSE_VERSION=3.10.2                  # kubeadm v1.36's PauseVersion
CLUSTER=${ETJ_KIND_CLUSTER:-etj}
OPERATOR_IMAGE=${ETJ_OPERATOR_IMAGE:-ghcr.io/etj-dev/etj-operator:dev}
TRAINER_IMAGE=${ETJ_TRAINER_IMAGE:-ghcr.io/etj-dev/etj-trainer:dev-cpu}
STORE_IMAGE=${ETJ_STORE_IMAGE:-ghcr.io/etj-dev/etj-store:dev}
SHARED_DIR=${ETJ_E2E_SHARED_DIR:-/var/tmp/etj-e2e}
TOOLCHAIN="$ROOT/testbed/src/etj_testbed/localcluster/toolchain"
export DOCKER_BUILDKIT=0   # the legacy builder: BuildKit's `# syntax=` line would pull docker/dockerfile from Docker Hub

START=$(date +%s)
step() { printf '[kind %4ss] %s\n' "$(($(date +%s) - START))" "$*" >&2; }
die() { printf 'kind.sh: error: %s\n' "$*" >&2; exit 1; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
timed() {  # timed LABEL CMD...: run CMD, print its duration
  local t0=$SECONDS label=$1
  shift
  "$@"
  step "$label ... done in $((SECONDS - t0)) s"
}
# Content hash of files (the cache keys), 12 hex digits.
hash_of() { cat "$@" | sha256sum | cut -c1-12; }

mkdir -p "$KCACHE"
# One build at a time (install/demo only read what `up` made).
lock() { exec 9>"$KCACHE/.lock" && flock 9; }

# ---------------------------------------------------------------------------------------------------- 1
ensure_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  [ -n "${ETJ_PYTHON_IMAGE:-}" ] || command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  command -v go >/dev/null || die "Go is needed (the README's prerequisite: Go >= 1.26)"
  if ((${#missing[@]})); then
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}: run as root (apt-get install ${missing[*]})"
    step "installing ${missing[*]} with apt"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

DOCKERD_PID="$KCACHE/dockerd.pid"
start_dockerd() {  # start_dockerd [--with-wrapper]
  local args=(--data-root "${ETJ_DOCKER_DATA_ROOT:-/var/lib/docker}" --pidfile "$DOCKERD_PID")
  if [ "${1:-}" = --with-wrapper ]; then
    install -D -m 0755 "$KIND_DIR/runc-wrapper" "$KCACHE/bin/etj-runc-wrapper"
    args+=(--add-runtime "etj-runc=$KCACHE/bin/etj-runc-wrapper" --default-runtime etj-runc)
  fi
  step "starting dockerd ${args[*]} (log: $KCACHE/dockerd.log)"
  # 9>&-: the daemon must not inherit this script's lock (it would hold it for as long as it runs).
  nohup dockerd "${args[@]}" >>"$KCACHE/dockerd.log" 2>&1 9>&- &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && return 0; sleep 1; done
  die "dockerd did not start; see $KCACHE/dockerd.log"
}
stop_our_dockerd() {
  local pid
  pid=$(cat "$DOCKERD_PID" 2>/dev/null) || die "dockerd is running but was not started by this script; privileged containers fail under it: restart it with --add-runtime etj-runc=$KIND_DIR/runc-wrapper --default-runtime etj-runc"
  step "stopping dockerd (pid $pid) to restart it with the runtime wrapper"
  kill "$pid"
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
  die "dockerd (pid $pid) did not stop"
}
ensure_dockerd() {
  if ! docker info >/dev/null 2>&1; then
    # A dockerd started earlier with the wrapper gets it again: the probe below would only find that out later.
    if [ -f "$KCACHE/needs-runtime-wrapper" ]; then start_dockerd --with-wrapper; else start_dockerd; fi
  fi
}
ensure_privileged() {  # needs the base image; called after it exists
  if docker run --rm --privileged "$BASE_IMAGE" true >/dev/null 2>"$KCACHE/privileged-probe.err"; then
    step "privileged containers run (runtime: $(docker info --format '{{.DefaultRuntime}}'))"
    return 0
  fi
  step "docker run --privileged fails here: $(tr '\n' ' ' <"$KCACHE/privileged-probe.err" | cut -c1-200)"
  [ "$(docker info --format '{{.DefaultRuntime}}')" != etj-runc ] || die "privileged containers fail even with the runtime wrapper"
  stop_our_dockerd
  touch "$KCACHE/needs-runtime-wrapper"
  start_dockerd --with-wrapper
  docker run --rm --privileged "$BASE_IMAGE" true || die "privileged containers still fail with the runtime wrapper"
  step "privileged containers run with the runtime wrapper (scripts/kind/runc-wrapper)"
}

# ---------------------------------------------------------------------------------------------------- 2
BASE_IMAGE=${ETJ_BASE_IMAGE:-etj.local/debian:$DEBIAN_SUITE-minbase}
PYTHON_IMAGE=${ETJ_PYTHON_IMAGE:-etj.local/python:3.11-$DEBIAN_SUITE}
ensure_base_images() {
  if [ -n "${ETJ_PYTHON_IMAGE:-}" ]; then
    # A registry is reachable (GitHub Actions): the Dockerfiles' upstream base, pulled by docker build.
    BASE_IMAGE=$ETJ_PYTHON_IMAGE
    ensure_privileged
    return 0
  fi
  debian_base "$BASE_IMAGE" "$DEBIAN_SUITE" || die "the $DEBIAN_SUITE base image could not be made"
  ensure_privileged
  python_base_image "$PYTHON_IMAGE" "$BASE_IMAGE"
}
# debian_base TAG SUITE [mmdebstrap options...]: a Debian minbase image made offline (mmdebstrap from Debian's
# packages, then docker import: no registry), its tar cached in $KCACHE. --format=tar always: mmdebstrap
# picks the format from the file name otherwise, "$tar.tmp" is no tar name, and a cold machine got a
# directory that docker import refused (issue 38). tests/kind/test_cold_cache.py runs this cold.
debian_base() {
  local tag=$1 suite=$2
  shift 2
  have_image "$tag" && return 0
  local tar="$KCACHE/debian-$suite-minbase.tar"
  if [ ! -s "$tar" ]; then
    step "mmdebstrap --variant=minbase $suite (Debian packages only; no container registry)"
    rm -rf "$tar.tmp"
    timed "mmdebstrap $suite" nice -n 10 mmdebstrap --quiet --variant=minbase --format=tar "$@" "$suite" "$tar.tmp" \
      || return 1
    mv "$tar.tmp" "$tar"
  fi
  timed "docker import $tag" docker import "$tar" "$tag" >/dev/null
}
# python_base_image TAG BASE: Debian's Python on BASE; the build context carries the host's extra CA
# certificates (a TLS-inspecting proxy), so that pip in the images built on it trusts what the host trusts.
python_base_image() {
  local ctx="$KCACHE/ctx/python"
  rm -rf "$ctx" && mkdir -p "$ctx/extra-ca"
  cp "$KIND_DIR/images/python/Dockerfile" "$ctx/"
  cp /usr/local/share/ca-certificates/*.crt "$ctx/extra-ca/" 2>/dev/null || true
  build_image "$1" "$ctx" --build-arg "BASE_IMAGE=$2"
}

# build_image TAG CONTEXT [docker build args...]: docker's layer cache makes a warm build a no-op.
build_image() {
  local tag=$1 ctx=$2 t0=$SECONDS log
  shift 2
  log="$KCACHE/logs/build-$(echo "$tag" | tr '/:' '__').log"
  mkdir -p "$KCACHE/logs"
  step "docker build $tag (log: $log)"
  local version=()
  case " $OPERATOR_IMAGE $TRAINER_IMAGE $STORE_IMAGE $CUDA_TRAINER_IMAGE " in
    # A release's images carry their version (scripts/release.sh): the label also gives them an image ID of
    # their own. A kubelet that pulled a release (its pull records are per image ID, KEP-2535) otherwise
    # refused the same ID preloaded under the dev name with pull policy Never ("not present").
    *" $tag "*) [ -z "${ETJ_IMAGE_VERSION:-}" ] || version=(--label "org.opencontainers.image.version=$ETJ_IMAGE_VERSION") ;;
  esac
  if ! nice -n 10 docker build -t "$tag" "${version[@]}" "$@" "$ctx" >"$log" 2>&1; then
    tail -30 "$log" >&2
    die "docker build $tag failed (log: $log)"
  fi
  step "docker build $tag ... $((SECONDS - t0)) s, $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
}

# ---------------------------------------------------------------------------------------------------- 3
# TORCH_INDEX for the trainer images: download.pytorch.org (the Dockerfiles' default) may be unreachable where
# only PyPI is; PyPI's torch is the CUDA build, which runs on CPU too (a larger image). ETJ_TORCH_INDEX overrides.
TORCH_INDEX_ARGS=()
torch_index() {
  if [ -n "${ETJ_TORCH_INDEX:-}" ]; then
    TORCH_INDEX_ARGS=(--build-arg "TORCH_INDEX=$ETJ_TORCH_INDEX")
  elif ! torch_index_reachable; then
    step "download.pytorch.org does not resolve here: the trainer images take torch from PyPI (CUDA build, runs on CPU)"
    TORCH_INDEX_ARGS=(--build-arg "TORCH_INDEX=https://pypi.org/simple")
  fi
}
torch_index_reachable() { getent hosts download.pytorch.org >/dev/null 2>&1; }
ensure_etj_images() {
  build_image "$OPERATOR_IMAGE" "$ROOT" --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE"
  ensure_cpu_trainer_image
  ensure_store_image
}
# The CPU trainer image. With the CPU wheel index out of reach (ETJ_TORCH_INDEX unset), Debian's CPU torch
# (trainer-image/Dockerfile.cpu-debian, ~2 GB) rather than PyPI's CUDA torch (Dockerfile.cpu, ~7 GB): the image
# is unpacked in every worker node, and three copies of CUDA libraries no kind node can use once filled a CI
# machine's disk. When Debian's torch is not the pin, Dockerfile.cpu from PyPI as before.
ensure_cpu_trainer_image() {
  if [ -z "${ETJ_TORCH_INDEX:-}" ] && ! torch_index_reachable; then
    # A subshell: build_image dies on failure, which here must only fall back.
    if (ensure_python_forky && build_image "$TRAINER_IMAGE" "$ROOT" -f "$ROOT/trainer-image/Dockerfile.cpu-debian" \
          --build-arg "DEBIAN_IMAGE=$PYTHON_FORKY_IMAGE"); then
      return 0
    fi
    step "the CPU trainer image on Debian's torch was NOT built (see above): torch from PyPI instead"
  fi
  torch_index
  build_image "$TRAINER_IMAGE" "$ROOT" -f "$ROOT/trainer-image/Dockerfile.cpu" \
    --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" "${TORCH_INDEX_ARGS[@]}"
}
# The store image (trainer-image/Dockerfile.store): Debian testing's python3-torch on a forky base, made like
# the bookworm one (offline: mmdebstrap + docker import). Never fatal: when Debian's torch is not the
# trainer's pin (the suite moves) or forky cannot be fetched, the image is not built, nothing points at it,
# and the jobs' stores run the trainer image as before.
STORE_SUITE=forky
STORE_BASE_IMAGE=etj.local/debian:$STORE_SUITE-minbase
ensure_store_base() {
  [ -n "${ETJ_PYTHON_IMAGE:-}" ] && return 0   # a registry is reachable: the Dockerfile's debian:forky-slim
  # A testing suite's Release carries Valid-Until; a mirror snapshot older than it would be refused. The
  # option stays in the base (/etc/apt/apt.conf.d/99mmdebstrap) for the image's own apt-get.
  debian_base "$STORE_BASE_IMAGE" "$STORE_SUITE" --aptopt='Acquire::Check-Valid-Until "false"'
}
# Python on the forky base, with the host's extra CA certificates like the bookworm Python base: pip runs in
# Dockerfile.cpu-debian's build.
PYTHON_FORKY_IMAGE=etj.local/python:3-$STORE_SUITE
ensure_python_forky() {
  ensure_store_base || return 1
  python_base_image "$PYTHON_FORKY_IMAGE" "$STORE_BASE_IMAGE"
}
ensure_store_image() {
  local base=()
  [ -n "${ETJ_PYTHON_IMAGE:-}" ] || base=(--build-arg "DEBIAN_IMAGE=$STORE_BASE_IMAGE")
  # A subshell: build_image dies on failure, which here must only skip the store image.
  if (ensure_store_base && build_image "$STORE_IMAGE" "$ROOT" -f "$ROOT/trainer-image/Dockerfile.store" "${base[@]}"); then
    return 0
  fi
  docker image rm "$STORE_IMAGE" >/dev/null 2>&1 || true   # an older build must not be loaded instead
  step "store image NOT built (see above; a torch version mismatch says so): the jobs' stores run the trainer image $TRAINER_IMAGE"
}

# The CUDA trainer image (trainer-image/Dockerfile), for GPU clusters; kind has no GPU, so `up` does not build
# it. Offline, its nvidia/cuda base is replaced by the Python base: torch's wheels carry their CUDA libraries,
# and only the driver comes from the host.
CUDA_TRAINER_IMAGE=${ETJ_CUDA_TRAINER_IMAGE:-ghcr.io/etj-dev/etj-trainer:dev}
ensure_cuda_trainer_image() {
  local base=()
  [ -n "${ETJ_PYTHON_IMAGE:-}" ] || base=(--build-arg "CUDA_IMAGE=$PYTHON_IMAGE")
  torch_index
  build_image "$CUDA_TRAINER_IMAGE" "$ROOT" -f "$ROOT/trainer-image/Dockerfile" "${base[@]}" "${TORCH_INDEX_ARGS[@]}"
}

# ---------------------------------------------------------------------------------------------------- 4
KIND="$KCACHE/tools/kind-$KIND_VERSION/kind"
ensure_kind() {
  if [ ! -x "$KIND" ]; then
    step "go install sigs.k8s.io/kind@$KIND_VERSION"
    timed "kind" env GOBIN="$(dirname "$KIND")" CGO_ENABLED=0 nice -n 10 go install "sigs.k8s.io/kind@$KIND_VERSION"
  fi
}

k8s_ldflags() {
  local major minor flags="-s -w" pkg
  major=$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f1)
  minor=$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f2)
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=2026-01-01T00:00:00Z"
  done
  echo "$flags -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
}
K8S_CMDS=(kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
ensure_k8s_binaries() {
  K8S_BIN="$KCACHE/k8s-$KUBERNETES_VERSION-$(hash_of "$TOOLCHAIN/go.mod" "$TOOLCHAIN/go.sum" <(k8s_ldflags))/bin"
  [ -x "$K8S_BIN/etcd" ] && [ -x "$K8S_BIN/helm" ] && return 0
  local work="$KCACHE/k8s-build" pkgs=()
  rm -rf "$work" && mkdir -p "$work/bin"
  cp "$TOOLCHAIN/go.mod" "$TOOLCHAIN/go.sum" "$work/"
  for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  step "go build ${K8S_CMDS[*]} etcd helm from the control plane's pinned module (Kubernetes $KUBERNETES_VERSION; ~10-20 min cold on 2 cores)"
  (cd "$work" && timed "kubernetes binaries" env GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 nice -n 10 \
    go build -trimpath -ldflags="$(k8s_ldflags)" -o "$work/bin/" "${pkgs[@]}" go.etcd.io/etcd/server/v3 helm.sh/helm/v3/cmd/helm)
  mv "$work/bin/server" "$work/bin/etcd" 2>/dev/null || mv "$work/bin/v3" "$work/bin/etcd"
  mkdir -p "$(dirname "$K8S_BIN")" && rm -rf "$K8S_BIN" && mv "$work/bin" "$K8S_BIN" && rm -rf "$work"
}

ensure_ext_binaries() {
  EXT_BIN="$KCACHE/ext-$(echo "$COREDNS_VERSION $KNP_VERSION $CRICTL_VERSION $LPP_VERSION" | sha256sum | cut -c1-12)/bin"
  mkdir -p "$EXT_BIN"
  local spec bin mod
  for spec in "coredns github.com/coredns/coredns@$COREDNS_VERSION" \
              "netpol sigs.k8s.io/kube-network-policies/cmd@$KNP_VERSION" \
              "crictl sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" \
              "local-path-provisioner github.com/rancher/local-path-provisioner@$LPP_VERSION"; do
    bin=${spec%% *} mod=${spec#* }
    [ -x "$EXT_BIN/$bin" ] && continue
    step "go install $mod"
    rm -rf "$EXT_BIN/.tmp" && mkdir -p "$EXT_BIN/.tmp"
    timed "$bin" env GOBIN="$EXT_BIN/.tmp" CGO_ENABLED=0 GOFLAGS="-trimpath" nice -n 10 go install -ldflags="-s -w" "$mod"
    mv "$EXT_BIN/.tmp/"* "$EXT_BIN/$bin"
  done
}

# component_image TAG BINARY_PATH NAME [PACKAGES]
component_image() {
  local tag=$1 src=$2 name=$3 packages=${4:-} ctx="$KCACHE/ctx/component-$3"
  have_image "$tag" && return 0
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$KIND_DIR/images/component/Dockerfile" "$ctx/"
  cp "$src" "$ctx/$name"
  build_image "$tag" "$ctx" --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "BINARY=$name" --build-arg "PACKAGES=$packages"
}

NODE_KEY=""
# Bump when ensure_node_image below changes what goes into the node image.
NODE_RECIPE=2  # 2: the registry hosts directory for the kubelet's pulls
ensure_node_image() {
  if [ -n "${ETJ_KIND_NODE_IMAGE:-}" ]; then
    # A registry is reachable (GitHub Actions): upstream kindest/node, pulled by kind create cluster.
    NODE_IMAGE=$ETJ_KIND_NODE_IMAGE
    step "node image $NODE_IMAGE (ETJ_KIND_NODE_IMAGE; not built here)"
    return 0
  fi
  # The node image's key: everything that goes into it.
  NODE_KEY=$(cat "$KIND_DIR"/images/*/* "$KIND_DIR"/manifests/* "$TOOLCHAIN/go.mod" "$TOOLCHAIN/go.sum" \
             <(echo "$KIND_VERSION $KUBERNETES_VERSION $HELM_VERSION $COREDNS_VERSION $KNP_VERSION $CRICTL_VERSION" \
                    "$LPP_VERSION $ETCD_IMAGE_TAG $PAUSE_VERSION $DEBIAN_SUITE $NODE_RECIPE") | sha256sum | cut -c1-12)
  NODE_IMAGE=etj.local/kind-node:$KUBERNETES_VERSION-$NODE_KEY
  have_image "$NODE_IMAGE" && { step "node image $NODE_IMAGE (cached)"; return 0; }
  ensure_k8s_binaries
  ensure_ext_binaries
  local reg=registry.k8s.io kv=$KUBERNETES_VERSION kindnet_tag="$NODE_KEY" images=() c
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    component_image "$reg/$c:$kv" "$K8S_BIN/$c" "$c"; images+=("$reg/$c:$kv")
  done
  component_image "$reg/kube-proxy:$kv" "$K8S_BIN/kube-proxy" kube-proxy "iptables conntrack ipset kmod"
  component_image "$reg/etcd:$ETCD_IMAGE_TAG" "$K8S_BIN/etcd" etcd
  component_image "$reg/coredns/coredns:$COREDNS_VERSION" "$EXT_BIN/coredns" coredns
  component_image "etj.local/local-path-provisioner:$LPP_VERSION" "$EXT_BIN/local-path-provisioner" local-path-provisioner
  images+=("$reg/kube-proxy:$kv" "$reg/etcd:$ETCD_IMAGE_TAG" "$reg/coredns/coredns:$COREDNS_VERSION"
           "etj.local/local-path-provisioner:$LPP_VERSION")
  # local-path's helper pod runs `sh` scripts: the Debian base has them.
  docker tag "$BASE_IMAGE" etj.local/local-path-helper:$DEBIAN_SUITE && images+=("etj.local/local-path-helper:$DEBIAN_SUITE")
  local ctx="$KCACHE/ctx/pause"
  if ! have_image "$reg/pause:$PAUSE_VERSION"; then
    rm -rf "$ctx" && mkdir -p "$ctx"
    cp "$KIND_DIR/images/pause/Dockerfile" "$ctx/"
    cp "$(go env GOMODCACHE)/k8s.io/kubernetes@$KUBERNETES_VERSION/build/pause/linux/pause.c" "$ctx/" \
      || die "pause.c not in the module cache (k8s.io/kubernetes@$KUBERNETES_VERSION)"
    build_image "$reg/pause:$PAUSE_VERSION" "$ctx" --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "PAUSE_VERSION=$PAUSE_VERSION"
  fi
  images+=("$reg/pause:$PAUSE_VERSION")
  ctx="$KCACHE/ctx/kindnet"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$KIND_DIR/images/kindnet/"* "$ctx/"
  cp "$K8S_BIN/kubectl" "$EXT_BIN/netpol" "$ctx/"
  build_image "etj.local/kindnet:$kindnet_tag" "$ctx" --build-arg "BASE_IMAGE=$BASE_IMAGE"
  images+=("etj.local/kindnet:$kindnet_tag")

  # The node's build context: kind's own node files from its module, containerd's config, the binaries.
  local kmod
  kmod=$(cd "$KCACHE" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  ctx="$KCACHE/ctx/node"
  rm -rf "$ctx" && mkdir -p "$ctx/bin" "$ctx/manifests"
  cp -r "$kmod/images/base/files" "$ctx/files" && chmod -R u+w "$ctx/files"
  rm -f "$ctx/files/etc/containerd/config.toml"
  cp "$KIND_DIR/images/node/Dockerfile" "$KIND_DIR/images/node/containerd-config.toml" "$ctx/"
  sed "s/@PAUSE_IMAGE@/registry.k8s.io\/pause:$PAUSE_VERSION/" "$KIND_DIR/images/node/containerd-config.toml" >"$ctx/containerd-config.toml"
  # The kind network's registry, over plain HTTP, for the kubelet's own pulls (a release installed from it).
  mkdir -p "$ctx/files/etc/containerd/certs.d/$REGISTRY_NAME:5000"
  printf 'server = "http://%s:5000"\n\n[host."http://%s:5000"]\n  capabilities = ["pull", "resolve"]\n' \
    "$REGISTRY_NAME" "$REGISTRY_NAME" >"$ctx/files/etc/containerd/certs.d/$REGISTRY_NAME:5000/hosts.toml"
  cp "$K8S_BIN/kubelet" "$K8S_BIN/kubeadm" "$K8S_BIN/kubectl" "$EXT_BIN/crictl" "$ctx/bin/"
  sed "s/KINDNET_TAG/$kindnet_tag/g" "$KIND_DIR/manifests/default-cni.yaml" >"$ctx/manifests/default-cni.yaml"
  cp "$KIND_DIR/manifests/default-storage.yaml" "$ctx/manifests/"
  build_image "etj.local/kind-node-base:$NODE_KEY" "$ctx" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg "KUBERNETES_VERSION=$KUBERNETES_VERSION"

  # Preload the images into the node's containerd (k8s.io namespace), as `kind build node-image` does.
  local tars="$KCACHE/ctx/node-images" t0=$SECONDS
  rm -rf "$tars" && mkdir -p "$tars"
  step "docker save ${#images[@]} images for the node: ${images[*]}"
  docker save -o "$tars/images.tar" "${images[@]}"
  docker rm -f etj-node-build >/dev/null 2>&1 || true
  step "importing them into the node's containerd"
  docker run --name etj-node-build --privileged --entrypoint /bin/bash -v "$tars:/kind/images:ro" \
    "etj.local/kind-node-base:$NODE_KEY" -euc '
      containerd >/tmp/containerd.log 2>&1 &
      for _ in $(seq 1 30); do ctr version >/dev/null 2>&1 && break; sleep 1; done
      ctr -n k8s.io images import --all-platforms --no-unpack --digests /kind/images/images.tar
      ctr -n k8s.io images ls -q
      kill %1; wait || true
      rm -rf /run/containerd /tmp/containerd.log /var/lib/containerd/tmpmounts' >&2
  docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
    etj-node-build "$NODE_IMAGE" >/dev/null
  docker rm etj-node-build >/dev/null
  rm -rf "$tars"
  step "node image $NODE_IMAGE ... $((SECONDS - t0)) s to preload, $(docker image inspect -f '{{.Size}}' "$NODE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
}

# ---------------------------------------------------------------------------------------------------- 5
KUBECONFIG_OUT="$KCACHE/kubeconfig-$CLUSTER"
kind_config() {
  local patches=""
  # The offline node preloads CoreDNS $COREDNS_VERSION (kubeadm names one the package proxy does not serve).
  [ -n "${ETJ_KIND_NODE_IMAGE:-}" ] || patches+=$'- |\n  kind: ClusterConfiguration\n  dns:\n    imageTag: '"$COREDNS_VERSION"$'\n'
  # kubelet >= 1.35 refuses a cgroup v1 host unless told not to (kind v0.31 no longer tests v1 for 1.35+).
  [ -f /sys/fs/cgroup/cgroup.controllers ] || patches+=$'- |\n  kind: KubeletConfiguration\n  failCgroupV1: false\n'
  cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
${patches:-[]}
nodes:
  - role: control-plane
  - role: worker
    labels:
      etj.dev/capacity-type: on-demand
      etj.dev/pool: cpu-on-demand
    extraMounts:
      - {hostPath: $SHARED_DIR, containerPath: $SHARED_DIR}
  - role: worker
    labels:
      etj.dev/capacity-type: spot
      etj.dev/pool: cpu-spot
    extraMounts:
      - {hostPath: $SHARED_DIR, containerPath: $SHARED_DIR}
  - role: worker
    labels:
      etj.dev/capacity-type: spot
      etj.dev/pool: cpu-spot
    extraMounts:
      - {hostPath: $SHARED_DIR, containerPath: $SHARED_DIR}
EOF
}

# Every kind node's kubelet and kube-proxy take inotify instances from the host's one per-user limit: with two
# clusters on a machine, Debian's default of 128 ran out and kube-proxy crash-looped on the workers ("too many
# open files"), so their pods reached no Service. kind's known-issues page raises the limit the same way.
INOTIFY_INSTANCES=512
ensure_inotify() {
  local now
  now=$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null) || return 0
  [ "$now" -ge "$INOTIFY_INSTANCES" ] && return 0
  if [ "$(id -u)" = 0 ] && sysctl -qw "fs.inotify.max_user_instances=$INOTIFY_INSTANCES"; then
    step "fs.inotify.max_user_instances $now -> $INOTIFY_INSTANCES (kube-proxy runs out beside another cluster)"
  else
    step "warning: fs.inotify.max_user_instances is $now; beside another kind cluster kube-proxy may run out"
  fi
}

ensure_cluster() {
  mkdir -p "$SHARED_DIR" && chmod 1777 "$SHARED_DIR"
  if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    local node_image
    node_image=$(docker inspect -f '{{.Config.Image}}' "$CLUSTER-control-plane" 2>/dev/null || true)
    if [ "$node_image" = "$NODE_IMAGE" ]; then
      step "kind cluster $CLUSTER exists (node image $NODE_IMAGE)"
      if docker ps --filter "label=io.x-k8s.kind.cluster=$CLUSTER" --filter status=exited -q | grep -q .; then
        # Stopped (a reboot, `docker stop`): started in kind's node order, so each gets its address back.
        docker start $("$KIND" get nodes --name "$CLUSTER" | sort) >/dev/null
        local t0=$SECONDS
        for _ in $(seq 1 150); do
          docker exec "$CLUSTER-control-plane" kubectl --kubeconfig /etc/kubernetes/admin.conf \
            wait --for=condition=Ready nodes --all --timeout=2s >/dev/null 2>&1 && break
          sleep 2
        done
        step "started the stopped nodes; all Ready after $((SECONDS - t0)) s"
      fi
    else
      step "kind cluster $CLUSTER runs $node_image, not $NODE_IMAGE: recreating it"
      "$KIND" delete cluster --name "$CLUSTER" >&2
    fi
  fi
  if ! "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    kind_config >"$KCACHE/kind-$CLUSTER.yaml"
    step "kind create cluster --name $CLUSTER (control plane, 1 on-demand and 2 spot workers)"
    timed "kind create cluster" "$KIND" create cluster --name "$CLUSTER" --image "$NODE_IMAGE" \
      --config "$KCACHE/kind-$CLUSTER.yaml" --wait 300s --retain >&2
  fi
  "$KIND" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_OUT"
}

# Images reach the nodes through a registry on the kind network (what kind's "local registry" guide does),
# not `kind load docker-image`: a push and a pull move only the layers that changed, so a rebuilt trainer
# image (7 GB where torch comes from PyPI's CUDA build) reaches three nodes in seconds instead of a full copy
# into each (about 6 min a node here). The registry is distribution's, built from its Go module like the
# other components; it listens on the kind network and on the host's loopback only. Each node pulls (plain
# HTTP, on the kind network), tags the image with the name pods use (imagePullPolicy: Never, so the cluster
# itself never pulls) and drops the layer blobs once unpacked, as containerd's discard_unpacked_layers does
# for the CRI's own pulls.
REGISTRY_VERSION=v3.0.0                # github.com/distribution/distribution/v3
REGISTRY_NAME=etj-registry
REGISTRY_HOST_PORT=${ETJ_KIND_REGISTRY_PORT:-5001}
ensure_registry() {
  local bin="$KCACHE/tools/registry-$REGISTRY_VERSION/registry" img=etj.local/registry:$REGISTRY_VERSION
  if [ ! -x "$bin" ]; then
    step "go install github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
    timed "registry" env GOBIN="$(dirname "$bin")" CGO_ENABLED=0 GOFLAGS="-trimpath" nice -n 10 \
      go install -ldflags="-s -w" "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
  fi
  component_image "$img" "$bin" registry
  if [ "$(docker inspect -f '{{.State.Running}}' "$REGISTRY_NAME" 2>/dev/null)" != true ]; then
    docker rm -f "$REGISTRY_NAME" >/dev/null 2>&1 || true
    step "starting the image registry $REGISTRY_NAME (kind network; host 127.0.0.1:$REGISTRY_HOST_PORT)"
    docker run -d --restart=always --name "$REGISTRY_NAME" --network kind \
      -p "127.0.0.1:$REGISTRY_HOST_PORT:5000" -v etj-registry-data:/var/lib/registry \
      -v "$KIND_DIR/registry.yml:/etc/etj-registry.yml:ro" "$img" serve /etc/etj-registry.yml >/dev/null
  fi
  for _ in $(seq 1 30); do
    curl -fsS "http://127.0.0.1:$REGISTRY_HOST_PORT/v2/" >/dev/null 2>&1 && return 0
    sleep 1
  done
  die "the registry did not answer on 127.0.0.1:$REGISTRY_HOST_PORT; docker logs $REGISTRY_NAME"
}
NODE_PULL_SCRIPT='
set -eu
src=$1 img=$2
ctr -n k8s.io images pull --plain-http --snapshotter=overlayfs "$src" >/dev/null
ctr -n k8s.io images tag --force "$src" "$img" >/dev/null
target=$(ctr -n k8s.io images ls "name==$img" | awk "NR==2 {print \$3}")
manifests=$(ctr -n k8s.io content get "$target" | jq -r ".manifests[]?.digest")
[ -n "$manifests" ] || manifests=$target
for m in $manifests; do
  for layer in $(ctr -n k8s.io content get "$m" | jq -r ".layers[]?.digest"); do
    ctr -n k8s.io content rm "$layer" >/dev/null 2>&1 || true
  done
done
crictl inspecti -q "$img" >/dev/null'
load_images() {
  local img
  ensure_registry
  local images=("$OPERATOR_IMAGE" "$TRAINER_IMAGE")
  have_image "$STORE_IMAGE" && images+=("$STORE_IMAGE")   # not built: the stores run the trainer image
  local all workers
  mapfile -t all < <("$KIND" get nodes --name "$CLUSTER" | sort)
  mapfile -t workers < <("$KIND" get nodes --name "$CLUSTER" | grep -v control-plane | sort)
  for img in "${images[@]}"; do
    # The operator runs on the control plane (scripts/kind/operator-values.yaml), the trainer on the workers.
    if [ "$img" = "$OPERATOR_IMAGE" ]; then load_image "$img" "${all[@]}"; else load_image "$img" "${workers[@]}"; fi
  done
}
# load_image IMAGE NODE...: IMAGE onto each NODE that lacks it, through the registry.
load_image() {
  local img=$1 n id t0 src pushed=""
  shift
  id=$(docker image inspect -f '{{.Id}}' "$img")
  src="${img#*/}" && src="${src//\//-}"   # ghcr.io/etj-dev/etj-trainer:dev-cpu -> etj-dev-etj-trainer:dev-cpu
  for n in "$@"; do
    if docker exec "$n" crictl inspecti -q "$img" 2>/dev/null | grep -q "${id#sha256:}"; then
      step "$img already on $n"
      continue
    fi
    if [ -z "$pushed" ]; then
      t0=$SECONDS
      step "docker push $img to the kind registry (only layers it lacks)"
      docker tag "$img" "127.0.0.1:$REGISTRY_HOST_PORT/$src"
      docker push -q "127.0.0.1:$REGISTRY_HOST_PORT/$src" >/dev/null || die "docker push $img failed"
      step "docker push ... $((SECONDS - t0)) s"
      pushed=1
    fi
    t0=$SECONDS
    step "pulling $img into $n (only layers it lacks)"
    docker exec "$n" bash -c "$NODE_PULL_SCRIPT" pull "$REGISTRY_NAME:5000/$src" "$img" \
      || die "pulling $img into $n failed"
    step "pulling $img into $n ... $((SECONDS - t0)) s"
  done
}

RELEASE=${ETJ_RELEASE:-etj}
RELEASE_NAMESPACE=${ETJ_RELEASE_NAMESPACE:-etj-system}
tools_env() {
  ensure_kind
  export KUBECONFIG="$KUBECONFIG_OUT"
  # With an upstream node image (GitHub Actions) the runner's kubectl and helm do; offline, the ones built
  # from the control plane's pinned module.
  if [ -n "${ETJ_KIND_NODE_IMAGE:-}" ] && command -v kubectl >/dev/null && command -v helm >/dev/null; then
    return 0
  fi
  ensure_k8s_binaries
  export PATH="$K8S_BIN:$PATH"
}
# helm install of charts/etj with the local operator image (never pulled), into a namespace that enforces
# Pod Security "restricted", as the e2e-kind workflow does. The image's tag stays "dev" across rebuilds, so
# its id goes into a pod annotation: a rebuilt operator image rolls the deployment.
install_chart() {
  local repo=${OPERATOR_IMAGE%:*} tag=${OPERATOR_IMAGE##*:} t0=$SECONDS
  kubectl get namespace "$RELEASE_NAMESPACE" >/dev/null 2>&1 || kubectl create namespace "$RELEASE_NAMESPACE" >&2
  kubectl label --overwrite namespace "$RELEASE_NAMESPACE" pod-security.kubernetes.io/enforce=restricted >&2
  # The store image where it was built (ensure_store_image): the operator's default for the jobs' stores.
  local store=""
  have_image "$STORE_IMAGE" && store=$STORE_IMAGE
  # With Kueue installed (`scripts/kind.sh kueue`), the operator admits labelled jobs through it.
  local kueue=false
  kueue_installed && kueue=true
  step "helm upgrade --install $RELEASE charts/etj (image $OPERATOR_IMAGE, pullPolicy Never, trainer $TRAINER_IMAGE, store ${store:-the trainer image}, kueue.enabled=$kueue)"
  helm upgrade --install "$RELEASE" "$ROOT/charts/etj" --namespace "$RELEASE_NAMESPACE" \
    --set image.repository="$repo" --set image.tag="$tag" --set image.pullPolicy=Never \
    --set trainer.image="$TRAINER_IMAGE" --set trainer.storeImage="$store" --values "$KIND_DIR/operator-values.yaml" \
    --set kueue.enabled="$kueue" \
    --set-string podAnnotations.etj\\.dev/image-id="$(docker image inspect -f '{{.Id}}' "$OPERATOR_IMAGE" | cut -c8-19)" \
    --wait --timeout 5m >&2
  kubectl -n "$RELEASE_NAMESPACE" rollout status "deployment/$RELEASE" --timeout=120s >&2
  kubectl -n "$RELEASE_NAMESPACE" get pods -o wide >&2
  step "helm install ... $((SECONDS - t0)) s"
}
# ---------------------------------------------------------------------------------------------------- Kueue
# Kueue on kind, offline (docs/kueue.md, "Kueue on kind"): the controller `etj kueue build` makes from the
# sigs.k8s.io/kueue module (the bed's binary) on the Debian base, pushed through the registry to the control
# plane, and Kueue's own chart from the same module rendered with scripts/kind/kueue/values.yaml: its CRDs,
# RBAC, the kueue-system Deployment and Configuration, the webhook Service and webhook configurations, whose
# certificate Kueue's own certificate controller makes (internalCertManagement). Idempotent: server-side apply.
KUEUE_VERSION=v0.17.0            # testbed/src/etj_testbed/localcluster/kueue_build.py's KUEUE_VERSION
KUEUE_NAMESPACE="kueue-system"
KUEUE_RELEASE=kueue              # Kueue's certificate controller looks for the chart's default names (kueue-*)
KUEUE_DEPLOYMENT=$KUEUE_RELEASE-controller-manager
kueue_installed() { kubectl -n "$KUEUE_NAMESPACE" get deployment "$KUEUE_DEPLOYMENT" >/dev/null 2>&1; }
ensure_kueue_image() {
  local bin ctx="$KCACHE/ctx/kueue"
  step "etj kueue build: Kueue $KUEUE_VERSION's controller from its Go module (cached; cold ~10-20 min: docs/kueue.md)"
  bin=$("$ROOT/.venv/bin/etj" kueue build | tail -1) && [ -x "$bin" ] || die "etj kueue build failed"
  KUEUE_IMAGE=etj.local/kueue:$KUEUE_VERSION-$(hash_of "$bin" "$KIND_DIR/kueue/Dockerfile")
  have_image "$KUEUE_IMAGE" && return 0
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$KIND_DIR/kueue/Dockerfile" "$bin" "$ctx/"
  build_image "$KUEUE_IMAGE" "$ctx" --build-arg "BASE_IMAGE=$BASE_IMAGE"
}
# Kueue's chart in the module cache (fetched through GOPROXY if absent, like kind's own module).
kueue_chart() {
  local dir
  dir=$(cd "$KCACHE" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
        | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  [ -f "$dir/charts/kueue/Chart.yaml" ] || die "Kueue's chart is not in sigs.k8s.io/kueue@$KUEUE_VERSION ($dir)"
  echo "$dir/charts/kueue"
}
# The chart's templates, rendered with the local image, less what is off here: the visibility API (its
# APIService would have no server: the VisibilityOnDemand gate is off in the values), KueueViz, Prometheus,
# cert-manager and the disabled PodDisruptionBudget.
render_kueue() {
  local chart=$1 show=() t
  for t in "$chart"/templates/*/*.yaml; do
    t=${t#"$chart"/}
    case $t in
      templates/visibility/* | templates/visibility-apf/* | templates/kueueviz/* | templates/prometheus/* \
        | templates/certmanager/* | templates/manager/manager-pdb.yaml) continue ;;
    esac
    show+=(--show-only "$t")
  done
  helm template "$KUEUE_RELEASE" "$chart" --namespace "$KUEUE_NAMESPACE" --values "$KIND_DIR/kueue/values.yaml" \
    --set controllerManager.manager.image.repository="${KUEUE_IMAGE%:*}" \
    --set controllerManager.manager.image.tag="${KUEUE_IMAGE##*:}" "${show[@]}"
}
KUEUE_PROBE='{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "etj-kind-probe"}}'
install_kueue() {
  local t0=$SECONDS manifest="$KCACHE/kueue-$CLUSTER.yaml" control_plane
  control_plane=$("$KIND" get nodes --name "$CLUSTER" | grep control-plane)
  load_image "$KUEUE_IMAGE" "$control_plane"
  render_kueue "$(kueue_chart)" >"$manifest"
  kubectl get namespace "$KUEUE_NAMESPACE" >/dev/null 2>&1 || kubectl create namespace "$KUEUE_NAMESPACE" >&2
  step "kubectl apply --server-side Kueue $KUEUE_VERSION ($(grep -c '^kind:' "$manifest") objects, image $KUEUE_IMAGE; $manifest)"
  kubectl apply --server-side --force-conflicts --field-manager=etj-kind -f "$manifest" >/dev/null
  local crds
  mapfile -t crds < <(sed -n 's/^  name: \(.*\.kueue\.x-k8s\.io\)$/crd\/\1/p' "$manifest")
  kubectl wait --for=condition=Established --timeout=120s "${crds[@]}" >/dev/null
  kubectl -n "$KUEUE_NAMESPACE" rollout status "deployment/$KUEUE_DEPLOYMENT" --timeout=300s >&2
  # Ready once its webhooks answer through the Service with the certificate Kueue made: a server-side dry
  # run of a ResourceFlavor goes through its mutating and validating webhooks.
  local i
  for i in $(seq 1 90); do
    echo "$KUEUE_PROBE" | kubectl create --dry-run=server -f - >/dev/null 2>"$KCACHE/kueue-probe.err" && break
    [ "$i" = 90 ] && die "Kueue's webhooks did not answer: $(cat "$KCACHE/kueue-probe.err")"
    sleep 2
  done
  step "Kueue $KUEUE_VERSION installed ... $((SECONDS - t0)) s"
}
# What `e2e` runs the suites with: the whole kind suite, and tests/e2e in its installed mode on this cluster
# (tests/e2e/e2econfig.py reads these), with the loaded CPU image (never pulled) and the shared directory.
e2e_env() {
  echo ETJ_KIND_FULL=1 ETJ_E2E_OPERATOR=installed "ETJ_E2E_KUBECONFIG=$KUBECONFIG_OUT" \
    "ETJ_E2E_TRAINER_IMAGE=$TRAINER_IMAGE" ETJ_E2E_IMAGE_PULL_POLICY=Never "ETJ_E2E_SHARED_DIR=$SHARED_DIR"
}
GPUS_PER_WORKER=2
# The example jobs ask for nvidia.com/gpu: advertise it on the CPU workers (node-status patch), as the workflow does.
advertise_gpus() {
  local node
  for node in $(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
    kubectl patch "$node" --subresource=status --type=json \
      -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"'"$GPUS_PER_WORKER"'"}]' >/dev/null
  done
}

# Everything runs inside main, called on the last line: bash reads a script as it runs it, so an edit to this
# file while it runs (a long build) would otherwise be read from the middle.
main() {
local cmd=${1:-up}
case "$cmd" in
  install)
    tools_env
    install_chart
    advertise_gpus
    ;;
  kueue)
    # Kueue on the cluster `up` made (docs/kueue.md, "Kueue on kind"), then the chart again: the operator
    # with kueue.enabled. Idempotent.
    lock
    ensure_packages
    ensure_dockerd
    ensure_base_images
    ensure_kueue_image
    tools_env
    install_kueue
    install_chart
    advertise_gpus
    ;;
  demo)
    # The local demo's script, table, timeline and accuracy comparison (`etj demo`), on this cluster: the
    # chart's operator and kind's workers train examples/demo-cpu.yaml in the loaded CPU image (never
    # pulled); checkpoints and sample logs go to the directory every node mounts. Extra arguments go to
    # `etj demo` (e.g. --no-reference).
    tools_env
    shift
    exec "$ROOT/.venv/bin/etj" demo --operator installed --kubeconfig "$KUBECONFIG_OUT" \
      --trainer-image "$TRAINER_IMAGE" --image-pull-policy Never --shared-dir "$SHARED_DIR" "$@"
    ;;
  e2e)
    # The kind tests (tests/kind, all of them) and the e2e suite in its installed mode on this cluster.
    tools_env
    shift
    cd "$ROOT"
    # shellcheck disable=SC2046
    exec env $(e2e_env) "$ROOT/.venv/bin/python" -m pytest tests/kind tests/e2e -v -ra "$@"
    ;;
  config)
    kind_config  # the kind cluster's configuration, as `up` creates it
    ;;
  env)
    e2e_env  # the environment `e2e` runs the suites with
    ;;
  docker)
    # Only Docker: installed (apt) if missing, dockerd started if not running, privileged containers checked.
    lock
    ensure_packages
    ensure_dockerd
    ensure_base_images
    ;;
  base)
    # Only the Debian base image (step 2's first half): its name on stdout. With ETJ_CACHE_DIR and
    # ETJ_BASE_IMAGE pointing at nothing yet, this is the cold path (tests/kind/test_cold_cache.py).
    lock
    ensure_packages
    ensure_dockerd
    debian_base "$BASE_IMAGE" "$DEBIAN_SUITE" || die "the $DEBIAN_SUITE base image could not be made"
    echo "$BASE_IMAGE"
    ;;
  store-image)
    # Only the store image (and what it needs): its name on stdout, or an error when it was not built.
    lock
    ensure_packages
    ensure_dockerd
    ensure_store_image
    have_image "$STORE_IMAGE" || exit 1
    echo "$STORE_IMAGE"
    ;;
  cuda-image)
    lock
    ensure_packages
    ensure_dockerd
    ensure_base_images
    ensure_cuda_trainer_image
    echo "$CUDA_TRAINER_IMAGE"
    ;;
  up | images | node-image)
    lock
    ensure_packages
    ensure_dockerd
    ensure_base_images
    ensure_etj_images
    [ "$cmd" = images ] && { step "images ready: $OPERATOR_IMAGE $TRAINER_IMAGE $STORE_IMAGE"; exit 0; }
    ensure_kind
    ensure_node_image
    [ "$cmd" = node-image ] && { echo "$NODE_IMAGE"; exit 0; }
    ensure_inotify
    ensure_cluster
    load_images
    step "cluster $CLUSTER ready; export KUBECONFIG=$KUBECONFIG_OUT"
    echo "$KUBECONFIG_OUT"
    ;;
  down)
    [ -x "$KIND" ] && "$KIND" delete cluster --name "$CLUSTER" >&2
    ;;
  *) die "usage: $0 [up|docker|base|images|store-image|cuda-image|node-image|install|kueue|demo|e2e|config|env|down]" ;;
esac
}
main "$@"; exit
