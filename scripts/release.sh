#!/usr/bin/env bash
# A release of etj: versioned images and the Helm chart as an OCI artifact, the chart naming its images by
# digest (as Kueue, cert-manager and Karpenter ship). `make release VERSION=x.y.z REGISTRY=host[:port]/ns`.
#
#   scripts/release.sh all      build the images (scripts/kind.sh's offline builders, tagged with the
#                               version), push them, then `chart` with the digests the pushes returned
#   scripts/release.sh chart    package charts/etj at VERSION with the images of ETJ_RELEASE_DIGESTS (a file
#                               of `name=repository@sha256:...` lines) and push it (helm push oci://)
#
# Images: etj-operator:VERSION, etj-store:VERSION, etj-trainer:VERSION-cpu and etj-trainer:VERSION (CUDA).
# Environment:
#   VERSION, REGISTRY             required (REGISTRY without a scheme: ghcr.io/etj-dev, 127.0.0.1:5001/etj)
#   PULL_REGISTRY                 where the nodes pull from, when not REGISTRY (kind: the registry's name on
#                                 the kind network, etj-registry:5000/etj, while this machine pushes to
#                                 127.0.0.1:5001/etj); the chart names images there, by the pushed digest
#   ETJ_RELEASE_IMAGES            the images to build and push (default: operator store trainer-cpu
#                                 trainer-cuda); the CUDA image is 7 GB, and kind's nodes never run it
#   ETJ_HELM_PLAIN_HTTP=1         a registry without TLS (the local one)
#   ETJ_RELEASE_KEEP=DIR          also copy the packaged chart there; ETJ_RELEASE_PUSH=0: package only
# Stdout: the chart's OCI reference (oci://REGISTRY/charts/etj) on the last line, once pushed; progress on
# stderr.
# .github/workflows/release.yaml does the same from a tag, with provenance, SBOM and keyless signatures.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'release: %s\n' "$*" >&2; }
die() { printf 'release: error: %s\n' "$*" >&2; exit 1; }

VERSION=${VERSION:-}
REGISTRY=${REGISTRY:-}
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "VERSION=x.y.z (semver) is required, got '$VERSION'"
[ -n "$REGISTRY" ] || die "REGISTRY=host[:port]/namespace is required"
REGISTRY=${REGISTRY%/}
PULL_REGISTRY=${PULL_REGISTRY:-$REGISTRY}
PULL_REGISTRY=${PULL_REGISTRY%/}
IMAGES=${ETJ_RELEASE_IMAGES:-operator store trainer-cpu trainer-cuda}
HELM=${HELM:-helm}
plain_http=()
WORKDIRS=()
trap 'rm -rf "${WORKDIRS[@]}"' EXIT
[ "${ETJ_HELM_PLAIN_HTTP:-0}" = 1 ] && plain_http=(--plain-http)

# The tag each image is pushed under.
tag_of() {
  case "$1" in
    operator) echo "$REGISTRY/etj-operator:$VERSION" ;;
    store) echo "$REGISTRY/etj-store:$VERSION" ;;
    trainer-cpu) echo "$REGISTRY/etj-trainer:$VERSION-cpu" ;;
    trainer-cuda) echo "$REGISTRY/etj-trainer:$VERSION" ;;
    *) die "unknown image '$1' (operator, store, trainer-cpu, trainer-cuda)" ;;
  esac
}

# build: scripts/kind.sh's builders (offline bases, the same Dockerfiles), with the release's tags.
build() {
  local want=" $IMAGES "
  say "building $IMAGES at $VERSION"
  ETJ_IMAGE_VERSION=$VERSION ETJ_OPERATOR_IMAGE=$(tag_of operator) ETJ_TRAINER_IMAGE=$(tag_of trainer-cpu) \
    ETJ_STORE_IMAGE=$(tag_of store) "$ROOT/scripts/kind.sh" images >&2
  if [[ $want == *" trainer-cuda "* ]]; then
    ETJ_IMAGE_VERSION=$VERSION ETJ_CUDA_TRAINER_IMAGE=$(tag_of trainer-cuda) "$ROOT/scripts/kind.sh" cuda-image >&2
  fi
}

# push IMAGE...: push each and write `name=repository@digest` (the repository as the nodes pull it).
push() {
  local name tag digest t0
  for name in $IMAGES; do
    tag=$(tag_of "$name")
    docker image inspect "$tag" >/dev/null 2>&1 || die "$tag was not built (scripts/kind.sh said why above)"
    t0=$SECONDS
    say "docker push $tag"
    docker push -q "$tag" >/dev/null || die "docker push $tag failed"
    # The registry's digest of what was pushed: the manifest digest the nodes will resolve.
    digest=$(docker image inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "$tag" \
      | grep -F "${tag%:*}@" | head -1 | cut -d@ -f2)
    [ -n "$digest" ] || die "no digest for $tag after the push"
    say "docker push $tag ... $((SECONDS - t0)) s, $digest"
    local repo=${tag%:*}
    echo "$name=$PULL_REGISTRY/${repo#"$REGISTRY"/}@$digest"
  done
}

# ref NAME: the pinned reference of NAME from the digests file, or empty.
ref() { sed -n "s/^$1=//p" "$DIGESTS" | tail -1; }

# chart: charts/etj at VERSION, its defaults the released images by digest; packaged, linted, pushed.
chart() {
  [ -f "${DIGESTS:-}" ] || die "ETJ_RELEASE_DIGESTS must name a file of name=repository@digest lines"
  local work operator store trainer
  work=$(mktemp -d)
  WORKDIRS+=("$work")
  cp -rL "$ROOT/charts/etj" "$work/etj"   # -L: files/crd.yaml links to crds/, outside the chart
  operator=$(ref operator)
  store=$(ref store)
  # The jobs' default trainer: the CUDA image where it was released (GPU nodes), else the CPU one.
  trainer=$(ref trainer-cuda)
  [ -n "$trainer" ] || trainer=$(ref trainer-cpu)
  [ -n "$operator" ] && [ -n "$trainer" ] || die "the digests file needs the operator and a trainer image"
  python3 - "$work/etj" "$VERSION" "$operator" "$trainer" "$store" <<'EOF'
import re
import sys
from pathlib import Path

chart, version, operator, trainer, store = sys.argv[1:]
# Line edits, not a YAML round trip: the released values.yaml keeps its comments (`helm show values`).
edits = {
    "Chart.yaml": [(r"(?m)^version: .*$", f"version: {version}"), (r'(?m)^appVersion: .*$', f'appVersion: "{version}"')],
    "values.yaml": [
        (r"(?m)^(image:\n  repository: ).*$", r"\g<1>" + operator.split("@")[0]),
        (r'(?m)^(image:\n(?:  .*\n)*?  digest: ).*$', r"\g<1>" + operator.split("@")[1]),
        (r"(?m)^(trainer:\n(?:  .*\n|\s*#.*\n)*?  image: ).*$", r"\g<1>" + trainer),
        (r'(?m)^(trainer:\n(?:  .*\n|\s*#.*\n)*?  storeImage: ).*$', r"\g<1>" + (store or '""')),
    ],
}
for name, subs in edits.items():
    path = Path(chart) / name
    text = path.read_text()
    for pattern, repl in subs:
        text, n = re.subn(pattern, repl, text, count=1)
        if n != 1:
            sys.exit(f"release: {name}: no line matched {pattern!r}")
    path.write_text(text)
EOF
  "$HELM" lint "$work/etj" >&2
  "$HELM" package "$work/etj" --destination "$work" >&2
  [ -z "${ETJ_RELEASE_KEEP:-}" ] || cp "$work/etj-$VERSION.tgz" "$ETJ_RELEASE_KEEP"
  if [ "${ETJ_RELEASE_PUSH:-1}" != 1 ]; then
    say "not pushed (ETJ_RELEASE_PUSH=${ETJ_RELEASE_PUSH})"
    return 0
  fi
  say "helm push etj-$VERSION.tgz oci://$REGISTRY/charts"
  "$HELM" push "$work/etj-$VERSION.tgz" "oci://$REGISTRY/charts" "${plain_http[@]}" >&2
  echo "oci://$REGISTRY/charts/etj"
}

case "${1:-all}" in
  all)
    build
    DIGESTS=$(mktemp)
    push >"$DIGESTS"
    say "images: $(tr '\n' ' ' <"$DIGESTS")"
    chart
    rm -f "$DIGESTS"
    ;;
  chart)
    DIGESTS=${ETJ_RELEASE_DIGESTS:-}
    chart
    ;;
  *) die "usage: $0 [all|chart]" ;;
esac
