"""Seeing the pipeline: per-request and per-batch timelines, their settings, their renderings.

This package sits at the bottom of the import order (it imports nothing else of aclserve), so
the server, the batcher and the runtime can all fill its records. Hooks elsewhere are a single
`is not None` check when tracing is off: a request's `RequestTrace` exists only when the request
was sampled (or the request log is on), a batch's `BatchTrace` only when it carries a sampled
request.
"""
from .records import CLIENT_GONE, BatchTrace, RequestTrace, now_ns
from .settings import TraceSettings, TraceSettingsError
from .tracer import Tracer

__all__ = ["CLIENT_GONE", "BatchTrace", "RequestTrace", "TraceSettings", "TraceSettingsError", "Tracer", "now_ns"]
