"""Which infer requests are followed, and what following them produces: a trace (sampled by the
Tracer) and a request log line (every request, when `request_log` is on).

The infer path checks one attribute, `ServerState.observer`, which is None unless one of them
wants requests; `begin()` then returns the request's RequestTrace (or None: not sampled and no
request log), which the transport fills and hands to `end()`. Event-loop thread only.
"""
from __future__ import annotations

import logging

from ..logs import REQUEST_LOGGER
from ..trace import CLIENT_GONE, RequestTrace, Tracer, now_ns
from .client_text import printable
from .redact import MAX_TEXT
from .request_ids import MAX_REQUEST_ID

REQUEST_ID_HEADER = "X-Request-Id"
# A refused request's model and version as the client named them, cut (and marked) in its log
# line: no model's name is longer than 128 characters, no version's than 18 digits
MAX_LOGGED_NAME = 256

request_log = logging.getLogger(REQUEST_LOGGER)


class Observer:
    def __init__(self, tracer: Tracer, log_requests: bool):
        self.tracer = tracer
        self.log_requests = log_requests

    @property
    def wanted(self) -> bool:
        return self.log_requests or self.tracer.any_on

    def begin(self, model: str, version: str, protocol: str, arrival_ns: int) -> RequestTrace | None:
        trace = self.tracer.start(model, version, protocol, arrival_ns)
        if trace is None and self.log_requests:
            trace = RequestTrace(model, version, protocol, arrival_ns, sampled=False)
        return trace

    def refused(self, model: str, version: str | None, protocol: str, arrival_ns: int, status: int,
                error: str, known_id: str | None = None) -> None:
        """A request refused before its model version was found (unknown, not serving, the
        server shutting down): its request log line, as the client named the model, with the
        request id known so far (a header's, or a gRPC message's)."""
        if self.log_requests:
            trace = RequestTrace(printable(model, MAX_LOGGED_NAME), printable(version or "", MAX_LOGGED_NAME),
                                 protocol, arrival_ns, sampled=False)
            trace.end_ns, trace.status = now_ns(), status
            trace.request_id = request_id(known_id)
            _log_request(trace, error)

    def end(self, trace: RequestTrace, status: int, error: str | None = None) -> None:
        trace.end_ns = now_ns()
        trace.status = status
        if trace.sampled:
            self.tracer.finish(trace)
        if self.log_requests:
            _log_request(trace, error)


class CancelledBecause(str):
    """A cancellation's message saying why the server cancelled a request, for its log line and
    trace (`task.cancel(CancelledBecause(...))`); a cancellation without one is its client gone.
    Its own class, so that no other cancellation's message is taken for one."""


class EndWhenSent:
    """A streamed request's trace and log line, ended when its answer leaves, not when it is
    made: a stream's answers wait for those of the requests before it (grpc_stream.py), which
    the line's duration and the trace's send stamps then include, and one the stream let go
    unsent (it ended first) is logged and traced as no answer (CLIENT_GONE: no send stamps, as
    for a client gone once its outputs came). Each is ended once: `sent()` or `dropped(why)`;
    one holding nothing (the request not observed) does nothing."""
    __slots__ = ("_held",)

    def __init__(self):
        self._held = None  # (end(status, error), status, error) once the answer is made

    def hold(self, end, status: int, error: str | None) -> None:
        self._held = (end, status, error)

    def sent(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held[0](held[1], held[2])

    def dropped(self, why: str) -> None:
        held, self._held = self._held, None
        if held is not None:
            held[0](CLIENT_GONE, why)


def request_id(value) -> str | None:
    """A request id fit for a trace or a log line: at most MAX_REQUEST_ID characters, anything
    unprintable (a newline that would forge a text log line) replaced by '?'."""
    if value is None:
        return None
    return printable(str(value)[:MAX_REQUEST_ID], MAX_REQUEST_ID)


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def _log_request(t: RequestTrace, error: str | None) -> None:
    fields = {"request_id": t.request_id, "model": t.model, "version": t.version, "protocol": t.protocol,
              "status": t.status, "duration_ms": _ms(t.end_ns - t.arrival_ns)}
    if t.decoded_ns and t.received_ns:
        fields["decode_ms"] = _ms(t.decoded_ns - t.received_ns)
    if t.result_ns:
        fields["queue_ms"] = _ms(t.queue_ns)
        fields["compute_ms"] = _ms(t.compute_ns)
    if t.encoded_ns:
        fields["encode_ms"] = _ms(t.encoded_ns - t.encode_start_ns)
    if error:
        # refusals quote the client's names as sent: cut where the client's answer is (redact.py)
        fields["error"] = printable(error, MAX_TEXT)
    text = " ".join(f"{k}={_logfmt(v)}" for k, v in fields.items() if v is not None)
    request_log.info("infer %s", text, extra={"fields": fields})


def _logfmt(value) -> str:
    """A text line's value, quoted (logfmt) when it holds a space, quote, '=' or backslash: a
    client's id or model name cannot pass for fields of its own ("x status=200")."""
    text = str(value)
    if text and not any(c in text for c in ' "=\\'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
