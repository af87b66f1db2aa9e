"""The server-wide budget of memory held by requests in flight, and each request's lease on it.

A request is charged before its memory is taken: its body as its bytes arrive (body.py: the
size it declares is only checked, `Lease.check`), its decompressed bytes as they are inflated,
and an estimate of its decoded tensors before decoding (see `json_tensor_estimate`). A charge
that would take the total over `max_inflight_bytes` fails with 503 + Retry-After (others hold
the memory: come back soon); one that would take this request alone over `max_request_bytes`
fails with 413 (it can never fit). Both transports charge the same budget (gRPC:
grpc_intake.py), each lease with the advice its transport and its body format give a request
that is too large (infer_body_hint: the binary tensor extension for an HTTP body all JSON only),
a charge with the advice where its memory goes (json_decoding_hint: decoding JSON tensor data
is advised the extension whatever the body's framing). Event-loop thread only: no locks.

Each infer request's lease is the model's it names, from the moment that is known (HTTP: its
path, before its body is read, which it is only once the repository has the model; gRPC: its
message's model_name, before it is charged, if the repository knows that model), and the budget
keeps what each model's leases hold. While the server serves more than one model, a
charge that would take its model past its share (`max_inflight_bytes_per_model`, `model_share`)
fails with 503 too: one model's flood of large requests held the whole budget and another
model's small requests were refused (a tester's: 36 clients of 24 MiB requests to one model,
2 clients of one-row requests to another, 5 of whose 30 got 503).
"""
from __future__ import annotations

import re
from typing import Callable

from ..errors import Overloaded, PayloadTooLarge

# Parsing a JSON number costs a Python object and a list slot (~40 bytes), then a float64 and
# the model dtype's array element: measured 52 bytes per number; the worst value of all
# (nested empty lists) takes 64, which is what is charged.
JSON_BYTES_PER_VALUE = 64
# How a request too large for max_request_bytes can need less, its 413's last words: the binary
# tensor extension only where the memory is JSON tensor data (one using it already was told to use it)
SMALLER_HINT = "send smaller requests"
JSON_BODY_HINT = "send tensors with the binary tensor extension or in smaller requests"
# A key `data` in a JSON text: an input's tensor carried as JSON values (a string "data" is no key)
_DATA_KEY = re.compile(rb'"data"\s*:')


def infer_body_hint(binary_extension: bool) -> str:
    """The advice of an HTTP infer request's lease, for its body's bytes: what its head says of
    them (all an `Expect: 100-continue` check knows, and the body is charged before it is
    parsed): a body framed for the binary tensor extension (Inference-Header-Content-Length)
    is told to send smaller requests, one all JSON to use the extension too."""
    return SMALLER_HINT if binary_extension else JSON_BODY_HINT


def json_decoding_hint(json_text: bytes | bytearray | memoryview, all_json: bool) -> str:
    """The advice of a 413 for decoding an HTTP infer body's JSON (`json_text`; `all_json`: the
    body has no binary part): the binary tensor extension where that JSON carries tensor data,
    whatever the framing: a body framed for the extension may still send a tensor as JSON
    `data`, and was told only to send smaller requests (a reviewer's find). A JSON part with no
    `data` only describes binary tensors: smaller requests. Called on a refusal only (it scans the text)."""
    return JSON_BODY_HINT if all_json or _DATA_KEY.search(json_text) else SMALLER_HINT


# What _over finds a charge would pass: nothing, the request's own limit (413), the budget (503),
# its model's share of the budget (503)
_FITS, _REQUEST, _BUDGET, _SHARE = "", "request", "budget", "share"


class MemoryExhausted(Overloaded):
    """The server's request memory budget is in use by other requests (or by its model's, up to its share)."""


def model_share(max_inflight_bytes: int, max_request_bytes: int, per_model: int = 0) -> int:
    """What one model may hold while others are served: `per_model` (max_inflight_bytes_per_model,
    at least max_request_bytes: config/server.py), or for 0 (auto) three quarters of the budget,
    but never less than one request may hold (a request that fits max_request_bytes fits its
    model's share when nothing else is held)."""
    return per_model or max(max_inflight_bytes * 3 // 4, max_request_bytes)


class MemoryBudget:
    def __init__(self, max_inflight_bytes: int, max_request_bytes: int, on_release=None, on_refused=None,
                 per_model: int = 0, models_served: Callable[[], int] = lambda: 1):
        self.limit = max_inflight_bytes
        self.per_request = max_request_bytes
        self.used = 0
        self.peak = 0
        self.refused = {413: 0, 503: 0}
        self.by_model: dict[str, int] = {}  # model -> bytes its leases hold; none at 0
        self.share = model_share(max_inflight_bytes, max_request_bytes, per_model)
        self._models_served = models_served  # how many models the server serves now (the repository's)
        self._on_release = on_release  # called with the bytes a finished request held, and those still held
        # called with a lease refused for want of room (503), the bytes that would make room for it in the
        # budget (0 or less: none lacking there), the model whose share refused it (None: the budget's) and
        # the bytes that would make room in that share: may end stalled bodies so that its retry fits
        # (stalled_bodies.py)
        self._on_refused = on_refused

    def lease(self, hint: str = SMALLER_HINT, model: str | None = None) -> "Lease":
        """A new request's lease; `hint` ends the message of its 413 (how to need less); `model`:
        the model it is for (None: no model's, a control request)."""
        return Lease(self, hint, model)

    def share_now(self) -> int:
        """What one model may hold now: its share while others are served, else the whole budget."""
        return self.share if self._models_served() > 1 else self.limit

    def _over(self, lease: "Lease", nbytes: int) -> str:
        """_FITS when `nbytes` more fits; _REQUEST when the request would pass its own limit;
        _SHARE when its model would pass its share while other models are served; _BUDGET when
        the requests in flight would pass theirs."""
        if lease.held + nbytes > self.per_request:
            return _REQUEST
        total = self.used + nbytes
        if total <= self.share:
            return _FITS  # (no model holds more than all of them: no dict lookup under the share)
        model = lease.model
        if (model is not None and self.by_model.get(model, 0) + nbytes > self.share
                and self._models_served() > 1):
            return _SHARE
        return _BUDGET if total > self.limit else _FITS

    def _count(self, model: str | None, nbytes: int) -> None:
        """`nbytes` (signed) more held by `model`'s leases; its entry goes at 0."""
        if model is not None and nbytes:
            held = self.by_model.get(model, 0) + nbytes
            if held:
                self.by_model[model] = held
            else:
                del self.by_model[model]

    def _take(self, lease: "Lease", nbytes: int, what: str, hint=None, growing: bool = False) -> None:
        over = self._over(lease, nbytes)
        if over:
            self._refuse(lease, nbytes, what, hint, over, growing)
        self.used += nbytes
        lease.held += nbytes
        self._count(lease.model, nbytes)
        if self.used > self.peak:
            self.peak = self.used

    def _refuse(self, lease: "Lease", nbytes: int, what: str, hint, over: str, growing: bool = False) -> None:
        """Count and raise the refusal `over` (_over's answer) names; `growing`: the request's
        whole need is not known (its 413 says "more than" what it came to)."""
        total = lease.held + nbytes
        if over is _REQUEST:
            self.refused[413] += 1
            need, limit = _need_and_limit(total, self.per_request)
            raise PayloadTooLarge(f"request needs {'more than' if growing else 'about'} {need} of server memory "
                                  f"({what}), over the "
                                  f"per-request limit of {limit} (max_request_bytes); "
                                  f"{(hint() if callable(hint) else hint) or lease.hint}")
        self.refused[503] += 1
        model = lease.model if over is _SHARE else None
        held = self.by_model.get(model, 0) if model is not None else self.used
        if self._on_refused is not None:  # what would make room: in the budget, and in the share that refused
            self._on_refused(lease, self.used + nbytes - self.limit, model,
                             held + nbytes - self.share if model is not None else 0)
        if model is not None:
            raise MemoryExhausted(f"model {model} holds {_mb(held)} of its {_mb(self.share)} share of request "
                                  f"memory (max_inflight_bytes_per_model); retry later")
        raise MemoryExhausted(f"server is busy: requests in flight hold {_mb(self.used)} of its "
                              f"{_mb(self.limit)} request memory (max_inflight_bytes); retry later")


class Lease:
    """One request's charge, the model's it is for (if any); `release()` gives it all back
    (idempotent). Use as a context manager."""

    __slots__ = ("budget", "held", "hint", "model")

    def __init__(self, budget: MemoryBudget, hint: str = SMALLER_HINT, model: str | None = None):
        self.budget = budget
        self.held = 0
        self.hint = hint
        self.model = model

    def attribute(self, model: str | None) -> None:
        """This lease is `model`'s from now on (a gRPC message's, once it is received), with
        what it holds already; None: no model's (answers of several models a connection holds)."""
        budget = self.budget
        budget._count(self.model, -self.held)
        self.model = model
        budget._count(model, self.held)

    def take(self, nbytes: int, what: str, hint: str | Callable[[], str] | None = None,
             growing: bool = False) -> None:
        """Charge `nbytes` more, or raise PayloadTooLarge (413, ending with `hint`, else the
        lease's; a callable is called then only: the advice costs nothing to a request that
        fits) / MemoryExhausted (503: the budget, or the model's share of it). `growing`: a part
        of what the request will hold, whose whole is not known yet (a body of no declared
        length, or inflating): the 413 says the request needs more than it came to, not about
        that much (2.0 MiB of a gzip body inflated when its limit was crossed was said to be its need)."""
        if nbytes > 0:
            self.budget._take(self, nbytes, what, hint, growing)

    def check(self, nbytes: int, what: str) -> None:
        """Raise what `take(nbytes)` would (413 / 503), charging nothing: for a size a client
        declares before its bytes come, which it may never send."""
        over = self.budget._over(self, nbytes)
        if over:
            self.budget._refuse(self, nbytes, what, None, over)

    def fits(self, nbytes: int) -> bool:
        """Whether `take(nbytes)` would succeed now."""
        return not self.budget._over(self, nbytes)

    def drop(self, nbytes: int) -> None:
        """Give back `nbytes` of this request's charge (memory it no longer holds)."""
        nbytes = min(nbytes, self.held)
        self.held -= nbytes
        self.budget.used -= nbytes
        self.budget._count(self.model, -nbytes)

    def settle(self, nbytes: int) -> None:
        """Charge exactly `nbytes` from now on: memory taken already (an answer made, waiting to
        be sent), so never refused, even past the budget; what was charged beyond it is given back."""
        budget = self.budget
        budget.used += nbytes - self.held
        budget._count(self.model, nbytes - self.held)
        self.held = nbytes
        if budget.used > budget.peak:
            budget.peak = budget.used

    def split(self, nbytes: int) -> "Lease":
        """A lease of its own for `nbytes` of this one's charge (moved, not charged again; the
        same model's): for memory that may outlive the request (a cancelled request's image
        decodes run on)."""
        nbytes = min(nbytes, self.held)
        self.held -= nbytes
        other = Lease(self.budget, self.hint, self.model)
        other.held = nbytes
        return other

    def take_over(self, other: "Lease") -> None:
        """Move `other`'s charge to this lease (not charged again): the way back from split."""
        if other.model != self.model:
            self.budget._count(other.model, -other.held)
            self.budget._count(self.model, other.held)
        self.held += other.held
        other.held = 0

    def release(self) -> None:
        held, self.held = self.held, 0
        if held:
            budget = self.budget
            budget.used -= held
            budget._count(self.model, -held)
            if budget._on_release is not None:
                budget._on_release(held, budget.used)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def json_tensor_estimate(json_bytes: int, values: int | None = None) -> int:
    """Bytes that decoding a JSON text of `json_bytes` holding at most `values` values may hold
    at its peak: a copy of the text, plus JSON_BYTES_PER_VALUE per value (default: the most a
    text of that size can hold, one per 2 bytes)."""
    if values is None:
        values = json_bytes // 2 + 1
    return json_bytes + values * JSON_BYTES_PER_VALUE


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _need_and_limit(need: int, limit: int) -> tuple[str, str]:
    """A need over the limit and the limit, in MiB, or in bytes where MiB would print them the
    same ("needs about 256.0 MiB ... over the limit of 256.0 MiB" was a need a few KiB over it)."""
    shown = _mb(need), _mb(limit)
    return (f"{need:,} bytes", f"{limit:,} bytes") if shown[0] == shown[1] else shown
