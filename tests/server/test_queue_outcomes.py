"""`/metrics` shows what became of the requests of each priority level's queue (a scheduling
tester: the batcher counted requests accepted, rejected, timed out, delayed and cancelled per
level, and nothing exported them; a `delay` policy's deadlines left no trace anywhere).

The affine model with a queue of one place and a batching window no test outlasts
(full_queue.py): what waits there stays until the test ends its wait."""
from __future__ import annotations

import asyncio
import urllib.request

from .full_queue import affine_server, fill_queue, refused_through_aiohttp
from .hostile import metric, wait_for


def outcome(url: str, what: str, level: int = 2) -> float:
    return metric(url, "aclserve_queue_outcomes_total",
                  f'model="affine",outcome="{what}",priority="{level}",version="1"')


def test_each_levels_queue_outcomes_are_counted(models_dir, tmp_path, make_config):
    with affine_server(models_dir, tmp_path, make_config) as srv:
        url = srv.url
        counted = ("accepted", "rejected", "timed_out", "delayed", "cancelled")
        assert [outcome(url, what) for what in counted] == [0] * 5  # (each at 0 from the load)

        async def scenario():
            reader, writer = await fill_queue(url)  # accepted: it fills the level's one place
            status, other = await refused_through_aiohttp(url)  # rejected: the level is full
            assert status == 503
            writer.close()  # cancelled: its client went while it waited
            other.close()
            await wait_for(lambda: outcome(url, "cancelled") == 1)

        asyncio.run(scenario())
        assert [outcome(url, what) for what in counted] == [1, 1, 0, 0, 1]
        text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
        for level in (1, 2, 3):  # every level has its series, at 0 where nothing came
            assert f'aclserve_queue_outcomes_total{{model="affine",outcome="delayed",priority="{level}"' in text


def test_a_client_gone_while_its_batch_runs_is_counted_cancelled_as_the_help_says(double_dir, clean_faults):
    """`cancelled` was described as "client gone", read as clients that left their queue; a client
    that gives up while its batch runs is counted there too (a tester's find): the help text and
    README say so. Its run is held by an injected fault while its client closes the connection."""
    import threading

    from aclserve.acl.cpu import faults
    from tests.serving import ServerThread, server_config

    from .metrics_samples import samples, value
    from .test_trace_client_left import _http_leaves

    gate = threading.Event()
    config = server_config(double_dir, model_defaults={"slots": 1, "execution_timeout_ms": 60_000})  # (held meanwhile)
    try:
        with ServerThread(config) as srv:
            held = faults.inject("execute", nth=1, hold=gate)
            _http_leaves(srv.url, held)  # (returns once its run is held, its connection closed)

            def found():
                text = urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode()
                return samples(text), text
            asyncio.run(wait_for(lambda: value(found()[0], "aclserve_request_failure_total", model="double",
                                               reason="Cancelled") == 1, limit_s=60))  # the server saw it go
            counted, text = found()
            gate.set()  # (before the server's close, which would wait for the run)
    finally:
        gate.set()
    assert value(counted, "aclserve_queue_outcomes_total", model="double", outcome="cancelled") == 1
    assert "cancelled (client gone before its outputs came: from its queue, or from its batch once formed" in text
