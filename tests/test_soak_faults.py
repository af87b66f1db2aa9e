"""tools/soak.py tells the faults it injects from real ones (an independent tester, t61: any 500
whose body said "failed on device" was filed as injected, though a real device error says that
too, runtime/completer.py; and with --fault-probability 0 some still could be)."""
from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
from aiohttp import web

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, server_config
from tests.soak_stub import ARGS, settled, soak, stub_server

ROWS = np.zeros((2, 64), np.float32)
# what the server answers a batch the device failed (507011: a real execution failure)
REAL_FAULT = {"error": "batch of 2 rows (gear 2) failed on device 0, instance digits:1#0: acl.rt.synchronize_event_"
                       "with_timeout failed with 507011: model execution failed on the device"}


def ask(run, url):
    async def go():
        async with aiohttp.ClientSession() as session:
            status = await run.ask(session, url, ROWS, binary=False)
        await settled()
        return status
    return asyncio.run(go())


def test_a_real_device_fault_is_no_injected_one_and_fails_the_run(tmp_path, capsys):
    async def handler(request):
        await request.read()
        return web.json_response(REAL_FAULT, status=500)

    async def go(run):
        async with stub_server(handler) as url, aiohttp.ClientSession() as session:
            return await run.ask(session, url, ROWS, binary=False)
    run = soak.Soak(ARGS)
    assert asyncio.run(go(run)) == 500
    assert run.tally.status == {500: 1}
    run.tally.checked = 1
    assert run.report(True, str(tmp_path / "run")) == 1
    assert "FAILED: 1 answers 500 that are no injected fault" in capsys.readouterr().out


def test_the_faults_the_soak_injects_are_told_by_their_code(tmp_path, clean_faults):
    """The real server, the CPU runtime failing every execution as the soak's fault spec asks."""
    run = soak.Soak(ARGS)
    models, _ = run.prepare(str(tmp_path))
    with ServerThread(server_config(models, model_control_mode="none")) as server:
        faults.inject(**faults.parse(soak.fault_spec(1.0))[0])
        assert ask(run, f"http://{server.url}/v2/models/digits/infer") == 500
        faults.clear()
    assert run.tally.status == {"500 device fault (injected)": 1}


def test_no_fault_is_injected_at_probability_0():
    assert soak.fault_spec(0.0) == "" and faults.parse(soak.fault_spec(0.0)) == []
