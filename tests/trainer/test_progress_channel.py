"""The trainer's final report reaches the store even when the store drops or delays it (issue 12: the job's
end used to outrun its last report, and status never got the accuracy)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from etj_trainer.core.progress import ProgressReporter, get_json, post_json
from etj_trainer.service.store_http import ProgressState, make_http_server


@pytest.fixture
def store() -> Iterator[str]:
    """The real progress server of the store pod, on a free port."""
    httpd = make_http_server("127.0.0.1", 0, ProgressState())
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/progress"
    httpd.shutdown()


class FlakyPath:
    """An HTTP hop in front of the store that drops the first POST (connection closed, no answer) and
    holds the next one back for ``delay_s`` before forwarding it."""

    def __init__(self, upstream: str, delay_s: float = 0.5) -> None:
        self.upstream, self.delay_s = upstream, delay_s
        self.posts = 0
        hop = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                hop.posts += 1
                if hop.posts == 1:
                    self.close_connection = True  # dropped: the client sees the connection go away
                    return
                time.sleep(hop.delay_s)
                post_json(hop.upstream, json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/progress"

    def close(self) -> None:
        self.httpd.shutdown()


FINAL = {"step": 180, "worldSize": 3, "resizes": [], "finished": True, "accuracy": 0.98}


def test_final_report_survives_a_dropped_and_a_delayed_post(store: str) -> None:
    hop = FlakyPath(store)
    try:
        reporter = ProgressReporter(hop.url)
        assert reporter.finish(FINAL, deadline_s=30)
    finally:
        hop.close()
    assert hop.posts == 2
    assert get_json(store) == FINAL


def test_final_report_is_sent_after_every_pending_report(store: str) -> None:
    # The background thread's last step report must not land after (and shadow) the final one.
    reporter = ProgressReporter(store)
    reporter.report({"step": 179, "worldSize": 3, "resizes": []}, force=True)
    assert reporter.finish(FINAL, deadline_s=30)
    assert get_json(store) == FINAL


def test_finish_gives_up_at_its_deadline_when_the_store_is_gone() -> None:
    reporter = ProgressReporter("http://127.0.0.1:1/progress")
    assert not reporter.finish(FINAL, deadline_s=0.5)
