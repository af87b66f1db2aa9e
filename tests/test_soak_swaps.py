"""tools/soak.py counts its model swaps by what the server did with them (an independent tester,
t61: "reloads: N" counted the files the tool wrote; a file that never loaded, garbage written
in the model's place, passed the run)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.error
import urllib.request

import aiohttp

from aclserve.acl.cpu import faults

from tests.server.hostile import metric
from tests.serving import ServerThread, server_config, wait_until
from tests.soak_stub import ARGS, settled, soak

import soak_swaps  # noqa: E402  (tools/, on the path soak_stub made)


@contextlib.contextmanager
def swapping(tmp_path, grace_s: float = soak_swaps.GRACE_S):
    """The soak's models served in poll mode, the server's log in a file as `aclserve serve` writes
    it: (the Soak, its models folder, the two variants, the server, its Swaps)."""
    run = soak.Soak(ARGS)
    models, variants = run.prepare(str(tmp_path))
    log = logging.FileHandler(tmp_path / "server.log")
    log.setLevel(logging.WARNING)
    logging.getLogger("aclserve").addHandler(log)
    try:
        with ServerThread(server_config(models, model_control_mode="poll", settle_s=0.1, debounce_s=0.05)) as server:
            # the model file copied in just now settles first: a swap written before its first load
            # would be that load, not a reload (as the soak starts its load once the server is ready)
            wait_until(lambda: model_ready(server), "the model served")
            swaps = soak_swaps.Swaps(str(tmp_path / "server.log"), grace_s)
            on_server(server, swaps.start)
            yield run, models, variants, server, swaps
    finally:
        logging.getLogger("aclserve").removeHandler(log)
        log.close()


def on_server(server, step, *args):
    async def go():
        async with aiohttp.ClientSession() as session:
            result = await step(session, f"http://{server.url}", *args)
        await settled()
        return result
    return asyncio.run(go())


def model_ready(server) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.url}/v2/models/{soak_swaps.MODEL}/ready", timeout=5) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def failed_loads(server) -> float:
    return metric(server.url, "aclserve_model_loads_total", 'model="digits",result="failed"')


def test_a_swap_that_never_loads_fails_the_run(tmp_path, capsys):
    with swapping(tmp_path, grace_s=2.0) as (run, models, _, server, swaps):
        soak_swaps.write_swap(models, b"not an OM file" * 100)  # (the tester's garbage.om, in the tool's place)
        swaps.wrote(1)
        wait_until(lambda: failed_loads(server) >= 1, "the load failed")
        on_server(server, swaps.settle, run.max_batch[1], lambda: True)
    failures = swaps.report()
    printed = capsys.readouterr().out
    assert "1 written, 0 loaded" in printed, printed
    assert failures[0].startswith("1 model loads failed with no fault injected (the first: "), failures
    assert failures[1:] == ["the server does not serve the last model swap written, 2 s after the load stopped"]


def test_swaps_superseded_before_they_loaded_pass_when_the_last_one_serves(tmp_path, capsys):
    """Three swaps written at once: the server may load each, or drop those the next replaced as
    they loaded; whichever, the last one serves and nothing failed."""
    with swapping(tmp_path) as (run, models, variants, server, swaps):
        for variant in (1, 0, 1):
            soak_swaps.write_swap(models, variants[variant])
            swaps.wrote(variant)
        on_server(server, swaps.settle, run.max_batch[1], lambda: True)
    assert swaps.report() == []
    assert swaps.serves_last and 1 <= swaps.loaded <= 3 and swaps.failed == 0
    assert f"3 written, {swaps.loaded} loaded (aclserve_model_reloads_total), {3 - swaps.loaded} superseded" \
        in capsys.readouterr().out


def test_a_load_failed_by_an_injected_fault_is_no_failure_once_its_retry_serves(tmp_path, clean_faults):
    """The soak's faults fail the swap's warm-up: the server retries it, and it serves once the
    faults stop."""
    with swapping(tmp_path) as (run, models, variants, server, swaps):
        faults.inject(**faults.parse(soak.fault_spec(1.0))[0])
        soak_swaps.write_swap(models, variants[1])
        swaps.wrote(1)
        wait_until(lambda: failed_loads(server) >= 1, "the warm-up failed")
        faults.clear()
        on_server(server, swaps.settle, run.max_batch[1], lambda: True)
    assert swaps.serves_last and swaps.loaded == 1 and swaps.failed >= 1
    assert all(soak.injected(said.encode()) for said in swaps.failed_said) and swaps.failed_said, swaps.failed_said
    assert swaps.report() == []
