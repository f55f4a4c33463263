"""The rendezvous pod's ports: the operator's Service and probes, the trainer's store server, the workers."""

from __future__ import annotations

RDZV_PORT = 29400  # the TCPStore of torch elastic's c10d rendezvous
PROGRESS_PORT = 29401  # HTTP: rank 0 POSTs progress here, the operator GETs it
# The store process's descriptor limit, so its connections: a job's ranks hold 2-3 each (the agent's
# rendezvous client, rank 0's join door, regroup and recovery clients), so thousands of ranks fit; a
# client opening connections without end meets the limit instead of exhausting the node.
STORE_MAX_OPEN_FILES = 16384
