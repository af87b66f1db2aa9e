"""The edge's one table: every error class answers the HTTP status and gRPC code it always has
(server/http_errors.py, grpc_status.STATUS_CODES); the errors themselves carry no status."""
import grpc
import pytest

from aclserve import errors
from aclserve.repository import ModelLoadFailed
from aclserve.server.auth import Forbidden, Unauthorized
from aclserve.server.body import BodyTimeout, UnsupportedEncoding, UnsupportedTransferCoding
from aclserve.server.budget import MemoryExhausted
from aclserve.server.grpc_status import status_code
from aclserve.server.http_errors import error_headers, http_status, retry_after

C = grpc.StatusCode


@pytest.mark.parametrize("cls, status, code", [
    (errors.ServeError, 500, C.INTERNAL),
    (errors.InvalidInput, 400, C.INVALID_ARGUMENT),
    (ModelLoadFailed, 400, C.INVALID_ARGUMENT),
    (Unauthorized, 401, C.UNAUTHENTICATED),
    (Forbidden, 403, C.PERMISSION_DENIED),
    (errors.NotFound, 404, C.NOT_FOUND),
    (BodyTimeout, 408, C.DEADLINE_EXCEEDED),  # the gRPC request message stalled too
    (errors.PayloadTooLarge, 413, C.RESOURCE_EXHAUSTED),
    (UnsupportedEncoding, 415, C.INTERNAL),
    (UnsupportedTransferCoding, 501, C.INTERNAL),
    (errors.ExecutionFailed, 500, C.INTERNAL),
    (errors.Unavailable, 503, C.UNAVAILABLE),
    (errors.QueueFull, 503, C.UNAVAILABLE),
    (errors.RequestTimeout, 503, C.UNAVAILABLE),
    (errors.ShuttingDown, 503, C.UNAVAILABLE),
    (errors.ModelUnavailable, 503, C.UNAVAILABLE),
    (MemoryExhausted, 503, C.UNAVAILABLE),
])
def test_each_error_class_has_its_status_and_code(cls, status, code):
    error = cls("what went wrong")
    assert http_status(error) == status and status_code(error) == code
    assert (retry_after(error) == 1.0) == (status == 503)


def test_the_errors_every_layer_raises_know_no_protocol():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ServeError)]
    assert classes and not any(hasattr(c, "status") or hasattr(c, "retry_after") for c in classes)


def test_only_unauthorized_adds_a_header():
    assert error_headers(Unauthorized("no token")) == {"WWW-Authenticate": 'Bearer realm="aclserve"'}
    assert error_headers(Forbidden("no")) is None and error_headers(errors.QueueFull("full")) is None


def test_an_error_that_knows_when_to_come_back_says_so_over_both_transports():
    """A load whose automatic retry is due in 42.3 s: Retry-After 43 (rounded up), pushback 42300 ms."""
    from aclserve.server.error_responses import retry_after_value
    from aclserve.server.grpc_status import pushback
    error = errors.ModelUnavailable("failed to load m")
    error.retry_after_s = 42.3
    assert retry_after(error) == 42.3 and retry_after_value(retry_after(error)) == "43"
    assert pushback(error) == (("grpc-retry-pushback-ms", "42300"),)
    assert retry_after_value(0.2) == "1" and retry_after(errors.ModelUnavailable("x")) == 1.0
