"""Build Kueue's controller manager from its Go module, once, into a cache keyed by version (docs/kueue.md).

`sigs.k8s.io/kueue` is fetched through the Go module proxy like the control plane's modules. The binary
is built from a tiny wrapper module that requires Kueue at `KUEUE_VERSION` and holds a copy of Kueue's own
`cmd/kueue/main.go`, so every package compiles at the versions Kueue's go.mod pins (the wrapper adds no
requirement of its own). The copy differs from upstream in one line: v0.17.0 reads the metrics serving
certificate from the hard-coded path `/etc/kueue/metrics/certs` (a Secret mounted into its Pod) whenever
internal cert management is off, and a process on the host has no such mount; the patched line reads the
directory from `$KUEUE_METRICS_CERT_DIR` and falls back to that path. The patch is applied by exact text
and a version bump whose main.go no longer has the line fails the build instead of building silently.

Beside the binary the cache keeps what running it needs from the module (CRDs, webhook manifests, the
docs the design notes cite), so a cleaned module cache does not break a built bed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from etj_testbed.localcluster import toolchain
from etj_testbed.localcluster.errors import ClusterError

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.17.0"
# Packages compiled at once; 1 keeps a cold build from taking both cores of a small shared machine
# (it then takes longer: docs/kueue.md has the measured times). ETJ_KUEUE_BUILD_P overrides.
DEFAULT_BUILD_PARALLELISM = 1

METRICS_CERT_LINE = 'metricsCertPath := "/etc/kueue/metrics/certs"'
METRICS_CERT_PATCH = "metricsCertPath := etjMetricsCertPath()"
METRICS_CERT_FUNC = """
// etjMetricsCertPath is the etj test bed's one change to Kueue's main.go (docs/kueue.md): a controller run
// as a host process reads its metrics certificate from $KUEUE_METRICS_CERT_DIR instead of a Pod's mount.
func etjMetricsCertPath() string {
	if dir := os.Getenv("KUEUE_METRICS_CERT_DIR"); dir != "" {
		return dir
	}
	return "/etc/kueue/metrics/certs"
}
"""
# Copied from the module into the cache: CRDs and webhooks to install, docs for the design notes.
MODULE_FILES = [
    "config/components/crd/bases",
    "config/components/webhook/manifests.yaml",
    "config/components/manager/controller_manager_config.yaml",
]


def _ldflags() -> str:
    stamps = {"GitVersion": KUEUE_VERSION, "GitCommit": "module-" + KUEUE_VERSION, "BuildDate": "2026-01-01"}
    flags = ["-s", "-w"]
    flags += [f"-X {KUEUE_MODULE}/pkg/version.{key}={value}" for key, value in stamps.items()]
    return " ".join(flags)


def _wrapper_go_mod() -> str:
    return f"module etj.dev/kueue\n\ngo 1.25.0\n\nrequire {KUEUE_MODULE} {KUEUE_VERSION}\n"


def cache_key() -> str:
    digest = hashlib.sha256("\n".join([_wrapper_go_mod(), _ldflags(), METRICS_CERT_FUNC]).encode())
    return f"kueue-{KUEUE_VERSION}-{digest.hexdigest()[:12]}"


def home() -> Path:
    """The cache directory of this Kueue build (under ETJ_CACHE_DIR like the control plane's)."""
    return toolchain.cache_root() / cache_key()


def binary() -> Path:
    return home() / "bin" / "kueue"


def crd_dir() -> Path:
    return home() / "module" / "config/components/crd/bases"


def webhook_manifests() -> Path:
    return home() / "module" / "config/components/webhook/manifests.yaml"


def is_built() -> bool:
    return (home() / "complete").exists() and binary().exists()


@contextmanager
def _build_lock() -> Iterator[None]:
    toolchain.cache_root().mkdir(parents=True, exist_ok=True)
    with open(toolchain.cache_root() / ".kueue-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_built(progress: toolchain.Progress = toolchain._print_progress) -> Path:
    """Return the cached kueue binary, building it first if needed (progress on stderr)."""
    if is_built():
        return binary()
    with _build_lock():
        if not is_built():  # another process may have built it while we waited
            _build(progress)
    return binary()


def module_dir(env: dict[str, str], cwd: Path) -> Path:
    """Kueue's source in the module cache, downloaded through GOPROXY if absent."""
    out = toolchain.run_checked(
        ["go", "mod", "download", "-json", f"{KUEUE_MODULE}@{KUEUE_VERSION}"], cwd, env, "go mod"
    )
    directory = json.loads(out).get("Dir")
    if not directory or not Path(directory).is_dir():
        raise ClusterError(f"`go mod download {KUEUE_MODULE}@{KUEUE_VERSION}` gave no source directory")
    return Path(directory)


def patched_main(source: str) -> str:
    if source.count(METRICS_CERT_LINE) != 1:
        raise ClusterError(
            f"Kueue {KUEUE_VERSION}'s cmd/kueue/main.go does not contain `{METRICS_CERT_LINE}` once; "
            "the bed's patch (kueue_build.py) needs updating for this version"
        )
    return source.replace(METRICS_CERT_LINE, METRICS_CERT_PATCH) + METRICS_CERT_FUNC


def _build(progress: toolchain.Progress) -> None:
    toolchain._go()  # a clear error when Go is missing
    target = home()
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    parallelism = os.environ.get("ETJ_KUEUE_BUILD_P", str(DEFAULT_BUILD_PARALLELISM))
    with tempfile.TemporaryDirectory(prefix="etj-kueue-build-", dir=target.parent) as tmp:
        work = Path(tmp)
        env = {
            **os.environ,
            "GOFLAGS": f"-mod=mod -buildvcs=false -p={parallelism}",
            "CGO_ENABLED": "0",
            "GOWORK": "off",
        }
        progress(f"etj: building Kueue {KUEUE_VERSION} from its Go module, once (cached in {target});")
        progress(
            "etj: a cold build compiles ~1,400 packages plus the standard library: "
            f"7-25 min on 2 cores with -p={parallelism} (docs/kueue.md)"
        )
        source = module_dir(env, work)
        (work / "go.mod").write_text(_wrapper_go_mod())
        shutil.copy(source / "go.sum", work / "go.sum")
        (work / "go.sum").chmod(0o644)
        (work / "main.go").write_text(patched_main((source / "cmd/kueue/main.go").read_text()))
        # The wrapper's go.sum needs Kueue's own hashes besides its dependencies'.
        toolchain.run_checked(["go", "mod", "download", KUEUE_MODULE], work, env, "go mod download")
        # `go build -v` names each package it compiles, the standard library's included.
        listed = toolchain.run_checked(["go", "list", "-deps", "."], work, env, "go list")
        total = sum(1 for line in listed.splitlines() if line.strip())
        out = work / "out"
        out.mkdir()
        cmd = ["go", "build", "-v", "-trimpath", f"-ldflags={_ldflags()}", "-o", str(out / "kueue"), "."]
        progress(f"etj:   compiling {total} packages in a wrapper module requiring {KUEUE_MODULE}")
        toolchain.go_build_with_progress(
            cmd,
            work,
            env,
            total,
            started,
            progress,
            failure=f"building Kueue failed (`go build` in {work})",
            every_s=30,
        )
        if target.exists():
            shutil.rmtree(target)
        (target / "bin").mkdir(parents=True)
        (out / "kueue").rename(target / "bin" / "kueue")
        _copy_module_files(source, target / "module")
        shutil.copy(work / "go.mod", target / "go.mod")
        (target / "complete").write_text(f"built in {time.monotonic() - started:.0f}s\n")
    progress(f"etj: Kueue {KUEUE_VERSION} built in {time.monotonic() - started:.0f}s into {target}")


def _copy_module_files(source: Path, dest_root: Path) -> None:
    """What running Kueue needs from its module (CRDs, webhooks, sample config), so a cleaned module cache
    does not break a built bed."""
    for rel in MODULE_FILES:
        src, dest = source / rel, dest_root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest)
        else:
            shutil.copy(src, dest)
    for copied in dest_root.rglob("*"):  # the module cache is read-only; the copy need not be
        copied.chmod(0o755 if copied.is_dir() else 0o644)
