"""LoadThreads: the repository's load executor, whose threads do not hold the process's exit.

Its threads compile, validate, open and warm up model versions, and close them. A load or
warm-up waits for the device as long as the device hangs; a ThreadPoolExecutor's threads are
joined when the interpreter exits, so one stuck there kept `aclserve serve` from exiting after
its shutdown had ended. These threads are daemons, and the repository's close waits for what
they still run (`unfinished()`) only until its deadline.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from typing import Callable

POLL_S = 0.1  # a deadline brought forward (the repository's close hurried) is seen within this
_calls_lock = threading.Lock()
_calls = 0  # calls submitted to any LoadThreads of the process and not finished (running_calls)


def running_calls() -> int:
    """Calls of every LoadThreads in the process submitted and not finished: after a shutdown,
    the work it abandoned (a load, a warm-up) that its daemon threads still run."""
    with _calls_lock:
        return _calls


class LoadThreads(concurrent.futures.Executor):
    """Up to `workers` daemon threads named `name`-N, started as work comes, running submitted
    calls in order. Owned by the repository's Lifecycle; shutdown() stops them once idle."""

    def __init__(self, workers: int, name: str):
        if workers < 1:
            raise ValueError("LoadThreads needs at least one worker")
        self._workers, self._name = workers, name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._unfinished: set[concurrent.futures.Future] = set()
        self._shut = False

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        global _calls
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._unfinished.add(future)
            with _calls_lock:
                _calls += 1
            self._jobs.put((future, fn, args, kwargs))
            if len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        future.add_done_callback(self._finished)
        return future

    def unfinished(self) -> list[concurrent.futures.Future]:
        """The calls submitted and not finished yet (queued or running)."""
        with self._lock:
            return list(self._unfinished)

    async def calls_ended_by(self, deadline: Callable[[], float]) -> None:
        """On the loop: wait for the unfinished calls until `deadline()` (time.monotonic(), read
        again every POLL_S: it may come forward), no later; their outcome is then theirs."""
        waiters = [asyncio.wrap_future(f) for f in self.unfinished()]
        while (running := [w for w in waiters if not w.done()]) and (left := deadline() - time.monotonic()) > 0:
            await asyncio.wait(running, timeout=min(left, POLL_S))
        for waiter in waiters:  # read: a failed load's error (said by its task) was an asyncio ERROR
            if waiter.done() and not waiter.cancelled():  # "Future exception was never retrieved" at exit
                waiter.exception()
            waiter.cancel()  # one still running is not waited for: its thread handles its outcome

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; the threads end once what is queued has run (`cancel_futures`: what
        has not started is cancelled). `wait`: join them, however long they run."""
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        for _ in threads:
            self._jobs.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._run(*job)
            del job  # nothing of a finished call is kept while idle

    @staticmethod
    def _run(future: concurrent.futures.Future, fn, args, kwargs) -> None:
        """One call; its result and arguments end with this frame. (A result left in _work's
        frame kept the last version a thread built, unloaded since, until its next job.)"""
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller, as ThreadPoolExecutor does
            future.set_exception(e)
        else:
            future.set_result(result)

    def _finished(self, future: concurrent.futures.Future) -> None:
        global _calls
        with self._lock:
            self._unfinished.discard(future)
        with _calls_lock:
            _calls -= 1
