"""What parsing a ModelInferRequest will cost, read from its wire bytes before protobuf parses them.

Parsing is where a gRPC request can take far more memory than it was sent. upb (protobuf 6)
keeps strings and bytes as views of the message, which costs nothing, but gives every repeated
entry an object of its own and every packed varint an 8-byte slot: 8 MiB of empty `inputs`
entries took 353 MiB once parsed (44x), 8 MiB of 1-byte shape values 120 MiB (15x); decoding
typed contents adds an array per input. `scan()` walks the fields (tags and lengths only: tensor
bytes are skipped, never read) and returns an upper bound of what parsing and decoding will
hold beyond the message itself, so the request is charged for it before it is parsed
(grpc_intake.py), as a JSON body is charged before orjson builds its objects.

It also returns the raw_input_contents entries as views of the message: tensors decoded from
them copy nothing, where the parsed message hands out a new bytes object (a copy) per entry.

And it bounds what protobuf's parse, on the event loop, may take before it parses: a message
of more than MAX_FIELDS fields is refused, as the JSON side refuses a text of too many keys (a
message of tiny fields was charged per byte and parsed: 1-2 million in 4.1 MB took 105-126 ms of
CPU), and so is one of more than MAX_PARAMETERS `parameters` entries (the request's, each input's
and each requested output's maps together: a map of 344,000 took 136-161 ms, 16,384 take 3-4).
A packed field is one field however many values it holds, so the scan also bounds each input's
shape dimensions and typed contents varints by their bytes (a value takes one at least): an
input that may hold more than decoding takes is read in detail, its values counted by their
last bytes, none decoded, and refused before the parse if it does (grpc_codec.refuse_unparsed;
Layout.inputs), where 8 MB of 1-byte shape values took the parse 0.24 s.

Pure functions over bytes (no grpc, no protobuf: protobuf_wire.py walks the wire format); field
numbers are grpc_service.proto's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import protobuf_wire
from ..errors import InvalidInput
from ..protobuf_wire import FIXED32, FIXED64, LEN, VARINT, WireError
from .json_limits import MAX_JSON_KEYS
from .request_ids import MAX_REQUEST_ID

# Bytes charged, set from the measurements above with headroom:
ENTRY_BYTES = 128  # per field walked: its parsed object or slot, and a decoded element
WORST_PER_BYTE = 64  # per byte of a part charged whole (parameters, outputs, unknown fields); worst seen 44
VARINT_PER_BYTE = 32  # packed varints: up to one element per byte, parsed (16) then decoded (16)
FIXED_PER_BYTE = 3  # packed floats: parsed, decoded (np.fromiter), maybe cast
# `parameters` entries one request may hold, all its maps together, as a JSON request may hold
# MAX_JSON_KEYS keys in all its objects: what HTTP takes, gRPC takes
MAX_PARAMETERS = MAX_JSON_KEYS
# fields a request may hold, nested ones included, each walked (about 1 us: 17-28 ms at most); a
# message of more is refused, what follows them not read. A request needs a few an input and an
# output, one a parameters entry (MAX_PARAMETERS at most) and one an image in bytes_contents (at
# most images.max_pending, 256 by default); typed contents one an input, their values packed as
# encoders do by default (one a value where they are not)
MAX_FIELDS = MAX_PARAMETERS + 1_024
# characters of model_name, model_version and id a refused request's answer echoes: an id is cut
# as the request log cuts it; no model's name is longer than 128, no version's than 18 digits
ECHOED_CHARS = MAX_REQUEST_ID

# ModelInferRequest: 1 model_name, 2 model_version, 3 id, 4 parameters, 5 inputs, 6 outputs,
# 7 raw_input_contents. InferInputTensor: 1 name, 2 datatype, 3 shape, 4 parameters, 5 contents.
# InferRequestedOutputTensor: 1 name, 2 parameters.
# InferTensorContents: 1-5 bool/int/int64/uint/uint64 (varints), 6-7 fp32/fp64, 8 bytes.
_NAMES, _PARAMETERS, _INPUTS, _OUTPUTS, _RAW = (1, 2, 3), 4, 5, 6, 7
_MODEL_NAME, _MODEL_VERSION = 1, 2
_INPUT_NAME, _INPUT_DATATYPE, _INPUT_SHAPE, _INPUT_PARAMETERS, _INPUT_CONTENTS = 1, 2, 3, 4, 5
_INPUT_STRINGS = (_INPUT_NAME, _INPUT_DATATYPE)
_OUTPUT_PARAMETERS = 2
_VARINTS, _FIXED, _BYTES = (1, 2, 3, 4, 5), (6, 7), 8
# a contents field's elements: (the wire type of one not packed, bytes of one packed; 0: a varint each)
_ELEMENT_WIRES = {**{number: (VARINT, 0) for number in _VARINTS}, 6: (FIXED32, 4), 7: (FIXED64, 8)}


class InputLayout:
    """One `inputs` entry read from the wire, nothing decoded: its name's and datatype's bytes
    (the last ones, as protobuf keeps them; None: none given), how many shape dimensions it has
    (`dims`), and how many elements each typed `contents` field holds (field number ->
    elements, in `contents`; `varints`: of the varint fields together), all occurrences counted,
    packed or not, as protobuf joins them."""

    __slots__ = ("_buf", "name", "datatype", "dims", "shape_at", "contents", "varints", "has_contents")

    def __init__(self, buf: memoryview):
        self._buf = buf
        self.name: memoryview | None = None
        self.datatype: memoryview | None = None
        self.dims = 0
        self.shape_at: list[tuple[int, int, int]] = []  # (wire type, start, stop) of each shape field
        self.contents: dict[int, int] = {}
        self.varints = 0
        self.has_contents = False  # a contents field, even an empty one (protobuf's HasField)

    def add_contents(self, number: int, elements: int) -> None:
        if elements:
            self.contents[number] = self.contents.get(number, 0) + elements
            if number in _VARINTS:
                self.varints += elements

    def shape(self) -> list[int]:
        """Its dimensions decoded, int64 as protobuf reads them: read `dims` first (a shape of
        millions is not to be decoded in Python)."""
        buf, values = self._buf, []
        for wire, pos, end in self.shape_at:
            while pos < end:
                value, pos = protobuf_wire.varint(buf, pos, end)
                values.append(value - (1 << 64) if value >= 1 << 63 else value)
                if wire == VARINT:
                    break
        return values


@dataclass(frozen=True)
class Layout:
    """`cost`: bytes parsing and decoding may hold beyond the message. `raw_contents`: the
    raw_input_contents entries, in order, as views of the message. `typed`: an input has typed
    `contents` (a refusal's advice then is raw_input_contents). `model`, `version`: its model_name and
    model_version whole ("" when it has none), None when not UTF-8, which protobuf refuses: looked up
    before anything is charged, as parsed (a name's length is in its NOT_FOUND), and the model its
    memory is charged to when the repository serves it (grpc_intake.py). The last occurrence of each,
    as protobuf keeps it: an earlier one that is not UTF-8 is refused once parsed, or by the lookup
    of the last one's name first (NOT_FOUND, not INVALID_ARGUMENT), uncharged either way."""

    cost: int
    raw_contents: list[memoryview]
    typed: bool = False
    model: str | None = ""
    version: str | None = ""
    # at most this many shape dimensions, typed contents varints in an input (a packed one takes a
    # byte at least): an input over what decoding takes is looked at in detail (`inputs`)
    most_dims: int = 0
    most_varints: int = 0
    message: memoryview = memoryview(b"")  # (what `inputs` reads)

    def inputs(self, count: int) -> list[InputLayout]:
        """The first `count` inputs in detail (as decoding reads them, a few), found by a walk of
        the message again: the scan notes no input's place (a note each took a fifth of its time).
        InvalidInput when a packed varint in them is cut, which protobuf refuses too."""
        walker, found = _Walker(self.message), []
        for number, wire, start, stop in walker.fields(0, len(self.message)):
            if len(found) == count:
                break
            if number == _INPUTS and wire == LEN:
                found.append(walker.read_input(start, stop))
        return found


def scan(message: bytes) -> Layout:
    """InvalidInput when `message` is not protobuf wire data (truncated, bad wire type), or holds
    more than MAX_FIELDS fields or more than MAX_PARAMETERS parameters entries."""
    walker = _Walker(memoryview(message))
    cost, raw = walker.request()
    model, version = (whole(utf8) for utf8 in walker.names)
    return Layout(cost, raw, walker.typed, model, version, walker.most_dims, walker.most_varints, walker.buf)


def whole(utf8: memoryview | None) -> str | None:
    """A string's bytes decoded ("" for none), None when they are not UTF-8: Python's decoder
    refuses what protobuf's (upb) does, surrogates and overlong forms too. Whole, as protobuf would
    decode it (an 8 MiB name: 5 ms, as parsing its message took)."""
    if utf8 is None:
        return ""
    try:
        return str(utf8, "utf-8")
    except UnicodeDecodeError:
        return None


def _too_many_parameters() -> InvalidInput:
    return InvalidInput(f"request message holds more than {MAX_PARAMETERS:,} parameters entries (the request's, "
                        f"its inputs' and its outputs' maps together); a request needs a few")


def _too_many_fields() -> InvalidInput:
    return InvalidInput(f"request message holds more than {MAX_FIELDS:,} protobuf fields (nested ones included); a "
                        f"request needs a few per input and output, one per parameters entry and one per image in "
                        f"bytes_contents (typed contents: one per input, unless the encoder does not pack their "
                        f"values): send tensors in raw_input_contents")


def names(message: bytes) -> tuple[str, str, str]:
    """(model_name, model_version, id) as far as they can be read, each cut at ECHOED_CHARS
    characters: a refused request's stream error names its request with them. Cut, because a
    stream holds up to 64 answers: each echoed a 3.5 MB model_name and id whole, uncharged
    (a tester's 4 streams that read nothing took the server from 115 MB to 1.9 GB). Empty
    strings where the message does not say."""
    found = {}
    buf = memoryview(message)
    try:
        for number, wire, start, stop in _Walker(buf).fields(0, len(buf)):
            if number in _NAMES and wire == LEN:
                found[number] = buf[start:stop]  # the last one is the name, as protobuf reads it
    except InvalidInput:  # not protobuf past some point, or more than MAX_FIELDS fields: what was read
        pass
    # decoded once each, not at every repeat: 17,408 ids took 35 ms to read, where the walk takes 17
    return tuple(_first_chars(found[number], ECHOED_CHARS) if number in found else "" for number in _NAMES)


def _first_chars(utf8: memoryview, limit: int) -> str:
    """The first `limit` characters of `utf8` (bytes that are not UTF-8 replaced), decoding only
    the bytes they can take (4 a character at most), not a long text to cut it."""
    return str(utf8[:4 * limit], "utf-8", "replace")[:limit]


class _Walker:
    __slots__ = ("buf", "walked", "parameters", "typed", "names", "most_dims", "most_varints")

    def __init__(self, buf: memoryview):
        self.buf = buf
        self.walked = 0
        self.parameters = 0  # parameters entries walked, all maps together
        self.typed = False  # an input has a contents field, not empty
        self.names: list[memoryview | None] = [None, None]  # model_name's, model_version's bytes: the last ones,
        # as protobuf reads them
        self.most_dims = self.most_varints = 0  # bounds, of the input that may hold most

    def request(self) -> tuple[int, list[memoryview]]:
        cost, raw = 0, []
        for number, wire, start, stop in self.fields(0, len(self.buf), _PARAMETERS):
            cost += ENTRY_BYTES
            if wire != LEN or number in _NAMES:
                if number in (_MODEL_NAME, _MODEL_VERSION) and wire == LEN:
                    self.names[number - _MODEL_NAME] = self.buf[start:stop]
                continue
            if number == _RAW:
                raw.append(self.buf[start:stop])
            elif number == _INPUTS:
                cost += self._input(start, stop)
            else:  # parameters entries, outputs (walked only to count their entries), unknown fields
                if number == _OUTPUTS:
                    self._output(start, stop)
                cost += WORST_PER_BYTE * (stop - start)
        return cost, raw

    def _output(self, pos: int, end: int) -> None:
        for _ in self.fields(pos, end, _OUTPUT_PARAMETERS):
            pass

    def _input(self, pos: int, end: int) -> int:
        cost = dims = varints = 0  # dims, varints: at most (a byte a packed value), not counted here
        for number, wire, start, stop in self.fields(pos, end, _INPUT_PARAMETERS):
            cost += ENTRY_BYTES
            if number == _INPUT_SHAPE:
                dims += stop - start if wire == LEN else 1
            if wire != LEN or number in _INPUT_STRINGS:  # (views of the message once parsed: they cost nothing)
                continue
            if number == _INPUT_SHAPE:
                cost += VARINT_PER_BYTE * (stop - start)
            elif number == _INPUT_CONTENTS:
                self.typed = self.typed or stop > start
                contents_cost, contents_varints = self._contents(start, stop)
                cost += contents_cost
                varints += contents_varints
            else:
                cost += WORST_PER_BYTE * (stop - start)
        if dims > self.most_dims:
            self.most_dims = dims
        if varints > self.most_varints:
            self.most_varints = varints
        return cost

    def _contents(self, pos: int, end: int) -> tuple[int, int]:
        """(cost, varints at most) of an input's contents."""
        cost = varints = 0
        for number, wire, start, stop in self.fields(pos, end):
            cost += ENTRY_BYTES
            if number in _VARINTS:
                varints += stop - start if wire == LEN else 1
            if wire != LEN:
                continue
            size = stop - start
            if number in _VARINTS:
                cost += VARINT_PER_BYTE * size
            elif number in _FIXED:
                cost += FIXED_PER_BYTE * size
            elif number == _BYTES:
                cost += size  # decoding makes each element a bytes object of its own
            else:
                cost += WORST_PER_BYTE * size
        return cost, varints

    def read_input(self, pos: int, end: int) -> InputLayout:
        """The input whose fields are buf[pos:end], in detail (walked before: within the bounds)."""
        tensor = InputLayout(self.buf)
        for number, wire, start, stop in self.fields(pos, end):
            if number == _INPUT_SHAPE and wire in (VARINT, LEN):  # (another wire type: a field protobuf does not know)
                tensor.dims += 1 if wire == VARINT else self._varints(start, stop)
                tensor.shape_at.append((wire, start, stop))
            elif wire != LEN:
                continue
            elif number == _INPUT_NAME:
                tensor.name = self.buf[start:stop]
            elif number == _INPUT_DATATYPE:
                tensor.datatype = self.buf[start:stop]
            elif number == _INPUT_CONTENTS:
                tensor.has_contents = True
                for field in self.fields(start, stop):
                    tensor.add_contents(field[0], self._elements(*field))
        return tensor

    def _elements(self, number: int, wire: int, start: int, stop: int) -> int:
        """Elements a field of typed contents holds: one not packed (bytes_contents: each a field
        of its own), packed ones; none in a field of another wire type (unknown to protobuf)."""
        one, width = _ELEMENT_WIRES.get(number, (LEN if number == _BYTES else None, 0))
        if wire == one:
            return 1
        if wire == LEN and number in _ELEMENT_WIRES:
            return (stop - start) // width if width else self._varints(start, stop)
        return 0

    def _varints(self, start: int, stop: int) -> int:
        """How many varints buf[start:stop] packs: one ends at each byte under 0x80, counted by
        numpy (8 MB in 3-9 ms, where protobuf took 0.24-0.77 s to parse them). Refused when its
        last one is cut, as protobuf refuses it once parsed."""
        if stop > start and self.buf[stop - 1] >= 0x80:
            raise _malformed("a varint is truncated or longer than 10 bytes")
        return int(np.count_nonzero(np.frombuffer(self.buf[start:stop], np.uint8) < 0x80))

    def fields(self, pos: int, end: int, parameters: int | None = None):
        """(number, wire type, start, stop) of each field in buf[pos:end]; for a length-delimited
        field start:stop is its payload. Fields numbered `parameters` (length-delimited: a map's
        entries) count against MAX_PARAMETERS too."""
        try:
            for number, wire, _, start, stop in protobuf_wire.fields(self.buf, pos, end):
                self.walked += 1
                if self.walked > MAX_FIELDS:
                    raise _too_many_fields()
                if number == parameters and wire == LEN:
                    self.parameters += 1
                    if self.parameters > MAX_PARAMETERS:
                        raise _too_many_parameters()
                yield number, wire, start, stop
        except WireError as e:
            raise _malformed(str(e)) from None


def _malformed(detail: str) -> InvalidInput:
    return InvalidInput(f"request message is not a valid ModelInferRequest: {detail}")
