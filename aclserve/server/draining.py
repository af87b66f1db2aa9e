"""The served versions a (model, version)'s series stand for besides the one serving: those out
of service still draining, and what the ones a reload replaced counted once closed.

A reload of a version loads its file beside the serving one and swaps it in; the one replaced
drains (its queued and running requests finish) and is then closed. The scrape-time counters
read each served version's own counts (its batcher's queue outcomes, its pool's batch faults),
so without this they went back to 0 at each reload (Prometheus reads that as a counter reset)
and the requests still queued in the old batcher were in no queue depth. A version unloading
drains likewise, out of the serving map, until its series go with it (`unloaded`).

Which versions drain is the repository's own record (repo.draining(), repository/retiring.py),
read at each scrape. What a replaced version counted is kept here when it closes (`retired`:
the repository keeps nothing of a closed version, whose pool and batcher must be freed), in the
loop step it leaves that record, and dropped with its (model, version) (`unloaded`); app.py adds
the listener. A reader (`carry(count)`) turns a served version into a collections.Counter of its
figures; `CarriedCounts.total` adds them up. Loop thread only.
"""
from __future__ import annotations

import collections
from typing import Callable, Iterable

from .contracts import Draining, ServedModel

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
        replaced, closed = self._versions.replaced(name, version), self._closed.get((name, version))
        if not replaced and closed is None:  # (most versions, at each scrape: nothing to add)
            return self._count(served)
        total = collections.Counter(closed or ())
        for counted in (*replaced, served):
            total.update(self._count(counted))  # (update keeps the figures at 0, where + drops them)
        return total

    def _keep(self, key: Key, served: ServedModel) -> None:
        self._closed.setdefault(key, collections.Counter()).update(self._count(served))

    def _forget(self, key: Key) -> None:
        self._closed.pop(key, None)


class _NoneDraining:
    """A ServerMetrics made without a repository (tests of its own series)."""

    def replaced(self, name: str, version: str) -> list[ServedModel]:
        return []

    def unloading(self) -> Iterable[tuple[str, str, ServedModel]]:
        return ()


class DrainingVersions:
    def __init__(self, draining: Draining | None = None):
        self._draining = draining if draining is not None else _NoneDraining()  # (repo.draining())
        self._carried: list[CarriedCounts] = []

    def carry(self, count: Callable[[ServedModel], collections.Counter]) -> CarriedCounts:
        """A reader's figures, kept over reloads from now on (made before the first event)."""
        carried = CarriedCounts(self, count)
        self._carried.append(carried)
        return carried

    def replaced(self, name: str, version: str) -> list[ServedModel]:
        """The versions a reload of (name, version) replaced, still draining."""
        return self._draining.replaced(name, version)

    def unloading(self) -> Iterable[tuple[str, str, ServedModel]]:
        """(model, version, served) of each version unloading: out of service, still draining."""
        return self._draining.unloading()

    def on_repository_event(self, event: str, name: str, version=None, **info) -> None:
        """Listener for ModelRepository.add_listener. A version a reload replaced closes before
        its model's task ends (lifecycle.py), so before its (model, version) can be unloaded."""
        key = (name, str(version))
        if event == "retired":
            for carried in self._carried:
                carried._keep(key, info["served"])
        elif event == "unloaded":
            for carried in self._carried:
                carried._forget(key)
