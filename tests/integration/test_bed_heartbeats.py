"""The test bed's kwok nodes heartbeat through node Leases, as kubelets do (issue 29): the Lease is renewed
while the Node object is not rewritten, so a bed of many nodes does not flood every node watcher."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

from etj_testbed.localcluster import toolchain
from tests.integration.opbed import Bed


def test_kwok_is_configured_for_lease_heartbeats() -> None:
    assert any("heartbeat-with-lease" in stage for stage in toolchain.KWOK_STAGES)
    assert not any(stage.endswith("node/heartbeat/node-heartbeat.yaml") for stage in toolchain.KWOK_STAGES)


def test_a_kwok_node_renews_its_lease_without_rewriting_the_node(bed: Bed) -> None:
    name = bed.node("lease", "on-demand")
    leases = client.CoordinationV1Api(bed.cluster.api_client())

    def lease() -> Any:
        try:
            return leases.read_namespaced_lease(name, "kube-node-lease")
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    bed.wait("the node's Lease", lambda: lease() is not None, 60)
    # Ready is kwok's write; the controller-manager answers a new node with writes of its own (the not-ready
    # taint removed, its TTL annotation), each of which may land seconds later on a loaded machine, and CI
    # caught one landing after the taint was gone. So the baseline is the Node as it is after a first
    # renewal, when those have long settled, and the claim is about the renewal after it.
    bed.wait("the node Ready and untainted", lambda: _settled(bed.core.read_node(name)), 60)
    first = lease().spec.renew_time
    bed.wait("a first Lease renewal", lambda: lease().spec.renew_time != first, 60)
    node = cast(Any, bed.core.read_node(name))
    second = lease().spec.renew_time
    # One more renewal (every 40 s / 4 = 10 s) while the Node object stays as it was.
    bed.wait("a second Lease renewal", lambda: lease().spec.renew_time != second, 60)
    after = cast(Any, bed.core.read_node(name))
    assert after.metadata.resource_version == node.metadata.resource_version, _writers(after)


def _settled(node: Any) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    tainted = any(t.key == "node.kubernetes.io/not-ready" for t in (node.spec.taints or []))
    return ready and not tainted


def _writers(node: Any) -> str:
    return "the Node was rewritten; its writers: " + ", ".join(
        f"{m.manager} {m.operation} {m.subresource or ''} at {m.time}"
        for m in node.metadata.managed_fields or []
    )
