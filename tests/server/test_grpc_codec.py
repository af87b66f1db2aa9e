"""The gRPC request codec alone (server/grpc_codec.py): what a ModelInferRequest may mix."""
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.errors import InvalidInput
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec
from aclserve.server.bytes_codec import MAX_QUOTED_DIMS
from aclserve.server.grpc_codec import UNPARSED_VARINTS, decode_infer_request, refuse_unparsed
from aclserve.server.grpc_wire import scan

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


OVER = UNPARSED_VARINTS + 1
LONG = [1] * (MAX_QUOTED_DIMS + 1)
WIDE = codec.Signature([TensorSpec("img", "BYTES", np.dtype(object), (-1,)), spec("x", "FP32", [-1, 2]),
                        spec("idx", "INT64", [-1, -1])], [spec("y", "FP32", [-1, 2])], 8)


def typed(*inputs, raw: bool = False) -> pb.ModelInferRequest:
    """A request of `inputs`, each (name, datatype, shape, contents field, elements)."""
    msg = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, field, elements in inputs:
        tensor = msg.inputs.add(name=name, datatype=datatype, shape=shape)
        if field:
            getattr(tensor.contents, field).extend([1] * elements)
    if raw:
        msg.raw_input_contents.extend([b"\0" * 8] * len(inputs))
    return msg


OVER_BOUND = {
    "long shape": typed(("x", "FP32", LONG, "", 0), raw=True),
    "long shape, second input": typed(("x", "FP32", [1, 2], "fp32_contents", 2), ("idx", "INT64", [1] * 1000, "", 0)),
    "long shape, unknown input": typed(("z", "FP32", [1] * 1000, "", 0)),
    "long shape, input twice": typed(("x", "FP32", [1, 2], "fp32_contents", 2), ("x", "FP32", LONG, "", 0)),
    "too many contents": typed(("idx", "INT64", [1, 3], "int64_contents", OVER)),
    "too few for their shape": typed(("idx", "INT64", [1, OVER + 1], "int64_contents", OVER)),
    "another datatype": typed(("idx", "INT32", [1, OVER], "int_contents", OVER)),
    "no datatype": typed(("idx", "", [1, OVER], "int64_contents", OVER)),
    "another rank": typed(("idx", "INT64", [1, 1, OVER], "int64_contents", OVER)),
    "negative dimension": typed(("idx", "INT64", [-1, OVER], "int64_contents", OVER)),
    "too many rows": typed(("idx", "INT64", [9, 2000], "int64_contents", OVER)),
    "another field": typed(("x", "FP32", [1, 2], "int_contents", OVER)),
    "a picture's": typed(("img", "BYTES", [1], "bool_contents", OVER)),
    "beside raw contents": typed(("idx", "INT64", [1, OVER], "int64_contents", OVER), raw=True),
}


@pytest.mark.parametrize("case", sorted(OVER_BOUND))
def test_an_input_of_more_packed_values_than_decoding_takes_is_refused_unparsed_as_decoding_refuses_it(case):
    """refuse_unparsed reads the scan's counts, before protobuf parses the message (8 MB of
    either took the parse 0.24 s), and says what decoding the parsed message says."""
    msg = OVER_BOUND[case]
    with pytest.raises(InvalidInput) as decoded:
        decode_infer_request(msg, WIDE)
    with pytest.raises(InvalidInput) as unparsed:
        refuse_unparsed(scan(msg.SerializeToString()), WIDE)
    assert unparsed.value.message == decoded.value.message


def test_inputs_within_what_decoding_takes_are_left_to_it():
    served = typed(("x", "FP32", [1, 2], "fp32_contents", 2), ("idx", "INT64", [1, OVER], "int64_contents", OVER))
    sig = codec.Signature([spec("x", "FP32", [-1, 2]), spec("idx", "INT64", [-1, -1])], [spec("y", "FP32", [-1, 2])], 8)
    refuse_unparsed(scan(served.SerializeToString()), sig)
    assert decode_infer_request(served, sig).inputs["idx"].shape == (1, OVER)
    many_bytes = typed(("idx", "INT64", [1, 3], "int64_contents", 0))
    many_bytes.inputs[0].contents.int64_contents.extend([300] * (OVER - 1))  # 2 bytes each: read in detail
    for within in (typed(("x", "FP32", LONG[1:], "", 0)), typed(("x", "FP32", [300] * MAX_QUOTED_DIMS, "", 0)),
                   typed(("idx", "INT64", [1, 3], "int64_contents", OVER - 1)), many_bytes):
        refuse_unparsed(scan(within.SerializeToString()), WIDE)  # (decoding refuses them)
