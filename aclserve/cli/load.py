"""The closed loop `aclserve profile` drives: C clients, each sending its next request when the
last one is answered or refused, with every outcome counted (a refusal is not a request served).
A request that raises instead of saying why it was refused ends the run, every client with it.
Before the run, untraced, a warm-up of the same loop (`warm_up`), whose requests the run's figures
leave out and its first line says beside them: the server answered them too (its /metrics count
them), and a run of 5 s answered a fifth more than it said.
A loop ends DRAIN_S past its time at most: the requests still in flight then are cut (cancelled)
and counted as such. It waited for every one: 100,000 clients' last requests, queued at a server
answering some thousands a second, made a run of 10 s last 33 s (a tester). The answers of the drain
are counted, and its time up to the last of them: not its time after, in which only the requests cut
were under way (a server at a standstill read 1 answer over the run and the whole drain)."""
from __future__ import annotations

import asyncio
import collections
import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..quoting import counted

# one request, given its number in the loop (request_id names it): None when answered, else why it
# was refused ("HTTP 503", "QueueFull", ...)
Request = Callable[[int], Awaitable["str | None"]]


# this process's own mark in its requests' ids: another client of the same server sending `profile-7` (or
# another profile run) does not have its trace taken for one of these and left out of the summary
_RUN = secrets.token_hex(4)


def request_id(number: int) -> str:
    """The id a request of the loop is sent with (X-Request-Id; in-process, its known id): its
    trace is named by it, so that the summary can leave out the requests cut."""
    return f"profile-{_RUN}-{number}"


@dataclass
class Outcomes:
    answered: int = 0
    refused: collections.Counter = field(default_factory=collections.Counter)  # reason -> count
    # from the loop's start to the run's end, or to the last answer or refusal counted when that came later
    # (in the drain: DRAIN_S past the run's end at most)
    seconds: float = 0.0
    warm_up: "Outcomes | None" = None  # the run's warm-up's (warm_up): not among these
    # the numbers of the requests still in flight DRAIN_S past the run's end, cancelled: neither answered nor refused
    cut_numbers: frozenset = frozenset()

    @property
    def cut(self) -> int:
        return len(self.cut_numbers)

    @property
    def sent(self) -> int:
        """The requests sent: each is answered, refused or cut (one that raises ends the run). 0 when
        the run was over before any client started (100,000 of them took seconds to start)."""
        return self.answered + sum(self.refused.values()) + self.cut

    def answered_in(self) -> str:
        """'12,928 requests answered in 3.0 s (4,309 req/s; after 2,951 in a 1.0 s warm-up, not counted)' ('1 request
        answered ...'): the run's, as the profile's first line says it."""
        return (f"{counted(self.answered, 'request')} answered in {self.seconds:.1f} s "
                f"({self.answered / self.seconds:,.0f} req/s{self.after_warm_up()})")

    def after_warm_up(self) -> str:
        """'; after 2,951 in a 1.0 s warm-up, not counted' (its refused too, when any), or ''."""
        return "" if self.warm_up is None else f"; {self.warm_up.as_warm_up()}"

    def as_warm_up(self) -> str:
        """These, a warm-up's: 'after 2,951 in a 1.0 s warm-up, not counted' (its refused and cut
        too, when any: 'after 2,951 answered, 12 refused and 3 cut in ...')."""
        others = [f"{n:,} {what}" for n, what in ((sum(self.refused.values()), "refused"), (self.cut, "cut")) if n]
        counts = f"{self.answered:,} answered{' and ' if len(others) == 1 else ', '}{' and '.join(others)}" \
            if others else f"{self.answered:,}"
        return f"after {counts} in a {self.seconds:.1f} s warm-up, not counted"

    def cut_short(self, seconds: float) -> str:
        """'cut: 11,283 requests still in flight 1 s past the run's 3 s (--seconds) were cancelled, counted
        neither answered nor refused (the rate counts the answers of those 1 s, over the time to the last
        of them)', or '' when none was."""
        if not self.cut:
            return ""
        return (f"cut: {counted(self.cut, 'request')} still in flight {DRAIN_S:g} s past the "
                f"run's {seconds:g} s (--seconds) {'were' if self.cut > 1 else 'was'} cancelled, counted neither "
                f"answered nor refused (the rate counts the answers of those {DRAIN_S:g} s, over the time to the "
                "last of them)")

    def refusals(self) -> str:
        """'12,928 (HTTP 503)': how many were refused, and why, the commonest reason first."""
        reasons = self.refused.most_common()
        if len(reasons) == 1:
            return f"{reasons[0][1]:,} ({reasons[0][0]})"
        return f"{sum(self.refused.values()):,} (" + ", ".join(f"{why}: {n:,}" for why, n in reasons) + ")"


DRAIN_S = 1.0  # how long past its end a loop waits for the requests then in flight


async def closed_loop(clients: int, seconds: float, one: Request) -> Outcomes:
    """`clients` clients sending `one` request after another for `seconds`; those in flight
    DRAIN_S past that are cancelled, counted as cut."""
    outcomes = Outcomes()
    start = time.monotonic()
    end = last = start + seconds  # (last: the run's end, or the last outcome past it)
    numbers = itertools.count()
    in_flight: set[int] = set()

    async def client():
        nonlocal last
        while time.monotonic() < end:
            number = next(numbers)
            in_flight.add(number)
            try:
                refused = await one(number)
            finally:
                in_flight.discard(number)
            last = max(last, time.monotonic())
            if refused is None:
                outcomes.answered += 1
            else:
                outcomes.refused[refused] += 1
                await asyncio.sleep(0)  # a refusal comes back at once: let the others run
    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    try:  # (the clients' start counted: 100,000 of them take seconds)
        done, _ = await asyncio.wait(tasks, timeout=max(0.0, end + DRAIN_S - time.monotonic()),
                                     return_when=asyncio.FIRST_EXCEPTION)
        # cut: the drain's time up to its last outcome, not the rest, when only the requests cut were under way
        # (else the time to now, the last outcome's: the cancels below take time too)
        outcomes.seconds = (last if in_flight else time.monotonic()) - start
        outcomes.cut_numbers = frozenset(in_flight)
        failed = next((task for task in done if not task.cancelled() and task.exception() is not None), None)
        if failed is not None:
            failed.result()  # (raises it)
    finally:  # a request that raised ends the run: the other clients stop too, not spin on (Python 3.10: no TaskGroup)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return outcomes


WARM_UP_S = 1.0  # at most; a fifth of a shorter run


async def warm_up(clients: int, run_seconds: float, one: Request) -> Outcomes:
    """The closed loop before a run of `run_seconds`, untraced, for min(WARM_UP_S, run_seconds / 5):
    the clients' connections open and the model's queue at its pace before the run counts. The
    caller's first request (sent alone, so that what the model refuses is one line) was answered
    before it and is counted in it."""
    outcomes = await closed_loop(clients, min(WARM_UP_S, run_seconds / 5), one)
    outcomes.answered += 1
    return outcomes
