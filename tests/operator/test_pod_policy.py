"""--forbid-host-path (the chart's security.forbidHostPath): a job with a hostPath trainer volume is refused
with a reason of its own (issue 37 item 5). The operator end: tests/integration/test_pod_policy.py."""

from __future__ import annotations

from typing import Any

import pytest

from etj_operator.api.models import ElasticTrainingJobSpec
from etj_operator.decide.objects.pod_policy import refusal
from etj_operator.decide.status.conditions import ConditionReason, rejection_reason
from tests.operator.factories import spec

HOST = {"name": "host", "hostPath": {"path": "/var/lib/kubelet"}}
PVC = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
CASES: dict[str, tuple[list[dict[str, Any]], bool, str | None]] = {
    # name: (trainer.volumes, --forbid-host-path, what the refusal says; None: none)
    "no volumes": ([], True, None),
    "a claim": ([PVC], True, None),
    "a hostPath, allowed": ([PVC, HOST], False, None),
    "a hostPath, forbidden": ([PVC, HOST], True, "HostPathForbidden: trainer.volumes host: hostPath volumes"),
}


@pytest.mark.parametrize("case", CASES)
def test_host_path_volumes_are_refused_where_forbidden(case: str) -> None:
    volumes, forbid, says = CASES[case]
    body = spec().model_dump(mode="json", by_alias=True, exclude_none=True)
    body["trainer"]["volumes"] = volumes
    found = refusal(ElasticTrainingJobSpec.model_validate(body), forbid_host_path=forbid)
    if says is None:
        assert found is None
        return
    assert found is not None and found.startswith(says), found
    assert rejection_reason(found) == ConditionReason.HOST_PATH_FORBIDDEN
