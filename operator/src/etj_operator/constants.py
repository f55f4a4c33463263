"""Names shared by the operator's modules: labels, and the node labels that override (ports: etj_contract).

Kept in one place because the worker pods, the indices and the tests must agree on them exactly.
"""

from __future__ import annotations

from etj_operator.api.models import GROUP

# Labels on every pod and service the operator creates. The job label is what the pod index keys on,
# so a restarted operator finds its own pods without listing anything.
LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"
LABEL_SLOT = f"{GROUP}/slot"
# A worker pod pinned to one capacity type (spot, on-demand) by the deadline policy; absent: unpinned.
LABEL_CAPACITY = f"{GROUP}/capacity"
# A store pod's index (its name's suffix). The job's Service selects one index: the serving store. A store
# moving off a drained node starts under a new index, outside the Service, and is switched in once Ready
# (decide/plan/store_move.py).
LABEL_STORE = f"{GROUP}/store"
# The nodes a worker pod was created to avoid (comma-separated; status.avoidedNodes then): a Pending pod whose
# list names a node no longer avoided is recreated, or it would wait for ever off a node it may use again.
ANNOTATION_AVOIDED_NODES = f"{GROUP}/avoided-nodes"
# The Kueue Workload a worker pod runs under (docs/kueue.md): the job's base Workload (replicas.min workers)
# or one of its extra seats (one worker each). Its value is the Workload's name.
LABEL_KUEUE_SEAT = f"{GROUP}/kueue-seat"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "etj-operator"
ROLE_WORKER = "worker"
ROLE_RENDEZVOUS = "rendezvous"

# Node label that overrides every cloud convention (values: spot, on-demand) and names the pool.
LABEL_CAPACITY_OVERRIDE = f"{GROUP}/capacity-type"
LABEL_POOL_OVERRIDE = f"{GROUP}/pool"
