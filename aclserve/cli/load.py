"""The closed loop `aclserve profile` drives: C clients, each sending its next request when the
last one is answered or refused, with every outcome counted (a refusal is not a request served).
A request that raises instead of saying why it was refused ends the run, every client with it.
Before the run, untraced, a warm-up of the same loop (`warm_up`), whose requests the run's figures
leave out and its first line says beside them: the server answered them too (its /metrics count
them), and a run of 5 s answered a fifth more than it said."""
from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

# one request: None when answered, else why it was refused ("HTTP 503", "QueueFull", ...)
Request = Callable[[], Awaitable["str | None"]]


@dataclass
class Outcomes:
    answered: int = 0
    refused: collections.Counter = field(default_factory=collections.Counter)  # reason -> count
    seconds: float = 0.0  # from the first request sent to the last answer (past the run's end on a slow server)
    warm_up: "Outcomes | None" = None  # the run's warm-up's (warm_up): not among these

    @property
    def sent(self) -> int:
        """The requests sent: each is answered or refused (one that raises ends the run). 0 when the
        run was over before any client started (100,000 of them took seconds to start)."""
        return self.answered + sum(self.refused.values())

    def after_warm_up(self) -> str:
        """'; after 2,951 in a 1.0 s warm-up, not counted' (its refused too, when any), or ''."""
        return "" if self.warm_up is None else f"; {self.warm_up.as_warm_up()}"

    def as_warm_up(self) -> str:
        """These, a warm-up's: 'after 2,951 in a 1.0 s warm-up, not counted' (its refused too, when any)."""
        refused = f" answered and {sum(self.refused.values()):,} refused" if self.refused else ""
        return f"after {self.answered:,}{refused} in a {self.seconds:.1f} s warm-up, not counted"

    def refusals(self) -> str:
        """'12,928 (HTTP 503)': how many were refused, and why, the commonest reason first."""
        reasons = self.refused.most_common()
        if len(reasons) == 1:
            return f"{reasons[0][1]:,} ({reasons[0][0]})"
        return f"{sum(self.refused.values()):,} (" + ", ".join(f"{why}: {n:,}" for why, n in reasons) + ")"


async def closed_loop(clients: int, seconds: float, one: Request) -> Outcomes:
    outcomes = Outcomes()
    start = time.monotonic()
    end = start + seconds

    async def client():
        while time.monotonic() < end:
            refused = await one()
            if refused is None:
                outcomes.answered += 1
            else:
                outcomes.refused[refused] += 1
                await asyncio.sleep(0)  # a refusal comes back at once: let the others run
    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    try:
        await asyncio.gather(*tasks)
    finally:  # a request that raised ends the run: the other clients stop too, not spin on (Python 3.10: no TaskGroup)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    outcomes.seconds = time.monotonic() - start
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
