"""Turns: the pictures waiting for a decode thread, taken in turn by the requests that sent them.

A request's pictures are one Submission. A free thread takes the next picture (in row order) of
the submission with the fewest pictures decoding; among equals, of the one served least recently
(round-robin), which then goes to the back. So a request of one picture sent while another's 32
wait gets the next thread free, not the 33rd: with FIFO order it waited ~100 s behind 32
pictures of a few seconds each (found by tester t88). A submission dropped takes its pictures
not started out at once. Thread-safe: the pool's threads take, the event loop puts and drops.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence


class Submission:
    """One request's pictures in the pool. `fn(item)` decodes one, and `report(index, result,
    error, dropped)` is called in the thread once it has (`dropped`: the pictures its failure
    dropped); the fields after them change under the Turns' lock only. An item is let go once a
    thread has it or it is dropped."""

    __slots__ = ("fn", "report", "items", "taken", "decoding", "first_taken_ns")

    def __init__(self, fn: Callable, items: Sequence, report: Callable[[int, object, BaseException | None, int], None]):
        self.fn, self.report = fn, report
        self.items = list(items)
        self.taken = 0  # pictures handed to a thread (or dropped): those from here on wait
        self.decoding = 0  # of those, the ones a thread is decoding now
        self.first_taken_ns = 0  # time.perf_counter_ns() when a thread took its first picture; 0: none yet

    def waiting(self) -> int:
        return len(self.items) - self.taken


class Turns:
    def __init__(self):
        self._lock = threading.Condition(threading.Lock())
        self._waiting: dict[Submission, None] = {}  # those with pictures waiting, least recently served first
        self._closed = False

    def put(self, submission: Submission) -> None:
        """Queue a submission's pictures. Raises RuntimeError once closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the decode pool is closed")
            if submission.waiting():
                self._waiting[submission] = None
                self._lock.notify(submission.waiting())

    def take(self) -> tuple[Submission, int, object] | None:
        """(submission, index, item) of the next picture to decode, waiting for one; None once
        closed. The caller calls ended(submission) after decoding it."""
        with self._lock:
            while not self._waiting:
                if self._closed:
                    return None
                self._lock.wait()
            chosen = None
            for submission in self._waiting:  # (a few requests at a time: a scan is cheaper than a heap)
                if chosen is None or submission.decoding < chosen.decoding:
                    chosen = submission
                    if not chosen.decoding:
                        break
            index = chosen.taken
            item, chosen.items[index] = chosen.items[index], None
            chosen.taken += 1
            chosen.decoding += 1
            if not chosen.first_taken_ns:
                chosen.first_taken_ns = time.perf_counter_ns()
            del self._waiting[chosen]
            if chosen.waiting():
                self._waiting[chosen] = None  # to the back of its equals
            return chosen, index, item

    def ended(self, submission: Submission, failed: bool) -> int:
        """A picture `take` gave has been decoded, or `failed`: then the submission's pictures not
        started are dropped at once (the thread would take the next before the loop hears);
        returns the number dropped."""
        with self._lock:
            submission.decoding -= 1
            return self._drop(submission) if failed else 0

    def drop(self, submission: Submission, unless_started: bool = False) -> int:
        """Take the submission's pictures not started out of the queue, their items let go;
        the number dropped. `unless_started`: only when none has been started (else 0)."""
        with self._lock:
            if unless_started and submission.taken:
                return 0
            return self._drop(submission)

    def _drop(self, submission: Submission) -> int:
        self._waiting.pop(submission, None)
        dropped = submission.waiting()
        submission.items[submission.taken:] = [None] * dropped
        submission.taken = len(submission.items)
        return dropped

    def close(self) -> list[Submission]:
        """No more puts; the threads end once idle. Returns the submissions with pictures still
        waiting, which the caller drops."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            return list(self._waiting)
