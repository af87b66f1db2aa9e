"""What an unload lets go of is freed (a soak found an unloaded version's InstancePool alive long
after its unload, held by the result of the last call its load thread ran)."""
from __future__ import annotations

import gc
import weakref

import pytest

from aclserve.repository.load_threads import LoadThreads

from .repo_helpers import place, until, x_rows


class Built:
    """Stands for what a load thread's call returns (a version's pool and its parts)."""


def freed(ref: weakref.ref) -> bool:
    gc.collect()
    return ref() is None


@pytest.mark.asyncio
async def test_a_load_thread_keeps_nothing_of_its_last_call():
    threads = LoadThreads(1, "test-load")
    try:
        future = threads.submit(Built)
        built = weakref.ref(future.result(30))
        del future
        await until(lambda: freed(built), "the last call's result freed while its thread is idle")
    finally:
        threads.shutdown()


@pytest.mark.asyncio
async def test_an_unloaded_version_is_freed(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo(model_control_mode="explicit")
    assert (await repo.get("m").infer(x_rows(), 1)).outputs["y"].tolist() == [[1.0] * 4]
    pool = weakref.ref(repo.get("m").pool)
    await repo.unload("m")
    await events.wait("unloaded", "m")
    events.seen.clear()  # the test's listener keeps each event's info: "unloading" names the version
    await until(lambda: freed(pool), "the unloaded version's pool freed")
