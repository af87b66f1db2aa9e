"""A load whose file is gone when a step reads it says so in the server's words, `<path>: no such
file` (as a compile that finds no .onnx does), never Python's raw `[Errno 2] No such file or
directory: '<path>'`, which a load call's answer, the index and /metrics quoted: the hash of an
.onnx whose file was deleted while its load waited for its load_concurrency turn (explicit mode:
a load call vouches for the folder as it read it, so there it is a failed load; poll mode stops
such a load instead: test_gone_before_the_scan.py). Real server on a real port, the compile
ahead held in its child (`compile_holds`, tests/conftest.py)."""
from __future__ import annotations

import json

from tests.serving import ServerThread, in_thread, index_of, request, server_config, wait_until

from .repo_helpers import place

WAITING = "waiting: other versions are loading (load_concurrency)"
HANG_GUARD_S = 120  # (not a timing)


def test_a_file_deleted_while_its_load_waits_for_its_turn_fails_saying_no_such_file(models_dir, model_files,
                                                                                    compile_holds):
    with ServerThread(server_config(models_dir, load_concurrency=1)) as srv:  # (its start loads what is there)
        place(model_files[1]["onnx"], models_dir / "a_block.onnx")
        place(model_files[2]["onnx"], models_dir / "m.onnx")
        block, blocked = in_thread(lambda: request(srv, "POST", "/v2/repository/models/a_block/load"))
        wait_until(lambda: any(compile_holds.iterdir()), "a_block compiling (held)")
        load, loaded = in_thread(lambda: request(srv, "POST", "/v2/repository/models/m/load"))
        wait_until(lambda: index_of(srv).get(("m", "1")) == ("LOADING", WAITING), "m waiting for its turn")
        (models_dir / "m.onnx").unlink()
        for mark in compile_holds.iterdir():
            mark.unlink()
        load.join(HANG_GUARD_S)
        block.join(HANG_GUARD_S)
    status, _, body = loaded[0]
    assert status == 400, (status, body)
    assert json.loads(body)["error"] == "failed to load m: version 1: <models>/m.onnx: no such file", body
    assert blocked[0][0] == 200, blocked
