"""/metrics while a version drains out of service: replaced by a reload of its file, or unloading.

The scrape-time series read the serving version's own batcher, so a reload put its queue
outcomes back to 0 (an independent tester: request_success_total{vm,2} stayed at 9,300 while
queue_outcomes_total{accepted} dropped from 709 to 0, which Prometheus reads as a reset), and the
requests still queued in the replaced version, or in a version unloading, were in no
aclserve_queue_depth, the gauge an autoscaler scales on.

The affine model with a batching window no test outlasts (full_queue.py): a 3-row request
waits in its queue until the test closes its connection, which keeps the old version draining
for as long as the test needs (nothing here is timed). The app runs on the test's own loop, so
the repository's wait_idle() says when the replaced version has closed."""
from __future__ import annotations

import asyncio
import os
import shutil

import aiohttp

from tests.serving import server_config, started_app

from .full_queue import HELD_WINDOW_MS, RELEASE, WAITING, request
from .metrics_samples import samples, value

AFFINE = {"model": "affine", "version": "1"}
LEVEL = {"priority": "2"}  # the default level


def _models(tmp_path, models_dir):
    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "affine.om", own / "affine.om")
    (own / "affine.yaml").write_text(f"batching: {{max_queue_delay_ms: {HELD_WINDOW_MS}}}\n")
    return own


async def _scrape(session, url):
    async with session.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return samples(await resp.text())


async def _until(predicate, limit_s: float = 60.0):
    async def loop():
        while not await predicate():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), limit_s)  # a hang guard, not a timing check


async def _queue_one(url: str):
    """A request waiting in the default level's queue until its writer closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request(WAITING))
    return reader, writer


def _queue(found) -> tuple[float, float, float]:
    """(queue depth, accepted, cancelled) of the default level."""
    return (value(found, "aclserve_queue_depth", **AFFINE, **LEVEL),
            value(found, "aclserve_queue_outcomes_total", outcome="accepted", **AFFINE, **LEVEL),
            value(found, "aclserve_queue_outcomes_total", outcome="cancelled", **AFFINE, **LEVEL))


async def _queue_is(session, url, wanted: tuple) -> bool:
    return _queue(await _scrape(session, url)) == wanted


async def _is_unloading(session, url) -> bool:
    return value(await _scrape(session, url), "aclserve_model_state", state="UNLOADING", **AFFINE) == 1


def test_queue_outcomes_and_depth_carry_over_a_reload_of_the_file(models_dir, tmp_path):
    """Scraped while the replaced version holds a queued request, and after it has closed."""
    own = _models(tmp_path, models_dir)
    config = server_config(own, model_control_mode="poll", settle_s=0.1, debounce_s=0.05, shutdown_timeout_s=120)

    async def scenario():
        runner, state, url, runtime, repo = await started_app(config)
        try:
            async with aiohttp.ClientSession() as session:
                async def ready():
                    async with session.get(f"{url}/v2/models/affine/ready") as resp:
                        return resp.status == 200
                await _until(ready)  # poll mode: loaded once the file has settled
                _, first = await _queue_one(url)
                await _until(lambda: _queue_is(session, url, (1, 1, 0)))
                async with session.post(f"{url}/v2/models/affine/infer", data=RELEASE,
                                        headers={"Content-Type": "application/json"}) as resp:
                    assert resp.status == 200  # fills the waiting one's batch: both run
                await _until(lambda: _queue_is(session, url, (0, 1, 0)))
                _, waiting = await _queue_one(url)  # held in the version about to be replaced
                await _until(lambda: _queue_is(session, url, (1, 2, 0)))
                shutil.copy(models_dir / "affine.om", own / ".affine.tmp")
                os.replace(own / ".affine.tmp", own / "affine.om")  # the same model, a new file: a reload

                async def reloaded():
                    return value(await _scrape(session, url), "aclserve_model_reloads_total", model="affine") == 1
                await _until(reloaded)
                draining = _queue(await _scrape(session, url))
                waiting.close()  # the old version's last request goes: it has drained, and closes
                await repo.wait_idle()
                closed = _queue(await _scrape(session, url))
                first.close()
        finally:
            await runner.cleanup()
        return draining, closed

    draining, closed = asyncio.run(scenario())
    assert draining == (1, 2, 0)  # the replaced version's queue and counts, beside the new one's
    assert closed == (0, 2, 1)  # kept once it has closed: its request was cancelled


async def _unloading_one_queued(session, url, unload):
    """One request queued for affine, then `unload()` (a coroutine) begun: (the request's
    connection, the unload's future) once the version is UNLOADING."""
    _, waiting = await _queue_one(url)
    await _until(lambda: _queue_is(session, url, (1, 1, 0)))
    unloading = asyncio.ensure_future(unload())
    await _until(lambda: _is_unloading(session, url))
    return waiting, unloading


def test_a_version_unloading_shows_its_queue_until_it_has_drained(models_dir, tmp_path):
    """Unloaded through the API while a request waits in its queue: UNLOADING, it was in no
    scrape-time series; its series go once it has closed."""
    own = _models(tmp_path, models_dir)
    config = server_config(own, shutdown_timeout_s=120)

    async def scenario():
        runner, state, url, runtime, repo = await started_app(config)
        try:
            async with aiohttp.ClientSession() as session:
                waiting, unload = await _unloading_one_queued(
                    session, url, lambda: session.post(f"{url}/v2/repository/models/affine/unload"))
                during = _queue(await _scrape(session, url))
                waiting.close()
                async with await unload as resp:
                    assert resp.status == 200
                after = await _scrape(session, url)
        finally:
            await runner.cleanup()
        return during, after

    during, after = asyncio.run(scenario())
    assert during == (1, 1, 0)
    assert _queue(after) == (0, 0, 0)  # its series went with it, once it had closed


def test_an_unload_whose_caller_is_cancelled_still_closes_the_version(models_dir, tmp_path):
    """An unload call cancelled while its version drains (the server cancels the call of a
    client that goes away: handler_cancellation), as this test does: the cancellation reached
    the model's task and stopped the close half-way, which left the version UNLOADING for good
    (its pool never freed, its series kept) and refused every later load of the model ("no
    version loaded"). The close now ends, then the cancellation goes on."""
    own = _models(tmp_path, models_dir)
    config = server_config(own, shutdown_timeout_s=120)

    async def scenario():
        runner, state, url, runtime, repo = await started_app(config)
        try:
            async with aiohttp.ClientSession() as session:
                waiting, unload = await _unloading_one_queued(session, url, lambda: repo.unload("affine"))
                unload.cancel()
                await _scrape(session, url)  # (the loop has run the cancellation through)
                waiting.close()  # the version's last request goes: it has drained
                await asyncio.wait([unload])
                await repo.wait_idle()
                after = await _scrape(session, url)
                async with session.post(f"{url}/v2/repository/models/affine/load") as resp:
                    loaded = resp.status
        finally:
            await runner.cleanup()
        return unload.cancelled(), after, loaded

    cancelled, after, loaded = asyncio.run(scenario())
    assert cancelled
    assert value(after, "aclserve_model_state", state="UNAVAILABLE", **AFFINE) == 1  # "unloaded": closed
    assert _queue(after) == (0, 0, 0)  # its series went with it
    assert loaded == 200
