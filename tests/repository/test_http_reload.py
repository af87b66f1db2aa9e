"""Hot reload seen through the real server: HTTP clients on a real port while the file is
replaced and a corrupt file is dropped. No request may fail; the answers switch over."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from aclserve.config import load_server_config
from tests.serving import started_app

from .repo_helpers import Events, place

pytestmark = pytest.mark.asyncio

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}


async def test_http_clients_see_no_failure_across_reloads(models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    os.utime(models_dir / "m.om", (1, 1))  # an old file: taken at once at start
    config = load_server_config(None, {"models_dir": str(models_dir), "port": 0, "device": "cpu",
                                       "settle_s": 0.3, "debounce_s": 0.05, "log_level": "warning"})
    runner, _, base, _, repo = await started_app(config)
    events = Events()
    repo.add_listener(events)
    url = f"{base}/v2/models/m/infer"
    phase = {"now": 0}
    answers, failures = [], []
    stop = asyncio.Event()

    async def client(session):
        while not stop.is_set():
            start = phase["now"]
            async with session.post(url, json=BODY) as resp:
                body = await resp.json()
                if resp.status != 200:
                    failures.append((resp.status, body))
                else:
                    answers.append((start, body["outputs"][0]["data"][0]))

    async def answered_in(p, count=10):
        while sum(1 for a in answers if a[0] >= p) < count:
            await asyncio.sleep(0.01)

    try:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(client(session)) for _ in range(4)]
            await asyncio.wait_for(answered_in(0), 60)
            place(model_files[2]["om"], models_dir / "m.om")
            await events.wait("reloaded", "m")
            phase["now"] = 1
            await asyncio.wait_for(answered_in(1), 60)
            data = Path(model_files[3]["om"]).read_bytes()
            (models_dir / "x.bin").write_bytes(data[:-10])
            os.replace(models_dir / "x.bin", models_dir / "m.om")
            await events.wait("load_failed", "m")
            phase["now"] = 2
            await asyncio.wait_for(answered_in(2), 60)
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                index = await resp.json()
            stop.set()
            await asyncio.gather(*tasks)
    finally:
        await runner.cleanup()
    assert failures == []
    assert {v for p, v in answers if p >= 1} == {2.0}
    (row,) = [r for r in index if r["name"] == "m"]
    assert row["state"] == "READY" and row["reason"].startswith("serving the previous file; the new one failed: ")
    assert "truncated" in row["reason"]
