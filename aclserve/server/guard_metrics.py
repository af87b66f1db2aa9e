"""Scrape-time metrics of the server's guards: infer requests in flight, the request memory budget
(what each model holds of it and its share, the bodies it ended and the heap trims after large
requests or connection churn), the API token check, both transports' open connections, the HTTP
connections' limits and early answers, gRPC's messages received at once and the calls refused
before their message was read (by grpc or here), log lines dropped for a stderr read too slowly,
and trace files that could not be written. Read from their owners when /metrics is scraped, so the
request path pays nothing for them. The models' and the runtime's health follow them: health_metrics.py."""
from __future__ import annotations

from typing import Iterable

from .. import logs
from .exposition import Family, single
from .grpc_refusals import NO_ROOM_TO_RECEIVE
from .scrape import ScrapeReads


class GuardCollector:
    def __init__(self, state):
        self._state = state

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
        yield _labelled("gauge", "aclserve_request_memory_model_bytes", "Memory charged to requests in flight "
                        "for each model that holds some", "model", sorted(budget.by_model.items()))
        yield _gauge("aclserve_request_memory_model_share_bytes", "Most of it one model may hold now "
                     "(max_inflight_bytes_per_model while more than one model is served, else max_inflight_bytes)",
                     budget.share_now())
        yield _counter("aclserve_stalled_bodies_ended", "HTTP request bodies ended 408 because no byte of theirs "
                       "came for 1 s or more while another request was refused for the request memory they "
                       "held (max_inflight_bytes, or its model's share of it)", state.stalled_bodies.ended)
        yield _labelled("counter", "aclserve_request_memory_refused", "Requests refused by the memory budget "
                        "(413: alone over a limit, 503: budget in use, or its model's share of it)", "status",
                        ((str(status), n) for status, n in sorted(budget.refused.items())))
        yield _labelled("counter", "aclserve_auth_refusals", "Requests refused by the API token check "
                        "(no_token, invalid_token: 401; repeated_header: 400; no_token_configured, web_page: 403)",
                        "reason", state.auth.refused.items())
        yield _labelled("gauge", "aclserve_connections", "Open connections, by transport, each under its own "
                        "max_connections cap (HTTP's but those taken over it for a health probe or /metrics): "
                        "http, grpc (grpc core's, over TLS once its handshake is done)",
                        "transport", (("http", len(conns)), ("grpc", state.grpc_connections())))
        yield _labelled("counter", "aclserve_connections_closed", "HTTP connections closed or refused by the "
                        "server's limits (grpc core counts none of its own)", "reason", sorted(conns.counts.items()))
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
        yield _gauge("aclserve_grpc_waiting", "gRPC calls waiting for one of those places to receive their "
                     "message", arrivals.waiting)
        yield _counter("aclserve_grpc_slow_messages_ended", "gRPC calls ended "
                       "DEADLINE_EXCEEDED because their message took over 1 s while others "
                       "waited to be received (max_inflight_bytes / grpc_max_message_bytes)",
                       arrivals.evicted)
        yield _counter("aclserve_grpc_streams_refused", "ModelStreamInfer streams "
                       "refused (an error_message answer, then UNAVAILABLE): streams held "
                       "their half of those places",
                       arrivals.streams_refused)
        yield _labelled("counter", "aclserve_grpc_calls_refused", "gRPC calls refused before their message "
                        "was read: call_limit (RESOURCE_EXHAUSTED, over max_connections calls at once) and "
                        "unknown_method (UNIMPLEMENTED), which grpc answers itself, and no_room_to_receive "
                        "(UNAVAILABLE, after 2 s waiting for one of those places)", "reason",
                        [*state.grpc_refusals.counts().items(), (NO_ROOM_TO_RECEIVE, arrivals.waits_refused)])
        yield _counter("aclserve_heap_trims", "malloc_trim calls after large requests or a burst, or once "
                       "quiet after connection churn", state.trimmer.trims)
        yield _counter("aclserve_log_lines_dropped", "Log lines dropped, not written, because "
                       "stderr was not read as fast as they came (its queue full), or lost because "
                       "stderr refused them (its reader gone: EPIPE)",
                       logs.lines_dropped())
        yield _counter("aclserve_trace_files_failed", "Trace file writes that failed, each said in an "
                       "ERROR line (a full disk, a folder where the file goes): the traces they held are lost",
                       state.tracer.files_failed)


def _labelled(kind: str, name: str, doc: str, label: str, values: Iterable[tuple[str, float]]) -> Family:
    """A family of one label: a sample for each (label value, value) of `values`."""
    family = Family(kind, name, doc, [label])
    for labelled, value in values:
        family.add((labelled,), value)
    return family


def _gauge(name: str, doc: str, value: float) -> Family:
    return single("gauge", name, doc, value)


def _counter(name: str, doc: str, value: float) -> Family:
    return single("counter", name, doc, value)
