"""One /metrics scrape: what its collectors read of the repository (ScrapeReads, each read once),
the families it took (Snapshot), and its taking in steps (Scrape).

Several collectors want the repository index and the versions served (model states, per-model
series, per-version gauges and fault counters): read once a scrape instead of each reading them
again (they were four reads of the index, ~0.3 ms each at 41 versions, all on the event loop).

Every figure is copied on the event loop (most are the loop's own, kept without a lock), and at
1,000 versions that was ~65 ms in one stretch (~110 ms with a collection of the cycle collector's
in it), requests waiting behind it (t95: one client's p99 from 8-11 to 176 ms with /metrics
scraped in a loop). A Scrape takes it in steps, the loop running what waits between two: the
repository read, each collector's own figures, then the versions SLICE_VERSIONS at a time, every
per-version collector copying a version's figures in the same step. So a version's figures agree
with each other as they did (a request counted in its successes is in its latency histogram and
its queue outcomes: nothing the loop runs comes between their copies); what a slice does not hold
together is figures of different versions, which nothing adds up on the loop's side, and the
scrape's moment, which is the moment of each version's step (a few ms apart). The versions are
those read at its start: one unloaded meanwhile shows its last figures, one loaded meanwhile is
in the next scrape.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from .contracts import ServedModel
from .exposition import Family, slices

Versions = list[tuple[str, str, ServedModel]]
# versions copied in one step of the loop: ~55 us each at 1,000 tiny versions (the per-request series,
# the queue and busy gauges, the fault counters), ~1.5 ms a step; a busy version's busy ratios take longer
SLICE_VERSIONS = 25


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


class LabelTuples:
    """The label tuples of a collector's rows, kept from one scrape to the next (`labels(tuple)` is
    the tuple kept equal to it, `scrape_done()` forgets those the scrape did not use).

    Why: a scrape's rows live through several young collections of the cycle collector, and those
    it still watches then reach its oldest generation, whose collection walks every object there
    holding the GIL (~600,000 at 1,000 versions: ~0.35 s, over a second on a loaded host) and is
    due once what reached it since the last is a quarter of them. It stops watching a tuple once
    it has seen that its items are strings, numbers or tuples it does not watch, but it may meet a
    row before the label tuple made for it. With a label tuple made anew at each scrape, and a
    histogram's counts copied as a list, ~13,700 objects a scrape reached it at 1,000 versions, one
    of those collections every ~12 scrapes; ~2,100 now (the versions' list, a few rows). A label
    tuple kept is left alone after its first full collection, and a row made of it at its first
    young one."""

    def __init__(self):
        self._kept: dict[tuple, tuple] = {}
        self._used: dict[tuple, tuple] = {}

    def labels(self, labels: tuple) -> tuple:
        kept = self._kept.get(labels, labels)
        self._used[kept] = kept
        return kept

    def scrape_done(self) -> None:
        self._kept, self._used = self._used, {}


class VersionRows:
    """What a collector whose rows are per version (its `begin_scrape(reads)`) gives one scrape:
    `families` in their order, `add(model, version, served)` copying one version's figures into
    them, `end()` once every version is in (rows summed over the versions, say)."""

    families: list[Family]

    def add(self, model: str, version: str, served: ServedModel) -> None:
        raise NotImplementedError

    def end(self) -> None:
        pass


class _Whole(VersionRows):
    """A collector's families taken in one step (its `families(reads)`): no rows per version."""

    def __init__(self, families: list[Family]):
        self.families = families

    def add(self, model: str, version: str, served: ServedModel) -> None:
        pass


class Scrape:
    """One snapshot of `collectors` (each has `families(reads)`, taken in one step, or
    `begin_scrape(reads)` -> VersionRows), taken a step at a time: iterate `steps()`, each a
    stretch of the event loop's, then `snapshot()`. Loop thread only."""

    def __init__(self, collectors: list, reads: ScrapeReads, slice_versions: int = SLICE_VERSIONS):
        self._collectors, self._reads, self._slice = collectors, reads, slice_versions
        self._parts: list[VersionRows] = []

    def steps(self) -> Iterator[None]:
        self._reads.index()  # (~10 ms at 1,000 versions: the repository's rows, one read)
        yield
        versions = self._reads.versions()
        yield
        for collector in self._collectors:
            begin = getattr(collector, "begin_scrape", None)
            self._parts.append(begin(self._reads) if begin is not None else _Whole(collector.families(self._reads)))
            yield
        adding = [part for part in self._parts if not isinstance(part, _Whole)]
        for piece in slices(versions, self._slice):
            for model, version, served in piece:
                for part in adding:  # (a version's figures in one step: the module's docstring)
                    part.add(model, version, served)
            yield
        for part in self._parts:
            part.end()

    def snapshot(self) -> Snapshot:
        """The families taken, once every step has run."""
        return Snapshot([family for part in self._parts for family in part.families])
