"""Many jobs, one pool: which new workers are the job's min workers and which are elastic extras.

The rule (docs/operator.md, "Many jobs, one spot pool"): every job gets its ``replicas.min`` before any
job gets more than its min; among jobs, higher priority first, then earlier start. etj does not allocate
the pool itself: it gives each worker pod the priority that rule asks for and the kube-scheduler enforces
it. Workers up to min run at the job's own PriorityClass (``placement.priorityClassName``); workers beyond
min at the operator's elastic-extra class, lower than every job's and never preempting. So a pending min
worker of any job preempts running extras, pending min workers are bound before pending extras, and two
jobs' min workers of the same priority are bound in queue order (the scheduler's: priority, then time).

A pod's priority is fixed when it is created, so the choice is made per new pod from what the job
already has: a replacement for a lost min worker is a min worker, the rest are extras.
"""

from __future__ import annotations

from collections.abc import Sequence

from etj_operator.observe.pods import PodInfo


def extra_slots(
    job_min: int, survivors: Sequence[PodInfo], creates: Sequence[int], extra_class: str | None
) -> list[int]:
    """The slots among ``creates`` (in the order they are filled) that get the elastic-extra class.

    ``survivors``: the job's workers that stay; those not at the extra class are its min workers. Without
    an extra class (the operator runs without one) every worker runs at the job's priority, as before.
    """
    if extra_class is None:
        return []
    at_min = sum(1 for p in survivors if p.priority_class != extra_class)
    owed = max(0, job_min - at_min)
    return list(creates[owed:])
