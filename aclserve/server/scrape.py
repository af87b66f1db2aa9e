"""One /metrics scrape: what its collectors read of the repository (ScrapeReads, each read once)
and the families it took (Snapshot).

Several collectors want the repository index and the versions served (model states, per-model
series, per-version gauges and fault counters): read once a scrape instead of each reading them
again (they were four reads of the index, ~0.3 ms each at 41 versions, all on the event loop).
The loop runs nothing else during a snapshot, so one read serves them all.
"""
from __future__ import annotations

from typing import Callable, Iterable

from .contracts import ServedModel
from .exposition import Family

Versions = list[tuple[str, str, ServedModel]]


class ScrapeReads:
    """`index()`: the repository index rows (repo.index); `versions()`: (model, version, served)
    of every version scraped, as `read_versions(index rows)` finds them. A read that raises is
    tried again by the next collector that asks (each handles it as before)."""

    def __init__(self, read_index: Callable[[], list[dict]],
                 read_versions: Callable[[list[dict]], Iterable[tuple[str, str, ServedModel]]]):
        self._read_index, self._read_versions = read_index, read_versions
        self._index: list[dict] | None = None
        self._versions: Versions | None = None

    def index(self) -> list[dict]:
        if self._index is None:
            self._index = self._read_index()
        return self._index

    def versions(self) -> Versions:
        if self._versions is None:
            self._versions = list(self._read_versions(self.index()))
        return self._versions


class Snapshot:
    """The families of one scrape, in order. As a prometheus_client collector (`collect()`),
    generate_latest writes the same text as exposition.render (the reference, in tests)."""

    def __init__(self, families: list[Family]):
        self.families = families

    def collect(self):
        for family in self.families:
            yield family.prometheus()
