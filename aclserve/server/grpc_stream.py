"""One ModelStreamInfer call: its requests run concurrently, their answers go back as they are
ready, and a stream its client leaves quiet ends.

- Window: at most STREAM_WINDOW requests of a stream are held at once, from the read of a
  request to the send of its answer. A client that reads no answers is then not read either,
  and its answers do not pile up here.
- Quiet: while no request of the stream runs and no answer is being sent, the client's next
  message must come within `quiet_limit_s` (body_timeout_s; grpc's own idle limit sees only
  connections without calls), counted from the stream's last progress (a message read, an
  answer made or sent); else the stream ends with BodyTimeout (DEADLINE_EXCEEDED).
- Not timed: a stream whose client stops reading its answers. grpc's flow control holds the
  answer being sent, and the handler has no way to end that call: an abort's status waits
  behind the answer (tried). The call keeps its slot and at most STREAM_WINDOW requests until
  the client reads or goes. So a client that writes all its requests before reading any
  answer waits once the window and both sides' buffers are full (300 small requests fit).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import grpc

from .body import BodyTimeout

STREAM_WINDOW = 64  # requests of one stream held (read, answer not yet sent) before it is not read


class InferStream:
    """Owned by its ModelStreamInfer handler, which iterates `answers()` to the end; leaving the
    iteration cancels whatever of the stream still runs. `answer(message)` makes the response
    message for one request message and does not raise (errors are responses too)."""

    def __init__(self, context, answer: Callable[[bytes], Awaitable[object]], quiet_limit_s: float):
        self._context = context
        self._answer = answer
        self._quiet_limit_s = quiet_limit_s
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Queue = asyncio.Queue()  # answers made, not yet sent
        self._window = asyncio.Semaphore(STREAM_WINDOW)
        self._tasks: set[asyncio.Task] = set()
        self._running = 0  # requests read whose answer is not made yet
        self._sending = False  # an answer is with grpc (the client's flow control may hold it)
        self._progress_at = self._loop.time()  # the last message read, answer made or answer sent
        self.quiet = False  # ended for its client's silence

    async def answers(self):
        """The stream's response messages, as they are ready. Raises BodyTimeout when the stream
        went quiet waiting for a message; the error of a broken request stream."""
        reader = asyncio.ensure_future(self._read())
        watchdog = asyncio.ensure_future(self._watch())
        getter = None
        try:
            while not (reader.done() and self._running == 0 and self._ready.empty()):
                getter = asyncio.ensure_future(self._ready.get())
                await asyncio.wait([getter, watchdog] if reader.done() else [getter, watchdog, reader],
                                   return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    self._sending = True
                    yield getter.result()
                    self._sending = False
                    self._progress_at = self._loop.time()
                    self._window.release()
                    continue
                getter.cancel()
                if watchdog.done():
                    raise BodyTimeout(f"no request message on the stream for {self._quiet_limit_s:g} s "
                                      "(body_timeout_s)")
            reader.result()  # a broken request stream ends the call with its error
        finally:
            for task in (reader, watchdog, getter):
                if task is not None:
                    task.cancel()
            for task in list(self._tasks):
                task.cancel()

    async def _read(self) -> None:
        while True:
            await self._window.acquire()  # before reading: a message is held only once it can run
            message = await self._context.read()
            if message is grpc.aio.EOF:
                return
            self._progress_at = self._loop.time()
            self._running += 1
            task = asyncio.ensure_future(self._run(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, message: bytes) -> None:
        try:
            response = await self._answer(message)
        finally:
            self._running -= 1
            self._progress_at = self._loop.time()  # quiet from here at the earliest
        self._ready.put_nowait(response)

    async def _watch(self) -> None:
        """Return once the stream has been quiet for quiet_limit_s: no request running, no
        answer being sent, no message read."""
        while True:
            if self._running or self._sending:
                wait = self._quiet_limit_s
            else:
                wait = self._progress_at + self._quiet_limit_s - self._loop.time()
                if wait <= 0:
                    self.quiet = True
                    return
            await asyncio.sleep(wait)
