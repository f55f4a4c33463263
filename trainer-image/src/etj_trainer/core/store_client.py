"""Clients of the job's TCPStore (the store pod): every one the trainer opens is made here.

``use_libuv`` picks the *server's* event loop; a client speaks the same protocol to either server. But a
torch built without libuv refuses ``use_libuv=True`` even for a client ("use_libuv was requested but
PyTorch was built without libuv support"), and True is TCPStore's default: Debian's python3-torch, which
the store image and the Debian CPU trainer image run, is such a torch. Found on kind: every agent of the
Debian CPU image took that refusal for a store still starting and waited for it until its deadline. So
clients always ask for the non-libuv client, which every torch has.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from etj_contract import env as etj_env
from etj_contract.ports import RDZV_PORT
from etj_trainer.core import stopping

# For ``init_process_group``'s env:// rendezvous where rank 0 hosts the group's store (no agent store):
# torch/distributed/rendezvous.py reads this query parameter, else $USE_LIBUV, default on.
ENV_INIT_METHOD = "env://?use_libuv=0"


def client(host: str, port: int, timeout: timedelta, *, multi_tenant: bool = False) -> dist.TCPStore:
    """A client of the TCPStore at ``host``, ``port``."""
    return dist.TCPStore(
        host, port, is_master=False, timeout=timeout, multi_tenant=multi_tenant, use_libuv=False
    )


def connect(endpoint: str, timeout: timedelta, *, multi_tenant: bool = False) -> dist.TCPStore:
    """A client of the TCPStore at ``host[:port]`` (torch's parsing: IPv6 in brackets, RDZV_PORT if none)."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(endpoint, default_port=RDZV_PORT)
    return client(host, port, timeout, multi_tenant=multi_tenant)


def job_store() -> dist.TCPStore:
    """A worker's client of its job's store ($ETJ_RDZV_ENDPOINT), with the bounded collective timeout (the
    join, recovery and regroup protocols)."""
    return connect(os.environ[etj_env.RDZV_ENDPOINT.name], stopping.collective_timeout())
