"""`grpc.health.v1.Health` on the gRPC endpoint: what Kubernetes' gRPC probes (`grpc:` in a pod's
probe) and grpc_health_probe ask.

Check answers SERVING while the server is ready (the strict readiness of /v2/health/ready, or
the lenient one when configured: ServerState.ready) and NOT_SERVING otherwise, for the service
"" (the whole server) and for "inference.GRPCInferenceService"; any other name is NOT_FOUND, as
the health protocol says. Watch sends the status at once, then each change (looked at every
WATCH_POLL_S), SERVICE_UNKNOWN for a name it does not know; it ends, after a last
NOT_SERVING, when the shutdown's drain begins. Both read their one message within
body_timeout_s, as every method of the endpoint does, and need no API token (neither does
/v2/health over HTTP).

The two messages are built here from their fields (grpc/health/v1/health.proto) with
protobuf's descriptor API, in a pool of their own: grpcio-health-checking, which ships them
generated, requires protobuf 7, and tritonclient's message classes require protobuf 6.
"""
from __future__ import annotations

import asyncio
import contextlib

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from ..errors import InvalidInput, NotFound
from .open_calls import OpenCalls
from .grpc_intake import receive
from .grpc_status import end_call

SERVICE = "grpc.health.v1.Health"
INFERENCE_SERVICE = "inference.GRPCInferenceService"
WATCH_POLL_S = 1.0
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3  # HealthCheckResponse.ServingStatus


def _message_classes():
    """(HealthCheckRequest, HealthCheckResponse), from health.proto's fields."""
    fd = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="aclserve/grpc/health/v1/health.proto",
                                               package="grpc.health.v1", syntax="proto3")
    proto.message_type.add(name="HealthCheckRequest").field.add(
        name="service", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    statuses = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        statuses.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=fd.TYPE_ENUM, label=fd.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{name}"))
                 for name in ("HealthCheckRequest", "HealthCheckResponse"))


HealthCheckRequest, HealthCheckResponse = _message_classes()


class HealthServicer:
    """Owned by the endpoint (grpc_server.GrpcServer), beside the inference servicer whose
    `calls` it shares (so the endpoint's stop ends a Watch like any call at work); event-loop
    thread only."""

    def __init__(self, state, calls: OpenCalls):
        self.state = state
        self.calls = calls
        self._draining = asyncio.Event()

    def drain(self) -> None:
        """Shutdown begins: every Watch sends NOT_SERVING and ends."""
        self._draining.set()

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The method table, client-streaming on this side as the endpoint's others are
        (grpc_server.method_handlers): each reads its own message within body_timeout_s."""
        serialize = HealthCheckResponse.SerializeToString
        return {"Check": grpc.stream_unary_rpc_method_handler(self.Check, response_serializer=serialize),
                "Watch": grpc.stream_stream_rpc_method_handler(self.Watch, response_serializer=serialize)}

    def status(self, service: str) -> int | None:
        """The service's ServingStatus, or None for a name this server does not serve."""
        if service not in ("", INFERENCE_SERVICE):
            return None
        return SERVING if self.state.ready() else NOT_SERVING

    async def Check(self, requests, context):
        try:
            service = await self._service(context)
            status = self.status(service)
            if status is None:
                raise NotFound(f"unknown service '{service}' (this server answers for '' and '{INFERENCE_SERVICE}')")
            return HealthCheckResponse(status=status)
        except Exception as e:
            error = e
        await end_call(context, error, "Check", self.state.redact)

    async def Watch(self, requests, context):
        try:
            service = await self._service(context)
            sent = None
            while True:
                # (read once: a drain that begins while a status is being sent is seen on the
                # next round, which sends NOT_SERVING, instead of ending the watch without it)
                draining = self._draining.is_set()
                status = self.status(service)
                if status is None:
                    status = SERVICE_UNKNOWN
                elif draining:
                    status = NOT_SERVING
                if status != sent:
                    yield HealthCheckResponse(status=status)
                    sent = status
                if draining:
                    return
                with self.calls.at_work(), contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._draining.wait(), WATCH_POLL_S)
        except Exception as e:
            error = e
        await end_call(context, error, "Watch", self.state.redact)

    async def _service(self, context) -> str:
        """The service name the call's message asks about."""
        with self.calls.at_work():
            message = await receive(context, self.state.config.body_timeout_s, self.state.grpc_arrivals, probe=True)
        try:
            return HealthCheckRequest.FromString(message).service
        except DecodeError as e:
            raise InvalidInput(f"request message is not valid: {e}") from None
