"""etj_contract.env is the one list of ETJ_* variables: the operator sets, and the trainer reads, from it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from etj_contract import env as etj_env
from etj_operator.api.pod import RESERVED_ENV
from etj_operator.decide.objects.pod_env import worker_env
from etj_trainer import cli
from etj_trainer.agent.agent_config import AgentConfig
from etj_trainer.config import TrainConfig
from tests.operator.factories import job

SAMPLE = {int: "7", float: "0.5", str: "DynamicSGD", Path: "/p", etj_env.truthy: "true"}
# A variable that means something only beside another: the shard-group size is HSDP's.
COMPANION = {etj_env.SHARD_GROUP_SIZE.name: (etj_env.PARALLELISM, "HSDP")}


def _sample(var: etj_env.Var[Any]) -> tuple[str, Any]:
    if isinstance(var.parse, etj_env.Choice):
        raw = var.parse.options[-1]  # not the default
    elif var.parse is etj_env.floats:
        raw = "0.5,2"
    else:
        raw = SAMPLE[var.parse]
    return raw, var.parse(raw)


def test_names_are_unique_and_prefixed() -> None:
    names = [v.name for v in etj_env.ALL]
    assert len(names) == len(set(names)) and all(n.startswith("ETJ_") for n in names)


def test_the_operator_sets_exactly_the_reserved_variables_in_the_contracts_order() -> None:
    spec = job().spec
    names = [
        e["name"]
        for e in worker_env(spec, job="j", namespace="ns", uid="u", token_secret="tok", pod="j-worker-0")
    ]
    assert names == [*RESERVED_ENV, "HOME", "POD_IP"]
    assert tuple(v.name for v in etj_env.ALL if v.set_by == etj_env.SetBy.OPERATOR) == RESERVED_ENV


@pytest.mark.parametrize("var", etj_env.CONFIG_FIELDS, ids=lambda v: v.name)
def test_every_config_variable_reaches_its_train_config_field(var: etj_env.Var[Any]) -> None:
    raw, value = _sample(var)
    env = {var.name: raw}
    if var.name in COMPANION:
        other, other_raw = COMPANION[var.name]
        env[other.name] = other_raw
    assert getattr(TrainConfig.from_env(env), str(var.field)) == value


@pytest.mark.parametrize("var", etj_env.TRAIN_FLAGS, ids=lambda v: v.name)
def test_every_train_flag_reaches_its_field_through_the_environment(var: etj_env.Var[Any]) -> None:
    raw, value = _sample(var)
    parser = argparse.ArgumentParser()
    cli._add_train_flags(parser)
    args = ["--" + str(var.field).replace("_", "-"), raw]
    if var.name in COMPANION:
        other, other_raw = COMPANION[var.name]
        args += ["--" + str(other.field).replace("_", "-"), other_raw]
    ns = parser.parse_args(args)
    assert getattr(TrainConfig.from_env(cli._train_env(ns)), str(var.field)) == value


def test_unset_and_empty_variables_keep_the_defaults() -> None:
    assert TrainConfig.from_env({"ETJ_LR": "", "ETJ_EPOCHS": ""}) == TrainConfig()


def test_agent_config_reads_its_variables() -> None:
    base = {"ETJ_RDZV_ENDPOINT": "h:1"}
    agent = AgentConfig.from_env(base)
    assert (agent.run_id, agent.min_nodes, agent.max_nodes, agent.fast_restart) == ("etj", 1, 1, True)
    tuned = AgentConfig.from_env(
        {**base, "ETJ_FAST_RESTART": "0", "ETJ_LAST_CALL_TIMEOUT": "2.5", "ETJ_KEEP_ALIVE_INTERVAL": "4"}
    )
    assert (tuned.fast_restart, tuned.last_call_timeout, tuned.keep_alive_interval) == (False, 2.5, 4)


def test_the_launcher_vocabulary_is_the_contracts() -> None:
    """spec.trainer.launcher's values are the ones the trainer reads (one vocabulary, issue 51 item 2)."""
    from etj_operator.api.pod import Launcher

    assert tuple(m.value for m in Launcher) == etj_env.LAUNCHERS
