"""The model swaps of a soak run (tools/soak.py), and what the server made of them by its own
counters (/metrics) and log, not by the files the tool wrote.

A swap writes the other of the two compiles of the digits model (largest batch 8 and 32) over
the served file, renamed into place. The server then loads it beside the serving version and
puts it in service (aclserve_model_reloads_total{model="digits"} + 1), or the load fails
(aclserve_model_loads_total{model="digits",result="failed"} + 1, and a log line naming the
reason), or, when the next swap is written while it still loads, drops it unserved and loads
the newer file (neither count moves: a swap superseded, which a slow machine meets at the
default 5 s between swaps). From what the tool wrote and the server's counts over the run:
- loaded: the reloads;
- superseded: the swaps written less the reloads (the server reloads each swap at most once; one
  whose load failed and that was superseded before its retry is among them);
- failed loads: by a fault the soak injected (its code in the logged reason: a warm-up run that
  failed, which the server retries), or not, which fails the run;
- the last swap: no later one supersedes it, so after the load has stopped the tool waits up to
  GRACE_S for the server to serve it (its config's max_batch_size); if it does not, the run fails.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import time

from soak_tally import injected

GRACE_S = 30.0
MODEL = "digits"
# a failed load's log line (repository/failures.py), the first of a file's failures or a retry's; a reload's
# says what serves on
_NOT_LOADED = re.compile(rf"\b{MODEL}: version \S+ (?:from .+? )?not loaded(?: \(serving the previous \w+\))?: (.*)$",
                         re.M)


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of /metrics samples `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def write_swap(models: str, data: bytes) -> None:
    """A swap: `data` as the served model's file, renamed into place (the server takes it at once)."""
    target = os.path.join(models, f"{MODEL}.om")
    with open(target + ".part", "wb") as f:
        f.write(data)
    os.replace(target + ".part", target)


class Swaps:
    """The swaps of one run: `wrote` for each, `start` once the server is ready, `settle` after the
    load (a live server), then `report`."""

    def __init__(self, log_path: str, grace_s: float = GRACE_S):
        self.log_path, self.grace_s = log_path, grace_s
        self.written = 0
        self.last = 0  # the variant last written (0: the one served at the start)
        self._before = (0.0, 0.0)  # the server's reloads and failed loads when the load began
        self._log_from = 0
        self.loaded = self.failed = 0
        self.failed_said: list[str] = []  # the reasons of the failed loads, as the server logged them
        self.serves_last: bool | None = None  # None: not looked at (the server died)

    def wrote(self, variant: int) -> None:
        self.written += 1
        self.last = variant

    async def start(self, session, base: str) -> None:
        self._before = await self._counts(session, base)
        self._log_from = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0

    async def settle(self, session, base: str, max_batch: int, alive) -> None:
        """Wait (up to grace_s, while `alive()`) for the server to serve the last swap, whose largest
        batch is `max_batch`; then read its counts and log."""
        give_up = time.monotonic() + self.grace_s
        while True:
            if not alive():
                return
            serves = await self._serves(session, base, max_batch)
            if serves or time.monotonic() > give_up:
                break
            await asyncio.sleep(0.2)
        reloads, failed = await self._counts(session, base)
        self.loaded, self.failed = int(reloads - self._before[0]), int(failed - self._before[1])
        with open(self.log_path, errors="replace") as f:
            f.seek(self._log_from)
            self.failed_said = _NOT_LOADED.findall(f.read())
        self.serves_last = serves  # (last: a server gone before here leaves the swaps not counted)

    def report(self) -> list[str]:
        """Print what became of the swaps; returns the failures."""
        if self.serves_last is None:
            print(f"  model swaps written: {self.written} (the server died: not counted)")
            return []
        by_us = sum(injected(said.encode()) for said in self.failed_said)
        other = [said for said in self.failed_said if not injected(said.encode())]
        last = "the last one written" if self.written else "the model it started with (none written)"
        print(f"  model swaps: {self.written} written, {self.loaded} loaded (aclserve_model_reloads_total), "
              f"{self.written - self.loaded} superseded before they loaded; {self.failed} loads failed "
              f"(aclserve_model_loads_total), {by_us} of them by injected faults; the server "
              + (f"serves {last}" if self.serves_last else f"does not serve {last} {self.grace_s:g} s after the load "
                 "stopped"))
        out = []
        unexplained = max(self.failed - by_us, len(other))
        if unexplained:
            first = f" (the first: {other[0][:200]})" if other else ""
            out.append(f"{unexplained} model loads failed with no fault injected{first}")
        if not self.serves_last:
            out.append(f"the server does not serve the last model swap written, {self.grace_s:g} s after the load "
                       "stopped")
        return out

    @staticmethod
    async def _counts(session, base: str) -> tuple[float, float]:
        async with session.get(f"{base}/metrics") as r:
            text = await r.text()
        return (sample(text, "aclserve_model_reloads_total", model=MODEL),
                sample(text, "aclserve_model_loads_total", model=MODEL, result="failed"))

    @staticmethod
    async def _serves(session, base: str, max_batch: int) -> bool:
        try:
            async with session.get(f"{base}/v2/models/{MODEL}/config") as r:
                return r.status == 200 and json.loads(await r.read()).get("max_batch_size") == max_batch
        except Exception:  # (no answer yet: looked at again)
            return False
