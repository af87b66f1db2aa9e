"""A version whose device cannot give its instances their streams and events is refused before
its .onnx compiles, in the words its open would refuse it with: the counts come from its config
(instances, devices, slots), not from the compiled model. A tester's 57th model of 1 instance x 2
slots on the CPU runtime's 1023 events was compiled (minutes, GBs) only to be refused after.
What is on its way back there (a version unloading, still draining) refuses nothing before the
compile: it may be back by the open, whose claim decides. Real repository, CPU runtime, real
compiles; the events are lowered with device_limits (the runtime's own, ACLSERVE_CPU_MAX_EVENTS,
is read once per process)."""
from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from aclserve.acl.cpu import faults

from .repo_helpers import place, x_rows

pytestmark = pytest.mark.asyncio

# what the open's claim says of the second model (1 instance x 2 slots: 4 streams, 18 events)
REFUSAL = ("model b:1 (1 instance(s) x 2 slots) needs 4 streams and 18 events on device 0, which allows 1024 "
           "streams and 30 events (7 and 18 already in use); give models fewer instances or slots, spread them "
           "over more devices, or set device_limits if this device allows more")


@pytest.fixture
def runtime():
    """A CPU runtime whose device allows 30 events: one model of 1 instance x 2 slots (18) fits, not two."""
    from aclserve.runtime import AclRuntime
    rt = AclRuntime(device="cpu", device_limits=(None, 30)).start()
    yield rt
    rt.close()


def reason_of(repo, name: str) -> tuple[str, str]:
    ((state, reason),) = [(r["state"], r["reason"]) for r in repo.index() if r["name"] == name]
    return state, reason


@pytest.mark.parametrize("kind", ["onnx", "om"])  # the .om: refused by its open's claim, as before
async def test_a_model_the_device_cannot_hold_is_refused_before_its_compile(
        make_repo, models_dir, model_files, tmp_path, caplog, kind):
    cache = tmp_path / "cache"
    place(model_files[1]["om"], models_dir / "a.om")
    repo, events = await make_repo(compile_cache_dir=str(cache))
    caplog.set_level(logging.INFO, logger="aclserve")
    place(model_files[2][kind], models_dir / f"b.{kind}")
    await events.wait("load_failed", "b")
    state, reason = reason_of(repo, "b")  # the .onnx's word for word the .om's, waiting for room as a shortage
    assert (state, reason) == ("UNAVAILABLE", f"{REFUSAL} (the device short of streams or events: waits for room on "
                                              "device 0, tried again as models there unload)"), reason
    assert reason_of(repo, "a") == ("READY", "")
    assert not cache.exists() or not any(cache.iterdir())  # no compile entry, no work folder
    assert not [r for r in caplog.records if r.getMessage().startswith("b: compiling")]


async def test_a_model_fitting_once_an_unloading_one_is_gone_is_compiled_and_loads(
        make_repo, models_dir, model_files, tmp_path, caplog, compile_holds, clean_faults):
    place(model_files[1]["om"], models_dir / "a.om")
    (models_dir / "a.yaml").write_text("execution_timeout_ms: 600000\n")  # (only the test ends its held run)
    repo, events = await make_repo(model_control_mode="explicit", compile_cache_dir=str(tmp_path / "cache"),
                                   shutdown_timeout_s=600)
    place(model_files[2]["onnx"], models_dir / "b.onnx")  # (explicit mode: loaded when asked)
    caplog.set_level(logging.INFO, logger="aclserve")
    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate)
    try:
        request = asyncio.ensure_future(repo.get("a").infer(x_rows(), 1))
        await asyncio.get_running_loop().run_in_executor(None, held.entered.wait, 60)
        unload = asyncio.ensure_future(repo.unload("a"))  # drains: waits for the held run
        await events.wait("unloading", "a")
        load = asyncio.ensure_future(repo.load("b"))
        for _ in range(6000):  # (a hang guard: b's compile holds in its child, or b was refused)
            if any(compile_holds.iterdir()) or load.done():
                break
            await asyncio.sleep(0.01)
        assert not load.done(), load.exception()
        assert reason_of(repo, "a")[0] == "UNLOADING" and not unload.done()  # a still holds its events
        assert [r for r in caplog.records if r.getMessage().startswith(
            "b:1: its devices have the streams and events it needs only once what closes there gives theirs")]
    finally:
        gate.set()
    await request
    await unload
    for mark in compile_holds.iterdir():
        mark.unlink()
    await load
    assert reason_of(repo, "b") == ("READY", "")


async def test_a_device_the_host_has_not_is_refused_before_the_compile(make_repo, models_dir, model_files, tmp_path,
                                                                       runtime):
    """Also known from the config alone: `devices` naming a device the host has not (the open's refusal)."""
    count = runtime.device_count()
    cache = tmp_path / "cache"
    place(model_files[1]["onnx"], models_dir / "m.onnx")
    (models_dir / "m.yaml").write_text(f"devices: [0, {count + 3}]\n")
    repo, _ = await make_repo(compile_cache_dir=str(cache))
    state, reason = reason_of(repo, "m")
    assert state == "UNAVAILABLE" and reason.startswith(
        f"{models_dir / 'm.yaml'}: devices [0, {count + 3}]: this host has no device {count + 3} ")
    assert not cache.exists() or not any(cache.iterdir())


async def test_a_pbtxt_gpu_the_host_has_not_is_refused_before_the_compile_in_its_words(
        make_repo, models_dir, model_files, tmp_path, runtime):
    """A config.pbtxt's instance_group gpus were refused as the `devices` they became, a key that
    file has not (a tester moving Triton repositories, t99): named in its field, the group's list."""
    count = runtime.device_count()
    cache = tmp_path / "cache"
    place(model_files[1]["onnx"], models_dir / "gpu" / "1" / "model.onnx")
    (models_dir / "gpu" / "config.pbtxt").write_text(
        f"max_batch_size: 4\ninstance_group [ {{ count: 1 kind: KIND_GPU gpus: [ 0, {count} ] }} ]\n")
    repo, _ = await make_repo(compile_cache_dir=str(cache))
    state, reason = reason_of(repo, "gpu")
    has = "device 0" if count == 1 else f"devices 0..{count - 1}"
    assert (state, reason) == ("UNAVAILABLE", f"{models_dir / 'gpu' / 'config.pbtxt'}: instance_group[0].gpus "
                                              f"[0, {count}]: this host has no device {count} (it has {has}: the ids "
                                              "this process sees, from 0)"), reason
    assert not cache.exists() or not any(cache.iterdir())


async def test_a_model_refused_for_streams_and_events_loads_once_another_is_unloaded(make_repo, models_dir,
                                                                                    model_files):
    """A tester's load refused by the device's ledger (`needs 4 streams and 18 events ... already in
    use`) was never tried again in poll mode once other models were unloaded and their events came
    back (a load call loaded it at once): a shortage, it waits for room there, and loads
    (test_room_waits.py: tried again as room is given back, not on the backoff's timer)."""
    place(model_files[1]["om"], models_dir / "a.om")
    repo, events = await make_repo(load_retry_initial_s=0.05, load_retry_max_s=0.2)
    place(model_files[2]["om"], models_dir / "b.om")
    await events.wait("load_failed", "b")
    (models_dir / "a.om").unlink()  # (poll mode: a unloads, its 18 events come back)
    await events.wait("loaded", "b")
    assert reason_of(repo, "b") == ("READY", "")


async def test_a_model_the_device_could_never_hold_is_not_retried(make_repo, models_dir, model_files):
    """Needing more events than the device has at all (2 instances x 2 slots: 36 of 30), no unload
    makes room: not retried, as a bad file is not (it waits for a new file, config or load call)."""
    place(model_files[1]["om"], models_dir / "big.om")
    (models_dir / "big.yaml").write_text("instances: 2\n")
    repo, _ = await make_repo(load_retry_initial_s=0.05, load_retry_max_s=0.2)
    state, reason = reason_of(repo, "big")
    assert state == "UNAVAILABLE" and reason.endswith("or set device_limits if this device allows more"), reason


async def test_the_metrics_label_of_a_ledger_refusal_leaves_out_the_figures_in_use(make_repo, models_dir,
                                                                                  model_files):
    """The ledger's `(7 and 18 already in use)` changes between the retries of one refusal as other
    models come and go, and each text is a series of its own in /metrics (aclserve_model_load_failure's
    reason label: a review, r33): the label leaves the figures out, the index says them."""
    place(model_files[1]["om"], models_dir / "a.om")
    repo, events = await make_repo(load_retry_initial_s=30, load_retry_max_s=60)
    place(model_files[2]["om"], models_dir / "b.om")
    await events.wait("load_failed", "b")
    assert reason_of(repo, "b")[1].startswith(REFUSAL)
    assert repo.load_failures()[("b", "1")] == (f"{REFUSAL.replace(' (7 and 18 already in use)', '')} (the device "
                                                "short of streams or events)")
