"""The HTTP guards over gRPC: the memory budget, charged before a message is parsed. A real
server on a real port, driven by grpc.aio channels."""
from __future__ import annotations

import asyncio
import shutil

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.errors import InvalidInput
from aclserve.server import grpc_wire
from aclserve.server.grpc_wire import MAX_FIELDS, WORST_PER_BYTE, names, scan

from .conftest import ServerThread, free_port, server_config
from .hostile import metric, wait_for

MiB = 1 << 20
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


def affine(rows: int, model="affine", request_id="", typed=False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    x = request.inputs.add(name="x", datatype="FP32", shape=[rows, 8])
    idx = request.inputs.add(name="idx", datatype="INT64", shape=[rows, 3])
    if typed:
        x.contents.fp32_contents.extend([1.0] * rows * 8)
        idx.contents.int64_contents.extend([1] * rows * 3)
    else:
        request.raw_input_contents.extend([np.ones((rows, 8), np.float32).tobytes(),
                                           np.ones((rows, 3), np.int64).tobytes()])
    return request


def stubs(channel):
    infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString, pb.ModelInferResponse.FromString)
    live = channel.unary_unary(LIVE, pb.ServerLiveRequest.SerializeToString, pb.ServerLiveResponse.FromString)
    return infer, live


# -- the wire scan (pure) --------------------------------------------------------------------------

def test_scan_views_raw_contents_and_bounds_parsing():
    request = affine(2, request_id="r1")
    request.outputs.add(name="y")
    message = request.SerializeToString()
    layout = scan(message)
    assert [bytes(v) for v in layout.raw_contents] == list(request.raw_input_contents)
    assert all(v.obj is message for v in layout.raw_contents)  # views of the message, no copies
    assert layout.cost < 4096  # a raw request costs little more than itself to parse
    assert names(message) == ("affine", "", "r1")
    typed = affine(2, typed=True).SerializeToString()
    assert scan(typed).raw_contents == [] and scan(typed).cost > 32 * 6  # varints: 32 per byte


@pytest.mark.parametrize("shape", [b"\x2a\x00", b"\x32\x00", b"\x3a\x00", b"\x22\x00"],
                         ids=["empty inputs", "empty outputs", "empty raw entries", "empty parameters"])
def test_scan_charges_messages_of_tiny_entries_more_than_parsing_takes(shape):
    """upb takes up to 44x such a message's size to parse it (measured: 8 MiB of empty inputs
    entries, 353 MiB): the scan's bound must be above that."""
    message = shape * 50_000  # 100 KB, over MAX_FIELDS entries
    assert scan(message).cost >= 44 * len(message)
    small = shape * 100
    assert scan(small).cost >= 44 * len(small)


def test_scan_refuses_what_is_not_protobuf_and_caps_its_walk():
    for bad in (b"\x0a\x05ab", b"\x0b", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x00\x00"):
        with pytest.raises(InvalidInput, match="not a valid ModelInferRequest"):
            scan(bad)
    assert names(b"\x0a\x05ab") == ("", "", "")
    many = b"\x0a\x01m" + b"\x1a\x00" * (MAX_FIELDS + 1)  # one name, then ids: too many fields to walk
    layout = scan(many)
    assert layout.raw_contents is None and layout.cost == WORST_PER_BYTE * len(many)
    assert grpc_wire.names(many)[0] == "m"


# -- a server with a small budget ------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(models_dir, tmp_path_factory):
    """4 MiB budget, 3 MiB per request; "slow" holds a partial batch (3 rows) until 8 rows are
    queued, so a test decides when a charged request ends."""
    root = tmp_path_factory.mktemp("grpc_guards")
    for name in ("affine", "double"):
        shutil.copy(models_dir / f"{name}.om", root / f"{name}.om")
    shutil.copy(models_dir / "affine.om", root / "slow.om")
    (root / "slow.yaml").write_text("batching: {max_queue_delay_ms: 60000}\n")
    srv = ServerThread(server_config(root, grpc_port=free_port(), model_control_mode="none", max_body_bytes=4 * MiB,
                                     max_request_bytes=3 * MiB, max_inflight_bytes=4 * MiB)).start()
    srv.grpc_url = f"127.0.0.1:{srv.config.grpc_port}"
    yield srv
    srv.close()
    if srv.error is not None:
        raise srv.error


def in_use(srv) -> float:
    return metric(srv.url, "aclserve_request_memory_bytes")


def refused(srv, status: int) -> float:
    return metric(srv.url, "aclserve_request_memory_refused_total", f'status="{status}"')


def test_a_request_over_max_request_bytes_alone_is_resource_exhausted(guarded):
    big = affine(1)
    big.raw_input_contents[0] = bytes(3 * MiB + 1)  # wrong for the shape: refused before that is looked at
    varints = affine(1, typed=True)
    varints.inputs[1].contents.int64_contents.extend([1] * 200_000)  # 200 KB that parse to 16x as much

    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            infer, _ = stubs(channel)
            errors = []
            for request in (big, varints):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await infer(request)
                errors.append(e.value)
            return errors, await infer(affine(2))
    before = refused(guarded, 413)
    errors, served = asyncio.run(scenario())
    assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_bytes" in e.details()
               and "raw_input_contents" in e.details() for e in errors), [e.details() for e in errors]
    assert "its message" in errors[0].details() and "parsing and decoding" in errors[1].details()
    assert np.frombuffer(served.raw_output_contents[1], np.int64).tolist() == [2] * 6  # others are served
    assert refused(guarded, 413) == before + 2 and in_use(guarded) == 0


def test_requests_over_the_budget_in_use_are_unavailable_and_it_comes_back_to_zero(guarded):
    """A 2.5 MiB request waits in "slow"'s queue holding its lease: 2 MiB requests do not fit
    what is left (UNAVAILABLE with a retry pushback, refused before parsing), a small one does;
    once the held request is answered the budget is back to 0."""
    held = affine(3, model="slow", request_id="h" * (5 * MiB // 2))  # the id makes it big, not its tensors
    large = affine(1, request_id="l" * (2 * MiB))

    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            infer, _ = stubs(channel)
            waiting = asyncio.ensure_future(infer(held))
            await wait_for(lambda: in_use(guarded) >= 5 * MiB // 2)
            outcomes = await asyncio.gather(*[infer(large) for _ in range(2)], return_exceptions=True)
            small = await infer(affine(1))
            fill = await infer(affine(5, model="slow"))  # 8 rows: the held batch runs
            answered = await waiting
            await wait_for(lambda: in_use(guarded) == 0)
            return outcomes, small, fill, answered
    before = refused(guarded, 503)
    outcomes, small, fill, answered = asyncio.run(scenario())
    for e in outcomes:
        assert isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.UNAVAILABLE, e
        assert "max_inflight_bytes" in e.details()
        assert dict(e.trailing_metadata())["grpc-retry-pushback-ms"] == "1000"
    assert len(small.raw_output_contents) == 2 and len(fill.raw_output_contents) == 2
    assert answered.id == held.id
    assert refused(guarded, 503) == before + 2
    assert metric(guarded.url, "aclserve_request_memory_peak_bytes") <= 4 * MiB


def test_a_streamed_request_is_charged_alone_and_its_refusal_names_it(guarded):
    big = affine(1, request_id="too-big")
    big.raw_input_contents[0] = bytes(3 * MiB + 1)

    async def scenario():
        async with grpc.aio.insecure_channel(guarded.grpc_url) as channel:
            stream = channel.stream_stream(STREAM, pb.ModelInferRequest.SerializeToString,
                                           pb.ModelStreamInferResponse.FromString)
            call = stream()
            await call.write(big)
            first = await call.read()
            await call.write(affine(2, request_id="fine"))
            second = await call.read()
            await call.done_writing()
            return first, second
    first, second = asyncio.run(scenario())
    assert first.infer_response.id == "too-big" and "max_request_bytes" in first.error_message
    assert second.infer_response.id == "fine" and not second.error_message
    assert in_use(guarded) == 0
