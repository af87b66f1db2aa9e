"""Review of 896b4f0 (the guard's Outbox, outbox.py) and 022a5d3 (the ModelStreamInfer quiet
limit, grpc_service.py). Real servers on real ports, raw sockets and grpc.aio channels; waits
are hang guards or lower bounds the test sets itself, never a speed check."""
import asyncio

from .full_queue import ONE_ROW, affine_server, fill_queue, refused_through_aiohttp, request
from .hostile import metric, open_raw
from .test_review_direct import _send_until_stalled

FLOOD = 64 << 20
BOUND = 32 << 20


def test_a_client_that_pipelines_early_refused_requests_and_reads_nothing_is_not_read_without_bound(
        models_dir, tmp_path, make_config):
    """outbox.py says the transport's flow control makes "a client that reads nothing still stop
    being read"; direct answers do stop reading then (guard._respond), early refusals do not:
    GuardedProtocol.data_received never looks at _write_paused, so every pipelined request is
    read, refused, and its 503 kept in the transport's buffer. A client sending 64 MiB of small
    requests and reading nothing has all of it read (about 40 MB of 503s buffered; it grows with
    what the client sends). Not new in 896b4f0 (its parent does the same), but the invariant
    the Outbox relies on does not hold."""
    with affine_server(models_dir, tmp_path, make_config, 20000) as srv:
        async def scenario():
            _, filler = await fill_queue(srv.url)
            status, other = await refused_through_aiohttp(srv.url)  # early refusals on from now
            _, writer = await open_raw(srv.url)
            sent = await _send_until_stalled(writer, request(ONE_ROW) * 200, FLOOD)
            writer.transport.abort()
            for w in (filler, other):
                w.close()
            return status, sent
        status, sent = asyncio.run(scenario())
        assert status == 503 and metric(srv.url, "aclserve_early_refusals_total") > 1000
        assert sent < BOUND, f"the server read {sent >> 20} MiB of requests from a client that reads nothing"
