"""The proclet's Service forwarder: a headless Service's name follows its selector between two live pods
(the store moving make before break), which an address fixed at a pod's start cannot."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading

from etj_testbed.localcluster.proclet.env import LoopbackIPs, ServiceForwarder


class Echo(socketserver.ThreadingTCPServer):
    """Answers each line with its own name and the line: which pod a connection reached."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, ip: str, port: int, name: str) -> None:
        self.name = name
        self.conns: list[socket.socket] = []
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                outer.conns.append(self.connection)
                peer = self.client_address[0]
                for line in self.rfile:
                    self.wfile.write(f"{outer.name}:{line.decode().strip()} from {peer}\n".encode())

        super().__init__((ip, port), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """As the pod's process dies: no more connections, and its open ones end."""
        self.shutdown()
        self.server_close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _ask(conn: socket.socket) -> str:
    conn.sendall(b"hi\n")
    return conn.recv(100).decode()


def test_each_connection_reaches_the_pod_selected_when_it_opens() -> None:
    ips = LoopbackIPs("127.36.0.0/16")
    old = Echo(ips.allocate("old"), 0, "old")
    ip, port = old.server_address[0], old.server_address[1]
    new = Echo(ips.allocate("new"), port, "new")  # the same port on its own address, as the store's
    selected: list[str | None] = [str(ip)]
    fwd = ServiceForwarder(ips.allocate("svc"), {port: port}, lambda: selected[0])
    me = ips.allocate(
        "client"
    )  # the client pod's address: the pod behind the name sees it, not the forwarder
    try:
        held = socket.create_connection((fwd.ip, port), 5, (me, 0))
        assert _ask(held) == f"old:hi from {me}\n"
        selected[0] = str(new.server_address[0])  # the Service is switched to the new pod
        assert _ask(held) == f"old:hi from {me}\n"  # an open connection stays with its pod
        with socket.create_connection((fwd.ip, port), 5, (me, 0)) as fresh:
            assert _ask(fresh) == f"new:hi from {me}\n"  # a new one follows the selector
        old.stop()  # the old pod goes: the connections to it end
        held.sendall(b"again\n")
        assert held.recv(100) == b""
        held.close()
        selected[0] = None  # nothing selected: a connection is closed at once
        with socket.create_connection((fwd.ip, port), timeout=5) as none:
            assert none.recv(100) == b""
    finally:
        fwd.close()
        new.stop()
