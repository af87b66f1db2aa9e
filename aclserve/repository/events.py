"""The repository's events and their listeners (ModelRepository.add_listener; the server's are
added by server/app.py).

callback(event, name, version, **info), event in:
    loaded       a version in service (info: seconds, the load's duration; served, its ServedVersion)
    reloaded     a version's new file or config in service (info: seconds; served; replaced, the
                 ServedVersion it took over from, draining now)
    unloading    a version out of service with no successor (info: served, draining now)
    unloaded     that version has closed: what is kept of its (name, version) may go
    load_failed  (info: reason) a version's load failed, or, the version empty, the model's files
                 cannot be served as they are (its config broken, say: problem_loads.py)
    retired      a version a reload replaced has closed (info: served, the ServedVersion it was)
The versions draining (out of service, not closed yet) are the Lifecycle's own record, read
through ModelRepository.draining() (retiring.py); a listener hears when each one closes. A
listener that raises is logged, and the others still hear the event. Loop thread only.
"""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)


class Listeners:
    def __init__(self):
        self._callbacks: list[Callable] = []

    def add(self, callback: Callable) -> None:
        self._callbacks.append(callback)

    def emit(self, event: str, name: str, version: str, **info) -> None:
        for callback in self._callbacks:
            try:
                callback(event, name, version, **info)
            except Exception:
                log.exception("repository listener failed on %s", event)
