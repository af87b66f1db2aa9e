"""Counters and histograms for the request path: plain numbers updated on the event loop,
rendered as Prometheus families when /metrics is scraped.

prometheus_client's Counter and Histogram take a lock and walk Python objects on every update;
for the three updates each infer request makes that was about 8 % of the light MLP's
throughput on one core (bench: 10.4k against 9.6k req/s at 64 clients with them off). These
keep a float and a list of bucket counts per label set instead. Event-loop thread only, so no
lock: a scrape copies the numbers there (`frozen()`, an exposition.Family, a list copy per
series) and the copy is written as text wherever the caller likes (server/metrics.py: a worker
thread). `collect()` is prometheus_client's collector protocol, for a CollectorRegistry.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from .exposition import Family


class LoopCounter:
    __slots__ = ("value",)

    def __init__(self):
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopHistogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound >= value
        self.sum += value


class _Family:
    """One metric family: its children by label values; a collector for a CollectorRegistry."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]):
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._children: dict[tuple[str, ...], object] = {}

    def labels(self, *values: str):
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def remove(self, *values: str) -> None:
        self._children.pop(tuple(str(v) for v in values), None)

    def describe(self):
        return []

    def collect(self):
        """prometheus_client's collector protocol (a CollectorRegistry's generate_latest)."""
        yield self.frozen().prometheus()

    def families(self, reads=None) -> list[Family]:
        """ServerMetrics' collector protocol: the numbers copied (on the loop; `reads` unused)."""
        return [self.frozen()]

    def frozen(self) -> Family:
        raise NotImplementedError

    def empty(self) -> Family:
        """The family without its rows (a scrape adds them: metrics.py)."""
        raise NotImplementedError

    def _new_child(self):
        raise NotImplementedError


class LoopCounterFamily(_Family):
    def _new_child(self) -> LoopCounter:
        return LoopCounter()

    def empty(self) -> Family:
        return Family("counter", self.name, self.documentation, self.labelnames)

    def frozen(self) -> Family:
        family = self.empty()
        family.rows = [(key, child.value) for key, child in self._children.items()]
        return family


class LoopHistogramFamily(_Family):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]):
        super().__init__(name, documentation, labelnames)
        self.bounds = tuple(float(b) for b in buckets)

    def _new_child(self) -> LoopHistogram:
        return LoopHistogram(self.bounds)

    def empty(self) -> Family:
        return Family("histogram", self.name, self.documentation, self.labelnames, self.bounds)

    def frozen(self) -> Family:
        family = self.empty()
        family.rows = [(key, tuple(child.counts), child.sum) for key, child in self._children.items()]
        return family
