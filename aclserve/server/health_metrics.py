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
from .scrape import ScrapeReads

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

    def families(self, reads: ScrapeReads) -> list[Family]:
        """ServerMetrics' collector protocol: every figure copied into rows (on the loop)."""
        return list(self._families(reads))

    def _families(self, reads: ScrapeReads):
        state = self._state
        yield single("gauge", "aclserve_abandoned_instances", "Model instances closed while the device still ran "
                     "their work: their memory is left allocated, not freed under it",
                     state.runtime.abandoned_instances())
        yield single("gauge", "aclserve_devices_failed", "Devices found failed as a whole (an HBM multi-bit ECC "
                     "error, say): nothing runs on them until the process restarts; the server is exiting "
                     "(status 75)", state.runtime.failed_devices())
        yield from self._dvpp(state.images.dvpp_outcomes())
        yield from self._models(reads)

    @staticmethod
    def _dvpp(outcomes: dict[str, int] | None):
        if outcomes is None:
            return
        decodes = Family("counter", "aclserve_dvpp_decodes", "Images given to the DVPP decoder, by outcome: dvpp "
                         "(decoded on DVPP), or decoded on the CPU because DVPP does not take them "
                         "(not_taken), failed on them (failed) or was given up after a hung task "
                         "(given_up)", ["outcome"])
        for outcome in OUTCOMES:
            decodes.add((outcome,), outcomes.get(outcome, 0))
        yield decodes

    def _models(self, reads: ScrapeReads):
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
        repo = self._state.repo
        try:
            for row in reads.index():
                ready.add((self._state.redact(row["name"]), str(row["version"]), row["state"]), 1)
                problem = row["version"] == "" and row["state"] == State.UNAVAILABLE.value  # (not a load call's)
                if problem and row["reason"] != WAITING_FOR_CONFIG:  # a broken config, say
                    label = reason_label(self._state.redact(row["reason"]))
                    failing.add((self._state.redact(row["name"]), "", label), 1)
            for (name, version), reason in sorted(repo.load_failures().items()):  # (their steady text: failures.py)
                failing.add((name, version, reason_label(self._state.redact(reason))), 1)
        except Exception:
            log.exception("collecting model states failed")
        yield ready
        yield failing
        faults = Family("counter", "aclserve_batch_faults", "Batches whose run failed, each counted once when "
                        "answered, by outcome: retried (run again whole on another instance, which "
                        "answered it), rerun_alone (its requests re-run one per run, each alone: "
                        "a request fails only if its own run does), failed (answered with its "
                        "error: not run again, or its whole re-run failed as well)",
                        ["model", "version", "outcome"])
        reruns = Family("counter", "aclserve_batch_reruns", "Runs that retrying failed batches cost, each "
                        "counted at its launch: a whole batch on another instance, a request alone",
                        ["model", "version"])
        rebuilds = Family("counter", "aclserve_instance_rebuilds", "Instances replaced after leaving rotation "
                          "(execution timeout, device fault, failed stream reset)", ["model", "version"])
        rebuilds_failed = Family("counter", "aclserve_instance_rebuild_failures", "Attempts to rebuild an "
                                 "instance that failed (tried again: at once, then with backoff)",
                                 ["model", "version"])
        out = Family("gauge", "aclserve_instances_out_of_rotation", "Instances of the version taking no batch "
                     "now: out of rotation until rebuilt (execution timeout, device fault, failed stream reset), "
                     "or on a device failed as a whole; 0 with all serving", ["model", "version"])
        codes = Family("counter", "aclserve_device_faults", "Faults the device reported, by ACL error code, "
                       "one per fault however many batches it failed (507047: a batch past the "
                       "execution timeout)", ["model", "version", "code"])
        for model, version, served in reads.versions():
            counts = self._pools.total(model, version, served)
            for kind, label, n in sorted((*figure, n) for figure, n in counts.items() if isinstance(figure, tuple)):
                if kind == "outcome":
                    faults.add((model, version, label), n)
                else:
                    codes.add((model, version, str(label)), n)
            reruns.add((model, version), counts["reruns"])
            rebuilds.add((model, version), counts["rebuilds"])
            rebuilds_failed.add((model, version), counts["rebuilds_failed"])
            out.add((model, version), len(served.pool.out_of_rotation()))  # (its own pool's: no carry-over)
        yield faults
        yield reruns
        yield rebuilds
        yield rebuilds_failed
        yield out
        yield codes
