"""The per-model series of /metrics (labelled by model alone; loads also by result): load
outcomes and durations, reloads, unloads and automatic load retries.

A model's series are made, every one at 0, when the model first appears in the repository
index (a version of it on disk or loaded, or its files that cannot be served as they are: its
config broken, say, whose failures aclserve_model_loads_total{result="failed"} counts as the
repository's problem_loads.py says), so that `increase()` sees its first reload, unload,
failed load or retry (a series that appears with its first count has no value to start from).
They go once the index lists nothing of the model (its files gone and its last version
unloaded), so a churn of models leaves no series behind; while it is listed they only grow. An
unload through the API keeps the model's files, and its row: its series stay. A model that
comes back after it was gone starts again from 0 (a counter reset, which `rate()` takes in its
stride). Whether a model is listed is read at each scrape (`families`), on the event loop; the
repository's events count (on the loop too: loop_metrics families, whose scrape copies numbers;
collecting prometheus_client's Histogram was half the loop's ~18 ms of a scrape at 40 models). The
retries are the repository's count, less what it was when the model's series were made.
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping

from ..repository.names import check_model_name
from ..repository.status import State
from .exposition import Family
from .loop_metrics import LoopCounterFamily, LoopHistogramFamily
from .scrape import ScrapeReads

log = logging.getLogger(__name__)

# up to the default compile_timeout_s: a load's seconds hold a dropped .onnx's compile (ATC: minutes)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
LOAD_RESULTS = ("ok", "failed")


class ModelSeries:
    """A collector (ServerMetrics.register: the repository index's rows, their "name" and
    "version", from its ScrapeReads) and a repository listener. `load_retries()` is the
    repository's model -> automatic load retries started."""

    def __init__(self, load_retries: Callable[[], Mapping[str, int]]):
        self._load_retries = load_retries
        self.load_duration = LoopHistogramFamily("aclserve_model_load_duration_seconds", "Time to load and warm "
                                                 "up a model version, its compile included", ["model"], LOAD_BUCKETS)
        self.loads = LoopCounterFamily("aclserve_model_loads", "Model load outcomes: a version's load, or "
                                       "(failed) the model's files that cannot be served as they are, its "
                                       "config broken, say", ["model", "result"])
        self.reloads = LoopCounterFamily("aclserve_model_reloads", "Model versions replaced while serving", ["model"])
        self.unloads = LoopCounterFamily("aclserve_model_unloads", "Model versions unloaded", ["model"])
        self._retries_before: dict[str, int] = {}  # model with series -> its retries when they were made

    def on_repository_event(self, event: str, name: str, version=None, **info) -> None:
        """Listener for ModelRepository.add_listener (contracts.ModelStore)."""
        if event not in ("loaded", "reloaded", "load_failed", "unloaded"):
            return
        self._appeared(name)  # (before the first scrape that lists it, say)
        if event == "load_failed":
            self.loads.labels(name, "failed").inc()
        elif event == "unloaded":
            self.unloads.labels(name).inc()
        else:
            self.loads.labels(name, "ok").inc()
            seconds = info.get("seconds")  # the load's duration
            if seconds is not None:
                self.load_duration.labels(name).observe(float(seconds))
            if event == "reloaded":
                self.reloads.labels(name).inc()

    def families(self, reads: ScrapeReads) -> list[Family]:
        """The families, once the series are in step with the models the index lists."""
        self._follow_index(reads)
        retries = Family("counter", "aclserve_model_load_retries", "Automatic load retries after "
                         "transient device errors", ["model"])
        counts = self._load_retries()
        for name, before in sorted(self._retries_before.items()):
            retries.add((name,), counts.get(name, 0) - before)
        return [self.load_duration.frozen(), self.loads.frozen(), self.reloads.frozen(), self.unloads.frozen(),
                retries]

    def _follow_index(self, reads: ScrapeReads) -> None:
        try:
            rows = reads.index()
        except Exception:  # (the series stay as they are)
            log.exception("reading the repository index for the model series failed")
            return
        listed = {row["name"] for row in rows}
        # a version, or the model's own problem (its config broken, say: a failed load of it, counted
        # by the repository's event); not a load call's row of a name no listing knows, nor a file's
        # that is no model's
        models = {row["name"] for row in rows if row["version"] or (row["state"] == State.UNAVAILABLE.value
                                                                    and check_model_name(row["name"]) is None)}
        for name in models - self._retries_before.keys():
            self._appeared(name)
        for name in self._retries_before.keys() - listed:
            self._gone(name)

    def _appeared(self, name: str) -> None:
        if name in self._retries_before:
            return
        self._retries_before[name] = self._load_retries().get(name, 0)
        for family, labels in self._series(name):
            family.labels(*labels)  # at 0

    def _gone(self, name: str) -> None:
        del self._retries_before[name]
        for family, labels in self._series(name):
            family.remove(*labels)

    def _series(self, name: str):
        yield self.load_duration, (name,)
        for result in LOAD_RESULTS:
            yield self.loads, (name, result)
        yield self.reloads, (name,)
        yield self.unloads, (name,)
