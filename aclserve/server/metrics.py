"""Prometheus metrics of one server app (its own collectors, so tests can run several).

Hot-path cost is kept low: the per-request and per-batch series are loop_metrics families
(plain numbers, no lock), the labelled children of a model version are looked up once and
cached in a VersionMetrics, and gauges that are cheap to read on demand (queue depth, busy
ratio, device memory) are computed at scrape time by a collector instead of being updated per
request. Everything here runs on the event loop thread but the text of a scrape: `snapshot()`
copies every figure there into exposition.Family rows (numbers and label strings, no
prometheus_client objects) and `render(snapshot)` writes them in a worker thread. Through
prometheus_client's families and generate_latest a scrape of 41 versions (5,600 lines) cost
~115 ms of CPU, ~18 ms of it on the loop; now ~4 ms on the loop and ~8 ms writing (exposition.py,
scrape.py). The failure series each version has from its load at 0, one per reason, are ~12 % of
the text.
"""
from __future__ import annotations

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
from .scrape import ScrapeReads, Snapshot

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
                 "compute_duration", "batch_size", "padding_rows", "_failures")

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

    def remove(self) -> None:
        """Drop this version's series from every family (the version was unloaded)."""
        o = self._owner
        for family in (o.success, o.request_duration, o.queue_duration, o.compute_duration, o.batch_size,
                       o.padding_rows):
            family.remove(*self._labels)  # loop_metrics: a series never observed is no error
        for reason in self._failures:
            o.failure.remove(*self._labels, reason)
        self._failures.clear()


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
        for family in (self.success, self.failure, self.request_duration, self.queue_duration,
                       self.compute_duration, self.batch_size, self.padding_rows):
            self.register(family)
        self.models = ModelSeries(load_retries)
        self.register(self.models)
        self.register(_LiveCollector(memory, draining or DrainingVersions()))
        self._index, self._live_versions = index, live_versions
        self._versions: dict[tuple[str, str], VersionMetrics] = {}

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
        """Add a collector: its families(reads: ScrapeReads) returns exposition.Family rows, on the event loop."""
        self._collectors.append(collector)

    def snapshot(self) -> Snapshot:
        """Every figure as it is now (event loop), copied into rows none of which is read again."""
        reads = ScrapeReads(self._index, self._live_versions)
        return Snapshot([family for collector in self._collectors for family in collector.families(reads)])

    def render(self, snapshot: Snapshot | None = None) -> bytes:
        """The exposition text of `snapshot` (any thread), or of a snapshot taken now (the loop)."""
        return render((snapshot if snapshot is not None else self.snapshot()).families)


class _BuildInfo:
    """The conventional info gauge: the server's version as a label, the value 1."""

    def families(self, reads: ScrapeReads) -> list[Family]:
        info = Family("gauge", "aclserve_build_info", "The server's version (a constant 1)", ["version"])
        info.add((__version__,), 1)
        return [info]


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

    def families(self, reads: ScrapeReads) -> list[Family]:
        depth = Family("gauge", "aclserve_queue_depth", "Requests waiting, per priority level",
                       ["model", "version", "priority"])
        busy = Family("gauge", "aclserve_instance_busy_ratio", "Fraction of the last 10 s the model's instances "
                      "had a batch in flight (averaged over instances)", ["model", "version"])
        compute = Family("gauge", "aclserve_compute_busy_ratio", COMPUTE_BUSY_HELP,
                         ["model", "version", "instance", "device"])
        outcomes = Family("counter", "aclserve_queue_outcomes", QUEUE_OUTCOMES_HELP,
                          ["model", "version", "priority", "outcome"])
        per_device: dict[int, float] = {}
        depth_row, outcome_row = depth.rows.append, outcomes.rows.append  # (~800 rows at 40 versions)
        try:
            for model, version, served in reads.versions():
                waiting = collections.Counter(served.batcher.stats.queue_depth())
                for replaced in self._draining.replaced(model, version):
                    waiting.update(replaced.batcher.stats.queue_depth())
                for level, n in sorted(waiting.items()):
                    depth_row(((model, version, str(level)), n))
                counted = self._outcomes.total(model, version, served)
                for level in sorted({level for level, _ in counted}):
                    priority = str(level)
                    for outcome in QUEUE_OUTCOMES:
                        outcome_row(((model, version, priority, outcome), counted[level, outcome]))
                busy.add((model, version), served.pool.busy_ratio())
                for row in served.pool.utilisation():
                    compute.add((model, version, row["instance"], str(row["device"])), row["compute_busy"])
                    per_device[row["device"]] = per_device.get(row["device"], 0.0) + row["compute_busy"]
        except Exception:
            log.exception("collecting model gauges failed")
        device_busy = Family("gauge", "aclserve_device_compute_busy_ratio", DEVICE_BUSY_HELP, ["device"])
        for device, fraction in sorted(per_device.items()):
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
        return [depth, outcomes, busy, compute, device_busy, used, total, reserve]
