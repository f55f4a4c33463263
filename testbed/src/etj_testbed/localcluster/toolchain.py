"""Build the control-plane binaries from upstream Go modules, once, into a cache keyed by version.

The pinned module lives beside this file (`toolchain/go.mod`). One `go build` of several of its `tool`
packages shares the compile of the k8s.io staging packages between the binaries, which is what makes a cold
build fit in CI's budget. The result is keyed by a hash of go.mod + go.sum, so bumping a version rebuilds and
an unchanged checkout reuses the cache in milliseconds.

The binaries come in two sets (issue 46): what a cluster runs (`CORE`: `make demo` builds only these) and
what only tests and the kind path use (`helm`, built by `make test` through `etj cluster build --all`). A
later build of the rest reuses Go's build cache for the packages they share.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from etj_testbed.localcluster.errors import ClusterError

TOOLCHAIN_DIR = Path(__file__).with_name("toolchain")
KUBERNETES_VERSION = "v1.36.3"
HELM_VERSION = "v3.21.4"  # must match helm.sh/helm/v3 in toolchain/go.mod (a test checks)
# Go names the binary of a `.../v3` package after the element before the version suffix.
BINARIES = {
    "kube-apiserver": "kube-apiserver",
    "kube-controller-manager": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler",
    "kubectl": "kubectl",
    "kwok": "kwok",
    "helm": "helm",
    "etcd": "server",
}
# The `tool` package of toolchain/go.mod that each binary is built from.
PACKAGES = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
    "helm": "helm.sh/helm/v3/cmd/helm",
    "etcd": "go.etcd.io/etcd/server/v3",
}
# What a local cluster starts (and `kubectl` for the user): the demo's whole need.
CORE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
ALL = tuple(BINARIES)

Progress = Callable[[str], None]


def _ldflags() -> str:
    # What hack/lib/version.sh stamps, so `kubectl version` reports the real release, not v0.0.0-master.
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    stamps = {
        "gitVersion": KUBERNETES_VERSION,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",  # fixed: identical inputs give identical binaries
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in stamps.items()]
    flags.append(f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}")
    return " ".join(flags)


def cache_root() -> Path:
    base = os.environ.get("ETJ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "etj"
    )
    return Path(base)


def toolchain_key() -> str:
    digest = hashlib.sha256(_ldflags().encode())
    for name in ("go.mod", "go.sum"):
        digest.update((TOOLCHAIN_DIR / name).read_bytes())
    return f"k8s-{KUBERNETES_VERSION}-{digest.hexdigest()[:12]}"


def bin_dir() -> Path:
    return cache_root() / toolchain_key() / "bin"


def binary(name: str) -> Path:
    return bin_dir() / BINARIES[name]


# kwok ships its default behaviours as Stage manifests in its module, not in the binary.
# Nodes heartbeat through their Lease (kube-node-lease), as kubelets do since 1.17: the node-heartbeat stage
# without a lease rewrote every Node's status every 20-45 s, a Node watch event each time (at 1,000 nodes,
# ~30 events/s that every node watcher, etj's included, had to decode; issue 29). With the lease stage a
# Node's status is rewritten every 10-20 min and the Lease (--node-lease-duration-seconds, components.py)
# keeps it Ready.
KWOK_STAGES = [
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
]


# kwok plays each stage with 4 requests in flight by default: on a loaded 2-core machine, where one write
# takes ~1 s, that is ~4 pods/s made Running, and a 10,000-pod bed took most of an hour (issue 29).
KWOK_OPTIONS = """apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 32
  nodePlayStageParallelism: 16
  nodeLeaseParallelism: 16"""


def kwok_stages() -> Path:
    # Named by the content: the toolchain cache is shared by checkouts that may want other stages.
    digest = hashlib.sha256("\n".join([*KWOK_STAGES, KWOK_OPTIONS]).encode()).hexdigest()[:8]
    return bin_dir().parent / f"kwok-stages-{digest}.yaml"


def missing(names: tuple[str, ...] = CORE) -> list[str]:
    """The binaries of ``names`` not in the cache yet (each is moved in whole, so present means built)."""
    return [n for n in names if not binary(n).exists()]


def is_built(names: tuple[str, ...] = CORE) -> bool:
    return not missing(names)


@contextmanager
def _build_lock() -> Iterator[None]:
    # Several pytest sessions or shells may ask for the toolchain at once; only one may build.
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _print_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure_built(progress: Progress = _print_progress, names: tuple[str, ...] = CORE) -> Path:
    """Return the cached bin dir once the binaries of ``names`` are in it, building the missing ones first
    (with progress on stderr)."""
    if is_built(names) and kwok_stages().exists():
        return bin_dir()
    with _build_lock():
        if not is_built(names):  # another process may have finished the build while we waited
            _build(missing(names), progress)
        if not kwok_stages().exists():
            _write_kwok_stages()
    return bin_dir()


def _write_kwok_stages() -> None:
    work = bin_dir().parent
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    kwok_dir = run_checked(
        [_go(), "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], TOOLCHAIN_DIR, env, "go list -m"
    ).strip()
    if not kwok_dir:  # not in the module cache (cleaned since the build): fetch it again
        run_checked([_go(), "mod", "download", "sigs.k8s.io/kwok"], TOOLCHAIN_DIR, env, "go mod download")
        kwok_dir = run_checked(
            [_go(), "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], TOOLCHAIN_DIR, env, "go list -m"
        ).strip()
    docs = [KWOK_OPTIONS, *((Path(kwok_dir) / rel).read_text().strip() for rel in KWOK_STAGES)]
    tmp = work / f"{kwok_stages().name}.{os.getpid()}.tmp"
    tmp.write_text("\n---\n".join(docs) + "\n")
    tmp.replace(kwok_stages())


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "the Go toolchain is not on PATH; install Go ≥ 1.26 (it builds kube-apiserver and friends)"
        )
    return go


def _build(names: list[str], progress: Progress) -> None:
    go = _go()
    target = bin_dir()
    target.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    packages = [PACKAGES[n] for n in names]
    with tempfile.TemporaryDirectory(prefix="etj-build-", dir=target.parent.parent) as tmp:
        work = Path(tmp)
        for name in ("go.mod", "go.sum"):
            shutil.copy(TOOLCHAIN_DIR / name, work / name)
        env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "CGO_ENABLED": "0"}
        progress(f"etj: building {', '.join(names)} ({KUBERNETES_VERSION}) from Go modules, once;")
        progress("etj: a cold build downloads ~1 GB of modules and compiles for 10-20 min on 2 cores")
        progress("etj: step 1/2: downloading modules")
        run_checked([go, "mod", "download"], work, env, "go mod download")
        listed = run_checked(
            [go, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", *packages],
            work,
            env,
            "go list",
        )
        total = sum(1 for line in listed.splitlines() if line.strip())
        progress(f"etj: step 2/2: compiling {total} packages into {len(names)} binaries")
        out = work / "bin"
        out.mkdir()
        cmd = [go, "build", "-v", "-trimpath", f"-ldflags={_ldflags()}", "-o", str(out) + "/", *packages]
        go_build_with_progress(
            cmd,
            work,
            env,
            total,
            started,
            progress,
            failure=f"building the control plane failed (`go build` in {work}); "
            "check Go ≥ 1.26 and registry access",
        )
        absent = [n for n in names if not (out / BINARIES[n]).exists()]
        if absent:
            raise ClusterError(f"the control-plane build produced no binary for {', '.join(absent)}")
        for name in names:  # one rename each: a binary in the cache is always whole
            (out / BINARIES[name]).replace(binary(name))
        shutil.copy(work / "go.mod", target.parent / "go.mod")
    progress(f"etj: {', '.join(names)} built in {time.monotonic() - started:.0f}s into {target}")


def go_build_with_progress(
    cmd: list[str],
    work: Path,
    env: dict[str, str],
    total: int,
    started: float,
    progress: Progress,
    failure: str,
    every_s: float = 15.0,
) -> None:
    """Run `go build -v` in ``work``, reporting every ``every_s`` how many of ``total`` packages it has
    compiled (`-v` prints one per line); a failed build raises ``failure`` with the build's last lines.
    The control plane's and Kueue's builds both take 10-30 min cold: a silent one looks hung."""
    proc = subprocess.Popen(
        cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    done, last_report = 0, 0.0
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-40:], line.rstrip()]
        if line.startswith(("#", "go:")) or " " in line.strip():
            continue
        done += 1
        now = time.monotonic()
        if now - last_report > every_s:
            last_report = now
            pct = min(99, 100 * done // max(total, 1))
            progress(f"etj:   {pct:3d}% ({done}/{total} packages, {now - started:.0f}s)")
    if proc.wait() != 0:
        detail = "\n".join(tail[-20:])
        raise ClusterError(f"{failure}. Last output:\n{detail}")


def run_checked(cmd: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"{what} failed: {result.stderr.strip()[-2000:]}")
    return result.stdout


def link_tools_into(directory: Path) -> list[Path]:
    """Symlink kubectl and helm (where built) next to the `etj` script so one PATH entry gives a user all
    three."""
    linked = []
    for name in ("kubectl", "helm"):
        if not binary(name).exists():
            continue
        dest = directory / name
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        dest.symlink_to(binary(name))
        linked.append(dest)
    return linked


def main(argv: list[str]) -> int:
    """`python -m etj_testbed.localcluster.toolchain check|build core|all`: scripts/setup.sh runs it with the
    system python3 (stdlib only), so the compile starts before the venv exists and overlaps pip's install."""
    if len(argv) != 2 or argv[0] not in ("check", "build") or argv[1] not in ("core", "all"):
        print("usage: python -m etj_testbed.localcluster.toolchain check|build core|all", file=sys.stderr)
        return 2
    names = CORE if argv[1] == "core" else ALL
    if argv[0] == "check":
        return 0 if is_built(names) and kwok_stages().exists() else 1
    try:
        ensure_built(names=names)
    except ClusterError as exc:
        print(f"etj: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
