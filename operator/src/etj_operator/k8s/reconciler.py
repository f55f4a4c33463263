"""Per-job reconcile loop: gather state from the indices, call the planner, apply the plan.

One asyncio task per job serializes that job's reconciles (no two plans for one job run at once) and
is woken ("kicked") by node, pod and job events; its wait timeout is the job's resync timer. The
indices can lag behind our own writes, so the loop keeps short-lived expectations of the pods it just
created or deleted, the way controller-runtime does, and never plans from a view missing its own pods.

The store's HTTP (progress read, replica bounds told) lives in store_client.py; this module gathers,
calls the planner, applies the plan and writes status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from etj_contract.replicas import Replicas
from etj_operator.api.models import CapacityType, ElasticTrainingJobSpec, ElasticTrainingJobStatus
from etj_operator.constants import ROLE_RENDEZVOUS
from etj_operator.decide.objects import dataplane, manifests, names, pod_policy
from etj_operator.decide.plan.planner import FINAL_REPORT_GRACE, JobView, Observed, Plan, plan
from etj_operator.decide.status.invalid_spec import spec_error_message
from etj_operator.k8s import job_objects, kueue_apply, kueue_watch, status_write
from etj_operator.k8s.client import KubeClient, StatusConflict
from etj_operator.k8s.metrics import METRICS, observe_drain
from etj_operator.k8s.rejections import rejections
from etj_operator.k8s.settings import Settings, World
from etj_operator.k8s.status_write import STATUS_WRITE_ATTEMPTS, post_events, record_written
from etj_operator.k8s.store_client import StoreClient, StoreLink
from etj_operator.observe.pods import PodInfo, pod_info
from etj_operator.timeutil import utcnow

log = logging.getLogger(__name__)

EXPECTATION_TTL = 30.0  # seconds an unobserved create/delete of ours is trusted over the index
SERVICE_RECHECK = 300.0


class JobRunner:
    def __init__(
        self,
        namespace: str,
        name: str,
        world: World,
        kube: KubeClient,
        settings: Settings,
        store_http: StoreClient,
        kueue: kueue_watch.KueueIndex | None = None,
    ) -> None:
        self.namespace, self.name = namespace, name
        self.world, self.kube, self.settings, self.kueue = world, kube, settings, kueue
        self.body: Mapping[str, Any] | None = None
        self.kick = asyncio.Event()
        self.status: ElasticTrainingJobStatus | None = None  # last status we wrote (the index may lag)
        self.status_version: str | None = None  # the job's resourceVersion that status belongs to
        self.planned_version: str | None = None  # the version this round's plan was computed from
        self.expect_create: dict[str, tuple[PodInfo, float]] = {}
        self.expect_delete: dict[str, tuple[str, float]] = {}  # name → (uid, deadline)
        self.lost_drains: set[str] = set()  # this round's drains whose delete someone else won
        self.store = StoreLink(store_http, settings.progress_port, self._token)
        self.service_checked = float("-inf")  # monotonic time of the last successful create-or-exists
        self.token: str | None = None  # the job's progress token (derived from its uid once known)
        self.spec_error: str | None = None  # why the operator's model refused the job's spec, if it did
        self.spec_error_said: str | None = None  # the spec error last said on the job (one Event each)
        # The store index this runner last pointed the job's Service at; None: not yet (a restarted
        # operator patches once, which also moves a Service of an older operator onto an index).
        self.serving: int | None = None
        self.create_rejection: str | None = None  # the apiserver's refusal of our last pod create
        self.round_started = utcnow()  # when the current reconcile round began (the drain stages' clock)
        self.task: asyncio.Task[None] | None = None
        self.progress_task: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        # Tasks copy the current context, so kopf's event posting works from inside them.
        self.task = asyncio.create_task(self._loop(), name=f"etj:{self.namespace}/{self.name}")
        if self.settings.progress_seconds > 0:
            self.progress_task = asyncio.create_task(self._poll_progress(), name=f"etj-progress:{self.name}")

    async def stop(self) -> None:
        for task in (self.task, self.progress_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _loop(self) -> None:
        backoff = 1.0
        while True:
            timeout = self.settings.resync_seconds
            try:
                started = time.perf_counter()
                result = await self.reconcile()
                METRICS.reconcile_seconds.observe(time.perf_counter() - started)
                backoff = 1.0
                if result is not None and result.requeue_after is not None:
                    timeout = min(timeout, result.requeue_after)
            except asyncio.CancelledError:
                raise
            except Exception:
                METRICS.reconcile_errors.labels(self.namespace, self.name).inc()
                log.exception(
                    "reconcile of %s/%s failed; retrying in %.0fs", self.namespace, self.name, backoff
                )
                self.status = self.status_version = None  # re-read status from the job next time
                timeout, backoff = backoff, min(backoff * 2, 30.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout)
            self.kick.clear()

    # --- gather ----------------------------------------------------------------------------------
    def _pods(self) -> list[PodInfo]:
        now = time.monotonic()
        seen = {p.name: p for p in self.world.job_pods(self.namespace, self.name)}
        for name, (_, deadline) in list(self.expect_create.items()):
            if name in seen or deadline < now:
                del self.expect_create[name]
        for name, (uid, deadline) in list(self.expect_delete.items()):
            pod = seen.get(name)
            if pod is None or pod.uid != uid or pod.terminating or deadline < now:
                del self.expect_delete[name]
        pods = [replace(p, terminating=True) if p.name in self.expect_delete else p for p in seen.values()]
        pods += [info for info, _ in self.expect_create.values()]
        return pods

    def _owned(self, uid: str) -> list[PodInfo]:
        # Pods of an earlier job with the same name (not yet garbage-collected) are not ours.
        return [p for p in self._pods() if not p.owner_uid or p.owner_uid == uid]

    def _job(self) -> JobView | None:
        body = self.body
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None  # being deleted: the garbage collector removes pods and service
        meta, self.spec_error = body["metadata"], None
        try:
            spec = ElasticTrainingJobSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            # The apiserver validates the same rules; this only happens with a CRD newer than the operator.
            log.error("job %s/%s has an invalid spec: %s", self.namespace, self.name, exc)
            self.spec_error = spec_error_message(exc.errors())
            return None
        status, self.planned_version = self.status, self.status_version
        if status is None:
            status = ElasticTrainingJobStatus.model_validate(body.get("status") or {})
            self.planned_version = meta.get("resourceVersion")
        return JobView(
            self.name,
            self.namespace,
            meta.get("uid", ""),
            int(meta.get("generation") or 0),
            spec,
            status,
            default_image=self.settings.default_trainer_image,
            default_store_image=self.settings.default_store_image,
            prices=self.settings.prices,
            deadline_costs=self.settings.deadline_costs,
            extra_priority_class=self.settings.extra_priority_class,
            kueue=self.kueue.job(meta.get("labels") or {}) if self.kueue is not None else None,
        )

    async def reconcile(self) -> Plan | None:
        self.round_started = utcnow()
        job = self._job()
        if job is None:
            if self.spec_error and self.body is not None:  # said on the job, its pods left alone
                self.spec_error_said = await status_write.report_invalid_spec(
                    self.kube, self.body, self.spec_error, self.spec_error_said
                )
            return None
        self.spec_error_said = None  # readable again: a later error is said again
        pods = self._owned(job.uid)
        if self.settings.progress_seconds > 0 and self.store.awaiting_final_report(pods):
            # Workers exited 0: their final report is in the store now. Read it before the planner may
            # stop the store, instead of waiting for the next poll (which the store's end would outrun).
            await self.store.refresh(self.world.job_pods(self.namespace, self.name))
        obs = Observed(
            nodes=self.world.nodes(),
            pods=pods,
            now=utcnow(),
            node_usage=self.world.node_usage(),
            usage_namespaces=self.settings.namespaces,
            deleted_nodes=self.world.deleted_nodes(),
            progress=self.store.progress,
            progress_time=self.store.progress_time,
            final_report_grace=FINAL_REPORT_GRACE if self.settings.progress_seconds > 0 else timedelta(0),
            create_rejection=self.create_rejection,
            progress_tracked=self.settings.progress_seconds > 0,
            **kueue_apply.kueue_seen(self.kueue, job),
        )
        result = plan(job, obs)
        await self.apply(job, result, {p.name: p for p in pods}, obs)
        if self.settings.progress_seconds > 0:  # the store is spoken to only where progress is read
            await self._tell_bounds(job, pods)
        return result

    # --- apply -----------------------------------------------------------------------------------
    async def apply(self, job: JobView, result: Plan, pods: Mapping[str, PodInfo], obs: Observed) -> None:
        # The Service moves to the new store before the old one is deleted: agents that lose the old
        # store must resolve the new one (decide/plan/store_move.py). If it cannot, the old store stays.
        drains, self.lost_drains = result.drains, set()
        if not await self._serve(job, result.serve_rendezvous):
            drains = [d for d in drains if d.role != ROLE_RENDEZVOUS or d.force]
            self.kick.set()
        # Drains next: they are the latency-critical part (the node is going away).
        await asyncio.gather(
            *(
                self._drain(job, d.pod, pods.get(d.pod), d.signal_since, str(d.reason), force=d.force)
                for d in drains
            )
        )
        await kueue_apply.apply_workloads(
            self.kube, job, result
        )  # a preempted seat's quota, once its worker is gone
        rejection, errors = await self._create_all(job, result)
        attempted = result.create_workers or result.create_rendezvous or rejection or errors
        if attempted or (result.status.current_replicas or 0) >= (result.status.desired_replicas or 0):
            # A round that created everything it wanted, or wants nothing: no refusal stands any more.
            before, self.create_rejection = self.create_rejection, rejection
            if rejection != before:
                self.kick.set()  # the next round's status carries the ReplicaFailure condition and Event
        # Status is written whatever the creates did: a refusal must never hide the job's state.
        await self._write_status(job, result, obs)
        if errors:
            raise errors[0]
        if result.delete_job:
            await self.kube.delete_job(job.namespace, job.name)

    async def _create_all(self, job: JobView, result: Plan) -> tuple[str | None, list[BaseException]]:
        """Create what the plan asks for; the apiserver's refusal (if any) and other errors, not raised."""
        # The job's Service, Secret and NetworkPolicy are not indexed (nothing else needs them): re-assert
        # their existence every few minutes, so a deleted one comes back without a request per reconcile.
        # Before any pod: a pod must never start without its token or outside its policy.
        if result.ensure_service and time.monotonic() - self.service_checked > SERVICE_RECHECK:
            outcomes = await job_objects.ensure_job_objects(
                self.kube, self.settings, job, result, self._token()
            )
            rejection, errors = rejections(outcomes)
            if rejection or errors:
                return rejection, errors
            if self.service_checked == float("-inf"):  # once per job and operator start
                job_objects.warn_unless_enforced(self.body, self.settings, job)
            self.service_checked = time.monotonic()
        if refused := pod_policy.refusal(job.spec, forbid_host_path=self.settings.forbid_host_path):
            return refused, []
        creates: list[Any] = []
        secret = job_objects.token_secret_name(self.settings, job)
        if result.create_rendezvous:
            store = manifests.rendezvous_pod(
                job.spec,
                job=job.name,
                namespace=job.namespace,
                uid=job.uid,
                token_secret=secret,
                image=result.store_image,
                index=result.rendezvous_index,
            )
            creates.append(self._create(store))
        pinned = [(s, CapacityType.SPOT if result.pin_spot else None) for s in result.create_workers]
        pinned += [(s, CapacityType.ON_DEMAND) for s in result.create_on_demand]
        extras = set(result.extra_workers)
        for slot, capacity in pinned:
            extra = slot in extras
            body = manifests.worker_pod(
                job.spec,
                job=job.name,
                namespace=job.namespace,
                uid=job.uid,
                slot=slot,
                token_secret=secret,
                grace_seconds=self.settings.worker_grace_seconds,
                image=result.trainer_image,
                startup_workers=result.startup_workers,
                capacity=capacity,
                avoid_nodes=result.avoid_nodes,
                priority_class=job.extra_priority_class if extra else job.spec.placement.priority_class_name,
                seat=result.worker_seats.get(slot),
            )
            creates.append(self._create(body))
        return rejections(await asyncio.gather(*creates, return_exceptions=True))

    async def _serve(self, job: JobView, store: int | None) -> bool:
        """Point the job's Service at store ``store`` unless it already is; False if that failed."""
        if store is None or store == self.serving:
            return True
        selector = manifests.rendezvous_selector(job.name, store)
        try:
            if await self.kube.select_store(job.namespace, names.rendezvous_name(job.name), selector):
                self.serving = store
                log.info("%s/%s: the store Service selects store %d", job.namespace, job.name, store)
            return True  # no Service yet: it is created selecting ``store`` (job_objects.py)
        except Exception as exc:  # any failure: keep the old store, try again next round
            log.warning(
                "%s/%s: could not switch the store Service to %d: %s", job.namespace, job.name, store, exc
            )
            return False

    async def _drain(
        self,
        job: JobView,
        name: str,
        pod: PodInfo | None,
        since: datetime | None,
        reason: str,
        *,
        force: bool = False,
    ) -> None:
        uid = pod.uid if pod is not None else None
        grace = None  # the pod's own terminationGracePeriodSeconds: time for the JIT checkpoint
        idle = pod is not None and pod.phase in ("Failed", "Succeeded", "Pending") and pod.node is None
        if force or idle:
            grace = 0  # nothing runs (or its node is gone): no reason to wait
        sent = utcnow()
        if not await self.kube.delete_pod(job.namespace, name, uid=uid or None, grace=grace):
            self.lost_drains.add(name)  # gone already: whoever deleted it counts it (_write_status)
        accepted = utcnow()
        self.expect_delete[name] = (uid or "", time.monotonic() + EXPECTATION_TTL)
        self.expect_create.pop(name, None)
        observe_drain(reason, since, self.round_started, sent, accepted)
        log.info("drained %s/%s: %s", job.namespace, name, reason)

    async def _create(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        await self.kube.create_pod(body)  # AlreadyExists is fine: the name is deterministic
        # Parsed from the body: until the index sees the pod, the planner reads its class (min worker or
        # extra: decide/plan/sharing.py) here.
        info = pod_info(body)
        self.expect_create[name] = (info, time.monotonic() + EXPECTATION_TTL)

    def _token(self) -> str:
        """The job's progress token (its uid never changes for one runner: JobRunners.upsert)."""
        if self.token is None:
            uid = ((self.body or {}).get("metadata") or {}).get("uid", "")
            self.token = dataplane.job_token(
                self.settings.token_key, namespace=self.namespace, job=self.name, uid=uid
            )
        return self.token

    async def _write_status(self, job: JobView, result: Plan, obs: Observed) -> None:
        """Write the plan's status on the version of the job it was computed from; on a conflict, plan again.

        By now the plan's drains and creates are done. Its status holds absolute counters (failures, crash
        times) computed from an older job, and its Events describe what was done: dropping both on a 409
        lost a count and an Event (a drained pod is not drained again, so no later plan repeats them). So
        the plan is computed again from the job as it is now and the *same* observation: the same drains,
        crashes and Events, counted once on top of the newer status. Its actions are not applied again.
        A pod whose delete another writer won (a leader handoff: both saw it fail) is theirs to count, with
        or without a conflict: the plan is made without it, or it was counted twice (issue 37).
        """
        if self.lost_drains:
            obs = replace(obs, pods=[p for p in obs.pods if p.name not in self.lost_drains])
            result = plan(job, obs)
        for attempt in range(STATUS_WRITE_ATTEMPTS):
            new = result.status.to_patch()
            if new == job.status.to_patch():
                # Nothing to write, but what was done is still said (a store move changes no status).
                post_events(self.body, result)
                return
            try:
                response = await self.kube.patch_status(job.namespace, job.name, new, self.planned_version)
                break
            except StatusConflict:
                self.status = self.status_version = None
                log.info("status of %s/%s conflicted (%d); planning again", job.namespace, job.name, attempt)
                self.body = await self.kube.get_job(job.namespace, job.name)
                fresh = self._job()  # sets planned_version to the fresh job's
                if fresh is None:
                    return  # gone or being deleted
                job, result = fresh, plan(fresh, obs)
        else:
            post_events(self.body, result)  # what was done stays said, even if the count is lost this time
            raise StatusConflict(f"{job.namespace}/{job.name}: {STATUS_WRITE_ATTEMPTS} conflicts in a row")
        if response is None:
            self.status = self.status_version = None  # gone
            return
        self.status = ElasticTrainingJobStatus.model_validate(response.get("status") or {})
        self.status_version = (response.get("metadata") or {}).get("resourceVersion")
        record_written(job, result)
        post_events(self.body, result)

    # --- progress, and the bounds the running processes need ---------------------------------------
    async def _tell_bounds(self, job: JobView, pods: list[PodInfo]) -> None:
        """The job's replica bounds to its store (store_client.StoreLink.tell_bounds)."""
        await self.store.tell_bounds(Replicas(job.spec.replicas.min, job.spec.replicas.max), pods)

    async def _poll_progress(self) -> None:
        while True:
            await asyncio.sleep(self.settings.progress_seconds)
            if await self.store.refresh(self.world.job_pods(self.namespace, self.name)):
                self.kick.set()
