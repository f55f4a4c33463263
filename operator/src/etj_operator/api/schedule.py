"""Deadline, on-demand cap and prices (spec), and the schedule and cost the operator reports (status).

Issue 28: "have this model by Friday, as cheaply as possible". A job without ``spec.deadline`` behaves as
before (no on-demand workers are added for the schedule); with one, the operator trains on spot and adds
on-demand workers only while the job would otherwise miss it (decide/deadline/policy.py).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from etj_operator.api._base import ApiModel, Time, cel, rules

MAX_DEADLINE_SECONDS = 366 * 86_400  # a year: longer is a typo, not a training run
MAX_PRICE = 100_000.0  # USD per worker-hour: an upper bound that still catches unit mistakes (cents)
MAX_RELEASED_NAMES = 32  # status.schedule.onDemandReleased keeps the newest names: status stays small
PodName = Annotated[str, Field(max_length=253)]

# The operator's default prices when neither the spec nor the chart gives any (the chart's values.yaml
# carries the same numbers). Named in status.cost.priceSource so a reader knows what the cost is based on.
DEFAULT_PRICE_ON_DEMAND = 3.06  # USD/h, AWS p3.2xlarge (1x V100) on-demand, Linux, us-east-1 list price
DEFAULT_PRICE_SPOT = 0.918  # 30 % of on-demand: an assumption (docs/economics.md, "Prices")
DEFAULT_PRICE_SOURCE = (
    "operator default: AWS p3.2xlarge us-east-1 on-demand list price $3.06/h; spot assumed 30% of it"
)


class DeadlineSpec(ApiModel):
    """When the job must be done, and how many on-demand workers it may add to get there."""

    model_config = {
        "json_schema_extra": rules(
            cel(
                "has(self.finishBy) != has(self.withinSeconds)",
                "set exactly one of deadline.finishBy and deadline.withinSeconds",
            ),
        )
    }

    finish_by: Time | None = Field(
        default=None, description="Absolute deadline (RFC 3339), e.g. 2026-12-04T17:00:00Z."
    )
    within_seconds: int | None = Field(
        default=None,
        ge=60,
        le=MAX_DEADLINE_SECONDS,
        description="Deadline as a duration from the job's start (status.startTime).",
    )
    max_on_demand_workers: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="Most on-demand workers the operator adds to stay on schedule; unset: up to "
        "replicas.max; 0: never (the deadline is then only reported).",
    )

    @model_validator(mode="after")
    def _check(self) -> DeadlineSpec:
        if (self.finish_by is None) == (self.within_seconds is None):
            raise ValueError("set exactly one of deadline.finishBy and deadline.withinSeconds")
        return self


class PricesSpec(ApiModel):
    """USD per worker-hour by capacity type, for status.cost; unset ones come from the operator (chart)."""

    spot_per_hour: float | None = Field(
        default=None, ge=0, le=MAX_PRICE, description="USD per spot worker-hour."
    )
    on_demand_per_hour: float | None = Field(
        default=None, ge=0, le=MAX_PRICE, description="USD per on-demand worker-hour."
    )


class WorkersByCapacity(ApiModel):
    """Running worker pods by the capacity type of their node."""

    spot: int = Field(default=0, ge=0, description="Workers on spot nodes.")
    on_demand: int = Field(default=0, ge=0, description="Workers on on-demand nodes.")


class CostStatus(ApiModel):
    """Money spent on the job's worker pods so far (running workers x price x time)."""

    usd: float = Field(default=0.0, ge=0, description="Cost so far in USD.")
    spot_worker_seconds: float = Field(default=0.0, ge=0, description="Spot worker-seconds so far.")
    on_demand_worker_seconds: float = Field(default=0.0, ge=0, description="On-demand worker-seconds so far.")
    price_source: Annotated[str, Field(max_length=512)] = Field(
        default="", description="Where the prices come from: the spec, or the operator's (chart) defaults."
    )
    update_time: Time | None = Field(default=None, description="When the cost was last added up.")


class ScheduleStatus(ApiModel):
    """Where the job stands against its deadline."""

    deadline: Time | None = Field(default=None, description="The deadline in force (absolute).")
    projected_finish: Time | None = Field(
        default=None, description="When the job finishes at its current rate (unset: no rate measured yet)."
    )
    slack_seconds: int | None = Field(
        default=None,
        description="Seconds ahead of (positive) or behind (negative) the straight line from start to the "
        "deadline (Uniform Progress).",
    )
    on_demand_wanted: int | None = Field(
        default=None, ge=0, description="On-demand workers the deadline policy asks for now."
    )
    reason: Annotated[str, Field(max_length=256)] = Field(
        default="", description="Why the policy decided what it did (one CamelCase word)."
    )
    # Written with the decision, not read back from a resize: a release that coincides with spot workers
    # joining (the running count rises or stays) or of a worker still pending changes no world size, so
    # status.resizeHistory may never say OnDemandReleased (issue 36).
    on_demand_released: Annotated[list[PodName], Field(max_length=MAX_RELEASED_NAMES)] = Field(
        default_factory=list,
        description="On-demand worker pods the policy released, oldest first (the newest 32); each "
        "release is also an OnDemandReleased Event naming them.",
    )
