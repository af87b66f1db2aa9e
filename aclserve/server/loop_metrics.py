"""Counters and histograms for the request path: plain numbers updated on the event loop,
rendered as Prometheus families when /metrics is scraped.

prometheus_client's Counter and Histogram take a lock and walk Python objects on every update;
for the three updates each infer request makes that was about 8 % of the light MLP's
throughput on one core (bench: 10.4k against 9.6k req/s at 64 clients with them off). These
keep a float and a list of bucket counts per label set instead. Event-loop thread only, so no
lock: a scrape copies the numbers there (`frozen()`, a list copy per series) and the copy is
turned into Prometheus families and text wherever the caller likes (server/metrics.py: a
worker thread, so a big scrape does not hold the loop).
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString


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

    def _new_child(self):
        raise NotImplementedError


class _Frozen:
    """A family's numbers copied at one moment; collect() builds its Prometheus family."""

    def __init__(self, build, rows: list):
        self._build, self._rows = build, rows

    def collect(self):
        yield self._build(self._rows)


class LoopCounterFamily(_Family):
    def _new_child(self) -> LoopCounter:
        return LoopCounter()

    def frozen(self) -> _Frozen:
        return _Frozen(self._family, [(key, child.value) for key, child in self._children.items()])

    def collect(self):
        return self.frozen().collect()

    def _family(self, rows: list) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, value in rows:
            family.add_metric(list(key), value)
        return family


class LoopHistogramFamily(_Family):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]):
        super().__init__(name, documentation, labelnames)
        self.bounds = tuple(float(b) for b in buckets)

    def _new_child(self) -> LoopHistogram:
        return LoopHistogram(self.bounds)

    def frozen(self) -> _Frozen:
        return _Frozen(self._family, [(key, child.counts[:], child.sum) for key, child in self._children.items()])

    def collect(self):
        return self.frozen().collect()

    def _family(self, rows: list) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # `le` as prometheus_client writes it
        for key, counts, total_sum in rows:
            total, cumulative = 0, []
            for name, count in zip(names, counts):
                total += count
                cumulative.append((name, total))
            family.add_metric(list(key), cumulative, sum_value=total_sum)
        return family
