"""The progress document: what the trainer's rank 0 POSTs to ``ETJ_PROGRESS_URL`` and the operator reads.

The channel is trainer → store pod (``POST /progress``) → operator (``GET /progress``, every few seconds).
POSTs from different ranks can arrive out of order (a leaving rank 0's last report can land after the new
rank 0's first), and a poll can miss any single document, so nothing the operator must see may live in one
document only. Two rules make the channel lossless for what matters:

- ``resizes`` is append-only: the store keeps the union of every report's resize records (``merge``), so a
  stale document cannot take one back;
- ``finished``/``accuracy`` are sticky: once a finished report is stored, later stale reports cannot unset
  it, and the trainer POSTs that final report synchronously, retrying until the store acknowledges it
  (``etj_trainer.core.progress``);
- ``lastError`` (the last line of a crashed worker's error, sent by its agent in a report of its own,
  without a step) stays until a newer error replaces it: an error report changes nothing else, and a
  training report without one does not clear it (the operator shows it when the step stops advancing);
- ``crashes`` counts the agents' crash reports (``crash: true`` with ``lastError``, one per worker group an
  agent restarted after a crash): the store adds them up, so no report can take one back, and the operator
  counts the increase between two reads (a crash loop that makes progress between crashes is still a
  loop; the agent's own budget restarts its count after progress).

Wire names are camelCase (JSON); unknown or malformed fields are dropped on parse, never fatal: the channel
must not break the operator whatever a trainer image sends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeGuard

PROGRESS_PATH = "/progress"
# How long a finishing rank 0 retries its final report; the operator waits longer than this for it before
# marking the job Succeeded without it (etj_operator decide/plan/model.py FINAL_REPORT_GRACE).
FINAL_REPORT_DEADLINE_S = 60.0
MAX_RESIZES = 100
# The store's HTTP endpoint answers only requests carrying the job's token (ETJ_PROGRESS_TOKEN, from the
# job's Secret) in this header, as "Bearer <token>"; /healthz stays open for probes. A store started
# without a token (``etj-train local`` on loopback) accepts any request.
TOKEN_HEADER = "Authorization"
TOKEN_SCHEME = "Bearer"
# Bodies above this size are refused unread (413): a report with MAX_RESIZES records is ~20 KB, and an
# unbounded body would let one request exhaust the store pod's memory.
MAX_BODY_BYTES = 256 * 1024
MAX_ERROR_CHARS = 1024  # lastError is one line, the cause a human reads in the job's status and Events


def auth_header(token: str | None) -> dict[str, str]:
    """The request header that carries ``token``; empty without one."""
    return {TOKEN_HEADER: f"{TOKEN_SCHEME} {token}"} if token else {}


# a trainer's history is bounded: the operator keeps fewer (status.resizeHistory) anyway


class TrainerResize(StrEnum):
    """The reasons a trainer gives its own resize records; the operator's reasons (why) replace them."""

    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"


class StatePath(StrEnum):
    """How the trained state crossed a resize (a record's ``path``; status.resizeHistory[].statePath)."""

    IN_PLACE = "InPlace"  # kept in memory by the ranks that stayed; a joiner got it from a peer
    IN_PLACE_RESHARDED = "InPlaceResharded"  # sharded: gathered before the change, resharded in memory
    RESTART = "Restart"  # the world restarted and restored the newest checkpoint (resharded if sharded)


@dataclass(frozen=True)
class ResizeRecord:
    """One change of the trainer's world size, as the trainer saw it: ``from_``/``to`` count ranks (the
    operator's status.resizeHistory counts worker pods: ranks / processes per pod).

    ``time`` (RFC 3339, UTC) is when the new world finished its first step; ``pauseSeconds`` is the time
    without steps around the change; ``stepsLost`` the steps redone after a restore.
    """

    time: str
    from_: int
    to: int
    reason: str = ""
    pause_seconds: float | None = None
    steps_lost: int | None = None
    path: str = ""  # a StatePath; empty from a trainer older than the field

    @property
    def key(self) -> tuple[str, int, int]:
        """Identity of the record: the trainer writes one record per (time, from, to)."""
        return (self.time, self.from_, self.to)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"time": self.time, "from": self.from_, "to": self.to, "reason": self.reason}
        if self.pause_seconds is not None:
            out["pauseSeconds"] = self.pause_seconds
        if self.steps_lost is not None:
            out["stepsLost"] = self.steps_lost
        if self.path:
            out["statePath"] = self.path
        return out

    @classmethod
    def from_json(cls, raw: Any) -> ResizeRecord | None:
        """The record, or None when ``raw`` is not a well-formed one."""
        if not isinstance(raw, dict):
            return None
        time, frm, to = raw.get("time"), raw.get("from"), raw.get("to")
        if not isinstance(time, str) or not _count(frm) or not _count(to):
            return None
        pause, lost, reason = raw.get("pauseSeconds"), raw.get("stepsLost"), raw.get("reason")
        path = raw.get("statePath")
        return cls(
            time=time,
            from_=frm,
            to=to,
            reason=reason if isinstance(reason, str) else "",
            pause_seconds=float(pause) if _nonneg_number(pause) else None,
            steps_lost=lost if _count(lost) else None,
            path=path if path in set(StatePath) else "",
        )


# Scalar fields: attribute name → wire name. One table, so to_json and from_json cannot drift apart.
_WIRE = {
    "epoch": "epoch",
    "step": "step",
    "samples_seen": "samplesSeen",
    "samples_total": "samplesTotal",
    "samples_per_second": "samplesPerSecond",
    "loss": "loss",
    "world_size": "worldSize",
    "per_rank_batch": "perRankBatch",
    "per_worker_batch": "perWorkerBatch",
    "accumulation_steps": "accumulationSteps",
    "lr_multiplier": "lrMultiplier",
    "lr": "lr",
    "accuracy": "accuracy",
    "failed_writes": "failedWrites",
}
_INTS = frozenset(
    {"epoch", "step", "samples_seen", "samples_total", "world_size", "per_rank_batch", "per_worker_batch"}
    | {"accumulation_steps", "failed_writes"}
)


@dataclass(frozen=True)
class ProgressDoc:
    """One progress report (docs/contract.md, "Progress channel")."""

    epoch: int | None = None
    step: int | None = None
    samples_seen: int | None = None
    # Samples the whole run trains (epochs x dataset size): with samplesSeen, how far along the job is
    # (the operator's deadline policy projects the finish from it).
    samples_total: int | None = None
    samples_per_second: float | None = None
    loss: float | None = None
    world_size: int | None = None  # ranks (training processes), not pods
    per_rank_batch: int | None = None  # the largest rank's share of the step
    per_worker_batch: int | None = None  # the largest pod's share: its ranks' shares together
    accumulation_steps: int | None = None  # micro-batches of the largest rank's share
    lr_multiplier: float | None = None
    lr: float | None = None  # the LR in force: base x schedule factor (samples seen) x lr_multiplier
    last_checkpoint: dict[str, Any] | None = None  # {step, path, time}: a shared write confirmed done
    # While writes of the shared checkpoint fail: how many in a row, and the newest one's error (the
    # operator's CheckpointDurable condition). Unset again once one is written.
    failed_writes: int | None = None
    checkpoint_error: str | None = None
    resizes: tuple[ResizeRecord, ...] = field(default_factory=tuple)
    finished: bool = False
    accuracy: float | None = None  # at the end, on the validation set
    # The last error line of a crashed training process (the agent reports it when it restarts one); the
    # operator names it when the step stops advancing (the Progressing condition).
    last_error: str | None = None
    # Crash reports the store has counted (it sets this; a trainer never sends it) and whether this report
    # is one (the agent's, when it restarts its crashed workers). The store keeps the sum, never the flag.
    crashes: int | None = None
    crash: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for attr, wire in _WIRE.items():
            value = getattr(self, attr)
            if value is not None:
                out[wire] = value
        if self.last_checkpoint is not None:
            out["lastCheckpoint"] = self.last_checkpoint
        out["resizes"] = [r.to_json() for r in self.resizes]
        out["finished"] = self.finished
        if self.last_error is not None:
            out["lastError"] = self.last_error
        if self.checkpoint_error is not None:
            out["checkpointError"] = self.checkpoint_error
        if self.crashes is not None:
            out["crashes"] = self.crashes
        if self.crash:
            out["crash"] = True
        return out

    @classmethod
    def from_json(cls, raw: Any) -> ProgressDoc:
        """Parse leniently: every field that does not parse is left unset."""
        if not isinstance(raw, dict):
            return cls()
        values: dict[str, Any] = {}
        for attr, wire in _WIRE.items():
            value = raw.get(wire)
            if attr in _INTS and _count(value):
                values[attr] = value
            elif attr not in _INTS and _finite_number(value):
                values[attr] = float(value)
        ckpt = raw.get("lastCheckpoint")
        if isinstance(ckpt, dict):
            values["last_checkpoint"] = dict(ckpt)
        resizes = raw.get("resizes")
        if isinstance(resizes, list):
            values["resizes"] = tuple(r for r in map(ResizeRecord.from_json, resizes) if r is not None)
        values["finished"] = raw.get("finished") is True
        error = raw.get("lastError")
        if isinstance(error, str) and error.strip():
            values["last_error"] = error.strip().splitlines()[-1][:MAX_ERROR_CHARS]
        ckpt_error = raw.get("checkpointError")
        if isinstance(ckpt_error, str) and ckpt_error.strip():
            values["checkpoint_error"] = ckpt_error.strip()[:MAX_ERROR_CHARS]
        crashes = raw.get("crashes")
        if _count(crashes):
            values["crashes"] = crashes
        values["crash"] = raw.get("crash") is True
        return cls(**values)


def merge(stored: ProgressDoc | None, incoming: ProgressDoc) -> ProgressDoc:
    """What the store keeps after ``incoming`` arrives on top of ``stored``.

    The newer report wins for the counters, except that a finished report is never replaced by an
    unfinished one (a late report of a leaving rank cannot un-finish the job) nor a report with a step by
    one without (an error-only report), the resize records are the union of both, in time order, so no
    report can take one back, the last error stays until a newer one replaces it, and ``crashes`` is the
    stored count plus one for a crash report (a count a trainer sends is ignored: only the store counts).
    """
    before = stored.crashes if stored is not None else None
    crashes = (before or 0) + 1 if incoming.crash else before
    if stored is None:
        return replace(incoming, crashes=crashes, crash=False)
    # A report without a step (e.g. the agent's error-only report) updates no counters.
    keep = (stored.finished and not incoming.finished) or (incoming.step is None and stored.step is not None)
    base = stored if keep else incoming
    seen: dict[tuple[str, int, int], ResizeRecord] = {}
    for record in (*stored.resizes, *incoming.resizes):
        # A record seen twice keeps its fuller copy (a pause known to one report only is not dropped).
        old = seen.get(record.key)
        if old is None or (old.pause_seconds is None and record.pause_seconds is not None):
            seen[record.key] = record
    resizes = tuple(sorted(seen.values(), key=lambda r: r.time))[-MAX_RESIZES:]
    # The last error is sticky: the operator shows it only while the step stands still.
    error = incoming.last_error or stored.last_error
    return replace(base, resizes=resizes, last_error=error, crashes=crashes, crash=False)


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _finite_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _nonneg_number(value: object) -> TypeGuard[int | float]:
    return _finite_number(value) and value >= 0


__all__ = [
    "FINAL_REPORT_DEADLINE_S",
    "MAX_BODY_BYTES",
    "MAX_ERROR_CHARS",
    "MAX_RESIZES",
    "PROGRESS_PATH",
    "TOKEN_HEADER",
    "TOKEN_SCHEME",
    "ProgressDoc",
    "ResizeRecord",
    "TrainerResize",
    "auth_header",
    "merge",
]
