"""grpc_wire.scan: what a ModelInferRequest costs to parse, read from its bytes before it is
parsed (raw contents as views of the message, tiny entries charged above upb's cost, what is not
protobuf refused, each input's packed values counted); grpc_wire.names: a refused request's names, cut."""
from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2 as pb

from aclserve.errors import InvalidInput
from aclserve.protobuf_wire import len_field, varint_field
from aclserve.server import grpc_wire
from aclserve.server.grpc_wire import ECHOED_CHARS, MAX_FIELDS, MAX_PARAMETERS, names, scan

from .grpc_raw import affine


def test_scan_views_raw_contents_and_bounds_parsing():
    request = affine(2, request_id="r1")
    request.outputs.add(name="y")
    message = request.SerializeToString()
    layout = scan(message)
    assert [bytes(v) for v in layout.raw_contents] == list(request.raw_input_contents)
    assert all(v.obj is message for v in layout.raw_contents)  # views of the message, no copies
    assert layout.cost < 4096  # a raw request costs little more than itself to parse
    assert names(message) == ("affine", "", "r1")
    assert scan(message).model == "affine"  # its charge is that model's (its share: budget.py)
    assert scan(message + len_field(1, b"m" * 1000)).model == "m" * 1000  # the last, whole: looked up as parsed
    assert scan(pb.ModelInferRequest(id="r1").SerializeToString()).model == ""
    for not_utf8 in (b"\xff", b"a\xed\xa0\x80", b"\xc0\x80"):  # (a surrogate, an overlong NUL: upb refuses them)
        # refused uncharged, as protobuf refuses it (grpc_intake.parse)
        assert scan(message + len_field(2, not_utf8)).version is None
    typed = affine(2, typed=True).SerializeToString()
    assert scan(typed).raw_contents == [] and scan(typed).cost > 32 * 6  # varints: 32 per byte


@pytest.mark.parametrize("shape", [b"\x2a\x00", b"\x32\x00", b"\x3a\x00", b"\x22\x00"],
                         ids=["empty inputs", "empty outputs", "empty raw entries", "empty parameters"])
def test_scan_charges_messages_of_tiny_entries_more_than_parsing_takes(shape):
    """upb takes up to 44x such a message's size to parse it (measured: 8 MiB of empty inputs
    entries, 353 MiB): the scan's bound must be above that."""
    message = shape * MAX_PARAMETERS  # 32 KB: parameters at their bound, every kind within MAX_FIELDS
    assert scan(message).cost >= 44 * len(message)
    small = shape * 100
    assert scan(small).cost >= 44 * len(small)


ENTRY = b"\x0a\x01k\x12\x02\x08\x01"  # a parameters entry: key "k", bool_param true


@pytest.mark.parametrize("where", ["request", "input", "output", "over-long tags"])
def test_scan_refuses_more_parameters_entries_than_the_bound_and_stops_walking_there(where):
    """Entries of every map count, the request's, its inputs' and its outputs' together; the walk
    stops at the first entry over the bound (what follows, here no protobuf, is not read)."""
    tag = {"request": b"\x22", "input": b"\x22", "output": b"\x12", "over-long tags": b"\xa2\x00"}[where]
    entries = (tag + bytes([len(ENTRY)]) + ENTRY) * MAX_PARAMETERS
    if where in ("input", "output"):  # one input or output of them all, beside an entry of the request's
        entries = b"\x22\x00" + len_field(5 if where == "input" else 6, entries[:-len(tag + ENTRY) - 1])
    assert pb.ModelInferRequest.FromString(entries)  # (well formed)
    assert scan(entries).cost > 0
    with pytest.raises(InvalidInput, match=f"more than {MAX_PARAMETERS:,} parameters entries"):
        scan(entries + b"\x22\x00" + b"\x0b")


FIELDS_OVER = f"more than {MAX_FIELDS:,} protobuf fields"


@pytest.mark.parametrize("field", [b"\x1a\x00", b"\x2a\x00", b"\x42\x00", b"\x35\x00\x00\x80\x3f"],
                         ids=["ids", "empty inputs", "empty bytes_contents", "unpacked fp32_contents"])
def test_scan_refuses_a_message_of_more_fields_than_it_walks_and_reads_no_further(field):
    """Fields are counted nested ones included (here `field` repeated in the request, or in an
    input's contents, where it belongs): MAX_FIELDS are walked, one more is refused and what
    follows it (here no protobuf) is not read. Such a message's parse was what bounded a gRPC
    client's stall: 1-2 million tiny fields took protobuf 105-126 ms."""
    def message(count: int) -> bytes:
        if field in (b"\x1a\x00", b"\x2a\x00"):  # the request's own
            return field * count
        return len_field(5, len_field(5, field * (count - 2)))  # an input's contents' (2 fields before)
    assert pb.ModelInferRequest.FromString(message(MAX_FIELDS + 1))  # (well formed)
    assert scan(message(MAX_FIELDS)).cost > 0
    with pytest.raises(InvalidInput, match=FIELDS_OVER) as refused:
        scan(message(MAX_FIELDS + 1) + b"\x0b")
    assert "send tensors in raw_input_contents" in str(refused.value)


def test_scan_refuses_what_is_not_protobuf_and_caps_its_walk():
    for bad in (b"\x0a\x05ab", b"\x0b", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x00\x00"):
        with pytest.raises(InvalidInput, match="not a valid ModelInferRequest"):
            scan(bad)
    assert names(b"\x0a\x05ab") == ("", "", "")
    many = b"\x0a\x01m" + b"\x1a\x00" * MAX_FIELDS  # one name, then ids: too many fields to walk
    with pytest.raises(InvalidInput, match=FIELDS_OVER):
        scan(many)
    assert names(many)[0] == "m"  # (its refusal names it)


def test_names_are_read_cut_at_their_first_characters():
    """A refused request's answer echoes its names: the first ECHOED_CHARS characters of each,
    read from that many bytes at most (4 a character), not copied whole (a stream held 64 answers
    of 3.5 MB names). A character cut at the bytes' end, or bytes that are not UTF-8, do not
    change the characters kept."""
    wide = "a" + "\U0001f600" * 300_000  # 4 bytes each after the first: the 1,024th byte cuts one
    request = pb.ModelInferRequest(model_name="m" * 1000, model_version="7" * 1000, id=wide)
    model, version, ident = names(request.SerializeToString())
    assert (model, version, ident) == ("m" * ECHOED_CHARS, "7" * ECHOED_CHARS, wide[:ECHOED_CHARS])
    short = pb.ModelInferRequest(model_name="é" * ECHOED_CHARS, id="r1").SerializeToString()
    assert names(short) == ("é" * ECHOED_CHARS, "", "r1")
    assert names(b"\x1a\x03\xffab") == ("", "", "\ufffdab")  # an id that is not UTF-8, as before


def test_names_are_decoded_once_each_however_often_they_repeat(monkeypatch):
    """The last of each is the name, as protobuf reads it, and only it is decoded: a refused
    message's names are read on the event loop (twice on a stream), and decoding each of 17,408
    repeated ids took 35 ms, twice the walk's time."""
    decoded = []
    first_chars = grpc_wire._first_chars
    monkeypatch.setattr(grpc_wire, "_first_chars", lambda utf8, limit: decoded.append(bytes(utf8)) or
                        first_chars(utf8, limit))
    message = b"\x0a\x01m" + b"".join(b"\x1a\x02%02d" % (k % 100) for k in range(MAX_FIELDS - 1))
    assert names(message) == ("m", "", "%02d" % ((MAX_FIELDS - 2) % 100))
    assert decoded == [b"m", b"%02d" % ((MAX_FIELDS - 2) % 100)]


def test_scan_bounds_each_inputs_packed_values_and_reads_them_in_detail_when_asked():
    """The walk bounds an input's shape dimensions and contents varints by their bytes (a value
    takes one at least: nothing is counted on the way of every request); Layout.inputs then counts
    them by their last bytes, not decoded (8 MB of shape values took the parse 0.24 s, to be
    refused after), every occurrence, packed or not, as protobuf joins them; the name and
    datatype are the last ones given."""
    contents = (len_field(3, b"\x01\xac\x02") + varint_field(3, 7)  # int64_contents: 1, 300 packed, 7 alone
                + len_field(6, b"\0" * 12) + b"\x35\x00\x00\x80\x3f"  # fp32_contents: 3 packed, 1 alone
                + len_field(8, b"a") + len_field(8, b""))  # bytes_contents: 2
    tensor = (len_field(1, b"a") + len_field(1, b"idx") + len_field(2, b"INT64") + len_field(3, b"\x02")
              + varint_field(3, 1 << 40) + len_field(3, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x03")
              + len_field(5, contents))
    message = len_field(5, tensor) + len_field(5, b"") + len_field(5, len_field(1, b"third"))
    parsed = pb.ModelInferRequest.FromString(message).inputs[0]
    layout = scan(message)
    assert (layout.most_dims, layout.most_varints) == (1 + 1 + 11, 3 + 1)  # bytes packed, fields alone
    first, empty = layout.inputs(2)
    assert (bytes(first.name), bytes(first.datatype)) == (b"idx", b"INT64") == (parsed.name.encode(), b"INT64")
    assert first.dims == len(parsed.shape) == 4 and first.shape() == list(parsed.shape) == [2, 1 << 40, -1, 3]
    assert first.contents == {3: 3, 6: 4, 8: 2} and first.varints == 3 and first.has_contents
    assert (len(parsed.contents.int64_contents), len(parsed.contents.fp32_contents)) == (3, 4)
    assert (empty.name, empty.dims, empty.contents, empty.has_contents) == (None, 0, {}, False)
    many = len_field(5, len_field(3, b"\x01" * 5_000_000)) + len_field(5, len_field(5, len_field(2, b"\x81\x01" * 9)))
    long, short = scan(many).inputs(2)
    assert (scan(many).most_dims, long.dims, scan(many).most_varints, short.varints) == (5_000_000, 5_000_000, 18, 9)


@pytest.mark.parametrize("field", [3, 5], ids=["shape", "contents"])
def test_packed_varints_whose_last_is_cut_are_refused_when_read(field):
    """As protobuf refuses them once parsed: before, all the others were parsed first."""
    values = len_field(field, b"\x01" * 1000 + b"\x81")
    message = len_field(5, values if field == 3 else len_field(5, values))
    layout = scan(message)
    with pytest.raises(InvalidInput, match="not a valid ModelInferRequest: a varint is truncated"):
        layout.inputs(1)
    with pytest.raises(Exception, match="Error parsing"):
        pb.ModelInferRequest.FromString(message)
