"""Teardown bounded in time: an instance is freed once the device has let go of it, else abandoned.

A batch the device never finishes keeps its streams busy, and that work reads the model and
writes into a slot's memory. Destroying such a stream waits for the work (CANN: a stream with
unfinished tasks is destroyed once they complete), so an untimed teardown waits as long as the
device hangs; and freeing the memory under the work lets the device write into memory that is
reused for something else, which is worse than leaking it. So a ModelInstance's close waits for
its threads and streams only until a deadline (the shutdown's, else its reset_timeout_ms); past
it the instance is abandoned (also when its launcher thread is still inside a launch: the close
answers the batches that thread holds, Launcher.give_up in launcher.py): nothing of it is
freed, one ERROR line names it, and it is held here (`held()`, `aclserve_abandoned_instances`
in /metrics). `release_recovered()` frees the held instances whose device work has ended
since: each instance close calls it first, the runtime calls it before it resets the
devices, and a thread calls it every RETRY_S while any are held. A device with an instance
still held, still being closed (a rebuild's disposal, in its own thread) or being built by a
rebuild, or with a model load still opening or warming up a pool on it (one a shutdown
abandoned: it may hang there), is not reset by the runtime it belongs to (another runtime's
reset there gives back only its own set_device) and ACL is not finalized (the process's exit
gives the device back).

An instance whose context stopped on a failure cannot learn from its streams' synchronize
whether the device is done (it answers the failure at once): its streams are aborted first
(`still_running`), and one whose abort fails counts as still running.

A close's deadline may be brought forward while it waits (`ModelInstance.hurry`: a shutdown
arriving while an unload waits for the device), so the waits are cut in POLL_S slices that each
look at the deadline again. Where CANN has no `synchronize_stream_with_timeout` the wait is
untimed (acl/compat.py says so once in the log).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import time
from typing import Callable, Iterable, Mapping

from ..acl import AclError, compat
from ..acl import constants as C
from ..daemon_threads import run_in_thread

log = logging.getLogger(__name__)

# What a closing pool gives its instances even past its deadline (a shutdown's drain may have used
# all of it): an idle instance's threads stop and its streams answer within it, a hung one never.
GRACE_S = 0.5
# The longest single wait for the device: a deadline brought forward is seen within this.
POLL_S = 0.1
# What each instance's close gets at least, however late it comes: an idle instance's threads
# stop and its streams answer within it (a hung one is abandoned after it).
INSTANCE_GRACE_S = 0.1

# Held instances are retried at every instance close and, while there are any, every RETRY_S
# (a device that lets go while nothing else closes frees them too)
RETRY_S = 1.0

_lock = threading.Lock()  # guards the lists below
_retrying = threading.Lock()  # held while the held instances are retried, so each is freed once
_held: list = []  # abandoned ModelInstances: `name`, `device.id`, `release(deadline)`
_retry_thread: threading.Thread | None = None  # retries the held instances while there are any
_working: list[tuple[object, int]] = []  # (owner, device) of each instance close, rebuild or load running now


def _forget_in_child() -> None:
    """The parent's abandoned instances and closes are not a forked child's (its runtime starts
    afresh there: acl_runtime.py); its locks may have been held by the parent's threads."""
    global _lock, _retrying, _retry_thread
    _lock, _retrying, _retry_thread = threading.Lock(), threading.Lock(), None
    _held.clear()
    _working.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def ms_left(deadline: float) -> int:
    """Milliseconds until `deadline` (time.monotonic()) for a timed ACL wait: at least 1, the
    smallest bound pyACL documents (-1 is forever)."""
    return max(1, math.ceil((deadline - time.monotonic()) * 1000))


def join(thread: threading.Thread, deadline: Callable[[], float]) -> bool:
    """Join `thread` until `deadline()` (read again every POLL_S). Whether it has ended."""
    while thread.is_alive() and (left := deadline() - time.monotonic()) > 0:
        thread.join(min(left, POLL_S))
    return not thread.is_alive()


def still_running(acl, threads: Iterable[threading.Thread | None], streams: Mapping[str, int],
                  deadline: Callable[[], float], stops_on_failure: bool = False) -> str | None:
    """Join `threads`, then wait for `streams` (their context current), until `deadline()` (read
    again every POLL_S: it may come forward). None when all are done; else what still runs. A
    fault a stream kept is not work: destroying the stream clears it. But where the streams
    stop on a failure (`stops_on_failure`), a synchronize reports the stopped context's failure
    at once, not once the device is done, so the streams are then aborted (compat.abort_stream;
    one that cannot be, what still runs)."""
    for thread in threads:
        if thread is not None and not join(thread, deadline):
            return f"its thread {thread.name} is still running"
    failed = False
    for role, stream in streams.items():
        while True:
            try:
                compat.synchronize_stream(acl, stream, ms_left(min(deadline(), time.monotonic() + POLL_S)))
                break
            except AclError as e:
                if e.ret != C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
                    failed = True
                    break
                if time.monotonic() >= deadline():
                    return f"the device is still running its {role} stream"
    if failed and stops_on_failure:
        for role, stream in streams.items():
            outcome = compat.abort_stream(acl, stream)
            if outcome == compat.ABORT_FAILED:
                return f"its {role} stream could not be aborted after its context stopped on a failure"
            if outcome == compat.NO_ABORT:
                break  # not taken here (said once): the same for the others
    return None


def abandon(instance, running: str) -> None:
    """Hold `instance` unfreed, saying so once; the retry thread frees it once the device lets
    go (also when no other instance closes meanwhile)."""
    global _retry_thread
    with _lock:
        _held.append(instance)
        start = _retry_thread is None
        if start:
            _retry_thread = threading.Thread(target=_retry_held, name="aclserve-abandoned-retry", daemon=True)
            _retry_thread.start()
    log.error("%s: %s past the close's deadline; the instance is abandoned: its context, streams, "
              "model and slot memory stay allocated (the device may still write into them) and are "
              "freed if the device lets go of them while the process runs", instance.name, running)


def release_recovered(wait_s: float | None = None) -> int:
    """Free the held instances whose device work has ended since (a poll each). Returns how
    many are still held. One retry at a time, so each is freed once; with `wait_s`, none if
    another one runs longer than that (a close does not queue behind a retry that waits on the
    device, which where CANN cannot time a wait may be for good). `_lock` is not held while the
    device is polled (held() answers /metrics meanwhile). An instance whose release fails stays
    held."""
    if not _retrying.acquire(timeout=-1 if wait_s is None else wait_s):
        return held()
    try:
        with _lock:
            candidates = list(_held)
        freed = [i for i in candidates if _released(i)]
        with _lock:
            for instance in freed:
                _held.remove(instance)
                log.warning("%s: the device has let go of the abandoned instance; it is freed", instance.name)
            return len(_held)
    finally:
        _retrying.release()


def _released(instance) -> bool:
    try:
        return instance.release(time.monotonic()) is None
    except Exception:  # noqa: BLE001 - one instance's failure must not stop the retries of the others
        log.exception("%s: freeing the abandoned instance failed; it stays held", instance.name)
        return False


def _retry_held() -> None:
    """While instances are held: retry them every RETRY_S, then end (abandon() starts another).
    A failed retry is logged and retried: the thread ends only with nothing held."""
    global _retry_thread
    while True:
        time.sleep(RETRY_S)
        try:
            release_recovered()
        except Exception:  # noqa: BLE001 - the thread must outlive it, or held instances wait for a close
            log.exception("retrying the abandoned instances failed")
        with _lock:
            if not _held:
                _retry_thread = None
                return


@contextlib.contextmanager
def working_on(device_id: int, owner):
    """Count `device_id` as in use by `owner` (the AclRuntime whose device it is) while the block
    runs: an instance's close waiting for the device, a rebuild building an instance on it (its
    context made, its model loading), or a model load opening and warming up a pool on it."""
    with _lock:
        _working.append((owner, device_id))
    try:
        yield
    finally:
        with _lock:
            _working.remove((owner, device_id))


def held(device_id: int | None = None) -> int:
    """Abandoned instances still held (on `device_id`, or on any device)."""
    with _lock:
        return sum(1 for i in _held if device_id is None or i.device.id == device_id)


def unreleased(device_id: int | None = None, owner=None) -> int:
    """Instances held, being closed, rebuilt or loaded (on `device_id`, or on any device; of
    `owner`'s devices, or of any runtime's): while its own are, a runtime does not reset the
    device, nor is ACL finalized while any are."""
    with _lock:
        work = [*((i.device.owner, i.device.id) for i in _held), *_working]
        return sum(1 for o, d in work if (device_id is None or d == device_id) and (owner is None or o is owner))


def close_at_once(closes: list[Callable[[], None]]) -> list[Exception]:
    """Run the instances' (or pools': closing.py) closes side by side, each in a thread, and
    return their errors: each waits for its device up to the deadline and then a moment of its
    own (INSTANCE_GRACE_S), so one after another, 48 hung instances ended 4.8 s past the
    shutdown deadline (one after another where no thread can be started: run_in_thread)."""
    errors: list[Exception] = []

    def close(run: Callable[[], None]) -> None:
        try:
            run()
        except Exception as e:  # keep closing the others; report at the end
            errors.append(e)
    if len(closes) == 1:
        close(closes[0])
        return errors
    threads = [run_in_thread(functools.partial(close, run), "instance-close") for run in closes]
    for thread in threads:
        if thread is not None:  # (None: no thread to be had, at exit say: closed in this one)
            thread.join()
    return errors
