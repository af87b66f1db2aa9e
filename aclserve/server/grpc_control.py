"""The RPCs of `inference.GRPCInferenceService` but inference (the servicer's base: grpc_service.py
adds ModelInfer and ModelStreamInfer): health and metadata, a model's config and statistics, the
repository and trace extensions, and the extensions not offered (shared memory, log settings:
UNIMPLEMENTED, like the HTTP server's 400). They answer from the same ServerState as the HTTP app
(views.py), and fail the way Triton fails (grpc_status.end_call). Every unary method reads its
own message, within body_timeout_s (one_message). Event-loop thread only.
"""
from __future__ import annotations

import functools
import itertools

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from ..errors import InvalidInput, NotFound, PayloadTooLarge
from ..trace.settings import KEYS
from . import views
from .body import BodyTimeout
from .grpc_arrivals import PROBES
from .grpc_intake import receive
from .grpc_status import end_call
from .open_calls import OpenCalls

# Largest message of a method other than ModelInfer / ModelStreamInfer (names, a few settings),
# as HTTP's repository API bodies (routes.REPOSITORY_BODY): parsed and read on the event loop,
# 8 MiB of tiny trace settings took it 0.15 s to parse and 1.1 s to read
CONTROL_MESSAGE_BYTES = 1 << 20
# settings a TraceSetting request may name: more, and one is unknown (the first of them is named)
_TRACE_KEYS = len(KEYS)


def rpc(method):
    """A unary method whose failure ends its call with the failure's status (end_call)."""
    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            with self.calls.at_work():
                return await method(self, request, context)
        except Exception as e:
            error = e
        await end_call(context, error, method.__name__, self.state.redact)
    return wrapper


def version_or_none(value: str) -> str | None:
    return value or None


def metadata(context, key: str) -> str | None:
    """The call's metadata `key` (lower case, as grpc passes keys), None without it."""
    return next((v for k, v in (context.invocation_metadata() or ()) if k == key), None)


def authorization(context) -> list[str]:
    """The `authorization` metadata values ("Bearer <token>"), as the HTTP headers (server/auth.py
    refuses two)."""
    return [v for k, v in (context.invocation_metadata() or ()) if k == "authorization"]


def _not_offered(extension: str):
    """The methods of `extension`, one of views.NOT_OFFERED: UNIMPLEMENTED naming it and what to do
    instead, as HTTP's 400 for its routes says it. (The generated base class raises
    NotImplementedError in a worker thread, which grpc logs as an unexpected error with its
    traceback: a log line per call any client can make.)"""
    refusal = views.not_offered(extension)

    async def refuse(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, refusal)
    return refuse


class ControlServicer(pbg.GRPCInferenceServiceServicer):
    """The RPCs but inference, and the reading of a unary call's message."""

    def __init__(self, state):
        self.state = state
        self.calls = OpenCalls()  # ended by the endpoint's stop (grpc_server.py)

    def _model_access(self, context) -> None:
        """auth_inference: the token for every model RPC, as for /v2/models/... over HTTP."""
        if self.state.auth.inference:
            self.state.auth.check_value(authorization(context))

    # -- health and metadata --------------------------------------------------------------------
    async def ServerLive(self, request, context):
        """False once shutdown has begun, as /v2/health/live answers 503 then and Triton's
        IsLive is false while it exits (a call open at the drain's start; new ones are refused)."""
        return pb.ServerLiveResponse(live=not self.state.shutting_down)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.state.ready())

    @rpc
    async def ModelReady(self, request, context):
        """ready=false for a model or version the repository does not know, not NOT_FOUND: as
        Triton (its ModelIsReady succeeds with ready false, for an empty name too), so that
        tritonclient's is_model_ready answers False over gRPC as over HTTP."""
        self._model_access(context)
        try:
            ready = views.model_ready(self.state, request.name, version_or_none(request.version))
        except NotFound:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(**views.server_metadata())

    @rpc
    async def ModelMetadata(self, request, context):
        self._model_access(context)
        doc = views.metadata(self.state, views.model_name(request.name), version_or_none(request.version))
        # a tensor's `parameters` (an image input's decoding, an output's label file) have no
        # field in Triton's TensorMetadata; the labels are in ModelConfig's label_filename
        return json_format.ParseDict(doc, pb.ModelMetadataResponse(), ignore_unknown_fields=True)

    @rpc
    async def ModelConfig(self, request, context):
        self._model_access(context)
        doc = views.config(self.state, views.model_name(request.name), version_or_none(request.version))
        return pb.ModelConfigResponse(config=json_format.ParseDict(doc, mc.ModelConfig()))

    @rpc
    async def ModelStatistics(self, request, context):
        self._model_access(context)
        if request.version and not request.name:  # as Triton: a version of no model is no request
            raise InvalidInput("a model version was given without a model name")
        doc = views.statistics(self.state, request.name or None, version_or_none(request.version))
        # aclserve's own fields (utilisation) have no place in Triton's message
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # -- repository -----------------------------------------------------------------------------
    @rpc
    async def RepositoryIndex(self, request, context):
        self.state.auth.check_repository_value(authorization(context), None)
        await _one_repository(request, context)  # (as Triton's gRPC; its HTTP answers a named index)
        entries = await views.repository_index(self.state, request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

    @rpc
    async def RepositoryModelLoad(self, request, context):
        self.state.auth.check_repository_value(authorization(context), "load")
        await _one_repository(request, context)
        views.check_load_parameters({k: v if v.WhichOneof("parameter_choice") else None
                                     for k, v in request.parameters.items()})
        await self.state.repo.load(views.model_name(request.model_name))
        return pb.RepositoryModelLoadResponse()

    @rpc
    async def RepositoryModelUnload(self, request, context):
        self.state.auth.check_repository_value(authorization(context), "unload")
        await _one_repository(request, context)
        if request.parameters["unload_dependents"].WhichOneof("parameter_choice") not in (None, "bool_param"):
            raise InvalidInput("parameters.unload_dependents must be a bool_param")  # (absent: an empty one)
        await self.state.repo.unload(views.model_name(request.model_name))
        return pb.RepositoryModelUnloadResponse()

    # -- extensions not offered ------------------------------------------------------------------
    SystemSharedMemoryStatus = SystemSharedMemoryRegister = SystemSharedMemoryUnregister = \
        _not_offered("system_shared_memory")
    CudaSharedMemoryStatus = CudaSharedMemoryRegister = CudaSharedMemoryUnregister = _not_offered("cuda_shared_memory")
    LogSettings = _not_offered("logging")

    # -- trace extension ------------------------------------------------------------------------
    @rpc
    async def TraceSetting(self, request, context):
        """Without settings: read them. A setting with no values clears it (the model's back to
        the global value), as tritonclient sends a None. Any call needs what the model RPCs need
        (the token under auth_inference, as HTTP's /v2/trace/setting), and a change needs the
        token when one is set, else a loopback listener, as over HTTP (server/auth.py)."""
        self._model_access(context)
        if request.settings:
            self.state.auth.check_trace_change(authorization(context))
        # (a map of more settings than there are holds an unknown one, among the first of them)
        changes = {key: (list(value.value) or None)
                   for key, value in itertools.islice(request.settings.items(), _TRACE_KEYS + 1)}
        doc = views.trace_settings(self.state, request.model_name or None, changes or None)
        response = pb.TraceSettingResponse()
        for key, value in doc.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    def one_message(self, method, deserialize):
        """`method`, a unary RPC of this servicer, as the handler of a client-streaming call
        (grpc_server.method_handlers): it reads the one request message itself, within
        body_timeout_s (grpc's own unary handling waits for it without a limit, holding the
        call's slot), and a message that does not parse is INVALID_ARGUMENT. A health or
        readiness method's read goes before the others' (grpc_arrivals.PROBES)."""
        probe = method.__name__ in PROBES

        @functools.wraps(method)
        async def handler(request_iterator, context):
            try:
                with self.calls.at_work():
                    message = await self._receive(context, probe)
                if len(message) > CONTROL_MESSAGE_BYTES:
                    raise PayloadTooLarge(f"request message of {len(message):,} bytes is over the "
                                          f"{CONTROL_MESSAGE_BYTES:,} this method takes")
                try:
                    request = deserialize(message)
                except DecodeError as e:
                    raise InvalidInput(f"request message is not valid: {e}") from None
            except Exception as e:  # as `rpc` does: grpc would answer UNKNOWN with its text
                await end_call(context, e, method.__name__, self.state.redact)
            return await method(request, context)
        return handler

    async def _receive(self, context, probe: bool = False) -> bytes:
        """The call's one message, within body_timeout_s (BodyTimeout, and what grpc had
        received of it is given back once the call ends)."""
        try:
            return await receive(context, self.state.config.body_timeout_s, self.state.grpc_arrivals, probe)
        except BodyTimeout:
            self._trim_when_ended(context)
            raise

    def _trim_when_ended(self, context) -> None:
        """A call ended before its message came: grpc core frees what it received of it once
        the call ends, then give it back to the system."""
        max_body_bytes = self.state.config.max_body_bytes
        state = self.state  # (what requests in flight hold: this is no burst's end)
        context.add_done_callback(lambda _: state.trimmer.released(max_body_bytes, state.budget.used))


async def _one_repository(request, context) -> None:
    """One model repository is served: a call naming one is refused as Triton refuses it."""
    if request.repository_name:
        # a load or unload naming no model: KServe's own proto puts model_name where Triton's has this
        kserve = getattr(request, "model_name", None) == ""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, views.NAMED_REPOSITORY + (
            " (from a client built on KServe's grpc_predict_v2.proto? Its model_name is this field: use Triton's "
            "grpc_service.proto, as tritonclient does)" if kserve else ""))
