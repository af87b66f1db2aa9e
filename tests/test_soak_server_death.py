"""tools/soak.py stops when its server dies (an independent tester, t61: after a kill -9 its
clients asked the dead port in a busy loop, 46,755 ClientConnectorErrors in 20 s and a core
burnt, the run went on to its full length, and the report said `end 0 MB` of RSS)."""
from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import threading
import time

import aiohttp

from tests.serving import wait_until
from tests.soak_stub import ARGS, soak


def test_clients_back_off_from_a_port_that_refuses():
    """Each refusal doubles the wait before the next request (0.05 s, 0.1 s, 0.2 s, ...): in a
    window of 0.3 s a client makes 4 requests at most, however fast the machine (a busy loop
    made hundreds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed: nothing listens there)
    run = soak.Soak(ARGS)

    async def one_client():
        async with aiohttp.ClientSession() as session:
            run.window_end = time.monotonic() + 0.3
            await run.client(session, f"http://127.0.0.1:{port}/v2/models/digits/infer", seed=0)
    asyncio.run(one_client())
    assert 1 <= run.tally.client_errors["ClientConnectorError"] <= 4, run.tally.client_errors


def test_the_run_stops_when_its_server_dies_and_reports_the_last_rss_seen(capsys):
    """A real run of 10 minutes: its server is killed once an answer was checked."""
    run = soak.Soak(argparse.Namespace(**dict(vars(ARGS), minutes=10.0, clients=2)))
    ended = []
    thread = threading.Thread(target=lambda: ended.append(run.execute()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: run.tally.checked > 0 and run.rss, "an answer checked and an RSS sample")
        run.proc.kill()
        thread.join(90)  # (a hang guard: the run stops within a second or so; it went on for 10 minutes)
    finally:
        shutil.rmtree(run.folder, ignore_errors=True)  # (a failed run keeps it)
    assert ended == [1], "the run did not stop when its server died"
    printed = capsys.readouterr().out
    assert "FAILED: the server died" in printed, printed
    assert "s into the run: the run stopped there" in printed, printed
    rss = next(line for line in printed.splitlines() if line.startswith("server RSS"))
    assert " s into the run " in rss and " 0 MB" not in rss, rss
