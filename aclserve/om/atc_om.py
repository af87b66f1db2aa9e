"""Recognise OM files built by Huawei's ATC and identify any file.

The layout is GraphEngine's ModelFileHeader (hicann/ge, `framework_types_internal.h` and
`om_file_helper.cc`; the 2020 layout in mindspore-ai/graphengine `inc/framework/common/types.h`).

Only bytes 0-155 of the 256-byte ModelFileHeader are stable across GE releases; later fields
(platform_version, dynamic flag) moved, so they are read from the current layout and
reported as such.
"""
from __future__ import annotations

import os
import shlex
import struct
from dataclasses import asdict, dataclass

from ..regular_files import open_regular
from . import container

ATC_MAGIC = b"IMOD"  # 0x444F4D49 little-endian ("DOMI" in GE's code)
OM2_MAGIC = b"PK\x03\x04"
HEADER_SIZE = 256
MODEL_TYPES = {0: "IR", 1: "standard", 2: "OM-tiny", 3: "flow", 4: "lite", 5: "bundle"}


@dataclass
class AtcOmHeader:
    name: str
    version: int
    length: int
    model_length: int
    is_encrypt: bool
    is_checksum: bool
    model_type: str
    gen_mode: str
    ops: int
    om_ir_version: int
    platform_version: str
    is_dynamic: bool
    consistent_length: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_atc_header(head: bytes, file_size: int) -> AtcOmHeader | None:
    """Parse a 256-byte ATC header; None unless magic and headsize match."""
    if len(head) < HEADER_SIZE or head[:4] != ATC_MAGIC:
        return None
    headsize, version = struct.unpack_from("<II", head, 4)
    if headsize != HEADER_SIZE:
        return None
    (length,) = struct.unpack_from("<I", head, 76)
    is_encrypt, is_checksum, model_type, gen_mode = head[80], head[81], head[82], head[83]
    (ops,) = struct.unpack_from("<I", head, 116)
    (om_ir_version,) = struct.unpack_from("<I", head, 152)
    (model_length,) = struct.unpack_from("<Q", head, 184)
    payload = model_length or length
    return AtcOmHeader(
        name=_cstr(head[84:116]),
        version=version,
        length=length,
        model_length=model_length,
        is_encrypt=bool(is_encrypt),
        is_checksum=bool(is_checksum),
        model_type=MODEL_TYPES.get(model_type, f"unknown({model_type})"),
        gen_mode="online" if gen_mode == 1 else "offline",
        ops=ops,
        om_ir_version=om_ir_version,
        platform_version=_cstr(head[160:180]),
        is_dynamic=head[193] == 1,
        consistent_length=payload == file_size - HEADER_SIZE,
    )


class NotAnOm(container.OmFormatError):
    """A file that is no OM of any kind: its message is the whole reason, "not an OM file" or "not
    a loadable OM" included, for a caller to show as it is (the Engine added its own, "not a
    loadable OM: not an OM file ...": i221, i230)."""


class TooShortForOm(NotAnOm):
    """A file of fewer bytes than an OM's header that is none, or a CPU OM's (cut short, or whole:
    either is refused by the runtime for its size, as GE refuses any file under its header's)."""


def identify(path: str | os.PathLike) -> tuple[str, object]:
    """Classify a file: ("cpu_om", header dict) | ("atc_om", AtcOmHeader) | ("om2", None).

    Raises FileNotFoundError for a missing file, regular_files.NotRegularFile (an OSError) for a
    FIFO, socket, device node or folder, and container.OmFormatError for anything else.
    """
    with open_regular(path) as f:  # a FIFO, socket or device node is refused unopened
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_SIZE)
    if head[:len(container.MAGIC)] == container.MAGIC:
        if size < HEADER_SIZE:  # (the runtime refuses it by its size before its header, as GE does: said alike)
            raise TooShortForOm(too_short_said(size))
        return "cpu_om", container.read_header(path)
    if head[:4] == ATC_MAGIC:
        hdr = parse_atc_header(head, size)
        if hdr is None:
            raise container.OmFormatError(_not_atc_header(head, size))
        if not hdr.consistent_length:
            raise container.OmFormatError(
                f"ATC OM length mismatch: header says {hdr.model_length or hdr.length} payload bytes, "
                f"file has {size - HEADER_SIZE} (truncated?)")
        return "atc_om", hdr
    if head[:4] == OM2_MAGIC:
        return "om2", None
    if size < HEADER_SIZE:  # (not "neither a CPU OM nor an ATC header": it is too short to hold one)
        raise TooShortForOm(too_short_said(size))
    raise NotAnOm("not an OM file (neither a CPU OM nor an ATC 'IMOD' header)")


def too_short_said(size: int) -> str:
    """Why a file of `size` bytes, fewer than an OM's header, is none: in the same words whether
    identify refused it or the ACL could not read it (runtime/unread_file.py)."""
    fault = "the file is empty (0 bytes)" if size == 0 else f"the file is too short to be an OM ({size} bytes)"
    return f"not a loadable OM: {fault}"


def _not_atc_header(head: bytes, size: int) -> str:
    """Why a file starting with 'IMOD' has no ATC header (the file's size was said as the header's)."""
    if len(head) < HEADER_SIZE:
        return f"file starts with 'IMOD' but is {size} bytes, shorter than an ATC OM's {HEADER_SIZE}-byte header"
    (headsize,) = struct.unpack_from("<I", head, 4)
    return (f"file starts with 'IMOD' but its {HEADER_SIZE}-byte header is not an ATC OM header (its size "
            f"field says {headsize}, not {HEADER_SIZE})")


def compile_hint(path: str) -> str:
    """What to do with a file `identify` refused, when its name says it is an ONNX model: compile
    it if it parses as one (a garbage .onnx was sent to `aclserve compile`, which refused it)."""
    if not path.lower().endswith(".onnx"):
        return ""
    if not _parses_as_onnx(path):
        return "; nor is it an ONNX model, whatever its name: it does not parse as one"
    return f" (an ONNX model: `aclserve compile {shlex.quote(path)}` makes an OM of it)"


def _parses_as_onnx(path: str) -> bool:
    import onnx  # (here only: a refused .onnx is rare, and the runtime imports this module)
    try:
        with open_regular(path) as f:
            model = onnx.load(f, load_external_data=False)
    except Exception:  # protobuf's DecodeError and friends, a file that cannot be read
        return False
    return bool(model.graph.node or model.graph.output)  # (an empty file parses, as an empty model)


def om_kind(path: str) -> str | None:
    """"a CPU OM" or "an ATC OM" when the file starts as one, else None: what a compile refused
    as no ONNX model may be compiled already."""
    try:
        with open_regular(path) as f:
            head = f.read(len(container.MAGIC))
    except OSError:
        return None
    if head == container.MAGIC:
        return "a CPU OM"
    return "an ATC OM" if head[:4] == ATC_MAGIC else None
