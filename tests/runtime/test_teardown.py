"""Teardown never waits for good on a hung device: an instance whose batch the device never
finishes is released when the device lets go, or abandoned (its memory left allocated, never
freed under the device) once its close's bound passes. The device here is the CPU runtime with
an execution held by a fault (faults.inject(..., hold=gate)) that the test only releases at
the end; nothing asserts a duration."""
from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

import pytest

from aclserve.acl.cpu import faults
from aclserve.errors import DeviceTimeout
from aclserve.runtime import AclRuntime, open_pool, teardown
from aclserve.runtime.futures import BatchFutures

from tests.hung_device import let_go, short_timeout_only_on
from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


@contextlib.contextmanager
def timed_out_then_done():
    """The batch run in the block times out; its execution is held until then and let go
    after, so it ends late by itself and nothing hangs. (A fixed delay past the timeout was
    not enough: a completion thread stalled that long would find the batch done.)"""
    gate = threading.Event()
    faults.inject("execute", nth=1, hold=gate)
    try:
        with pytest.raises(DeviceTimeout):
            yield
    finally:
        gate.set()


def test_a_rebuild_abandons_a_hung_instance_instead_of_waiting_for_it(runtime, affine_om, caplog):
    """The replacement serves while the old instance is disposed of; the disposal ends once the
    old instance's reset_timeout_ms has passed, leaving its memory allocated (the device may
    still write into its slots), says so once, and frees it when the device lets go."""
    pool = open_pool(runtime, affine_om(), "affine", execution_timeout_ms=100)
    short_timeout_only_on(pool)  # the rebuilt instance's batch gets a generous one
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        first = pool.instances[0]
        first.reset_timeout_ms = 200
        faults.inject("execute", nth=1, hold=gate)
        with pytest.raises(DeviceTimeout):
            done.submit([affine_request(1)], 1).result(timeout=30)
        assert done.submit([affine_request(1, 4)], 1).result(timeout=30).instance == "affine#0"
        assert pool.instances[0] is not first
        rebuild = [t for t in threading.enumerate() if t.name == "affine-rebuild0"]
        for thread in rebuild:
            thread.join(60)  # a hang guard: it waited for the device for good before
            assert not thread.is_alive()
        assert not gate.is_set()  # the device still holds the old instance's batch
        assert teardown.held() == 1
        assert first.context and first.slots and first.model is not None  # nothing freed under it
        abandoned = [r for r in caplog.records if "abandoned" in r.getMessage()]
        assert len(abandoned) == 1 and "affine#0" in abandoned[0].getMessage()
        let_go(gate)
        assert not first.context and not first.slots and first.model is None
    finally:
        let_go(gate)
        pool.close()


@contextlib.contextmanager
def abandoned_while_hung(runtime, affine_om):
    """A pool closed (deadline 0.2 s) while its batch hangs on the device: yields (the
    abandoned instance, the hung batch's future, the gate that lets the device go)."""
    pool = open_pool(runtime, affine_om(), "affine", execution_timeout_ms=600_000)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        held = faults.inject("execute", nth=1, hold=gate)
        hung = done.submit([affine_request(1)], 1)
        assert held.entered.wait(30)
        instance = pool.instances[0]
        pool.close(deadline=time.monotonic() + 0.2)
        yield instance, hung, gate
    finally:
        let_go(gate)
        pool.close()


def test_closing_a_pool_while_a_batch_hangs_ends_at_its_deadline(runtime, affine_om):
    """Unload and shutdown: the pool's close waits for the device until the deadline it is
    given, then abandons the instance still running (its batch fails on its own later)."""
    device = runtime.device(0)
    baseline = device.mem_info()[0]
    with abandoned_while_hung(runtime, affine_om) as (instance, hung, gate):
        assert not gate.is_set() and teardown.held() == 1
        assert instance.context and instance.slots
        let_go(gate)
        hung.result(timeout=30)  # the batch came back late, into memory that was still there
        assert not instance.context and device.mem_info()[0] == baseline


def test_an_idle_pool_closes_and_frees_everything(runtime, affine_om):
    device = runtime.device(0)
    baseline = device.mem_info()[0]
    pool = open_pool(runtime, affine_om(), "affine", instances=2)
    BatchFutures(pool).submit([affine_request(2)], 2).result(timeout=30)
    pool.close(deadline=time.monotonic())  # past already: an idle device lets go at once
    assert teardown.held() == 0 and device.mem_info()[0] == baseline


def test_the_runtime_leaves_alone_a_device_that_a_rebuild_still_waits_for(affine_om, caplog):
    """Closing the runtime while a rebuild's disposal still waits for the hung device (in its
    own thread): the device is not reset and ACL not finalized under that close; the disposal
    frees the old instance once the device lets go."""
    rt = AclRuntime(device="cpu").start()
    gate = threading.Event()
    pool = open_pool(rt, affine_om(), "affine", execution_timeout_ms=100)
    short_timeout_only_on(pool)  # the rebuilt instance's batch gets a generous one
    done = BatchFutures(pool)
    first = pool.instances[0]
    first.reset_timeout_ms = 600_000  # the disposal outwaits everything below
    try:
        faults.inject("execute", nth=1, hold=gate)
        with pytest.raises(DeviceTimeout):
            done.submit([affine_request(1)], 1).result(timeout=30)
        done.submit([affine_request(1)], 1).result(timeout=30)  # on the rebuilt instance
        pool.close(deadline=time.monotonic())  # does not wait for the rebuild thread's disposal
        assert teardown.unreleased() == 2 and teardown.held() == 0  # the rebuild, and its disposal
        rt.close()
        assert "device 0 not reset" in caplog.text and "ACL not finalized" in caplog.text
    finally:
        gate.set()
        for thread in [t for t in threading.enumerate() if t.name == "affine-rebuild0"]:
            thread.join(60)  # a hang guard: the device has let go
        pool.close()
        rt.close()
    assert not first.context and teardown.unreleased() == 0
    AclRuntime(device="cpu").start().close()  # now the device is reset and ACL finalized


def test_the_runtime_leaves_alone_a_device_that_a_rebuild_still_builds_on(affine_om, caplog):
    """Closing the runtime while a rebuild still builds the replacement instance (its context
    made, its model loading, in its own thread; the pool's close stopped waiting for it): the
    device is not reset and ACL not finalized under that build (CANN: destroy a device's
    contexts before resetting it)."""
    rt = AclRuntime(device="cpu").start()
    building = threading.Event()
    pool = open_pool(rt, affine_om(), "affine", execution_timeout_ms=100)
    done = BatchFutures(pool)
    try:
        load = faults.inject("query_size", nth=1, hold=building)  # the rebuild's model load
        with timed_out_then_done():
            done.submit([affine_request(1)], 1).result(timeout=30)
        assert load.entered.wait(30)
        pool.close(deadline=time.monotonic())  # stops waiting for the rebuild thread
        for _ in range(3000):  # a hang guard: the old instance's late batch ends by itself
            if teardown.release_recovered() == 0:
                break
            time.sleep(0.01)
        rt.close()
        assert "device 0 not reset" in caplog.text and "ACL not finalized" in caplog.text
    finally:
        building.set()
        for thread in [t for t in threading.enumerate() if t.name == "affine-rebuild0"]:
            thread.join(60)  # a hang guard
        pool.close()
        rt.close()
    assert teardown.unreleased() == 0
    AclRuntime(device="cpu").start().close()  # now the device is reset and ACL finalized


def test_an_idle_instance_is_freed_even_when_a_rebuild_used_up_the_close_deadline(runtime, affine_om, caplog):
    """The pool's close waits for a rebuild first; the instances it closes after that get a
    moment of their own, so an idle one is freed, not abandoned as if the device held it."""
    building = threading.Event()
    pool = open_pool(runtime, affine_om(), "affine", instances=2, execution_timeout_ms=100, retry=False)
    done = BatchFutures(pool)
    idle = pool.instances[1]
    try:
        load = faults.inject("query_size", nth=1, hold=building)  # the rebuild's model load
        with timed_out_then_done():
            done.submit([affine_request(1)], 1, lane=0).result(timeout=30)
        assert load.entered.wait(30)
        pool.close(deadline=time.monotonic())  # the rebuild thread takes all of it
        assert not idle.context and "affine#1" not in "".join(
            r.getMessage() for r in caplog.records if "abandoned" in r.getMessage())
    finally:
        building.set()
        for thread in [t for t in threading.enumerate() if t.name == "affine-rebuild0"]:
            thread.join(60)  # a hang guard
        pool.close()
        for _ in range(3000):  # a hang guard: the old instance's late batch ends by itself
            if teardown.release_recovered() == 0:
                break
            time.sleep(0.01)


def test_an_abandoned_instance_keeps_its_streams_and_events_on_the_ledger_until_freed(runtime, affine_om):
    """Its streams and events still exist on the device, so a load meanwhile must not count on
    them (the device would refuse it); they are given back once the instance is freed."""
    ledger = runtime.device(0).ledger
    before = (ledger.streams, ledger.events)
    pool = open_pool(runtime, affine_om(), "affine", instances=2, execution_timeout_ms=600_000)
    claimed = (ledger.streams - before[0], ledger.events - before[1])
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        held = faults.inject("execute", nth=1, hold=gate)
        hung = done.submit([affine_request(1)], 1, lane=0)
        assert held.entered.wait(30)
        pool.close(deadline=time.monotonic() + 0.2)
        assert teardown.held() == 1
        assert (ledger.streams - before[0], ledger.events - before[1]) == (claimed[0] // 2, claimed[1] // 2)
        let_go(gate)
        hung.result(timeout=30)
        assert (ledger.streams, ledger.events) == before
    finally:
        let_go(gate)
        pool.close()


def test_a_rebuilt_instance_keeps_the_reset_timeout_its_pool_was_opened_with(runtime, affine_om):
    """reset_timeout_ms is the model's (its config key): the instances the pool opens and the
    one a rebuild makes all wait that long for the device at close."""
    pool = open_pool(runtime, affine_om(), "affine", execution_timeout_ms=100, reset_timeout_ms=1234)
    short_timeout_only_on(pool)  # the rebuilt instance's batch gets a generous one
    done = BatchFutures(pool)
    try:
        first = pool.instances[0]
        assert first.reset_timeout_ms == 1234
        with timed_out_then_done():
            done.submit([affine_request(1)], 1).result(timeout=30)
        done.submit([affine_request(1)], 1).result(timeout=30)  # waits for the rebuilt instance
        assert pool.instances[0] is not first and pool.instances[0].reset_timeout_ms == 1234
    finally:
        pool.close()
        for _ in range(3000):  # a hang guard: the old instance's late batch ends by itself
            if teardown.release_recovered() == 0:
                break
            time.sleep(0.01)


def test_an_abandoned_instance_is_freed_when_the_device_lets_go_with_nothing_else_closing(runtime, affine_om):
    """Held instances were retried only when another instance closed: on a quiet server they
    stayed held (threads, context and memory; the gauge said a hang that was over) until then
    (found by an independent soak). A thread retries them while any are held."""
    with abandoned_while_hung(runtime, affine_om) as (instance, hung, gate):
        assert teardown.held() == 1 and instance.context
        gate.set()  # the device lets go; nothing else closes or calls release_recovered
        hung.result(timeout=30)
        for _ in range(3000):  # a hang guard, not a timing
            if teardown.held() == 0:
                break
            time.sleep(0.01)
        assert teardown.held() == 0 and not instance.context


def test_a_pool_counts_what_it_left_on_the_device_the_instance_a_rebuild_replaced_included(runtime, affine_om):
    """What a failed load's retry waits for (repository/failures.py): after its pool's close, the
    instances not freed are the abandoned ones, here the hung one a rebuild replaced and then
    abandoned; the word that none is left comes once the device lets go of it."""
    pool = open_pool(runtime, affine_om(), "affine", execution_timeout_ms=100)
    short_timeout_only_on(pool)
    done, gate, none_left = BatchFutures(pool), threading.Event(), threading.Event()
    try:
        pool.instances[0].reset_timeout_ms = 200
        faults.inject("execute", nth=1, hold=gate)
        with pytest.raises(DeviceTimeout):
            done.submit([affine_request(1)], 1).result(timeout=30)
        pool.close()  # (after the rebuild: the rebuilt instance is freed, the hung one abandoned)
        assert teardown.held() == 1 and pool.left_on_device.count == 1
        assert pool.left_on_device.when_none(none_left.set) and not none_left.is_set()
        let_go(gate)
        assert none_left.wait(30) and pool.left_on_device.count == 0  # (a hang guard)
        assert not pool.left_on_device.when_none(none_left.clear)  # none left: not kept, not run
        assert none_left.is_set()
    finally:
        let_go(gate)
        pool.close()


def test_an_instance_whose_release_fails_stays_held_and_the_others_are_still_retried():
    """Found by review: one release that raised skipped the rest of the retry and ended the
    retry thread for good. Instances here are stand-ins for ModelInstances: what is tested is
    teardown's bookkeeping, not the device."""
    class Held:
        def __init__(self, name, fails):
            self.name, self.fails, self.freed = name, fails, False
            self.device = SimpleNamespace(id=0)

        def release(self, deadline):
            if self.fails:
                raise RuntimeError("set_context failed")
            self.freed = True
            return None

    broken, fine = Held("broken", True), Held("fine", False)
    teardown.abandon(broken, "its compute stream is still running")
    teardown.abandon(fine, "its compute stream is still running")
    try:
        for _ in range(3000):  # a hang guard: the retry thread frees "fine" within RETRY_S
            if fine.freed:
                break
            time.sleep(0.01)
        assert fine.freed and teardown.held() == 1
        broken.fails = False
        for _ in range(3000):  # the same thread, still retrying
            if teardown.held() == 0:
                break
            time.sleep(0.01)
        assert broken.freed and teardown.held() == 0
    finally:
        broken.fails = False
        teardown.release_recovered()


def test_a_close_waits_a_moment_for_a_retry_already_running_not_for_good():
    """Instance closes do not wait for a retry that runs (it may wait on a hung device for
    good); the runtime's close waits a moment (RETRY_WAIT_S), so a retry of the retry thread
    that meets it does not leave ACL unfinalized (found by review). A stand-in instance: what
    is tested is the retries' bookkeeping."""
    class Freed:
        name, device = "freed", SimpleNamespace(id=0)

        def release(self, deadline):
            return None

    teardown._retrying.acquire()  # a retry running (the retry thread's)
    try:
        teardown.abandon(Freed(), "its compute stream is still running")
        assert teardown.release_recovered(wait_s=0) == 1  # an instance close: not waited for
        done = []
        waiter = threading.Thread(target=lambda: done.append(teardown.release_recovered(wait_s=30)))
        waiter.start()
    finally:
        teardown._retrying.release()  # the running retry ends
    waiter.join(60)  # a hang guard
    assert done == [0] and teardown.held() == 0


def test_an_instance_whose_thread_cannot_start_frees_what_it_made(runtime, affine_om, monkeypatch):
    """At the process's thread limit a load failed with "can't start new thread" after the
    instance had made its context, streams, model and slots, and its launcher thread ran on:
    all held until exit (found by running the server under `ulimit -u`)."""
    from aclserve.acl.cpu import _state
    from aclserve.runtime.instance_resources import InstanceResources
    device = runtime.device(0)
    baseline = (device.mem_info()[0], len(_state.contexts), len(_state.streams), len(_state.events))
    threads = threading.active_count()
    start_thread = InstanceResources.start_thread

    def no_completion_thread(self, role, target):
        if role == "complete":
            raise RuntimeError("can't start new thread")
        return start_thread(self, role, target)

    monkeypatch.setattr(InstanceResources, "start_thread", no_completion_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        open_pool(runtime, affine_om(), "affine", instances=1)
    assert (device.mem_info()[0], len(_state.contexts), len(_state.streams), len(_state.events)) == baseline
    assert threading.active_count() == threads and teardown.held() == 0
    monkeypatch.undo()
    pool = open_pool(runtime, affine_om(), "affine", instances=1)  # its claim on the device went back too
    pool.close()
