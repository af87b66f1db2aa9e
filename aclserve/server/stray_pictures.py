"""A JPEG or PNG file sent as the bytes of a tensor that is not an image input: the whole raw
body (Inference-Header-Content-Length: 0), or an input's binary data (HTTP's binary extension,
gRPC's raw_input_contents). It was taken as the tensor's bytes when its size fitted the input (a
PNG padded to a UINT8 [-1, 10, 12, 3] input's 360 bytes answered 200, its bytes read as
pixels), and at any other size refused without saying what it was (an independent tester).
Known by images.header.picture_file, whose rule no tensor's bytes meet by chance. Pure functions."""
from __future__ import annotations

from ..errors import InvalidInput
from ..images.header import PNG_SIGNATURE, picture_file
from ..runtime.types import TensorSpec

# what an input that is not an image input is told when pictures are sent to it
IMAGE_INPUT_HINT = "declare it an image input in the model's YAML to send images"
# the first byte of a PNG or a JPEG: the only bytes a tensor is looked at further for
_FIRST_BYTES = (PNG_SIGNATURE[0], 0xFF)


def refuse_picture(name: str, data, spec: TensorSpec, what: str = "its binary data", offset: int = 0) -> None:
    """Raise InvalidInput when `data` (from `offset`) is a JPEG or PNG file: input `name` (`spec`,
    not an image input: its datatype is not BYTES) takes tensor bytes."""
    if len(data) <= offset or data[offset] not in _FIRST_BYTES:
        return
    kind = picture_file(memoryview(data)[offset:])
    if kind is not None:
        raise InvalidInput(f"input '{name}': {what} is a {kind} file, not {spec.datatype} {list(spec.shape)} tensor "
                           f"data (it is not an image input: {IMAGE_INPUT_HINT})")
