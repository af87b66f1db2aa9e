"""Scrape-time metrics of the guards: request memory budget, connections, heap trims, log lines dropped, the DVPP
decoder's outcomes, and the repository's model states and batch faults. Read from their owners when /metrics
is scraped, so the request path pays nothing for them.

A version's failed batches, re-runs, rebuilds and device faults are its pool's counts: a reload of the same
version replaces the pool, so the replaced pools are added to it, while they drain and once
closed (draining.py), so a counter never goes back (Prometheus would read a reset); a version
unloading shows its own until it has drained, and its series then go with it."""
from __future__ import annotations

import collections
import logging

from .. import logs
from ..images.dvpp import OUTCOMES
from ..repository.status import WAITING_FOR_CONFIG, State
from .exposition import Family
from .scrape import ScrapeReads

log = logging.getLogger(__name__)


def pool_figures(served) -> collections.Counter:
    """A served version's failed batches by outcome, re-runs, rebuilds and device faults by code
    (DrainingVersions.carry)."""
    pool = served.pool
    figures = collections.Counter({"reruns": pool.batch_faults.reruns, "rebuilds": pool.rebuilds,
                                   "rebuilds_failed": pool.rebuilds_failed})
    figures.update({("outcome", outcome): n for outcome, n in pool.batch_faults.outcomes().items()})
    figures.update({("code", code): n for code, n in pool.fault_counts().items()})
    return figures


class GuardCollector:
    def __init__(self, state):
        self._state = state
        self._pools = state.draining.carry(pool_figures)

    def families(self, reads: ScrapeReads) -> list[Family]:
        """ServerMetrics' collector protocol: every figure copied into rows (on the loop)."""
        return list(self._families(reads))

    def _families(self, reads: ScrapeReads):
        state = self._state
        budget, conns = state.budget, state.connections
        yield _gauge("aclserve_requests_in_flight", "Infer requests being served on either transport: "
                     "decoded, queued, running or being answered", state.infer_requests.count)
        yield _gauge("aclserve_request_memory_bytes", "Memory charged to requests in flight", budget.used)
        yield _gauge("aclserve_request_memory_peak_bytes", "Highest request memory charged at once", budget.peak)
        yield _gauge("aclserve_request_memory_limit_bytes", "max_inflight_bytes", budget.limit)
        yield _counter("aclserve_stalled_bodies_ended", "HTTP request bodies ended 408 because no byte of theirs "
                       "came for 1 s or more while another request was refused for the request memory they "
                       "held (max_inflight_bytes)", state.stalled_bodies.ended)
        refused = Family("counter", "aclserve_request_memory_refused", "Requests refused by the memory "
                         "budget (413: alone over a limit, 503: budget in use)", ["status"])
        for status, n in sorted(budget.refused.items()):
            refused.add((str(status),), n)
        yield refused
        auth = Family("counter", "aclserve_auth_refusals", "Requests refused by the API token check "
                      "(no_token, invalid_token: 401; repeated_header: 400; no_token_configured, web_page: 403)",
                      ["reason"])
        for reason, n in state.auth.refused.items():
            auth.add((reason,), n)
        yield auth
        yield _gauge("aclserve_connections", "Open connections", len(conns))
        closed = Family("counter", "aclserve_connections_closed", "Connections closed or refused by the "
                        "server's limits", ["reason"])
        for reason, n in sorted(conns.counts.items()):
            closed.add((reason,), n)
        yield closed
        yield _counter("aclserve_tls_handshakes_refused", "TLS handshakes of the HTTP endpoint that "
                       "TLS refused, on either side (no or a bad client certificate, an old protocol "
                       "version, not TLS; a client not trusting the server's certificate)",
                       conns.tls_refused)
        yield _gauge("aclserve_connections_held", "Connections not read until the Retry-After of their "
                     "overload refusal (503) has passed", conns.held)
        yield _counter("aclserve_connection_holds", "Overload refusals (503) whose connection "
                       "was held for its Retry-After", conns.holds)
        yield _counter("aclserve_early_refusals", "Infer requests refused 503 (queue full) from "
                       "their head and body, before aiohttp parsed them (shed_before_parsing)",
                       conns.early.refused if conns.early is not None else 0)
        yield _counter("aclserve_direct_infer", "Infer requests answered by the connection "
                       "guard itself, without aiohttp's request objects (direct_infer)",
                       conns.direct.answered if conns.direct is not None else 0)
        arrivals = state.grpc_arrivals
        yield _gauge("aclserve_grpc_receiving", "Places taken among the gRPC messages received at once "
                     "(max_inflight_bytes / grpc_max_message_bytes): unary calls reading, streams", arrivals.holding)
        yield _gauge("aclserve_grpc_streams", "ModelStreamInfer streams open, each holding one of those places",
                     arrivals.streams)
        yield _counter("aclserve_grpc_slow_messages_ended", "gRPC calls ended "
                       "DEADLINE_EXCEEDED because their message took over 1 s while others "
                       "waited to be received (max_inflight_bytes / grpc_max_message_bytes)",
                       arrivals.evicted)
        yield _counter("aclserve_grpc_streams_refused", "ModelStreamInfer streams "
                       "refused (an error_message answer, then UNAVAILABLE): streams held "
                       "their half of those places",
                       arrivals.streams_refused)
        refused_calls = Family("counter", "aclserve_grpc_calls_refused", "gRPC calls grpc answered itself, before "
                               "any handler ran: call_limit (RESOURCE_EXHAUSTED, over max_connections "
                               "calls at once), unknown_method (UNIMPLEMENTED)", ["reason"])
        for reason, n in state.grpc_refusals.counts().items():
            refused_calls.add((reason,), n)
        yield refused_calls
        yield _counter("aclserve_heap_trims", "malloc_trim calls after large requests or a burst",
                       state.trimmer.trims)
        yield _counter("aclserve_log_lines_dropped", "Log lines dropped, not written, because "
                       "stderr was not read as fast as they came (its queue full)",
                       logs.lines_dropped())
        yield _gauge("aclserve_abandoned_instances", "Model instances closed while the device still ran their work: "
                     "their memory is left allocated, not freed under it", state.runtime.abandoned_instances())
        yield _gauge("aclserve_devices_failed", "Devices found failed as a whole (an HBM multi-bit ECC error, "
                     "say): nothing runs on them until the process restarts; the server is exiting (status 75)",
                     state.runtime.failed_devices())
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
                         "reason is in the label", ["model", "version", "reason"])
        repo = self._state.repo
        try:
            for row in reads.index():
                ready.add((self._state.redact(row["name"]), str(row["version"]), row["state"]), 1)
                problem = row["version"] == "" and row["state"] == State.UNAVAILABLE.value  # (not a load call's)
                if problem and row["reason"] != WAITING_FOR_CONFIG:  # a broken config, say
                    failing.add((self._state.redact(row["name"]), "", self._state.redact(row["reason"])), 1)
            for (name, version), reason in sorted(repo.load_failures().items()):
                failing.add((name, version, self._state.redact(reason)), 1)
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
        yield faults
        yield reruns
        yield rebuilds
        yield rebuilds_failed
        yield codes


def _gauge(name: str, doc: str, value: float) -> Family:
    return _single("gauge", name, doc, value)


def _counter(name: str, doc: str, value: float) -> Family:
    return _single("counter", name, doc, value)


def _single(kind: str, name: str, doc: str, value: float) -> Family:
    """A family of one series without labels."""
    family = Family(kind, name, doc)
    family.add((), value)
    return family
