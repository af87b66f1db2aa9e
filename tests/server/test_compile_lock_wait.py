"""A load whose .onnx another process is compiling into the same compile cache (a replica sharing
the folder: the cache entry's lock, repository/compiler.py) says so in its index reason while it
waits for that lock: it said "looking for the compile of m.onnx in the compile cache" for as long
as the other compile took. No path reaches the client. Real server on a real port, the lock held
by a real other process as a replica's compile holds it; released, the load uses or makes the entry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from aclserve.repository.compiler import cache_key
from tests import REPO
from tests.serving import ServerThread, request, server_config
from tests.tiny_models import double_onnx

WAITING = "waiting for another process compiling the same model"
HOLDER = """import sys
from aclserve.repository.compiler import exclusive
with exclusive(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def reason(srv, name: str) -> tuple[str, str] | None:
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    return next(((r["state"], r["reason"]) for r in json.loads(body) if r["name"] == name), None)


def test_a_load_waiting_for_another_process_compiling_its_model_says_so(tmp_path):
    folder, cache = tmp_path / "models", tmp_path / "cache"
    folder.mkdir()
    cache.mkdir()
    config = server_config(folder, compile_cache_dir=str(cache))  # (explicit mode: m loads by its call)
    with ServerThread(config) as srv:
        double_onnx(folder / "m.onnx")
        key = cache_key(folder / "m.onnx", config.model_defaults.compile, "cpu")
        with subprocess.Popen([sys.executable, "-c", HOLDER, str(cache / f".m-{key[:32]}.om.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO))) as holder:
            try:
                assert holder.stdout.readline() == "held\n"
                answers = []
                call = threading.Thread(
                    target=lambda: answers.append(request(srv, "POST", "/v2/repository/models/m/load")))
                call.start()
                seen = []
                for _ in range(300):  # a hang guard, not a timing (each read of the index is paced: 0.1 s or more)
                    seen.append(reason(srv, "m"))
                    if seen[-1] == ("LOADING", WAITING) or not call.is_alive():
                        break
                holder.stdin.close()  # the other process's compile ends, and its lock with it
                call.join(120)
            finally:
                holder.kill()
        after = reason(srv, "m")
    assert seen[-1] == ("LOADING", WAITING), seen[-5:]
    status, _, body = answers[0]
    assert status == 200, body
    assert after == ("READY", "")
