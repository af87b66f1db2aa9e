"""What an unload lets go of is freed (a soak found an unloaded version's InstancePool alive long
after its unload, held by the result of the last call its load thread ran: the 4-tuple
(pool, images, labels, ranges) that _open_and_warm_up hands to the loop, left in the idle
thread's running frame, where the collector does not look)."""
from __future__ import annotations

import gc
import time
import weakref

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from aclserve.repository.load_threads import LoadThreads
from aclserve.runtime.pool import InstancePool
from tests.serving import ServerThread, free_port, server_config

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


MODEL = "unload_frees"  # a name no other test's server uses: its pools are found among the process's objects


def opened_pools(name: str, known: list[weakref.ref]) -> list[InstancePool]:
    """The pools of model `name` alive in this process (the server's thread opened them) not in `known`."""
    gc.collect()  # (garbage an earlier test left is not counted)
    seen = {id(ref()) for ref in known if ref() is not None}
    return [o for o in gc.get_objects() if type(o) is InstancePool and o.name.startswith(f"{name}:")
            and id(o) not in seen]


def answers(http, grpc) -> list[float]:
    """One request of each kind a client sends (HTTP JSON, HTTP binary, gRPC): each answer's first value."""
    x = np.ones((2, 4), np.float32)
    out = []
    for binary in (False, True):
        given = httpclient.InferInput("x", [2, 4], "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        asked = [httpclient.InferRequestedOutput("y", binary_data=binary)]
        out.append(float(http.infer(MODEL, [given], outputs=asked).as_numpy("y")[0, 0]))
    given = grpcclient.InferInput("x", [2, 4], "FP32")
    given.set_data_from_numpy(x)
    out.append(float(grpc.infer(MODEL, [given]).as_numpy("y")[0, 0]))
    return out


def all_freed(refs: list[weakref.ref]) -> bool:
    """After collections: is every referent gone? What the server's loop still holds of an unload
    call (its handler, its task) goes a few loop steps after the answer: looked at again, a hang guard."""
    for _ in range(600):
        gc.collect()
        if all(ref() is None for ref in refs):
            return True
        time.sleep(0.05)
    return False


def test_versions_replaced_and_unloaded_through_the_server_are_freed(models_dir, model_files):
    """The real server (HTTP and gRPC on real ports, explicit control): each version, having served
    JSON, binary and gRPC requests, is freed once an unload call has unloaded it, and so is one a
    load call replaced with a changed file. Which load thread runs a call is the scheduler's: a
    version stayed only when its load's thread ran nothing after it, which on a fresh server's
    first load and unload was so in 20 runs of 20, in the later rounds now and then."""
    config = server_config(models_dir, grpc_port=free_port())
    with ServerThread(config) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{config.grpc_port}")
        try:
            for round_, scales in enumerate([(1,), (1, 2), (2, 1), (1, 2), (2, 1)]):
                pools: list[weakref.ref] = []
                for scale in scales:  # a second load call reloads the changed file
                    place(model_files[scale]["om"], models_dir / f"{MODEL}.om")
                    http.load_model(MODEL)
                    assert answers(http, grpc) == [float(scale)] * 3
                    (pool,) = opened_pools(MODEL, pools)
                    pools.append(weakref.ref(pool))
                    del pool
                http.unload_model(MODEL)  # answered once the version is closed
                assert all_freed(pools), f"round {round_}: a pool outlived its version's unload"
        finally:
            http.close()
            grpc.close()
