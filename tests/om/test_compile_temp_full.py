"""A temp folder with no room for the optimised model ONNX Runtime writes there (as large as the
model) was said as a broken model: "ONNX Runtime cannot load the model: ... INVALID_PROTOBUF :
Protobuf serialization failed", `aclserve compile` exiting 2 (bad input) and the server failing
the version for good (a tester: a 200 MB TMPDIR and a 320 MB model). It is the host short of disk:
the temp folder named, with TMPDIR, `aclserve compile` exiting 1 and the server retrying it.

The temp folder is a real 64 KB tmpfs in a mount namespace of the test's own, the model 128 KB
(the server's ports in a network namespace of its own: test_compile_cache_full.py's)."""
from __future__ import annotations

import json
import re
import sys

from tests.repository.test_compile_cache_full import _in_namespaces
from tests.repository.test_compile_cache_too_small import tmpfs_and_big_model

# inside the namespaces: a 64 KB tmpfs at TMP, the TMPDIR of `aclserve compile` and of a server
# serving MODELS, read until its load of big failed once; prints what each said (JSON)
SCRIPT = r"""
import json, os, subprocess, sys
from tests.processes import leashed_popen  # (what it starts dies with it, as it dies with the test)
tmp, models, out = sys.argv[1:4]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", tmp], check=True)
env = dict(os.environ, TMPDIR=tmp)
with leashed_popen([sys.executable, "-m", "aclserve", "compile", os.path.join(models, "big.onnx"), "-o", out],
                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as compiling:
    compile_said = compiling.communicate()[1]
proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", models, "--host", "127.0.0.1",
                      "--port", "18000", "--grpc-port", "18001", "--device", "cpu", "--readiness", "lenient"],
                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
failed = ""
while "not loaded" not in failed:
    failed = proc.stderr.readline()
    if not failed:
        break
proc.terminate()
proc.communicate(timeout=60)
print(json.dumps({"status": compiling.returncode, "said": compile_said.strip().splitlines()[-1:],
                  "failed": failed.rstrip()}))
"""


def test_a_temp_folder_without_room_for_the_optimised_model_is_the_host_short_of_disk(tmp_path):
    tmp, models = tmpfs_and_big_model(tmp_path)
    done = _in_namespaces(sys.executable, "-c", SCRIPT, str(tmp), str(models), str(tmp_path / "big.om"))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    said = (r"No space left on device for an optimised model about as large as the model \([0-9,]+ bytes\) in the "
            r"temp folder \(TMPDIR\)")
    assert found["status"] == 1, found  # (not 2: the input is not at fault)
    assert re.fullmatch(rf"aclserve compile: error: cannot write {re.escape(str(tmp))}: {said}",
                        found["said"][0]), found
    # the server: the same, as the host short of resources, retried
    assert re.search(rf"big: version 1 from .* not loaded: \[Errno 28\] {said}: '{re.escape(str(tmp))}' \(the host "
                     r"short of resources: retry 1 in [0-9.]+ s\)$", found["failed"]), found["failed"]
