"""Readiness as the log says it: the start's line, once the start's loads are done (`aclserve ready:
models loaded`, or `aclserve started; not ready yet: ...`), then one line each time readiness
turns on (INFO) or off (WARNING) after it, until shutdown (whose own lines say it).

/v2/health/ready is computed when asked (ServerState.ready(), the repository's Readiness), so
readiness has no event of its own: it changes with loads and retries, load calls, scans of the
folder, instances out of rotation and back. Each probe's answer is compared with the last said,
and so is readiness once a second (CHECK_EVERY_S) whether a probe asks or not: a line comes once
per change, at its first probe at the latest, never per probe. A server that started not ready
said nothing when its retried loads made it ready, though its probe turned 200 (a tester's find).
A line saying it is not ready says what holds it back (`why`: the repository's not_serving, as
`144 models not serving: device 0 short of streams or events (m57, m58, m59 and 141 more)`): a
strict server of more models than its devices hold was unready, its line naming nothing. Said when
models were still loading or to be loaded (a model copied in turns readiness off before its load),
it is said once more when they are done (`aclserve still not ready ...`), once until it changes.
Owned by the ServerState; loop thread only.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
INDEX_HINT = "see POST /v2/repository/index for each model's state"


# what readiness turning on means, by the `readiness` setting
READY_NOW = {"strict": "every model that should serve does",
             "lenient": "every model serves or has failed to load, and one at least serves (readiness: lenient; "
                        "a model that failed: POST /v2/repository/index)"}


class ReadinessLog:
    def __init__(self, ready: Callable[[], bool], readiness: str = "strict",
                 why: Callable[[], tuple[str, bool]] = lambda: ("", True)):
        self._ready = ready  # ServerState.ready(), which tells this what it found (`seen`)
        # what holds readiness back ("": nothing to name), and whether it stays so until something happens
        self._why = why
        self._why_settled = True  # the last not-ready line said what stays so (else said again once it does)
        self._means = READY_NOW[readiness]
        self._said: bool | None = None  # what the last line said; None: no line yet (or shut down)
        self._timer: asyncio.TimerHandle | None = None

    def started(self, ready: bool) -> None:
        """The start's loads are done: its line, and the checks from now on."""
        if ready:
            log.info("aclserve ready: models loaded")
        else:  # files still settling, loads retrying, or (strict) a model not serving
            log.info("aclserve started; not ready yet: %s", self._held_back())
        self._said = ready
        self._timer = asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)

    def seen(self, ready: bool) -> None:
        """Readiness as just found (by a probe, or the check): its line when it changed."""
        if self._said is None:
            return
        if ready == self._said:
            if not ready and not self._why_settled:  # (what was loading then is done now?)
                self._say_settled()
            return
        self._said = ready
        if ready:
            log.info("aclserve ready now: %s", self._means)
        else:
            log.warning("aclserve not ready now (readiness probes answer 503): %s", self._held_back())

    def _held_back(self) -> str:
        """What holds readiness back as a not-ready line says it (noting whether that stays so)."""
        why, self._why_settled = self._why()
        return f"{why}; {INDEX_HINT}" if why else INDEX_HINT

    def _say_settled(self) -> None:
        said = self._held_back()
        if self._why_settled:
            log.warning("aclserve still not ready (readiness probes answer 503): %s", said)

    def _check(self) -> None:
        self._ready()  # (which calls seen)
        if self._said is not None:
            self._timer = asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)

    def close(self) -> None:
        """Shutting down: no more lines (readiness is false from now on, and the shutdown's say so)."""
        self._said = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
