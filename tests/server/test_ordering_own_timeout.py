"""preserve_ordering beside a `delay` level without a deadline of its own, which Triton loads (it
refuses delay only beside a level's deadline): aclserve applies a request's own `timeout` there
(Triton ignores it), and a request past it was moved behind the queue, where it held every later
answer, already computed, until the on-time requests stopped coming (a tester's t17: a request
with `timeout` 1 us held the answers sent after it for 1.5 s; under steady load, without end). Under
preserve_ordering such a deadline now rejects: the client is answered 503 at once.
Real server on a real port, the double model; its only slot held by an injected fault while the
request with the timeout waits in the queue."""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, json_call, server_config

from .hostile import metric, wait_for

ORDERED_DELAY = {"preserve_ordering": True, "priority_levels": 1,
                 "default_queue_policy": {"timeout_action": "delay", "default_timeout_ms": 0, "max_queue_size": 0}}


def _body(parameters: dict | None = None) -> bytes:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
    return json.dumps({**body, "parameters": parameters} if parameters else body).encode()


def _outcome(url: str, what: str) -> float:
    return metric(url, "aclserve_queue_outcomes_total", f'model="double",outcome="{what}",priority="1",version="1"')


def test_own_timeout_under_preserve_ordering_is_answered_at_once(double_dir, clean_faults):
    gate = threading.Event()
    config = server_config(double_dir, model_defaults={"slots": 1, "execution_timeout_ms": 60_000,
                                                       "batching": ORDERED_DELAY})
    infer = "/v2/models/double/infer"
    with ServerThread(config) as srv, ThreadPoolExecutor(2) as clients:
        try:
            held = faults.inject("execute", nth=1, hold=gate)
            first = clients.submit(json_call, srv.url, infer, _body())
            assert held.entered.wait(60)  # the only slot is busy: what comes next waits in the queue
            late = clients.submit(json_call, srv.url, infer, _body({"timeout": 1}))
            asyncio.run(wait_for(lambda: _outcome(srv.url, "timed_out") + _outcome(srv.url, "delayed"), limit_s=60))
            assert (_outcome(srv.url, "timed_out"), _outcome(srv.url, "delayed")) == (1, 0)
            status, answer = late.result(60)  # answered while the slot is still held
            assert status == 503 and "timed out" in answer["error"], answer
            gate.set()
            assert first.result(60)[0] == 200
        finally:
            gate.set()  # (before the clients and the server close, which wait for the run)
