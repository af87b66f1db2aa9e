"""The CPU OM container: what `aclserve compile` writes when ATC is absent and the CPU runtime loads.

Layout (little-endian):

    offset 0   8 bytes  magic b"ACLSVOM\\x00"
    offset 8   u32      container version (1)
    offset 12  u32      header length H (bytes of UTF-8 JSON)
    offset 16  u64      payload length P (bytes of the ONNX model)
    offset 24  H bytes  JSON header
    offset 24+H P bytes ONNX payload (ORT-optimised graph)

The file is exactly 24 + H + P bytes; anything else is truncated or padded and refused.

Header keys: name, producer, created (ISO-8601 UTC), source {path, sha256}, payload_sha256,
header_sha256 (of the header's other keys: cpu_header.digest; older OMs have none),
inputs / outputs: [{name, datatype (KServe name), acl_dtype, format, dims}], the dynamic-batch
input (named `ascend_mbatch_shape_data`, as ATC adds it) listed last among the inputs with
{"dynamic_batch": true}, gears (ascending batch sizes, [] when static), options (compile options).
Dims use -1 for the batch dimension of a dynamic-batch model. A tensor may also record `size`, the
bytes the runtime reports for it (at the largest gear); the compiler leaves it out, so the CPU
runtime computes it from the dims (an AIPP input's as get_input_dims_v2 gives them).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..regular_files import open_regular
from . import cpu_header

MAGIC = b"ACLSVOM\x00"
VERSION = 1
_PREFIX = struct.Struct("<8sIIQ")
PREFIX_SIZE = _PREFIX.size  # 24
MAX_HEADER_BYTES = 16 * 1024 * 1024
CHECKSUM_MISMATCH = "CPU OM payload checksum mismatch (corrupt file)"
DYNAMIC_BATCH_INPUT = cpu_header.DYNAMIC_BATCH_INPUT
# characters of the output's name the temporary file beside it starts with: at most 128 bytes, so
# that ".<head>.<8 random>.part" stays within 143 (ecryptfs's limit; most filesystems' is 255)
# whatever the length of a name that fits (the whole name added 15 bytes: a 241-byte name failed)
TEMP_NAME_HEAD = 32


class OmFormatError(ValueError):
    """The file is not a well-formed CPU OM (bad magic, truncated, inconsistent lengths, bad JSON)."""


@dataclass
class CpuOm:
    header: dict
    payload: bytes = field(repr=False)

    @property
    def name(self) -> str:
        return self.header.get("name", "")

    @property
    def gears(self) -> list[int]:
        return list(self.header.get("gears", []))


def encode(header: dict, payload: bytes) -> bytes:
    header = dict(header)
    header.setdefault("payload_sha256", hashlib.sha256(payload).hexdigest())
    header[cpu_header.CHECKSUM_KEY] = cpu_header.digest(header)
    raw = json.dumps(header, indent=1, sort_keys=True).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(raw), len(payload)) + raw + payload


def write(path: str | os.PathLike, header: dict, payload: bytes) -> int:
    """Write atomically (temporary file in the same folder, then rename). Returns bytes written."""
    path = Path(path)
    data = encode(header, payload)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:TEMP_NAME_HEAD]}.", suffix=".part", dir=path.parent)
    except OSError as e:  # (named as the file asked for: the temporary one is ours, not the caller's)
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a model file is meant to be shared
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno is not None:
            raise _write_error(e, path, len(data)) from e
        raise
    return len(data)


def _write_error(error: OSError, path: Path, size: int) -> OSError:
    """`error` naming the file asked for; a full disk whose whole capacity is less than the file
    says so, as EFBIG: no room made there will ever fit it, so it is not retried as a full disk is
    (a 200 MB compile cache volume and a 320 MB model compiled again every minute, for good)."""
    if error.errno == errno.ENOSPC:
        try:
            disk = os.statvfs(path.parent)
        except OSError:
            disk = None
        if disk is not None and size > disk.f_blocks * disk.f_frsize:
            return OSError(errno.EFBIG, f"File too large for its disk: it needs {size:,} bytes, more than the "
                                        f"{disk.f_blocks * disk.f_frsize:,} bytes the whole disk holds", str(path))
    return OSError(error.errno, error.strerror, str(path))


def parse_prefix(prefix: bytes, file_size: int) -> tuple[int, int]:
    """Validate the 24-byte prefix against the file size; return (header_len, payload_len)."""
    if len(prefix) < PREFIX_SIZE:
        raise OmFormatError(f"file is {file_size} bytes, shorter than the {PREFIX_SIZE}-byte CPU OM prefix")
    magic, version, hlen, plen = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise OmFormatError("not a CPU OM (bad magic)")
    if version != VERSION:
        raise OmFormatError(f"CPU OM container version {version} is not supported (expected {VERSION})")
    if hlen > MAX_HEADER_BYTES:
        raise OmFormatError(f"CPU OM header length {hlen} is implausible")
    expected = PREFIX_SIZE + hlen + plen
    if expected != file_size:
        raise OmFormatError(f"CPU OM length mismatch: header says {expected} bytes, file has {file_size}"
                            + (" (truncated?)" if file_size < expected else ""))
    return hlen, plen


def decode(data: bytes | memoryview, verify_payload: bool = True) -> CpuOm:
    """The OM in `data`; its payload a slice of it (of a memoryview: no copy)."""
    hlen, plen = parse_prefix(data[:PREFIX_SIZE], len(data))
    header = _header(bytes(data[PREFIX_SIZE:PREFIX_SIZE + hlen]))
    payload = data[PREFIX_SIZE + hlen:]
    if verify_payload and "payload_sha256" in header:
        check_digest(hashlib.sha256(payload), header)
    return CpuOm(header, payload)


def check_digest(digest, header: dict) -> None:
    """The payload's sha256 (hashlib object) against the one the header records."""
    if digest.hexdigest() != header["payload_sha256"]:
        raise OmFormatError(CHECKSUM_MISMATCH)


def verify_payload_file(path: str | os.PathLike, header: dict) -> None:
    """The payload of the file at `path` against the header's checksum, read in chunks (the
    model is not held in memory at once); raises OmFormatError when they differ."""
    if "payload_sha256" not in header:
        return
    with open_regular(path) as f:
        hlen, plen = parse_prefix(f.read(PREFIX_SIZE), os.fstat(f.fileno()).st_size)
        verify_payload_in(f, PREFIX_SIZE + hlen, plen, header)


def verify_payload_in(f, offset: int, length: int, header: dict) -> None:
    """The `length` payload bytes at `offset` of the open file `f` against the header's checksum,
    read in chunks; raises OmFormatError when they differ."""
    digest = hashlib.sha256()
    f.seek(offset)
    left = length
    while left and (chunk := f.read(min(1 << 20, left))):
        digest.update(chunk)
        left -= len(chunk)
    check_digest(digest, header)


def read(path: str | os.PathLike, verify_payload: bool = True) -> CpuOm:
    with open_regular(path) as f:  # a FIFO, socket or device node is refused unopened
        data = f.read()
    return decode(data, verify_payload)


def read_header(path: str | os.PathLike) -> dict:
    """Header only, with the prefix validated against the file size (no payload read)."""
    with open_regular(path) as f:
        header, _, _ = read_header_from(f)
    return header


def read_header_from(f) -> tuple[dict, int, int]:
    """(header, payload offset, payload length) of the CPU OM open as `f` (a binary file at its
    start), the prefix validated against the file's size; the payload is left unread."""
    size = os.fstat(f.fileno()).st_size
    hlen, plen = parse_prefix(f.read(PREFIX_SIZE), size)
    raw = f.read(hlen)
    if len(raw) != hlen:
        raise OmFormatError(f"CPU OM header cut short: {len(raw)} of {hlen} bytes (truncated?)")
    return _header(raw), PREFIX_SIZE + hlen, plen


def _header(raw: bytes) -> dict:
    """The header's JSON, checked by cpu_header (what inspect, the repository and the runtime read:
    an OM with no outputs, say, loaded, then failed every run, retried for good as a device fault)."""
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OmFormatError(f"CPU OM header is not valid JSON: {e}") from None
    except RecursionError:  # json's decoder recurses once per level
        raise OmFormatError("CPU OM header is nested too deeply") from None
    try:
        return cpu_header.check(header)
    except cpu_header.HeaderError as e:
        raise OmFormatError(str(e)) from None
