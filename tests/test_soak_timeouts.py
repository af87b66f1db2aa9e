"""tools/soak.py fails a run whose server stalls (an independent tester, t61: the server stopped
with SIGSTOP for 35 s, the run passed with `client error TimeoutError: 8` and p99 43.7 ms, the
timed-out requests left out of the latency)."""
from __future__ import annotations

import argparse
import asyncio

import aiohttp
import numpy as np
import pytest

from tests.soak_stub import ARGS, soak, stub_server

TIMEOUT_S = 0.5


@pytest.mark.asyncio
async def test_a_request_the_server_never_answers_is_a_timeout_in_the_latency(tmp_path, capsys):
    release = asyncio.Event()

    async def stalled(request):  # answers only once the test is done with it
        await release.wait()
        raise aiohttp.web.HTTPServiceUnavailable()
    run = soak.Soak(argparse.Namespace(**dict(vars(ARGS), timeout_s=TIMEOUT_S)))
    async with stub_server(stalled) as url:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
            assert await run.ask(session, url, np.zeros((1, 64), np.float32), binary=True) is None
        release.set()
    assert run.tally.timeouts == 1 and not run.tally.client_errors
    assert run.tally.latency == [TIMEOUT_S]  # (in the latency, at its timeout)
    run.tally.checked = 1  # (the run is failed by its timeout alone)
    assert run.report(True, str(tmp_path / "run")) == 1
    printed = capsys.readouterr().out
    assert "max 500.0 ms (timed out: 1, each counted at its timeout)" in printed, printed
    assert "FAILED: 1 good-client requests timed out (the server stalled)" in printed, printed
