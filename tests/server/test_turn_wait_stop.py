"""A load waiting for its load_concurrency turn ("waiting: other versions are loading") ends at
once when it is stopped, as a compile does: an unload through the API, its file deleted (poll
mode). Before, the wait was for the loads ahead of it to end (a compile: up to compile_timeout_s,
an hour by default), the unload call unanswered all that time, and then the version was loaded and
warmed up anyway, only to be unloaded (found by an independent tester). Real server on a real port;
the load ahead is a compile held in its child process (`compile_holds`, tests/conftest.py)."""
from __future__ import annotations

import json
import logging
import shutil

from tests.serving import ServerThread, in_thread, request, server_config, wait_until
from tests.tiny_models import double_onnx

WAITING = "waiting: other versions are loading (load_concurrency)"
HANG_GUARD_S = 60  # (not a timing: the fixed server answers at once; the old one waited for the compile)


def rows(srv) -> dict[str, tuple[str, str]]:
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    return {row["name"]: (row.get("state", ""), row.get("reason", "")) for row in json.loads(body)}


def test_an_unload_ends_a_load_waiting_for_its_turn_at_once(models_dir, tmp_path, compile_holds, caplog):
    caplog.set_level(logging.INFO, logger="aclserve")
    folder = tmp_path / "models"
    folder.mkdir()
    with ServerThread(server_config(folder, load_concurrency=1, log_level="info")) as srv:
        double_onnx(folder / "a_block.onnx")
        shutil.copy(models_dir / "double.om", folder / "r.om")
        block, blocked = in_thread(lambda: request(srv, "POST", "/v2/repository/models/a_block/load"))
        wait_until(lambda: any(compile_holds.iterdir()), "a_block compiling (held)", HANG_GUARD_S)
        load, loaded = in_thread(lambda: request(srv, "POST", "/v2/repository/models/r/load"))
        wait_until(lambda: rows(srv).get("r") == ("LOADING", WAITING), "r waiting for its turn", HANG_GUARD_S)

        unload, unloaded = in_thread(lambda: request(srv, "POST", "/v2/repository/models/r/unload"))
        unload.join(HANG_GUARD_S)
        assert unloaded and unloaded[0][0] == 200, unloaded  # (without the change: none while a_block compiles)
        load.join(HANG_GUARD_S)
        assert rows(srv)["r"] == ("UNAVAILABLE", "unloaded")
        assert any(compile_holds.iterdir())  # (a_block's compile still held: nothing waited for it)

        for mark in compile_holds.iterdir():
            mark.unlink()
        block.join(120)
        after = rows(srv)
        ready = request(srv, "GET", "/v2/models/r/ready")[0]
        said = [r.getMessage() for r in caplog.records]
        again = request(srv, "POST", "/v2/repository/models/r/load")[0]  # (no turn left taken by the stopped wait)
    status, _, body = loaded[0]
    assert status == 400 and b"an unload request for it arrived during this load" in body, (status, body)
    assert blocked[0][0] == 200, blocked
    assert after["a_block"] == ("READY", "") and after["r"] == ("UNAVAILABLE", "unloaded")
    assert ready != 200
    assert again == 200
    assert "r: the load of version 1 was stopped while it waited for its turn (asked through the repository API)" \
        in said, said
    assert not [line for line in said if line.startswith("r: version 1 ready")], said  # never opened nor warmed


def test_a_file_deleted_ends_a_load_waiting_for_its_turn_at_once(models_dir, tmp_path, compile_holds, caplog):
    """Poll mode: r.om deleted while r waits; r leaves the index at the next scan, not once the
    compile ahead of it ends, and is never loaded."""
    caplog.set_level(logging.INFO, logger="aclserve")
    folder = tmp_path / "models"
    folder.mkdir()
    config = server_config(folder, model_control_mode="poll", load_concurrency=1, settle_s=0.2, debounce_s=0.05,
                           log_level="info")
    with ServerThread(config) as srv:  # (started once its folder's first loads are done: none)
        double_onnx(folder / "a_block.onnx")
        wait_until(lambda: any(compile_holds.iterdir()), "a_block compiling (held)", HANG_GUARD_S)
        shutil.copy(models_dir / "double.om", folder / "r.om")
        wait_until(lambda: rows(srv).get("r") == ("LOADING", WAITING), "r waiting for its turn", HANG_GUARD_S)

        (folder / "r.om").unlink()
        # (without the change: once a_block compiled)
        wait_until(lambda: "r" not in rows(srv), "r gone from the index", HANG_GUARD_S)
        assert any(compile_holds.iterdir())

        for mark in compile_holds.iterdir():
            mark.unlink()
        wait_until(lambda: rows(srv).get("a_block") == ("READY", ""), "a_block ready", HANG_GUARD_S)
        after = rows(srv)
    assert "r" not in after
    said = [r.getMessage() for r in caplog.records]
    assert "r: the load of version 1 was stopped while it waited for its turn (its file is gone)" in said, said
    assert not [line for line in said if line.startswith("r: version 1 ready")], said
