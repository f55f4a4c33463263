"""Clear errors from `etj cluster up`, and no half-started processes left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from etj_testbed.localcluster.cluster import LocalCluster
from etj_testbed.localcluster.components import PORT_OFFSETS, ports_from_base
from etj_testbed.localcluster.errors import ClusterError
from etj_testbed.localcluster.pki import LocalPKI


def test_ports_follow_the_base() -> None:
    ports = ports_from_base(20000)
    assert ports["kube-apiserver"] == 20043
    assert len(set(ports.values())) == len(PORT_OFFSETS)


def test_port_in_use_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETJ_CACHE_DIR", str(tmp_path))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        base = port - PORT_OFFSETS["kube-apiserver"]
        cluster = LocalCluster.named("busy", port_base=base)
        with pytest.raises(ClusterError) as err:
            cluster._check_ports_free()
    message = str(err.value)
    assert f"port {port} (kube-apiserver)" in message and "ETJ_CLUSTER_PORT_BASE" in message
    assert "\n" not in message


def _free_port_base() -> int:
    # Other local clusters (the shared test bed, a demo) may hold the usual bases: find an idle one.
    for base in range(30000, 40000, 100):
        cluster = LocalCluster.named("probe", port_base=base)
        try:
            cluster._check_ports_free()
        except ClusterError:
            continue
        return base
    raise AssertionError("no free port range for a second local cluster")


def _processes_under(root: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.cluster
def test_a_component_that_will_not_start_leaves_nothing_running(cluster: object) -> None:
    # `cluster` only guarantees the binaries are built; this test runs its own cluster on other ports.
    broken = LocalCluster.named("etj-broken-test", port_base=_free_port_base())
    broken.down()
    pki = LocalPKI(broken.layout.pki)
    pki.ensure()
    (broken.layout.pki / "apiserver.crt").write_text("not a certificate\n")  # issue() keeps existing files
    (broken.layout.pki / "apiserver.key").write_text("not a key\n")
    try:
        with pytest.raises(ClusterError) as err:
            broken.up()
        assert "kube-apiserver" in str(err.value)
        assert _processes_under(broken.layout.root) == []  # etcd, started first, was stopped again
        assert not broken.state_file.exists()
    finally:
        broken.down()


def test_cli_reports_errors_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "ETJ_CACHE_DIR": str(tmp_path), "PATH": "/nonexistent"}
    result = subprocess.run(
        [sys.executable, "-m", "etj_testbed.cli", "cluster", "up"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "etj: error: the Go toolchain is not on PATH" in result.stderr


def test_a_go_build_reports_its_packages_and_a_failure_quotes_its_last_lines(tmp_path: Path) -> None:
    """The control plane's and Kueue's cold builds share one runner (toolchain.go_build_with_progress):
    `go build -v` prints a package per line; progress counts them, and a failure says what failed with the
    build's last output. A shell stands in for go: the runner only reads lines and the exit code."""
    from etj_testbed.localcluster import toolchain

    said: list[str] = []
    script = "echo k8s.io/a; echo k8s.io/b; echo '# k8s.io/c'; echo 'c.go:1: undefined: x'; exit 2"
    with pytest.raises(ClusterError) as err:
        toolchain.go_build_with_progress(
            ["sh", "-c", script],
            tmp_path,
            dict(os.environ),
            4,
            0.0,
            said.append,
            "building X failed",
            every_s=0,
        )
    assert len(said) == 2 and said[0].startswith("etj:    25% (1/4 packages") and "(2/4 packages" in said[1]
    assert str(err.value).startswith("building X failed. Last output:\n") and "undefined: x" in str(err.value)
    toolchain.go_build_with_progress(
        ["sh", "-c", "echo a"], tmp_path, dict(os.environ), 1, 0.0, said.append, "x"
    )


def test_a_recycled_pid_is_not_taken_for_a_component() -> None:
    """The state file's pids are checked by argv[0] (components.process_alive): after a reboot the pid may
    belong to anything."""
    from etj_testbed.localcluster.components import process_alive

    me = os.getpid()
    assert process_alive(me, lambda argv0: argv0.endswith(os.path.basename(sys.executable).encode()))
    assert not process_alive(me, lambda argv0: argv0.endswith(b"/kueue"))
    child = subprocess.Popen(["true"])
    child.wait()
    assert not process_alive(child.pid, lambda _argv0: True)  # gone (reaped): nothing to find
