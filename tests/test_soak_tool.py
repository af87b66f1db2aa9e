"""tools/soak.py: its 503s are counted by the reason their answer gives, and its model has a
queue its own clients cannot fill (an independent tester, t56: 321 x 503 in a run without
faults, every one "queue is full", where README put the soak's 503s down to rebuilds)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np

from tests.canned_server import canned_server
from tests.serving import ServerThread, request, server_config
from tests.soak_stub import ARGS, soak

# what the server answers for each reason (README quotes them), and the reason the soak counts
SAID = {
    "the queue is full (61 of its 64 rows queued; this request's 4 rows do not fit: "
    "max_queue_size auto counts rows)": "queue full",
    "request timed out after 2000.0 ms in the queue": "timed out in the queue",
    "model digits version 1 is not ready (LOADING)": "model not ready, swapped or its instance rebuilt",
    "server is busy: requests in flight hold 64 MB of its 64 MB request memory (max_inflight_bytes); "
    "retry later": "memory budget in use",
    "server is shutting down": "other",
}


def _unavailable(said: str) -> bytes:
    body = json.dumps({"error": said}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(body), body))


def test_503s_are_counted_by_the_reason_their_answer_gives(tmp_path, capsys):
    run = soak.Soak(ARGS)
    rows = np.zeros((2, 64), np.float32)

    async def ask(url):
        async with aiohttp.ClientSession() as session:
            return await run.ask(session, url, rows, binary=False)
    for said in SAID:
        with canned_server(_unavailable(said)) as url:
            assert asyncio.run(ask(f"{url}/v2/models/digits/infer")) == 503
    run.tally.checked = 1  # (a run that checked no answer fails)
    assert run.report(True, str(tmp_path / "run")) == 0
    printed = capsys.readouterr().out
    assert "  503: 5\n" in printed, printed
    for said, reason in SAID.items():
        assert f"    {reason}: 1 (the first: {said[:160]})\n" in printed, printed
    # (it said "server still running at the end", which reads as a leak: a tester, t80)
    assert "\nserver alive when the run ended; log removed (the run passed)\n" in printed, printed


def test_the_soaks_model_has_a_queue_of_a_request_for_each_client(tmp_path):
    """The auto queue of its gears 1,2,4,8 held 64 rows, and 16 clients of 1-8 rows overran it."""
    models, _ = soak.Soak(ARGS).prepare(str(tmp_path))
    with ServerThread(server_config(models, model_control_mode="none")) as server:
        status, _, body = request(server, "GET", "/v2/models/digits/config")
    assert status == 200, body
    config = json.loads(body)
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == ARGS.clients
    assert "default_queue_policy.max_queue_size_unit" not in config.get("parameters", {})  # requests, not rows
