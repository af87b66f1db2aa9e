"""PeakSampler: the largest value a function returns while something runs, sampled in a thread
(a server's RSS for attack_server.py and grpc_slow_senders.py, a health check's latency for
loop_stalls.py)."""
from __future__ import annotations

import threading


class PeakSampler:
    """Calls `sample()` every `interval_s` in a thread of its own; peak() is the largest value
    since the last reset(start). Owns the thread; close() stops it."""

    def __init__(self, sample, interval_s: float):
        self._sample, self._interval_s = sample, interval_s
        self._peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._sample())
            self._stop.wait(self._interval_s)

    def reset(self, start=0) -> None:
        self._peak = start

    def peak(self):
        return self._peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
