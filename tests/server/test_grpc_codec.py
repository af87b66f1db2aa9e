"""The gRPC request codec alone (server/grpc_codec.py): what a ModelInferRequest may mix."""
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.errors import InvalidInput
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec
from aclserve.server.grpc_codec import decode_infer_request

from .test_codec import spec

SIG = codec.Signature([TensorSpec("img", "BYTES", np.dtype(object), (-1,)), spec("x", "FP32", [-1, 2])],
                      [spec("y", "FP32", [-1, 2])], 8)


def request(img_contents: bool, x_contents: bool) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    img = msg.inputs.add(name="img", datatype="BYTES", shape=[1])
    x = msg.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    msg.raw_input_contents.extend([len(b"abc").to_bytes(4, "little") + b"abc", np.ones(2, np.float32).tobytes()])
    if img_contents:
        img.contents.bytes_contents.append(b"abc")
    if x_contents:
        x.contents.fp32_contents.extend([1.0, 1.0])
    return msg


def test_raw_contents_alone_are_read():
    req = decode_infer_request(request(False, False), SIG)
    assert list(req.inputs["img"]) == [b"abc"] and req.inputs["x"].tolist() == [[1.0, 1.0]]


@pytest.mark.parametrize("img_contents, x_contents", [(True, False), (False, True)])
def test_contents_beside_raw_input_contents_are_refused_for_every_input(img_contents, x_contents):
    with pytest.raises(InvalidInput, match="has contents but the request uses raw_input_contents"):
        decode_infer_request(request(img_contents, x_contents), SIG)


def test_shared_memory_is_refused_for_a_bytes_input_too():
    msg = request(False, False)
    msg.inputs[0].parameters["shared_memory_region"].string_param = "r"
    with pytest.raises(InvalidInput, match="shared memory"):
        decode_infer_request(msg, SIG)


def test_raw_bools_are_the_bytes_0_and_1():
    sig = codec.Signature([spec("m", "BOOL", [-1, 2])], [spec("o", "BOOL", [-1, 2])], 8)
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="m", datatype="BOOL", shape=[1, 2])
    msg.raw_input_contents.append(b"\x01\x00")
    assert decode_infer_request(msg, sig).inputs["m"].tolist() == [[True, False]]
    msg.raw_input_contents[0] = b"\x01\x02"
    with pytest.raises(InvalidInput, match="input 'm': BOOL elements must be the bytes 0 or 1"):
        decode_infer_request(msg, sig)
