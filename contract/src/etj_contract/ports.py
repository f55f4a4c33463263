"""The rendezvous pod's ports: the operator's Service and probes, the trainer's store server, the workers."""

from __future__ import annotations

RDZV_PORT = 29400  # the TCPStore of torch elastic's c10d rendezvous
PROGRESS_PORT = 29401  # HTTP: rank 0 POSTs progress here, the operator GETs it
# The store process's descriptor limit, so its connections: a job's ranks hold 2-3 each (the agent's
# rendezvous client, rank 0's join door, regroup and recovery clients), so thousands of ranks fit; a
# client opening connections without end meets the limit instead of exhausting the node.
STORE_MAX_OPEN_FILES = 16384
# The store's own deadlines and caps against a client that holds it (issue 37; docs/operator.md, "Store
# image" and "Threat model"), kept here with the rest of the store's settings: the store uses them, the
# operator's probe and the docs quote them.
# A TCPStore query (torch's client writes each one whole, in one flush) must arrive complete this long after
# its first byte, and a new connection must send torch's handshake this long after it is accepted; else the
# relay closes it. Far above a query's transfer time (a 64 MiB value at 10 MB/s is under 7 s).
STORE_QUERY_DEADLINE_S = 10.0
# Connections one peer address may hold on the relayed TCPStore: a pod's clients are its agent's and each
# rank's 2-4 (8 ranks: ~40); three times that, so one pod cannot take the whole cap.
STORE_CONNECTIONS_PER_SOURCE = 128
# The HTTP server: a request line and headers must arrive within this of the accept (a client sends them in
# one packet), and so many clients may be reading theirs at once; past that the oldest is dropped.
STORE_HTTP_HEADER_DEADLINE_S = 5.0
STORE_HTTP_PENDING = 256
# The store pod's readiness probe: a set and a get through the store's own TCPStore port, answered by the
# HTTP server (200 or 503), within this (the probe's own timeout is longer).
STORE_READY_PATH = "/readyz"
STORE_READY_TIMEOUT_S = 2.0
