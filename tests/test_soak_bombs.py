"""tools/soak.py fails a run whose bombs are not refused (an independent tester, t61: a bomb
answered 500 was counted under the text key "gzip bomb -> 500", which the check for 500s never
saw, and a bomb answered 200 or 400 passed)."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from tests.serving import ServerThread, server_config
from tests.soak_stub import ARGS, settled, soak, stub_server


@pytest.mark.asyncio
async def test_a_bomb_answered_anything_but_413_fails_the_run(tmp_path, capsys):
    async def handler(request):  # answers the status the bomb's X-Status names
        await request.read()
        return web.Response(status=int(request.headers["X-Status"]), text="{}")
    kinds = [(f"bomb {status}", b"[0]", {"X-Status": str(status)}) for status in (500, 200, 400, 413)]
    run = soak.Soak(ARGS)
    async with stub_server(handler) as url, aiohttp.ClientSession() as session:
        await run.bomb_round(session, url, kinds)
    run.tally.checked = 1  # (the run is failed by its bombs alone)
    assert run.report(True, str(tmp_path / "run")) == 1
    printed = capsys.readouterr().out
    assert "FAILED: 3 bombs not answered 413: bomb 200 -> 200: 1, bomb 400 -> 400: 1, bomb 500 -> 500: 1" in printed, \
        printed
    assert "  bomb 413 -> 413: 1\n" in printed, printed


def test_the_server_answers_the_soaks_bombs_413(tmp_path):
    """The real server, and the soak's bombs (the gzip one inflating to 64 MiB, not 1 GiB: built in
    a second, not 7-15): each is refused 413, what the soak expects."""
    run = soak.Soak(ARGS)
    models, _ = run.prepare(str(tmp_path))
    kinds = run.bomb_bodies(64 << 20)

    async def one_round(url):
        async with aiohttp.ClientSession() as session:
            await run.bomb_round(session, url, kinds)
        await settled()
    with ServerThread(server_config(models, model_control_mode="none")) as server:
        asyncio.run(one_round(f"http://{server.url}/v2/models/digits/infer"))
    assert run.tally.bombs == {("gzip bomb", 413): 1, ("large json", 413): 1}
    run.tally.checked = 1
    assert run.tally.failures(alive=True) == []
