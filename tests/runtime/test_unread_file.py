"""A load the ACL failed for want of reading the file (145002, which the CPU runtime answers for a
descriptor it could not get, as a device's GE does) is told apart by the server looking at the
file: the host short (its header unread for EMFILE, or read fine a moment later) is transient,
retried; a file gone is the file's. A tester (t87) found loads under `ulimit -n 64` refused for
good as "not a loadable OM: [Errno 24] Too many open files", or as "a CPU OM ... refused: on an
Ascend host rebuild it" when the header read a moment later. Real CPU runtime, real files."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aclserve.acl import AclError
from aclserve.acl import constants as C
from aclserve.repository.retry import is_transient, transient_kind
from aclserve.runtime import Engine, open_pool
from aclserve.runtime.device import LoadError
from aclserve.runtime.unread_file import unread_file
from tests import REPO
from tests.tiny_models import tiny_cpu_om_bytes

# A load with every descriptor taken but `free`, for free = 0..5 (some fail where the CPU runtime
# opens the file, some inside ONNX Runtime, the rest load), then with all given back.
LOAD_SHORT_OF_DESCRIPTORS = """
import os, resource, sys
from aclserve.repository.retry import is_transient, transient_kind
from aclserve.runtime import AclRuntime, open_pool
rt = AclRuntime(device="cpu").start()
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
for free in range(6):
    taken = []
    try:
        while True:
            taken.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    for fd in taken[len(taken) - free:]:
        os.close(fd)
    del taken[len(taken) - free:]
    try:
        open_pool(rt, sys.argv[1], "m", instances=1).close()
        said = "loaded"
    except Exception as e:
        said = f"{transient_kind(e)}: {e}" if is_transient(e) else f"refused for good: {e}"
    for fd in taken:
        os.close(fd)
    print(said.replace(chr(10), " "), flush=True)
open_pool(rt, sys.argv[1], "m", instances=1).close()
print("then loaded")
"""


def test_a_load_short_of_descriptors_is_transient_wherever_it_fails(affine_om):
    om = affine_om()
    proc = subprocess.run([sys.executable, "-c", LOAD_SHORT_OF_DESCRIPTORS, om], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    said = proc.stdout.splitlines()
    assert proc.returncode == 0 and said[-1] == "then loaded", proc.stdout + proc.stderr[-2000:]
    failed = [line for line in said[:-1] if line != "loaded"]
    assert failed, said  # (with no descriptor free, the load cannot have passed)
    assert all(line.startswith("the host short of resources: ") for line in failed), said
    assert all("could not be read" in line and "not a loadable OM" not in line for line in failed), said
    assert any("Too many open files, the host short of descriptors" in line for line in failed), said


def test_a_file_the_acl_could_not_read_that_reads_now_is_retried(runtime, affine_om, clean_faults):
    """The ACL's read failed (145002) where the server's read of the header passes: it was the
    host short then, not a file for another runtime."""
    from aclserve.acl.cpu import faults
    om = affine_om()
    faults.inject("query_size", nth=1, code=C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)
    try:
        open_pool(runtime, om, "affine", instances=1).close()
        raise AssertionError("the load passed its fault")
    except Exception as e:
        error = e
    assert is_transient(error) and transient_kind(error) == "the host short of resources", error
    assert "could not be read (acl.mdl.query_size failed with 145002" in str(error), error
    assert "and reads now: taken for the host short of descriptors or memory then" in str(error), error
    assert "CPU OM" not in str(error) and "Ascend" not in str(error), error
    open_pool(runtime, om, "affine", instances=1).close()  # its retry loads


def test_a_file_gone_is_the_files_fault_not_retried(tmp_path):
    refusal = AclError("mdl.query_size", C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)
    error = unread_file("m", str(tmp_path / "gone.om"), refusal)
    assert not is_transient(error), error
    assert str(error) == (f"model m: {tmp_path / 'gone.om'} cannot be read: No such file or directory (acl.mdl."
                          "query_size failed with 145002: model file missing or unreadable)")


@pytest.mark.parametrize("device_fault", [False, True], ids=["cpu_runtime", "device_query_size"])
def test_an_empty_file_is_its_own_fault_not_the_host_short(runtime, tmp_path, clean_faults, device_fault):
    """GE answers an empty model file 145002 (GetFileLength takes it for no file), as the CPU runtime
    does now; the server's read of it then passes, b"", and the load was taken for the host short of
    descriptors and retried until its repeats stopped it (a tester, t91, the device's code injected
    as here). It is the file's: said so, never retried."""
    from aclserve.acl.cpu import faults
    empty = tmp_path / "empty.om"
    empty.write_bytes(b"")
    if device_fault:
        faults.inject("query_size", count=100, code=C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)
    with pytest.raises(LoadError) as refused:
        open_pool(runtime, str(empty), "m", instances=1).close()
    said = str(refused.value)
    assert not is_transient(refused.value), said
    assert f"{empty} is not a loadable OM: the file is empty (0 bytes) (acl.mdl.query_size failed with 145002" \
        in said, said
    assert "host short" not in said and "reads now" not in said, said


def test_a_file_shorter_than_an_om_header_is_its_own_fault(tmp_path):
    """The ACL could not read it, the server reads it whole: fewer bytes than an OM's header are not
    an OM at any retry."""
    short = tmp_path / "short.om"
    short.write_bytes(b"version https://git-lfs.github.com/spec/v1\n")  # (a Git LFS pointer, not its file)
    refusal = AclError("mdl.load_from_file", C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)
    error = unread_file("m", str(short), refusal)
    assert not is_transient(error), error
    assert str(error) == (f"model m: {short} is not a loadable OM: the file is too short to be an OM (43 bytes) "
                          "(acl.mdl.load_from_file failed with 145002: model file missing or unreadable)")


def test_an_engine_says_a_file_too_short_to_be_an_om_once_as_the_repository_does(tmp_path, affine_om):
    """GE answers 145002 for an empty file, 145006 for one of 1 to 255 bytes; the second was said
    "not a loadable OM: not an OM file: the file is too short to be an OM (12 bytes)", the check
    of the file (om/atc_om.py) and the Engine each saying what it is (i221). Once now, in the words
    of the repository's index (repository/test_reasons_said.py); a CPU OM's too, cut short or whole
    under 256 bytes ("CPU OM length mismatch ..." and "is a CPU OM ... and was refused: on an
    Ascend host rebuild it ..." before, i232)."""
    empty, short, cut, tiny = (tmp_path / f"{name}.om" for name in ("empty", "short", "cut", "tiny"))
    empty.write_bytes(b"")
    short.write_bytes(b"x" * 12)
    cut.write_bytes(Path(affine_om()).read_bytes()[:100])
    tiny.write_bytes(tiny_cpu_om_bytes())
    said = {}
    with Engine(device="cpu") as engine:
        for path in (empty, short, cut, tiny):
            with pytest.raises(LoadError) as refused:
                engine.load(path, name="m")
            said[path] = str(refused.value)
    assert said[empty] == (f"model m#0: {empty} is not a loadable OM: the file is empty (0 bytes) (acl.mdl.query_size "
                           "failed with 145002: model file missing or unreadable)")
    for path, size in ((short, 12), (cut, 100), (tiny, 197)):
        assert said[path] == (f"model m#0: {path} is not a loadable OM: the file is too short to be an OM ({size} "
                              "bytes) (acl.mdl.query_size failed with 145006: not a loadable OM file (size, magic or "
                              "length))"), said[path]
