"""Load and unload calls naming no model keep nothing once answered (a reviewer's reproduction: 300
concurrent load + unload pairs of made-up names to an empty folder left 294 of each name's marks
for good). Real app on a real port, real CPU runtime; the loads' read of the folder is held by an
event, so that every unload arrives while the load of its name runs."""
from __future__ import annotations

import asyncio
import json
import shutil

import aiohttp

from aclserve.server.app_keys import STATE
from tests.repository.repo_helpers import folder_reads_held

from .test_load_call_state import answer, arrived, serving

MADE_UP = [f"ghost{i:03d}" for i in range(100)]


def test_unloads_overtaking_loads_of_made_up_names_leave_nothing_kept(models_dir, tmp_path, make_config):
    """Each unload arriving while the load of its name reads the folder answers 200, as for a model
    copied in since (the load may find it; Triton answers 200 to any unload) and each load 404; the
    unload's call number and the name's hold stayed (a name's each, growing with every pair). Once the
    loads have answered nothing of the names is kept, and an unload of one is 404 "unknown model", as
    before any load. An unload overtaking the load of a real model still wins: 400, its hold kept."""
    async def scenario():
        shutil.copy(models_dir / "double.om", tmp_path / "double.om")
        _, runner, url = await serving(make_config(tmp_path, settle_s=0.0))  # (explicit mode)
        repo = runner.app[STATE].repo
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                async def call(what: str, name: str) -> int:
                    return (await answer(session, "POST", f"{url}/v2/repository/models/{name}/{what}"))[0]
                assert await call("unload", "double") == 200
                with folder_reads_held(repo) as reading:
                    loads = [asyncio.ensure_future(call("load", name)) for name in MADE_UP + ["double"]]
                    await asyncio.wait_for(reading.wait(), 30)  # a hang guard
                    await asyncio.wait_for(asyncio.gather(*(arrived(repo, n) for n in MADE_UP + ["double"])), 30)
                    unloaded = await asyncio.gather(*(call("unload", name) for name in MADE_UP + ["double"]))
                loaded = await asyncio.gather(*loads)
                kept = {"last unload": set(repo._calls._last_unload), "held": set(repo._lifecycle.held),
                        "asked": set(repo._calls.asked), "loading": set(repo._calls._loading)}
                again = await answer(session, "POST", f"{url}/v2/repository/models/{MADE_UP[0]}/unload")
                double = await answer(session, "GET", f"{url}/v2/models/double/ready")
            return unloaded, loaded, kept, again, double
        finally:
            await runner.cleanup()

    unloaded, loaded, kept, again, double = asyncio.run(scenario())
    assert unloaded == [200] * (len(MADE_UP) + 1)
    assert loaded == [400] * len(MADE_UP) + [400]  # (double's: "an unload request for it arrived during this load")
    assert kept == {"last unload": set(), "held": {"double"}, "asked": {"double"}, "loading": set()}
    assert (again[0], json.loads(again[2])) == (404, {"error": f"unknown model '{MADE_UP[0]}'"})
    assert double[0] == 404 and "has no available versions (unloaded)" in double[2]
