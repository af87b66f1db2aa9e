"""Unloading or reloading a model while the device hangs on one of its batches: the request is
answered (503) after the drain, the unload or reload finishes without the device, and the old
instance is abandoned (memory left allocated) rather than freed under the hung execution. The
execution is held by a CPU-runtime fault until the end of each test; nothing asserts a
duration."""
from __future__ import annotations

import asyncio
import shutil
import threading

import pytest

from aclserve.acl.cpu import faults
from aclserve.errors import ModelUnavailable, ShuttingDown
from aclserve.runtime import teardown

from .repo_helpers import serving, x_rows

pytestmark = pytest.mark.asyncio


async def let_go(gate: threading.Event) -> None:
    """Release the held execution and wait (hang guard) until the abandoned instance is freed."""
    gate.set()
    for _ in range(3000):
        if teardown.release_recovered() == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{teardown.held()} abandoned instance(s) never released")


async def hang_one_request(repo, gate: threading.Event):
    """A request whose execution the device holds, once it is running; and the instances it
    runs on, which wait 0.2 s for the device at close (the model's reset_timeout_ms)."""
    served = repo.get("m")
    instances = list(served.pool.instances)
    assert [instance.reset_timeout_ms for instance in instances] == [200]  # from m.yaml
    held = faults.inject("execute", nth=1, hold=gate)
    request = asyncio.ensure_future(served.infer(x_rows(), 1))
    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, held.entered.wait), 30)
    return request, instances


@pytest.fixture
def hung_repo(make_repo, models_dir, model_files, clean_faults):
    shutil.copyfile(model_files[1]["om"], models_dir / "m.om")
    # the execution timeout is far away: only the drain (shutdown_timeout_s) and the close's
    # bound (reset_timeout_ms) can end the wait
    (models_dir / "m.yaml").write_text("execution_timeout_ms: 600000\nreset_timeout_ms: 200\n")

    async def make():
        return await make_repo(model_control_mode="explicit", shutdown_timeout_s=0.5)
    return make


async def test_an_unload_while_a_batch_hangs_answers_the_request_and_abandons_the_instance(hung_repo):
    repo, _ = await hung_repo()
    gate = threading.Event()
    try:
        request, instances = await hang_one_request(repo, gate)
        await asyncio.wait_for(repo.unload("m"), 60)  # a hang guard: it waited for the device for good
        with pytest.raises((ShuttingDown, ModelUnavailable)):
            await asyncio.wait_for(request, 30)
        assert serving(repo) == [] and not gate.is_set()
        assert teardown.held() == 1 and all(i.context and i.slots for i in instances)
        await let_go(gate)
        assert not any(i.context for i in instances)
    finally:
        await let_go(gate)


async def test_a_reload_while_a_batch_hangs_serves_the_new_file(hung_repo, models_dir, model_files):
    repo, _ = await hung_repo()
    gate = threading.Event()
    try:
        request, instances = await hang_one_request(repo, gate)
        shutil.copyfile(model_files[2]["om"], models_dir / "m.om")
        await asyncio.wait_for(repo.load("m"), 60)  # a hang guard
        result = await asyncio.wait_for(repo.get("m").infer(x_rows(), 1), 30)
        assert float(result.outputs["y"][0, 0]) == 2.0
        await asyncio.wait_for(repo.wait_idle(), 60)  # the old version drained and closed
        # refused by the old version as it closed, the request went to the new one
        assert float((await asyncio.wait_for(request, 30)).outputs["y"][0, 0]) == 2.0
        assert teardown.held() == 1 and not gate.is_set()
        assert all(i.context and i.slots for i in instances)
    finally:
        await let_go(gate)


async def test_a_close_during_an_unload_that_waits_for_a_hung_device_keeps_its_own_deadline(hung_repo):
    """An unload (or reload) closing a version whose batch hangs waits for the device up to its
    instances' reset_timeout_ms (10 s by default; ten minutes here). A shutdown arriving
    meanwhile waits for that unload, so it must bring the unload's wait forward to the
    shutdown's own deadline, not wait out the unload's."""
    repo, _ = await hung_repo()
    gate = threading.Event()
    try:
        request, instances = await hang_one_request(repo, gate)
        for instance in instances:
            instance.reset_timeout_ms = 600_000
        unload = asyncio.ensure_future(repo.unload("m"))
        with pytest.raises((ShuttingDown, ModelUnavailable)):
            await asyncio.wait_for(request, 30)  # drained: the unload now waits for the device
        await asyncio.wait_for(repo.close(), 30)  # a hang guard: it waited out the unload's ten minutes
        await asyncio.wait_for(unload, 30)
        assert not gate.is_set() and teardown.held() == 1
        assert all(i.context and i.slots for i in instances)  # abandoned, not freed under the device
    finally:
        await let_go(gate)

