"""What became of a pool's batches whose run failed, for /metrics (aclserve_batch_faults_total and
aclserve_batch_reruns_total; the pool's instances count the device's faults themselves, by code).

Each batch given to the pool whose run failed is counted once, when the pool answers it, under
one outcome, so the outcomes add up to the failed batches:

    retried      run again whole on another instance, which answered it
    rerun_alone  its requests re-run one per run, each alone (isolation.py): each answered by its
                 own run or failed by it (then that request alone fails)
    failed       answered with its error: not run again (retry off, a batch of one request that
                 failed alone with no other instance, nothing left to run it, the model closing),
                 or its whole re-run failed too, alone (that is not split)

A batch that failed only because another batch's fault stopped the context they were in flight
on is one of them (its run failed too), while the device reported one fault: the failed batches
may outnumber the faults. `reruns` counts the runs retrying cost, each once, at its launch: a
whole batch re-run on another instance, a request re-run alone; a re-run that fails is not run
again, but a whole re-run that fails beside others or holding several requests is then split.
"""
from __future__ import annotations

import collections
import threading

from .batch import Batch

RETRIED, RERUN_ALONE, FAILED = "retried", "rerun_alone", "failed"
OUTCOMES = (RETRIED, RERUN_ALONE, FAILED)


class BatchFaults:
    """A pool's counts: written by its completion threads (and by a closing pool's or a rebuild
    thread's answers), read by scrapes; under their own lock, held for an increment only."""

    def __init__(self):
        self._lock = threading.Lock()
        self._outcomes = collections.Counter(dict.fromkeys(OUTCOMES, 0))
        self._reruns = 0

    def launched(self, batch: Batch) -> None:
        """An instance's launcher puts `batch` on the device (not one it hands back): a re-run when
        it holds a failed batch's work (a whole retry, or a part: both carry the lane they failed
        on). Counted only here, so the counter never goes down."""
        if batch.failed_lane is not None:
            with self._lock:
                self._reruns += 1

    def answered(self, batch: Batch, whole: Batch) -> None:
        """The pool hands `whole` to its listener, finished by `batch` (itself, or its last part)."""
        outcome = _outcome(batch, whole)
        if outcome is not None:
            with self._lock:
                self._outcomes[outcome] += 1

    def outcomes(self) -> dict[str, int]:
        """Failed batches by outcome, every outcome present (0 until one comes)."""
        with self._lock:
            return dict(self._outcomes)

    @property
    def reruns(self) -> int:
        return self._reruns


def _outcome(batch: Batch, whole: Batch) -> str | None:
    if whole is not batch:  # the last part of a batch split after its run failed
        return RERUN_ALONE
    if batch.ran_on is None:  # never launched (the model closing, no instance left): no run failed
        return None
    if batch.error is not None:  # (a launch clears the error: this one is its run's, or kept from it)
        return FAILED
    return RETRIED if batch.failed_lane is not None else None
