"""Prometheus metrics of one server app (its own collectors, so tests can run several).

Hot-path cost is kept low: the per-request and per-batch series are loop_metrics families
(plain numbers, no lock), the labelled children of a model version are looked up once and
cached in a VersionMetrics, and gauges that are cheap to read on demand (queue depth, busy
ratio, device memory) are computed at scrape time by a collector instead of being updated per
request. Everything here runs on the event loop thread but the text of a scrape: a snapshot
copies every figure there into exposition.Family rows (numbers and label strings, no
prometheus_client objects), in steps with the loop running between them (`snapshot_in_steps`,
scrape.py: a slice of versions a step), and `render(snapshot)` writes them in a worker thread
(scrape_text.py). Through prometheus_client's families and generate_latest a scrape of 41
versions (5,600 lines) cost ~115 ms of CPU, ~18 ms of it on the loop; now ~4 ms on the loop and
~8 ms writing (exposition.py). At 1,000 versions the copy is ~65 ms of the loop, in steps of
~1.5 ms but for the repository index's read (~10 ms). The failure series each version has from
its load at 0, one per reason, are ~12 % of the text.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable, Iterable, Mapping

from .._version import __version__
from .contracts import ServedModel
from .draining import DrainingVersions
from .exposition import Family, render
from .failure_reasons import FAILURE_REASONS
from .loop_metrics import LoopCounterFamily, LoopHistogramFamily
from .model_series import ModelSeries
from .scrape import SLICE_VERSIONS, LabelTuples, Scrape, ScrapeReads, Snapshot, VersionRows

log = logging.getLogger(__name__)

# from 50 us: an NPU model's queue and compute times are often well under a millisecond
LATENCY_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                   5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
COMPUTE_BUSY_HELP = ("Fraction of the last 10 s the instance's compute stream was executing; source: the "
                     "device's event_elapsed_time between exec_start and exec_end of each batch (stream "
                     "busy time, not the chip's own AI-core utilisation)")
DEVICE_BUSY_HELP = ("Fraction of the last 10 s the device's compute streams were executing (sum over its "
                    "instances, capped at 1); source: event_elapsed_time of each batch's execution")


class VersionMetrics:
    """Cached labelled children of one (model, version): no label lookups per request. Made
    when the version is loaded (ServerMetrics.on_repository_event), every series at 0 and a
    failure series for each reason, so that rate() and increase() see its first requests and
    the first failure of each kind (a series that appears with its first count has no start)."""

    __slots__ = ("_owner", "_labels", "success", "request_duration", "queue_duration",
                 "compute_duration", "batch_size", "padding_rows", "_failures", "_failure_rows")

    def __init__(self, owner: "ServerMetrics", model: str, version: str):
        self._owner = owner
        self._labels = (model, version)
        self.success = owner.success.labels(model, version)
        self.request_duration = owner.request_duration.labels(model, version)
        self.queue_duration = owner.queue_duration.labels(model, version)
        self.compute_duration = owner.compute_duration.labels(model, version)
        self.batch_size = owner.batch_size.labels(model, version)
        self.padding_rows = owner.padding_rows.labels(model, version)
        self._failures = {reason: owner.failure.labels(model, version, reason) for reason in FAILURE_REASONS}
        # (label values, series) of each failure, for a scrape: label tuples made once (scrape.LabelTuples says why)
        self._failure_rows = tuple(((model, version, reason), child) for reason, child in self._failures.items())

    def request_ok(self, seconds: float) -> None:
        self.success.inc()
        self.request_duration.observe(seconds)

    def request_failed(self, reason: str) -> None:
        """Counted by reason only (failure_reasons.py: one of FAILURE_REASONS): in the duration
        histogram a burst of refusals, answered in microseconds (the early ones at 0), passed for
        latency falling under overload."""
        child = self._failures.get(reason)
        if child is not None:  # (none once the version is unloaded: a late request brings no series back)
            child.inc()

    # observers registered on the batcher's stats (scheduling.stats.BatcherStats.observe)
    def on_request_done(self, level: int, queue_s: float, ok: bool, reason: str) -> None:
        if ok:
            self.queue_duration.observe(queue_s)

    def on_batch(self, gear: int | None, rows: int, compute_s: float) -> None:
        self.compute_duration.observe(compute_s)
        self.batch_size.observe(gear if gear is not None else rows)
        if gear is not None and gear > rows:
            self.padding_rows.inc(gear - rows)

    def rows(self) -> tuple:
        """Its rows of success, failure (a tuple of them: one a reason), the four histograms (their
        counts a tuple: scrape.LabelTuples says why) and padding_rows, its figures copied now (on
        the loop: in one step, so that they agree with each other)."""
        labels = self._labels
        histograms = [(labels, tuple(h.counts), h.sum) for h in (self.request_duration, self.queue_duration,
                                                                  self.compute_duration, self.batch_size)]
        return ((labels, self.success.value), tuple([(failure, child.value) for failure, child in self._failure_rows]),
                *histograms, (labels, self.padding_rows.value))

    def remove(self) -> None:
        """Drop this version's series from every family (the version was unloaded)."""
        o = self._owner
        for family in (o.success, o.request_duration, o.queue_duration, o.compute_duration, o.batch_size,
                       o.padding_rows):
            family.remove(*self._labels)  # loop_metrics: a series never observed is no error
        for reason in self._failures:
            o.failure.remove(*self._labels, reason)
        self._failures.clear()
        self._failure_rows = ()


class ServerMetrics:
    """Owns the collectors. `live_versions(index rows)` yields (model, version, served) for the
    scrape-time gauges, the versions unloading included (draining.py); `memory()` returns
    runtime.memory() rows; `draining` reads the versions out of service from the repository
    (draining.py); `index()` and `load_retries()` are the repository's (model states, the per-model
    series: model_series.py). A scrape reads the index and the versions once (scrape.py)."""

    def __init__(self, live_versions: Callable[[list[dict]], Iterable[tuple[str, str, ServedModel]]],
                 memory: Callable[[], list[dict]], draining: DrainingVersions | None = None,
                 index: Callable[[], list[dict]] = list, load_retries: Callable[[], Mapping[str, int]] = dict):
        self._collectors: list = [_BuildInfo()]  # in the order their families are written
        mv = ["model", "version"]
        # updated per request or per batch: the loop's own cheap families (loop_metrics.py)
        self.success = LoopCounterFamily("aclserve_request_success", "Successful infer requests", mv)
        self.failure = LoopCounterFamily("aclserve_request_failure", "Failed infer requests by reason",
                                         mv + ["reason"])
        self.request_duration = LoopHistogramFamily("aclserve_request_duration_seconds",
                                                    "Time in the server of a successful infer request "
                                                    "(decode to encode; failures: "
                                                    "aclserve_request_failure_total)", mv,
                                                    LATENCY_BUCKETS)
        self.queue_duration = LoopHistogramFamily("aclserve_queue_duration_seconds",
                                                  "Time a request waited before its batch started on its instance "
                                                  "(enqueue to launch, as Triton's queue)", mv,
                                                  LATENCY_BUCKETS)
        self.compute_duration = LoopHistogramFamily("aclserve_compute_duration_seconds",
                                                    "Time of one batch run (launch on its instance to result)", mv,
                                                    LATENCY_BUCKETS)
        self.batch_size = LoopHistogramFamily("aclserve_batch_size", "Executed batch size (compiled gear)", mv,
                                              BATCH_BUCKETS)
        self.padding_rows = LoopCounterFamily("aclserve_padding_rows", "Padding rows added to fill a gear", mv)
        self.register(_VersionSeries(self))
        self.models = ModelSeries(load_retries)
        self.register(self.models)
        self.register(_LiveCollector(memory, draining or DrainingVersions()))
        self._index, self._live_versions = index, live_versions
        self._versions: dict[tuple[str, str], VersionMetrics] = {}
        self.slice_versions = SLICE_VERSIONS  # versions a step of a snapshot copies (scrape.py)

    def version(self, model: str, version: str) -> VersionMetrics:
        key = (model, version)
        vm = self._versions.get(key)
        if vm is None:
            vm = self._versions[key] = VersionMetrics(self, model, version)
        return vm

    def on_repository_event(self, event: str, name: str, version=None, **info) -> None:
        """Listener for ModelRepository.add_listener (contracts.ModelStore)."""
        self.models.on_repository_event(event, name, version, **info)
        if event in ("loaded", "reloaded"):
            self.version(name, str(version))  # its series from now on (a reload's carry on)
        elif event == "unloaded":
            vm = self._versions.pop((name, str(version)), None)
            if vm is not None:  # an unloaded version's series would otherwise stay forever
                vm.remove()

    def register(self, collector) -> None:
        """Add a collector: its families(reads: ScrapeReads) returns exposition.Family rows, on the
        event loop; or, its rows per version, its begin_scrape(reads) a scrape.VersionRows."""
        self._collectors.append(collector)

    def snapshot(self) -> Snapshot:
        """Every figure as it is now (event loop), copied into rows none of which is read again."""
        scrape = self._scrape()
        for _ in scrape.steps():
            pass
        return scrape.snapshot()

    async def snapshot_in_steps(self) -> Snapshot:
        """snapshot(), the event loop running what waits between its steps (scrape.py says why)."""
        scrape = self._scrape()
        for _ in scrape.steps():
            await asyncio.sleep(0)
        return scrape.snapshot()

    def _scrape(self) -> Scrape:
        return Scrape(self._collectors, ScrapeReads(self._index, self._live_versions), self.slice_versions)

    def render(self, snapshot: Snapshot | None = None) -> bytes:
        """The exposition text of `snapshot` (any thread), or of a snapshot taken now (the loop)."""
        return render((snapshot if snapshot is not None else self.snapshot()).families)


class _BuildInfo:
    """The conventional info gauge: the server's version as a label, the value 1."""

    def families(self, reads: ScrapeReads) -> list[Family]:
        info = Family("gauge", "aclserve_build_info", "The server's version (a constant 1)", ["version"])
        info.add((__version__,), 1)
        return [info]


class _VersionSeries:
    """The per-request series of every version (its VersionMetrics), a scrape copying each
    version's in the step of its other figures (scrape.py)."""

    def __init__(self, metrics: ServerMetrics):
        self._metrics = metrics

    def begin_scrape(self, reads: ScrapeReads) -> "_VersionSeriesRows":
        return _VersionSeriesRows(self._metrics)


class _VersionSeriesRows(VersionRows):
    """The rows are written in the order of the versions' series (their loads'), not the scrape's
    (the index's), as the families' own frozen() writes them; a version with series the scrape
    does not list (its load event in, the index not showing it served) is copied at the end."""

    def __init__(self, metrics: ServerMetrics):
        m = metrics
        self._versions = m._versions
        self._order = list(m._versions)  # (model, version) in the order their series were made
        self._copied: dict[tuple[str, str], tuple] = {}
        self.families = [family.empty() for family in (m.success, m.failure, m.request_duration,
                                                        m.queue_duration, m.compute_duration, m.batch_size,
                                                        m.padding_rows)]

    def add(self, model: str, version: str, served: ServedModel) -> None:
        vm = self._versions.get((model, version))
        if vm is not None:
            self._copied[model, version] = vm.rows()

    def end(self) -> None:
        success, failure, *histograms, padding = self.families
        for key in self._order:
            rows = self._copied.get(key)
            if rows is None:
                vm = self._versions.get(key)
                if vm is None:  # unloaded meanwhile, its series gone with it
                    continue
                rows = vm.rows()
            success.rows.append(rows[0])
            failure.rows.extend(rows[1])
            for family, row in zip(histograms, rows[2:6]):
                family.rows.append(row)
            padding.rows.append(rows[6])


# per priority level, what became of the requests that reached its queue (LevelStats' counts,
# which the statistics JSON does not show: a `delay` policy's deadlines left no trace elsewhere)
QUEUE_OUTCOMES = ("accepted", "rejected", "timed_out", "delayed", "cancelled")
QUEUE_OUTCOMES_HELP = ("Requests per priority level: accepted into its queue, rejected (level full), timed_out "
                       "(deadline under reject), delayed (deadline under delay), cancelled (client gone before "
                       "its outputs came: from its queue, or from its batch once formed, which runs all the same)")


def queue_figures(served: ServedModel) -> collections.Counter:
    """A served version's queue outcomes, (level, outcome) -> count (DrainingVersions.carry)."""
    levels = served.batcher.stats.levels
    return collections.Counter({(level, outcome): getattr(counts, outcome)
                                for level, counts in levels.items() for outcome in QUEUE_OUTCOMES})


class _LiveCollector:
    """Scrape-time gauges: queue depth per level, instance busy ratio, device memory; and the
    queue outcomes, carried over reloads (draining.py). A version's queue depth counts what the
    versions it replaced still hold, and a version unloading is there until it has drained."""

    def __init__(self, memory: Callable[[], list[dict]], draining: DrainingVersions):
        self._memory = memory
        self._draining = draining
        self._outcomes = draining.carry(queue_figures)
        self._labels = LabelTuples()

    def begin_scrape(self, reads: ScrapeReads) -> "_LiveRows":
        return _LiveRows(self._memory, self._draining, self._outcomes, self._labels)


class _LiveRows(VersionRows):
    """One scrape's gauges of _LiveCollector: a version's added at a time, the devices' at the end."""

    def __init__(self, memory: Callable[[], list[dict]], draining: DrainingVersions, outcomes, labels: LabelTuples):
        self._memory, self._draining, self._outcomes, self._labels = memory, draining, outcomes, labels
        self._depth = Family("gauge", "aclserve_queue_depth", "Requests waiting, per priority level",
                             ["model", "version", "priority"])
        self._busy = Family("gauge", "aclserve_instance_busy_ratio", "Fraction of the last 10 s the model's "
                            "instances had a batch in flight (averaged over instances)", ["model", "version"])
        self._compute = Family("gauge", "aclserve_compute_busy_ratio", COMPUTE_BUSY_HELP,
                               ["model", "version", "instance", "device"])
        self._queue_outcomes = Family("counter", "aclserve_queue_outcomes", QUEUE_OUTCOMES_HELP,
                                      ["model", "version", "priority", "outcome"])
        self.families = [self._depth, self._queue_outcomes, self._busy, self._compute]
        self._per_device: dict[int, float] = {}
        self._failed = False  # a version's read raised: logged, the versions after it left out

    def add(self, model: str, version: str, served: ServedModel) -> None:
        if self._failed:
            return
        try:
            self._add(model, version, served)
        except Exception:
            self._failed = True
            log.exception("collecting model gauges failed")

    def _add(self, model: str, version: str, served: ServedModel) -> None:
        waiting = collections.Counter(served.batcher.stats.queue_depth())
        for replaced in self._draining.replaced(model, version):
            waiting.update(replaced.batcher.stats.queue_depth())
        depth_row, outcome_row, labels = self._depth.rows.append, self._queue_outcomes.rows.append, self._labels.labels
        for level, n in sorted(waiting.items()):
            depth_row((labels((model, version, str(level))), n))
        counted = self._outcomes.total(model, version, served)
        for level in sorted({level for level, _ in counted}):
            priority = str(level)
            for outcome in QUEUE_OUTCOMES:
                outcome_row((labels((model, version, priority, outcome)), counted[level, outcome]))
        self._busy.add(labels((model, version)), served.pool.busy_ratio())
        per_device = self._per_device
        for row in served.pool.utilisation():
            self._compute.add(labels((model, version, row["instance"], str(row["device"]))), row["compute_busy"])
            per_device[row["device"]] = per_device.get(row["device"], 0.0) + row["compute_busy"]

    def end(self) -> None:
        self._labels.scrape_done()
        device_busy = Family("gauge", "aclserve_device_compute_busy_ratio", DEVICE_BUSY_HELP, ["device"])
        for device, fraction in sorted(self._per_device.items()):
            device_busy.add((str(device),), min(1.0, fraction))
        used = Family("gauge", "aclserve_device_memory_used_bytes", "Device memory in use", ["device"])
        total = Family("gauge", "aclserve_device_memory_total_bytes", "Device memory size", ["device"])
        reserve = Family("gauge", "aclserve_device_memory_reserve_bytes",
                         "Device memory model loads keep free (memory_reserve_fraction of the total)", ["device"])
        try:
            for row in self._memory():
                used.add((str(row["device"]),), row["used"])
                total.add((str(row["device"]),), row["total"])
                if "reserve" in row:
                    reserve.add((str(row["device"]),), row["reserve"])
        except Exception:
            log.exception("collecting device memory failed")
        self.families += [device_busy, used, total, reserve]
