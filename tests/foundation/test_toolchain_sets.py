"""What each command builds (issue 46): `make demo` builds the binaries a cluster runs, `make test` the rest.

Pure: reads the pinned go.mod and the toolchain's tables; no build runs here."""

from __future__ import annotations

import re

from etj_testbed.localcluster import toolchain


def _go_mod_tools() -> set[str]:
    text = (toolchain.TOOLCHAIN_DIR / "go.mod").read_text()
    block = re.search(r"^tool \((.*?)^\)", text, re.S | re.M)
    assert block is not None
    return {line.strip() for line in block.group(1).splitlines() if line.strip()}


def test_every_binary_is_built_from_a_tool_of_the_pinned_module() -> None:
    assert set(toolchain.PACKAGES) == set(toolchain.BINARIES)
    assert set(toolchain.PACKAGES.values()) == _go_mod_tools()


def test_the_demo_builds_what_a_cluster_runs_and_not_helm() -> None:
    assert set(toolchain.CORE) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                   "kubectl", "kwok"}
    assert "helm" in toolchain.ALL and "helm" not in toolchain.CORE


def test_a_build_is_only_of_the_missing_binaries(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ETJ_CACHE_DIR", str(tmp_path))
    toolchain.bin_dir().mkdir(parents=True)
    for name in toolchain.CORE:
        toolchain.binary(name).write_text("")
    assert toolchain.is_built(toolchain.CORE) and not toolchain.is_built(toolchain.ALL)
    assert toolchain.missing(toolchain.ALL) == ["helm"]
