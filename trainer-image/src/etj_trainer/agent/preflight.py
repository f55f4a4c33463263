"""Refusing missing or bad input before any process starts (``etj-train local|train|worker``).

Without it, a job with no data or a model that does not import started a store, agents and workers, and
the error came from deep in a worker (``ValueError: dataset_size must be positive`` for a missing
``--data``), named nothing the user had typed, and under ``etj-train worker`` crash-looped first. Here
the inputs are checked where they are given -- the data sets, the model, the script -- and each problem
names its flag (``--data``) or, for a pod, its variable (``ETJ_DATA``, from ``spec.training``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etj_contract import env as etj_env
from etj_trainer.classifier.model_specs import model_problem
from etj_trainer.data.specs import data_problem


@dataclass(frozen=True)
class Refusal:
    var: etj_env.Var[Any]  # the setting at fault
    problem: str

    @property
    def flag(self) -> str:
        return "--" + (self.var.field or self.var.name.removeprefix("ETJ_").lower()).replace("_", "-")

    def for_cli(self) -> str:
        return f"{self.flag}: {self.problem}"

    def for_env(self) -> str:
        return f"{self.var.name}: {self.problem}"


def script_problem(raw: str) -> str | None:
    """``ETJ_SCRIPT`` (a JSON argv): a readable file, or ``-m`` a module that can be found."""
    try:
        argv = json.loads(raw)
    except ValueError as e:
        return f"not a JSON list ({e})"
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return "not a JSON list of strings with the script first"
    if argv[0] == "-m":
        name = argv[1] if len(argv) > 1 else ""
        try:
            found = bool(name) and importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        return None if found else f"-m {name}: no such module"
    path = Path(argv[0])
    if not path.is_file():
        return f"{path}: no such file"
    if not os.access(path, os.R_OK):
        return f"{path}: not readable by this user"
    return None


def check(env: Mapping[str, str], deep: bool = True) -> list[Refusal]:
    """Every problem with the job's inputs in ``env`` (the ``ETJ_*`` variables a worker would get).

    ``deep``: import the model's module (``etj-train local|train``); shallow, for ``etj-train worker``,
    which must not import torch before its forkserver does, it reads the module's source
    (classifier/model_specs.py). Standard library only either way until a deep check imports the model,
    but for the checkpoint bucket's probe (``_checkpoint_store``: the S3 client, over the network).
    """
    found = _checkpoint_store(env)
    script = etj_env.SCRIPT.read(env)
    if script:  # a script opens its own data and builds its own model
        problem = script_problem(script)
        return found + ([Refusal(etj_env.SCRIPT, problem)] if problem else [])
    data = etj_env.DATA.read(env) or ""
    problem = data_problem(data)
    if problem is not None:
        if not data:
            problem += " (the built-in trainer's data; or run your own loop with --script PATH)"
        found.append(Refusal(etj_env.DATA, problem))
    val = etj_env.VAL_DATA.read(env)
    if val and (problem := data_problem(val, "val")) is not None:
        found.append(Refusal(etj_env.VAL_DATA, problem))
    model = etj_env.MODEL.read(env)  # unset: the built-in default, which exists
    if model and (problem := model_problem(model, deep)) is not None:
        found.append(Refusal(etj_env.MODEL, problem))
    return found


def _checkpoint_store(env: Mapping[str, str]) -> list[Refusal]:
    """The bucket check: ``--checkpoint-uri`` can be listed and written (a probe object, deleted after).
    Without it a job whose bucket was unreachable trained a whole interval (or, issue 37, a whole run)
    before its first shared write failed."""
    uri = etj_env.CHECKPOINT_URI.read(env)
    if not uri:
        return []
    from etj_trainer.checkpoint.object_store import probe_problem  # minio: no torch

    problem = probe_problem(uri, env)
    return [Refusal(etj_env.CHECKPOINT_URI, problem)] if problem else []
