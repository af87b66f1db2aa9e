"""The served versions a (model, version)'s series stand for besides the one serving: those out
of service still draining, and what the ones a reload replaced counted once closed.

A reload of a version loads its file beside the serving one and swaps it in; the one replaced
drains (its queued and running requests finish) and is then closed. The scrape-time counters
read each served version's own counts (its batcher's queue outcomes, its pool's batch faults),
so without this they went back to 0 at each reload (Prometheus reads that as a counter reset)
and the requests still queued in the old batcher were in no queue depth. A version unloading
drains likewise, out of the serving map, until its series go with it (`unloaded`).

Kept from the repository's events (app.py adds the listener): `reloaded` names the version
replaced, draining until `retired` (its final counts are then kept); `unloading` names the
version going out of service with no successor, draining until `unloaded`, which also drops
what was kept of the version. A reader (`carry(count)`) turns a served version into a
collections.Counter of its figures; `CarriedCounts.total` adds them up. Loop thread only.
"""
from __future__ import annotations

import collections
from typing import Callable, Iterator

from .contracts import ServedModel

Key = tuple[str, str]


class CarriedCounts:
    """One reader's figures of a (model, version), carried over its reloads (DrainingVersions.carry)."""

    def __init__(self, versions: "DrainingVersions", count: Callable[[ServedModel], collections.Counter]):
        self._versions = versions
        self._count = count
        self._closed: dict[Key, collections.Counter] = {}  # the replaced versions closed: their final counts

    def total(self, name: str, version: str, served: ServedModel) -> collections.Counter:
        """What the version counted: `served` (serving, or unloading), the versions it replaced
        still draining and those closed."""
        total = collections.Counter(self._closed.get((name, version), ()))
        for counted in (*self._versions.replaced(name, version), served):
            total.update(self._count(counted))  # (update keeps the figures at 0, where + drops them)
        return total

    def _keep(self, key: Key, served: ServedModel) -> None:
        self._closed.setdefault(key, collections.Counter()).update(self._count(served))

    def _forget(self, key: Key) -> None:
        self._closed.pop(key, None)


class DrainingVersions:
    def __init__(self):
        self._replaced: dict[Key, list[ServedModel]] = {}  # reloads' replaced versions, draining
        self._unloading: dict[Key, ServedModel] = {}  # versions out of service with no successor, draining
        self._carried: list[CarriedCounts] = []

    def carry(self, count: Callable[[ServedModel], collections.Counter]) -> CarriedCounts:
        """A reader's figures, kept over reloads from now on (made before the first event)."""
        carried = CarriedCounts(self, count)
        self._carried.append(carried)
        return carried

    def replaced(self, name: str, version: str) -> list[ServedModel]:
        """The versions a reload of (name, version) replaced, still draining."""
        return self._replaced.get((name, version), [])

    def unloading(self) -> Iterator[tuple[str, str, ServedModel]]:
        """(model, version, served) of each version unloading: out of service, still draining."""
        for (name, version), served in list(self._unloading.items()):
            yield name, version, served

    def on_repository_event(self, event: str, name: str, version=None, **info) -> None:
        """Listener for ModelRepository.add_listener."""
        key = (name, str(version))
        if event == "reloaded" and info.get("replaced") is not None:
            self._replaced.setdefault(key, []).append(info["replaced"])
        elif event == "unloading":
            self._unloading[key] = info["served"]
        elif event == "retired":
            draining = self._replaced.get(key, [])
            served = info["served"]
            if served in draining:  # (not when the version was unloaded meanwhile: its series went)
                draining.remove(served)
                if not draining:
                    del self._replaced[key]
                for carried in self._carried:
                    carried._keep(key, served)
        elif event == "unloaded":
            self._replaced.pop(key, None)
            self._unloading.pop(key, None)
            for carried in self._carried:
                carried._forget(key)
