"""The repository closing while a model load hangs on the device (held in query_size by a
CPU-runtime fault until the test lets go): the close ends without it, the load is abandoned
and, once it returns, closes what it opened; versions loaded beside it in the same plan are
closed, not leaked. A watchdog lets the load go after 30 s, so a close that waits for it fails
the test instead of hanging it; nothing asserts a duration."""
from __future__ import annotations

import asyncio
import threading

import pytest

from aclserve.acl.cpu import faults
from aclserve.errors import ShuttingDown
from aclserve.runtime import teardown

from .repo_helpers import place

pytestmark = pytest.mark.asyncio


class Hold:
    """A fault holding the `nth` model load (or execution, the warm-up's) from now on until
    let_go() (or the watchdog)."""

    def __init__(self, nth: int = 1, kind: str = "query_size"):
        self.gate = threading.Event()
        self.fault = faults.inject(kind, nth=nth, hold=self.gate)
        self.watchdog = threading.Timer(30, self.gate.set)  # a hang guard, not a timing
        self.watchdog.start()

    async def entered(self) -> None:
        assert await asyncio.get_running_loop().run_in_executor(None, self.fault.entered.wait, 30)

    def held(self) -> bool:
        """Still held: whatever the test did so far did not wait for the load."""
        return not self.gate.is_set()

    async def let_go(self) -> None:
        """Release the load and wait (a hang guard) until its thread has closed what it opened."""
        self.watchdog.cancel()
        self.gate.set()
        for _ in range(3000):
            if teardown.release_recovered() == 0 and teardown.unreleased() == 0:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{teardown.unreleased()} load(s) or instance(s) still on the device")


def ledger(runtime) -> tuple[int, int]:
    book = runtime.device(0).ledger
    return book.streams, book.events


async def test_a_close_abandons_a_load_that_hangs_and_the_load_closes_its_pool_when_it_returns(
        make_repo, models_dir, model_files, runtime, clean_faults, caplog):
    repo, _ = await make_repo(model_control_mode="explicit", shutdown_timeout_s=0.5)
    before = ledger(runtime)
    place(model_files[1]["om"], models_dir / "m.om")
    hold = Hold()
    try:
        load = asyncio.ensure_future(repo.load("m"))
        await hold.entered()
        await repo.close()
        assert hold.held()  # the close did not wait for the load
        assert [m for m in caplog.messages if "abandoned" in m and "m: version 1" in m]
        await asyncio.wait([load])
    finally:
        await hold.let_go()
    assert ledger(runtime) == before  # what the abandoned load opened is closed


async def test_a_shutdown_during_start_closes_the_version_loaded_beside_a_hung_one(
        make_repo, models_dir, model_files, runtime, clean_faults):
    """Two versions of one model in one plan: one loads, the other hangs. The start, cancelled
    by the shutdown, used to drop the loaded one unclosed (its pool and device share leaked, and
    the runtime would reset the device under its instances)."""
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "m" / "2" / "model.om")
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    before = ledger(runtime)
    repo, _ = await make_repo(start=False, model_control_mode="none", shutdown_timeout_s=0.5)
    hold = Hold(nth=2)  # the second version's load (load_concurrency 1: after the first is in)
    try:
        start = asyncio.ensure_future(repo.start())
        await hold.entered()
        start.cancel()  # what the server's shutdown does with a start still loading
        await asyncio.wait([start])
        await repo.close()
        assert hold.held()
    finally:
        await hold.let_go()
    assert ledger(runtime) == before


async def test_a_warm_up_abandoned_at_close_stops_at_its_next_run(
        make_repo, models_dir, model_files, runtime, clean_faults):
    """The load's thread cannot be stopped, but its warm-up looks between runs: once the close
    has given up on the load, no more warm-up runs start, and the thread closes the pool as
    soon as the run it was inside ends (before, it ran every gear's runs first, holding the
    shutdown up to its deadline)."""
    repo, _ = await make_repo(model_control_mode="explicit", shutdown_timeout_s=0.5)
    before = ledger(runtime)
    place(model_files[1]["om"], models_dir / "m.om")
    hold = Hold(kind="execute")  # the warm-up's first run holds
    try:
        load = asyncio.ensure_future(repo.load("m"))
        await hold.entered()
        await repo.close()
        assert hold.held()
        later = faults.inject("execute", delay_ms=0.001)  # counts the executions from here on
        await asyncio.wait([load])
        # the shutdown's doing, not the model's: 503 / UNAVAILABLE (it was "no version loaded", a 400)
        assert isinstance(load.exception(), ShuttingDown) and "shut down before m was loaded" in str(load.exception())
    finally:
        await hold.let_go()
    assert later.seen == 0  # no warm-up run after the held one
    assert ledger(runtime) == before
