"""The demo's shared parts: the script (when to interrupt, when capacity returns), the result, the names
and paths both demos (`local.Demo`, `cluster.ClusterDemo`) and the view use."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[4]
GROUP_PATH = "/apis/etj.dev/v1alpha1"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/elastictrainingjobs.etj.dev"
SPOT_ITN = "aws-node-termination-handler/spot-itn"
INSTANCE = "demo"
JSON = dict[str, Any]


@dataclass
class Script:
    """When the demo interrupts and returns capacity (all in terms of what the job reports)."""

    interrupt_epoch: int = 1  # taint a spot node once training is inside this epoch...
    interrupt_min_world: int = 4  # ...and the world has this many ranks (status.worldSize)
    notice_s: float = 120.0  # AWS gives 120 s; the node goes earlier if its pods are already gone
    return_after_s: float = 5.0  # new spot capacity this long after the interrupted node is gone
    timeout_s: float = 1800.0


@dataclass
class DemoResult:
    status: JSON
    samples: list[JSON] = field(default_factory=list)  # one per poll: t, world, sps, loss, epoch, step
    events: list[tuple[float, str]] = field(default_factory=list)  # the demo's own actions
    run_dir: Path = Path()
    t0: float = 0.0

    @property
    def phase(self) -> str | None:
        return (self.status.get("status") or {}).get("phase")


def add_validation_data(env: list[JSON]) -> None:
    names = {e["name"]: e.get("value") for e in env}
    if "ETJ_VAL_DATA" not in names and names.get("ETJ_DATA"):
        # Without validation data the trainer reports no accuracy, and the demo ends by printing it.
        env.append({"name": "ETJ_VAL_DATA", "value": names["ETJ_DATA"]})
