"""/metrics at many models must not stall the event loop (t95: at 1,000 versions a scrape's copy of
the figures was ~65 ms of the loop in one go, and another client's p99 went from 8-11 to 176 ms
while scrapes ran in a loop): the figures are copied a slice of versions at a step, the text is
written in a thread giving the GIL back between chunks, scrapes at once share one taking, and a
scrape's rows do not pile up in the cycle collector's oldest generation (scrape.py, scrape_text.py)."""
from __future__ import annotations

import asyncio
import gc
import shutil
import threading

import aiohttp
from prometheus_client import generate_latest

from aclserve.server.exposition import Family, render
from aclserve.server.metrics import ServerMetrics
from aclserve.server.scrape import Snapshot
from tests.serving import server_config, started_app

MODELS = 7


def _models(tmp_path, models_dir):
    own = tmp_path / "models"
    own.mkdir()
    for i in range(MODELS):
        shutil.copy(models_dir / "double.om", own / f"m{i}.om")
    return own


class _LoopWatch:
    """A collector of no figures: at each version a scrape copies, whether a callback the loop was
    given at the scrape's first version has run yet (so, whether the loop ran between them). As
    families(reads), the whole at once, it sees what a scrape copying in one go does."""

    def __init__(self):
        self.seen: list[bool] = []

    def families(self, reads) -> list[Family]:
        rows = self.begin_scrape(reads)
        for version in reads.versions():
            rows.add(*version)
        return rows.families

    def begin_scrape(self, reads):
        return _Watching(self.seen)


class _Watching:
    """_LoopWatch's part of one scrape (scrape.VersionRows' protocol)."""

    def __init__(self, seen: list[bool]):
        self.families: list[Family] = []
        self._seen = seen
        self._ran: list[bool] = []

    def add(self, model, version, served) -> None:
        if not self._seen:
            asyncio.get_running_loop().call_soon(self._ran.append, True)
        self._seen.append(bool(self._ran))

    def end(self) -> None:
        pass


def test_a_scrape_copies_the_versions_a_slice_at_a_time_the_loop_running_between(tmp_path, models_dir):
    watch = _LoopWatch()

    async def scrape():
        runner, state, url, *_ = await started_app(server_config(_models(tmp_path, models_dir),
                                                                 model_control_mode="none"))
        try:
            state.metrics.slice_versions = 3
            state.metrics.register(watch)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{url}/metrics") as resp:
                    assert resp.status == 200
                    return await resp.text()
        finally:
            await runner.cleanup()

    text = asyncio.run(scrape())
    assert text.count('aclserve_request_success_total{model="m') == MODELS
    # the first slice's versions in one step, those after it once the loop had run
    assert watch.seen == [False] * 3 + [True] * (MODELS - 3), watch.seen


class _Counted:
    """A collector counting the snapshots taken."""

    def __init__(self):
        self.taken = 0

    def families(self, reads) -> list[Family]:
        self.taken += 1
        return []


def test_scrapes_at_once_share_one_taking_which_a_client_leaving_does_not_end():
    """Prometheus servers in pairs scrape at once: one snapshot and one text for both. The first
    scrape's client leaving (its handler cancelled) leaves the other its answer."""
    from aclserve.server.scrape_text import ScrapeText
    metrics = ServerMetrics(lambda index: [], lambda: [])
    counted = _Counted()
    metrics.register(counted)
    gate = threading.Event()
    scrapes = ScrapeText(metrics, gate.wait)  # (the device memory's refresh, in a worker thread)

    async def two_scrapes():
        first = asyncio.ensure_future(scrapes.text())
        second = asyncio.ensure_future(scrapes.text())
        for _ in range(3):  # (both waiting on the refresh the gate holds)
            await asyncio.sleep(0)
        first.cancel()
        gate.set()
        text = await second
        third = await scrapes.text()  # (after them: a taking of its own)
        return text, third, first.cancelled()

    try:
        text, third, cancelled = asyncio.run(two_scrapes())
    finally:
        gate.set()
    assert cancelled and counted.taken == 2
    assert text.body == third.body and b"aclserve_build_info" in text.body


def test_the_text_is_written_in_chunks_giving_the_gil_back_between_them():
    """Every CHUNK_LINES lines or so the writer calls its pause (time.sleep in a worker thread):
    the text is the same bytes as generate_latest's, whatever the chunks."""
    from aclserve.server.exposition import CHUNK_LINES
    gauge = Family("gauge", "t_gauge", "a gauge", ["model", "version"])
    for i in range(3 * CHUNK_LINES):
        gauge.add((f"m{i}", "1"), i / 7)
    histogram = Family("histogram", "t_seconds", "a histogram", ["model"], (0.1, 1.0))
    for i in range(CHUNK_LINES):
        histogram.rows.append(((f"m{i}",), (i, 1, 2), i * 0.5))
    families = [gauge, histogram, Family("counter", "t_none", "no rows", ["model"])]
    pauses = []
    assert render(families, lambda: pauses.append(1)) == generate_latest(Snapshot(families))
    assert len(pauses) >= 3 + 4  # (the histogram's CHUNK_LINES series are 5 lines each)


def test_a_scrapes_rows_leave_the_cycle_collectors_watch_at_their_first_collection(tmp_path, models_dir):
    """A row of a version's gauge or counter is a tuple of its label tuple and a number; its label
    tuple made anew at each scrape kept it watched by the cycle collector, and the rows of a scrape
    reached its oldest generation by thousands, each of its collections a stall of the loop (~0.35 s
    at 1,000 versions). Once a scrape's label tuples have been through a full collection, the
    next scrape's rows are left alone at their first young collection."""
    async def snapshots():
        runner, state, *_ = await started_app(server_config(_models(tmp_path, models_dir),
                                                            model_control_mode="none"))
        try:
            state.metrics.snapshot()
            gc.collect()
            snapshot = state.metrics.snapshot()
            gc.collect(1)
            return snapshot
        finally:
            await runner.cleanup()

    snapshot = asyncio.run(snapshots())
    per_version = [family for family in snapshot.families
                   if family.labelnames[:2] == ("model", "version") and family.kind != "histogram"]
    rows = [row for family in per_version for row in family.rows]
    assert len(per_version) >= 10 and len(rows) >= 10 * MODELS
    watched = [(family.name, row) for family in per_version for row in family.rows if gc.is_tracked(row)]
    assert not watched, watched[:5]
