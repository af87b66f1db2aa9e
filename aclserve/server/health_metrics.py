"""Scrape-time metrics of serving health: the repository's model states and load failures, what
each version's pool met running it (failed batches, re-runs, rebuilds, device faults) and its
instances out of rotation now, instances abandoned to a device still running them, devices
failed as a whole, and the DVPP decoder's outcomes. Read from their owners when /metrics is
scraped, so the request path pays nothing for them.

A version's failed batches, re-runs, rebuilds and device faults are its pool's counts: a reload of the same
version replaces the pool, so the replaced pools are added to it, while they drain and once
closed (draining.py), so a counter never goes back (Prometheus would read a reset); a version
unloading shows its own until it has drained, and its series then go with it."""
from __future__ import annotations

import collections
import logging

from ..images.dvpp import OUTCOMES
from ..repository.status import WAITING_FOR_CONFIG, State
from .exposition import Family, single
from .scrape import LabelTuples, ScrapeReads, VersionRows

log = logging.getLogger(__name__)

# the most of a load failure's reason its label shows (the index has it whole): each text is a series of its
# own, kept by the TSDB, and a reason runs to a thousand characters and more (the device's words, what to do)
REASON_LABEL_CHARS = 400


def reason_label(reason: str) -> str:
    """`reason` (redacted) cut to REASON_LABEL_CHARS, its end marked " ..." (not how much more: that
    count changes with the words cut off)."""
    return reason if len(reason) <= REASON_LABEL_CHARS else reason[:REASON_LABEL_CHARS - 4] + " ..."


def pool_figures(served) -> collections.Counter:
    """A served version's failed batches by outcome, re-runs, rebuilds and device faults by code
    (DrainingVersions.carry)."""
    pool = served.pool
    figures = collections.Counter({"reruns": pool.batch_faults.reruns, "rebuilds": pool.rebuilds,
                                   "rebuilds_failed": pool.rebuilds_failed})
    figures.update({("outcome", outcome): n for outcome, n in pool.batch_faults.outcomes().items()})
    figures.update({("code", code): n for code, n in pool.fault_counts().items()})
    return figures


class HealthCollector:
    """Registered right after the guards' collector (state.py): its families follow theirs on /metrics."""

    def __init__(self, state):
        self._state = state
        self._pools = state.draining.carry(pool_figures)
        self._labels = LabelTuples()

    def begin_scrape(self, reads: ScrapeReads) -> "_HealthRows":
        """ServerMetrics' collector protocol (scrape.py): the figures of no version copied now, the
        versions' as the scrape adds them (on the loop)."""
        return _HealthRows(self._state, self._pools, self._labels, reads)


class _HealthRows(VersionRows):
    """One scrape's families of HealthCollector: those of no version and the models' states taken
    at its start, the versions' fault counters as the scrape adds them."""

    def __init__(self, state, pools, labels: LabelTuples, reads: ScrapeReads):
        self._state, self._pools, self._labels = state, pools, labels
        self.families = [
            single("gauge", "aclserve_abandoned_instances", "Model instances closed while the device still ran "
                   "their work: their memory is left allocated, not freed under it",
                   state.runtime.abandoned_instances()),
            single("gauge", "aclserve_devices_failed", "Devices found failed as a whole (an HBM multi-bit ECC "
                   "error, say): nothing runs on them until the process restarts; the server is exiting "
                   "(status 75)", state.runtime.failed_devices()),
            *self._dvpp(state.images.dvpp_outcomes()), *self._models(reads)]
        self._faults = Family("counter", "aclserve_batch_faults", "Batches whose run failed, each counted once "
                              "when answered, by outcome: retried (run again whole on another instance, which "
                              "answered it), rerun_alone (its requests re-run one per run, each alone: "
                              "a request fails only if its own run does), failed (answered with its "
                              "error: not run again, or its whole re-run failed as well)",
                              ["model", "version", "outcome"])
        self._reruns = Family("counter", "aclserve_batch_reruns", "Runs that retrying failed batches cost, each "
                              "counted at its launch: a whole batch on another instance, a request alone",
                              ["model", "version"])
        self._rebuilds = Family("counter", "aclserve_instance_rebuilds", "Instances replaced after leaving "
                                "rotation (execution timeout, device fault, failed stream reset)", ["model", "version"])
        self._rebuilds_failed = Family("counter", "aclserve_instance_rebuild_failures", "Attempts to rebuild an "
                                       "instance that failed (tried again: at once, then with backoff)",
                                       ["model", "version"])
        self._out = Family("gauge", "aclserve_instances_out_of_rotation", "Instances of the version taking no "
                           "batch now: out of rotation until rebuilt (execution timeout, device fault, failed "
                           "stream reset), or on a device failed as a whole; 0 with all serving", ["model", "version"])
        self._codes = Family("counter", "aclserve_device_faults", "Faults the device reported, by ACL error code, "
                             "one per fault however many batches it failed (507047: a batch past the "
                             "execution timeout)", ["model", "version", "code"])
        self.families += [self._faults, self._reruns, self._rebuilds, self._rebuilds_failed, self._out, self._codes]

    def add(self, model: str, version: str, served) -> None:
        counts, labels = self._pools.total(model, version, served), self._labels.labels
        for kind, label, n in sorted((*figure, n) for figure, n in counts.items() if isinstance(figure, tuple)):
            if kind == "outcome":
                self._faults.add(labels((model, version, label)), n)
            else:
                self._codes.add(labels((model, version, str(label))), n)
        both = labels((model, version))
        self._reruns.add(both, counts["reruns"])
        self._rebuilds.add(both, counts["rebuilds"])
        self._rebuilds_failed.add(both, counts["rebuilds_failed"])
        self._out.add(both, len(served.pool.out_of_rotation()))  # (its own pool's: no carry-over)

    def end(self) -> None:
        self._labels.scrape_done()

    @staticmethod
    def _dvpp(outcomes: dict[str, int] | None) -> list[Family]:
        if outcomes is None:
            return []
        decodes = Family("counter", "aclserve_dvpp_decodes", "Images given to the DVPP decoder, by outcome: dvpp "
                         "(decoded on DVPP), or decoded on the CPU because DVPP does not take them "
                         "(not_taken), failed on them (failed) or was given up after a hung task "
                         "(given_up)", ["outcome"])
        for outcome in OUTCOMES:
            decodes.add((outcome,), outcomes.get(outcome, 0))
        return [decodes]

    def _models(self, reads: ScrapeReads) -> list[Family]:
        ready = Family("gauge", "aclserve_model_state", "1 for each model version's current state "
                       "(READY, LOADING, UNAVAILABLE, UNLOADING); version empty: the model's own "
                       "problem (its config), its versions may serve on, or a model a load call "
                       "is loading that no listing knows yet", ["model", "version", "state"])
        failing = Family("gauge", "aclserve_model_load_failure", "1 while a version's last load failed, or "
                         "(version empty) while the model's config or files cannot be used; the "
                         "reason is in the label, one text for one failure over its retries and load "
                         "calls: no retry plan, the numbers standing alone in the device's words (its ids "
                         "and times) as #, no streams and events in use of the ledger's refusal, "
                         f"at most {REASON_LABEL_CHARS} characters (the repository index "
                         "says it whole)",
                         ["model", "version", "reason"])
        state, labels = self._state, self._labels.labels
        try:
            for row in reads.index():
                ready.add(labels((state.redact(row["name"]), str(row["version"]), row["state"])), 1)
                problem = row["version"] == "" and row["state"] == State.UNAVAILABLE.value  # (not a load call's)
                if problem and row["reason"] != WAITING_FOR_CONFIG:  # a broken config, say
                    label = reason_label(state.redact(row["reason"]))
                    failing.add(labels((state.redact(row["name"]), "", label)), 1)
            for (name, version), reason in sorted(state.repo.load_failures().items()):  # (their steady text)
                failing.add(labels((name, version, reason_label(state.redact(reason)))), 1)
        except Exception:
            log.exception("collecting model states failed")
        return [ready, failing]
