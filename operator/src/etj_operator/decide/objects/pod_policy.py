"""What this operator refuses to put in a job's pods, whatever the CRD allows (the chart's ``security``).

Creating a job is creating pods in its namespace (docs/operator.md, "Threat model"): its trainer volumes
are Kubernetes Volumes passed through, hostPath included. ``--forbid-host-path`` refuses such a job: no pod
is created, and the refusal is the job's ReplicaFailure condition (reason HostPathForbidden) and a Warning
Event, as the apiserver's own refusals are (k8s/rejections.py, decide/status/conditions.py).
"""

from __future__ import annotations

from etj_operator.api.models import ElasticTrainingJobSpec

HOST_PATH_FORBIDDEN = "HostPathForbidden"


def refusal(spec: ElasticTrainingJobSpec, *, forbid_host_path: bool) -> str | None:
    """Why the job's pods may not be created here ("Reason: message"), or None."""
    if not forbid_host_path:
        return None
    names = [v.name for v in spec.trainer.volumes if (v.model_extra or {}).get("hostPath") is not None]
    if not names:
        return None
    return (
        f"{HOST_PATH_FORBIDDEN}: trainer.volumes {', '.join(names)}: hostPath volumes are forbidden by this "
        "operator (the chart's security.forbidHostPath, --forbid-host-path): use a persistentVolumeClaim, "
        "csi or another source"
    )
