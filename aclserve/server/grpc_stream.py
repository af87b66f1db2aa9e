"""One ModelStreamInfer call: its requests run concurrently, their answers go back in the order
the requests came, and a stream its client leaves quiet, or whose answers it does not take, ends.

- Order: as Triton answers a stream of a model that is not decoupled, so that a client may pair
  answers with requests by position (tritonclient drops the id of an error answer): an answer
  made early waits for those of the requests before it, and holds its place in the window
  meanwhile (a request waiting in its model's queue for company may then hold the stream's
  reading until its max_queue_delay_ms has passed).

- Window: at most STREAM_WINDOW requests of a stream are held at once, from the read of a
  request to the send of its answer. A client that reads no answers is then not read either,
  and its answers do not pile up here.
- Memory: each request's lease (its message, parsing, its answer) is held until grpc has taken
  its answer (sent it within the client's flow-control window), not only until it is made; a
  failed request's keeps the part its error answer holds (names cut: grpc_service.py).
- Quiet: while no request of the stream runs and no answer is being sent, the client's next
  message must come within `quiet_limit_s` (body_timeout_s; grpc's own idle limit sees only
  connections without calls), counted from the stream's last progress (a message read, an
  answer made or sent); else the server ends the stream with StreamIdle (UNAVAILABLE).
- Drain: at shutdown (`drain()`) nothing more is read; the requests running are answered,
  then the stream ends with ShuttingDown (UNAVAILABLE), at once when none runs, so that an idle
  stream does not hold the shutdown until its deadline.
- Unread: an answer the client has not taken within `send_limit_s` (body_timeout_s) ends the
  stream: nothing more is read, what runs is cancelled and the answers waiting are dropped,
  their leases given back at once. The answer grpc holds stays charged until grpc lets it go:
  grpc gives the handler no way to end a call whose answer waits on the client's flow control
  (an abort's status would wait behind that answer). When the client takes it, the stream ends
  with BodyTimeout saying so; when the client goes, or the connection reaches its age
  (grpc_max_connection_age_s), the call is cancelled and `close()` gives the rest back.
- Ending on an error (`ends_on_error`, Triton's `triton_grpc_error`): the answers after the first
  failed request would be dropped, so once a request fails nothing more is read and the requests
  after it still running are cancelled at once (counted failed, their client gone: a request
  queued leaves its queue unrun), their answers made let go. A tester found them run and counted
  successes, how many varying with the race (tests/server/test_grpc_stream_error_counts.py).
- Observation: a request's log line and trace end as its answer is handed to grpc, in order,
  or, its answer let go unsent, as no answer (observe.EndWhenSent, with why).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, NamedTuple

import grpc

from ..errors import ShuttingDown, Unavailable
from .body import BodyTimeout
from .budget import Lease
from .observe import CancelledBecause, EndWhenSent
from .open_calls import SHUTDOWN_MESSAGE

STREAM_WINDOW = 64  # requests of one stream held (read, answer not yet sent) before it is not read
# why an answer made was not sent, in its request's log line and trace (status 499, as a client gone)
AFTER_ERROR = "not sent: the stream ended with an earlier request's error (triton_grpc_error)"
ENDED_FIRST = "not sent: the stream ended first"
NOT_TAKEN = "not sent: the client did not take the answers before it (body_timeout_s)"
# why a request still running then was cancelled (the cancellation's message: infer_pipeline.counted_infer)
CANCELLED_AFTER_ERROR = CancelledBecause("cancelled: the stream ended with an earlier request's error "
                                         "(triton_grpc_error)")
CANCELLED_NOT_TAKEN = CancelledBecause("cancelled: the client did not take the answers before it (body_timeout_s)")


class StreamAnswer(NamedTuple):
    """One request's answer on a stream: ((response message, its request's error or None), the
    lease charging it, its request's observation, ended as the answer leaves or is let go)."""
    answer: tuple
    lease: Lease
    when_sent: EndWhenSent

    def let_go(self, why: str) -> None:
        """Not sent (`why`): its lease given back, its request logged and traced as unanswered."""
        self.lease.release()
        self.when_sent.dropped(why)


class StreamIdle(Unavailable):
    """A stream left quiet for quiet_limit_s, ended by the server: UNAVAILABLE, which clients
    retry, as grpc's own idle limit ends a connection (GOAWAY), and not DEADLINE_EXCEEDED, which
    clients read as their own deadline passed. A new stream may be opened at once (no pushback)."""

    retry_after_s = 0.0


class InferStream:
    """Owned by its ModelStreamInfer handler, which iterates `answers()` to the end and calls
    `close()` when the call ends, however it ends (idempotent; leaving the iteration closes it
    too): whatever of the stream still runs is cancelled and every lease it holds released.
    `answer(message)` makes the StreamAnswer of one request message, and does not raise
    (errors are responses too)."""

    def __init__(self, context, answer: Callable[[bytes], Awaitable[StreamAnswer]], quiet_limit_s: float,
                 send_limit_s: float, ends_on_error: bool = False):
        self._context = context
        self._answer = answer
        self._quiet_limit_s = quiet_limit_s
        self._send_limit_s = send_limit_s
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Queue = asyncio.Queue()  # StreamAnswers made, in order, not yet sent
        self._made: dict[int, StreamAnswer | None] = {}  # request number -> its answer, made before an earlier one's
        self._read_count = 0  # requests read: the next one's number
        self._queued_count = 0  # requests whose answer went to _ready (or was dropped): the next one in order
        self._dropped = False  # answers not sent any more (the stream ends): an answer made now is let go
        self._window = asyncio.Semaphore(STREAM_WINDOW)
        self._tasks: set[asyncio.Task] = set()  # requests running, the reader and the watchdog
        self._running = 0  # requests read whose answer is not made yet
        self._sending: Lease | None = None  # the lease of the answer with grpc (the client's flow control may hold it)
        self._sending_since = 0.0
        self._progress_at = self._loop.time()  # the last message read, answer made or answer sent
        self.quiet = False  # ended for its client's silence
        self.unread = False  # ended for answers its client did not take
        self.draining = False  # the server is shutting down: read nothing more
        self._stopping = SHUTDOWN_MESSAGE  # what the stream ends with then (drain())
        self._reader: asyncio.Task | None = None
        self._ends_on_error = ends_on_error
        self._failed_at: int | None = None  # with ends_on_error: the first failed request's number
        self._requests: dict[int, asyncio.Task] = {}  # request number -> its task, once it runs

    async def answers(self):
        """The stream's response messages, in the order of the requests. Raises StreamIdle when
        the stream went quiet waiting for a message; BodyTimeout when its client did not take an
        answer in time; the error of a broken request stream; ShuttingDown once drained."""
        if self.draining:
            raise ShuttingDown(self._stopping)
        reader = self._reader = self._start(self._read())
        watchdog = self._start(self._watch())
        getter = None
        try:
            while not (reader.done() and self._running == 0 and self._ready.empty()):
                getter = self._start(self._ready.get())
                await asyncio.wait([getter, watchdog] if reader.done() else [getter, watchdog, reader],
                                   return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    made, getter = getter.result(), None
                    self._sending, self._sending_since = made.lease, self._loop.time()
                    made.when_sent.sent()  # (handed over now: its log line's duration ends here)
                    yield made.answer
                    self._sent()
                    if self.unread:
                        raise BodyTimeout(f"answers not read within {self._send_limit_s:g} s (body_timeout_s)")
                    continue
                getter.cancel()
                if watchdog.done():
                    raise StreamIdle(f"no request message on the stream for {self._quiet_limit_s:g} s "
                                     "(body_timeout_s): the server ended it; a new stream may be opened")
            if not reader.cancelled():
                reader.result()  # a broken request stream ends the call with its error
            if self.draining:
                raise ShuttingDown(self._stopping)
        finally:
            if getter is not None and getter.done() and not getter.cancelled():
                getter.result().let_go(ENDED_FIRST)  # taken off the queue as the call was cancelled, never sent
            self.close()

    def drain(self, message: str = SHUTDOWN_MESSAGE) -> None:
        """The server is shutting down: read nothing more (a request not read yet is not
        answered: its client sees the stream end UNAVAILABLE); `answers()` ends once the
        requests running are answered, its status `message`."""
        self.draining, self._stopping = True, message
        if self._reader is not None:
            self._reader.cancel()

    def close(self) -> None:
        """Cancel what still runs, drop the answers waiting, release every lease held."""
        for task in list(self._tasks):
            task.cancel()
        self._drop_ready(ENDED_FIRST)
        if self._sending is not None:
            self._sent()

    def _start(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _sent(self) -> None:
        """grpc has taken the answer being sent (or the call ended): its lease goes back."""
        lease, self._sending = self._sending, None
        lease.release()
        self._progress_at = self._loop.time()
        self._window.release()

    def _drop_ready(self, why: str) -> None:
        self._dropped = True
        while not self._ready.empty():
            self._ready.get_nowait().let_go(why)
        for made in self._made.values():
            if made is not None:
                made.let_go(why)
        self._made.clear()

    def _in_order(self, number: int, made: StreamAnswer | None) -> None:
        """Request `number`'s answer is made (None: it was cancelled): queue it, and the answers
        made before it that waited for it, once every earlier request's answer is queued."""
        if self._dropped:
            if made is not None:
                made.let_go(ENDED_FIRST)
            return
        if made is not None and self._failed_at is not None and number > self._failed_at:
            made.let_go(AFTER_ERROR)  # its answer would follow the one the stream ends with
            made = None
        self._made[number] = made
        while self._queued_count in self._made:
            ready = self._made.pop(self._queued_count)
            self._queued_count += 1
            if ready is not None:
                self._ready.put_nowait(ready)
            else:  # no answer will be sent for it: its place in the window goes back
                self._window.release()

    async def _read(self) -> None:
        while True:
            await self._window.acquire()  # before reading: a message is held only once it can run
            message = await self._context.read()
            if message is grpc.aio.EOF:
                return
            self._progress_at = self._loop.time()
            self._running += 1
            self._start(self._run(message, self._read_count))
            self._read_count += 1

    async def _run(self, message: bytes, number: int) -> None:
        made = None
        try:
            if self._failed_at is None or number < self._failed_at:  # (else its answer would be dropped: not run)
                self._requests[number] = asyncio.current_task()
                made = await self._answer(message)
        finally:
            self._requests.pop(number, None)
            self._running -= 1
            self._progress_at = self._loop.time()  # quiet from here at the earliest
            if made is not None and made.answer[1] is not None and self._ends_on_error:
                self._end_after(number)
            self._in_order(number, made)

    def _end_after(self, failed: int) -> None:
        """Request `failed` failed on a stream that ends with it: read nothing more and cancel the
        requests after it (their answers would be dropped); the answers before it go on."""
        if self._failed_at is not None and self._failed_at < failed:
            return  # (an earlier one ends it)
        self._failed_at = failed
        if self._reader is not None:
            self._reader.cancel()
        for number, task in list(self._requests.items()):
            if number > failed:
                task.cancel(CANCELLED_AFTER_ERROR)
        for number in [number for number in self._made if number > failed]:
            made = self._made[number]
            if made is not None:
                made.let_go(AFTER_ERROR)
            self._made[number] = None

    async def _watch(self) -> None:
        """Return once the stream has been quiet for quiet_limit_s: no request running, no
        answer being sent, no message read. An answer not taken within send_limit_s ends the
        stream here (the handler waits on grpc meanwhile): see `_give_up`."""
        while True:
            now = self._loop.time()
            if self._sending is not None:
                wait = self._sending_since + self._send_limit_s - now
                if wait <= 0:
                    self._give_up()
                    return
            elif self._running:
                wait = self._quiet_limit_s
            else:
                wait = self._progress_at + self._quiet_limit_s - now
                if wait <= 0:
                    self.quiet = True
                    return
            await asyncio.sleep(wait)

    def _give_up(self) -> None:
        """The client has not taken an answer for send_limit_s: read nothing more, cancel the
        requests running, drop the answers waiting. The answer with grpc stays (and its lease)."""
        self.unread = True
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel(CANCELLED_NOT_TAKEN)
        self._drop_ready(NOT_TAKEN)
