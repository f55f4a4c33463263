"""The rendezvous pod's ports: the operator's Service and probes, the trainer's store server, the workers."""

from __future__ import annotations

RDZV_PORT = 29400  # the TCPStore of torch elastic's c10d rendezvous
PROGRESS_PORT = 29401  # HTTP: rank 0 POSTs progress here, the operator GETs it
