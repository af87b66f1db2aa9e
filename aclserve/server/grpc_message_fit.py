"""Whether a model's largest request fits in one gRPC message, said once as it loads.

grpc refuses a message over `grpc_max_message_bytes` itself, RESOURCE_EXHAUSTED "Received message
larger than max", before the server reads a byte of it (grpc_refusals.py: nothing counts it). A
model whose max_batch_size rows take more than that (an input [N, 65536] FP32 at 32 rows: 8 MiB
and the framing, over the 8 MiB default) was served without a word, and its gRPC clients learnt
the limit from that refusal. So each version that loads with gRPC on is measured against it, and
one whose largest batch does not fit is a WARNING line naming the rows that do and the setting.

The size counted is the least a client sends: a ModelInferRequest naming the model and each
input (name, datatype, shape) with one raw_input_contents entry per input (tritonclient's way;
typed contents take more), a dimension the model leaves open counted as 1 and a BYTES input's
elements (encoded pictures, strings) as none; so a line is never said of a model that fits.
"""
from __future__ import annotations

import logging
import math

from tritonclient.grpc import service_pb2 as pb

from ..protobuf_wire import encode_varint

log = logging.getLogger(__name__)


def request_bytes(model: str, inputs, rows: int | None) -> int:
    """The least a ModelInferRequest of `rows` rows (None: a static model's whole tensors) takes."""
    msg = pb.ModelInferRequest(model_name=model)
    entries = 0
    for spec in inputs:
        dims = [max(d, 1) for d in spec.shape]
        if rows is not None and spec.batched:
            dims[0] = rows
        msg.inputs.add(name=spec.name, datatype=spec.datatype, shape=dims)
        nbytes = 0 if spec.datatype == "BYTES" else math.prod(dims) * spec.dtype.itemsize
        entries += 1 + len(encode_varint(nbytes)) + nbytes  # raw_input_contents' tag (7), length, bytes
    return msg.ByteSize() + entries


def rows_that_fit(model: str, inputs, max_rows: int, limit: int) -> int:
    """The most rows, up to `max_rows`, whose request takes at most `limit` bytes (0: none fits)."""
    low, high = 0, max_rows  # (request_bytes grows with the rows: a bisection)
    while low < high:
        middle = (low + high + 1) // 2
        if request_bytes(model, inputs, middle) <= limit:
            low = middle
        else:
            high = middle - 1
    return low


def fit_warning(served, limit: int) -> str | None:
    """What to say of a served version (server.contracts.ServedModel) whose largest request is
    over `limit` bytes (grpc_max_message_bytes), or None when it fits."""
    name, max_rows = served.name, served.max_batch_size
    need = request_bytes(name, served.inputs, max_rows or None)
    if need <= limit:
        return None
    over = f"over grpc_max_message_bytes ({limit:,}), which grpc refuses RESOURCE_EXHAUSTED before the server sees it"
    if not max_rows:
        return (f"{name}: version {served.version}: no gRPC request of it fits in one message: its inputs take "
                f"{need:,} bytes or more, {over}; raise grpc_max_message_bytes to serve it over gRPC")
    fits = rows_that_fit(name, served.inputs, max_rows, limit)
    return (f"{name}: version {served.version}: gRPC requests of it fit in one message up to {fits} rows, not its "
            f"max_batch_size of {max_rows}: {max_rows} rows take {need:,} bytes or more, {over}; raise "
            f"grpc_max_message_bytes for its largest batch over gRPC")


class MessageFit:
    """A repository listener (ModelRepository.add_listener) of the gRPC endpoint, which adds it
    when it is built (grpc_server.py): one WARNING line for each loaded version whose largest
    request does not fit in one message, said again only when a reload changes what it says.
    Loop thread only."""

    def __init__(self, limit: int):
        self.limit = limit
        self._said: dict[tuple[str, str], str] = {}  # (model, version) -> its line

    def on_repository_event(self, event: str, name: str, version=None, **info) -> None:
        key = (name, str(version))
        if event in ("loaded", "reloaded"):
            line = fit_warning(info["served"], self.limit)
            if line is None:
                self._said.pop(key, None)
            elif self._said.get(key) != line:
                self._said[key] = line
                log.warning("%s", line)
        elif event == "unloaded":
            self._said.pop(key, None)
