"""Helpers for the chart tests: run the real helm binary, parse what it renders, check Pod Security.

Nothing is mocked: `render` is `helm template` (the same engine `helm install` uses), and the cluster tests
install the chart into the real local control plane.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from etj_testbed.localcluster import toolchain

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "etj"
CRD_SOURCE = REPO / "crds" / "etj.dev_elastictrainingjobs.yaml"
# helm template defaults to an old Kubernetes version; the chart asks for >= 1.29 (CEL rules in the CRD).
KUBE_VERSION = toolchain.KUBERNETES_VERSION

JSON = dict[str, Any]


def helm_bin() -> str:
    return str(toolchain.binary("helm"))


def helm(
    *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    argv = [helm_bin(), *args]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def value_args(values: Mapping[str, Any] | None = None, sets: Sequence[str] = ()) -> list[str]:
    """`--set-json` for each top-level key of `values` (exact types, no string coercion), then `--set`s."""
    args: list[str] = []
    for key, value in (values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    for item in sets:
        args += ["--set", item]
    return args


def render(
    values: Mapping[str, Any] | None = None,
    sets: Sequence[str] = (),
    release: str = "etj",
    namespace: str = "etj-system",
    check: bool = True,
) -> list[JSON]:
    """`helm template` → the rendered objects (empty documents dropped)."""
    result = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *value_args(values, sets),
        check=check,
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def template_error(values: Mapping[str, Any] | None = None, sets: Sequence[str] = ()) -> str:
    """The error helm prints for values it rejects (fails the test if it accepts them)."""
    result = helm(
        "template", "etj", str(CHART), "--kube-version", KUBE_VERSION, *value_args(values, sets), check=False
    )
    assert result.returncode != 0, f"helm accepted values it should reject: {values} {sets}"
    return result.stderr


def find(objs: Iterable[JSON], kind: str, name: str | None = None) -> list[JSON]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: Iterable[JSON], kind: str, name: str | None = None) -> JSON:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def rbac_file() -> JSON:
    data: JSON = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    return data


# ---- the operator's documented permissions -------------------------------------------------------


def documented_permissions(doc: Path = REPO / "docs" / "operator.md") -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples from docs/operator.md's "RBAC the operator needs" table.

    Resources are written `pods`, `events` (core), `elastictrainingjobs.etj.dev/status` or
    `customresourcedefinitions.apiextensions.k8s.io`; several may share a row.
    """
    text = doc.read_text()
    section = text.split("## RBAC the operator needs", 1)[1]
    triples: set[tuple[str, str, str]] = set()
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("resource", "") or set(cells[0]) <= {"-"}:
            continue
        verbs = [v.strip() for v in re.sub(r"\(.*?\)", "", cells[1]).split(",") if v.strip()]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            resource, _, rest = name.partition(".")
            sub = ""
            if "/" in name:
                base, sub = name.split("/", 1)
                resource, _, rest = base.partition(".")
                sub = "/" + sub
            for verb in verbs:
                triples.add((rest, resource + sub, verb))
    return triples


def rule_triples(rules: Iterable[JSON]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups") or [""]
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }


# ---- Pod Security Standards, "restricted" profile --------------------------------------------------

# Volume types the restricted profile allows.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod_spec: Mapping[str, Any]) -> list[str]:
    """What in a pod spec breaks the Pod Security "restricted" profile (baseline checks included), plus
    the chart's own rule of a read-only root filesystem. Empty list: admissible."""
    problems: list[str] = []
    psc = pod_spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            problems.append(f"{flag} is set")
    for vol in pod_spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {vol['name']} uses {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if psc.get("runAsUser") == 0:
        problems.append("pod runAsUser is 0")
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    for c in containers:
        name = c["name"]
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {caps.get('add')}")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            problems.append(f"{name}: runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp!r}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            problems.append(f"{name}: hostPort")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: root filesystem is writable")
    return problems
