"""The request log during the shutdown drain: an infer request on a connection opened during the
drain is refused 503 "server is shutting down" and has its request log line, under the name asked
for and the id its head carries (X-Request-Id), as one on a connection opened before. The
connection guard used to answer it itself (connections.py), out of the request logger's sight:
no line, so the operator could not tell those refusals happened (an independent tester's find).

A 3-row request waits in the queue (a batching window no test outlasts) and keeps the drain going
until the test closes its connection; nothing is timed."""
from __future__ import annotations

import http.client
import logging

from .full_queue import ONE_ROW, held_drain, status_of


def _post_late(host: str, port: int, path: str, request_id: str) -> tuple[int, str | None, bytes]:
    """An infer request on a new connection: (status, its Connection header, its body)."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", path, body=ONE_ROW, headers={"Content-Type": "application/json",
                                                          "X-Request-Id": request_id})
        answer = conn.getresponse()
        return answer.status, answer.getheader("Connection"), answer.read()
    finally:
        conn.close()


def test_an_infer_request_on_a_connection_opened_during_the_drain_has_its_log_line(models_dir, tmp_path,
                                                                                   make_config, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    with held_drain(models_dir, tmp_path, make_config, request_log=True) as server:
        host, port = server.url.rsplit(":", 1)
        caplog.clear()
        refused = (503, "close", b'{"error":"server is shutting down"}')
        assert _post_late(host, int(port), "/v2/models/affine/infer", "late-1") == refused
        assert _post_late(host, int(port), "/v2/models/nobody/versions/7/infer", "late-2") == refused
        lines = [r.fields for r in caplog.records if r.name == "aclserve.requests"]
        assert [(line["request_id"], line["model"], line["version"], line["status"], line["error"])
                for line in lines] == [("late-1", "affine", "", 503, "server is shutting down"),
                                       ("late-2", "nobody", "7", 503, "server is shutting down")], lines
        assert status_of(server.url, "/v2/health/live") == 503  # the rest of a late connection's routes: as before
