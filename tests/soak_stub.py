"""For the tests of tools/soak.py: the tool imported, its arguments for a short run, and a stub
server on 127.0.0.1 (a real aiohttp app on a port the kernel picks) answering its inference
requests as a test's handler says."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

from aiohttp import web

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import soak  # noqa: E402  (the tests import it from here)

__all__ = ["ARGS", "INFER", "settled", "soak", "stub_server"]

ARGS = argparse.Namespace(minutes=0.1, clients=16, slow=0, reload_s=5.0, bomb_s=10.0, bombs=False,
                          fault_probability=0.0, timeout_s=30.0)
INFER = "/v2/models/digits/infer"


@contextlib.asynccontextmanager
async def stub_server(handler):
    """Yields the inference URL of an app answering each POST with `handler(request)`."""
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post(INFER, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}{INFER}"
    finally:
        await runner.cleanup()


async def settled() -> None:
    """A moment for the connections a closed ClientSession closed to finish closing, before
    asyncio.run closes the loop: one still closing then was left to the collector, an unclosed
    transport pytest's unraisable check failed a test on (once in a full run)."""
    await asyncio.sleep(0.05)
