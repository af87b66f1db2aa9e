"""A model file too short to be an OM, in every call that reads a model file. GE reads the file
whole before it parses it (hicann/ge base/common/helper/model_parser_base.cc): ModelParserBase::
LoadFromFile takes an empty file for none (GetFileLength: "File[...] size is 0, not valid"),
145002; ParseModelContent refuses fewer bytes than its 256-byte ModelFileHeader, whatever they
are, 145006. A tester (t91) found an empty file answered 145006 by the CPU runtime, and 145002 by
a device, which the server then took for the host short of descriptors and retried."""
from __future__ import annotations

import struct

from aclserve.acl import constants as C

from tests.tiny_models import tiny_cpu_om_bytes

ROOM = 1 << 20  # (work and weight memory for load_from_file_with_mem: it refuses the file first)


def _codes(acl, path: str, work: int, weight: int) -> tuple[int, int, int]:
    """What query_size, load_from_file and load_from_file_with_mem answer for `path`."""
    return (acl.mdl.query_size(path)[2], acl.mdl.load_from_file(path)[1],
            acl.mdl.load_from_file_with_mem(path, work, ROOM, weight, ROOM)[1])


def test_an_empty_model_file_is_taken_for_no_file(acl, ctx, device_buffer, tmp_path):
    empty = tmp_path / "empty.om"
    empty.write_bytes(b"")
    codes = _codes(acl, str(empty), device_buffer(ROOM), device_buffer(ROOM))
    assert codes == (C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID,) * 3


def test_a_model_file_shorter_than_an_om_header_is_refused_whatever_it_holds(acl, ctx, device_buffer, tmp_path):
    work, weight = device_buffer(ROOM), device_buffer(ROOM)
    short = {"one_byte.om": b"\0", "imod.om": b"IMOD" + struct.pack("<I", 256) + bytes(247),
             "tiny_cpu.om": tiny_cpu_om_bytes()}
    for name, data in short.items():
        assert 0 < len(data) < 256, name
        (tmp_path / name).write_bytes(data)
        codes = _codes(acl, str(tmp_path / name), work, weight)
        assert codes == (C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID,) * 3, (name, len(data), codes)
