"""``/healthz`` of a replica that stands by for the leader Lease.

kopf serves the liveness endpoint only once it runs, and under leader election only the Lease's holder
runs kopf. A standby with nothing on its health port fails the chart's liveness probe (the kubelet
restarts it every minute) and never turns Ready, so a rolling update (``maxUnavailable: 0``) waits on it
forever: `helm upgrade --wait` timed out on kind. A standby is healthy by being alive and trying for the
Lease, so this answers 200 until the replica leads; then it closes and kopf's endpoint takes the port.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEALTH_PATH = "/healthz"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path.split("?", 1)[0] == HEALTH_PATH
        body = json.dumps({"role": "standby"} if found else {"error": "not found"}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a probe every 5 s would flood the log


class StandbyHealth:
    """The health endpoint on ``port`` in a daemon thread, until ``close()``."""

    def __init__(self, port: int, host: str = "0.0.0.0") -> None:
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="standby-health", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop answering and free the port (kopf binds it next)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
