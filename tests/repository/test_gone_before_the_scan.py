"""Poll mode: a version whose folder is deleted while it loads ends as the documented stop (one
INFO line, the version out of the index, no failed load) at whatever step of its load finds the
file gone, before any scan has seen the deletion. Only a scan stopped it: when a step got there
first (the compile's child opening the .onnx, the hash after a wait for the load_concurrency
turn, the check of an .om), the load failed as a bad file, an ERROR "not loaded: <path>: no such
file" or a raw "[Errno 2] No such file or directory: '<path>'", which requests were answered with
until the next scan (found by a tester adding and removing a Triton version folder 25 times). A
file replaced rather than deleted ends the same way, and its new file loads next (found by a
helper, i108: an .onnx failed as "changed while it compiled" until the next scan).

Real server (ServerThread) on a real port, the CPU runtime. The files are there at its start
(its first scan loads them); the compile ahead is held in its child (`compile_holds`,
tests/conftest.py). The deletion's scan is debounce_s (an hour) away, so the step meets the
missing file first, as in the tester's runs where the step came within the debounce."""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading

import pytest

from tests.serving import ServerThread, index_of, request, server_config, wait_until

from .repo_helpers import place

HANG_GUARD_S = 120  # (not a timing: how long a step may take on a loaded machine)


def held_for(holds, source) -> bool:
    """Whether a compile's child holds for `source` (the .onnx it was given)."""
    return any(mark.read_text() == os.fspath(source) for mark in holds.iterdir() if mark.stat().st_size)


@pytest.mark.parametrize("step", ["compile", "hash after its turn", "om check after its turn"])
def test_a_version_folder_deleted_as_a_step_meets_it_is_stopped_not_failed(step, models_dir, model_files,
                                                                            compile_holds, caplog):
    caplog.set_level(logging.INFO, logger="aclserve")
    (models_dir / "m").mkdir()
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    blocker = models_dir / "a_block.onnx"  # ("a_block" < "m": its load takes the one turn first)
    if step == "compile":
        new = models_dir / "m" / "2" / "model.onnx"
        place(model_files[2]["onnx"], new)
    else:
        place(model_files[3]["onnx"], blocker)
        new = models_dir / "m" / "2" / ("model.onnx" if step.startswith("hash") else "model.om")
        place(model_files[2]["onnx" if new.suffix == ".onnx" else "om"], new)
    for path in models_dir.rglob("*"):
        os.utime(path, (1, 1))  # old files: taken at once by the first scan
    config = server_config(models_dir, model_control_mode="poll", debounce_s=3600, settle_s=0.2,
                           load_concurrency=1 if step != "compile" else 2, readiness="lenient", log_level="info")
    srv = ServerThread(config)
    starting = threading.Thread(target=srv.start, daemon=True)
    starting.start()  # (it listens once the first scan's loads have ended)
    try:
        wait_until(lambda: held_for(compile_holds, new if step == "compile" else blocker), "the compile holding")
        shutil.rmtree(new.parent)
        for mark in compile_holds.iterdir():
            mark.unlink()
        starting.join(HANG_GUARD_S)
        assert srv.url, "the server never started"
        wait_until(lambda: ("m", "2") not in index_of(srv), "m/2 out of the index")
        index = index_of(srv)
        answer = request(srv, "GET", "/v2/models/m/versions/2/ready")
        metrics = request(srv, "GET", "/metrics")[2].decode()
    finally:
        srv.close()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    what = "compile" if step == "compile" else "load"  # (the hash: nothing compiled yet, nor for an .om)
    assert ("INFO", f"m: the {what} of version 2 was stopped (its file is gone)") in said, said
    assert not [line for level, line in said if level == "ERROR"], said
    assert index[("m", "1")] == ("READY", "")
    assert answer[0] == 404 and b"Errno" not in answer[2], answer
    assert 'aclserve_model_loads_total{model="m",result="failed"} 0.0' in metrics
    assert 'aclserve_model_load_failure{' not in metrics


def answer(srv, version: str) -> float:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
    status, _, out = request(srv, "POST", f"/v2/models/m/versions/{version}/infer", json=body)
    assert status == 200, out
    return json.loads(out)["outputs"][0]["data"][0]


@pytest.mark.parametrize("step", ["compile", "om check after its turn"])
def test_a_file_replaced_as_a_step_meets_it_is_stopped_and_the_new_file_loads(step, models_dir, model_files,
                                                                              compile_holds, caplog):
    """Replaced rather than deleted: the user dropped a new file of the version, an ordinary hot
    reload. An .onnx replaced while it compiled failed as "model.onnx changed while it compiled"
    (an ERROR, a failed load counted) until a scan loaded the new file; an .om replaced while it
    waited for its turn loaded the new bytes as the old file's. Now the old load stops and the new
    file loads next (scale 3), with no failure in between."""
    caplog.set_level(logging.INFO, logger="aclserve")
    (models_dir / "m").mkdir()
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    kind = "onnx" if step == "compile" else "om"
    new = models_dir / "m" / "2" / f"model.{kind}"
    place(model_files[2][kind], new)
    blocker = models_dir / "a_block.onnx"  # ("a_block" < "m": its load takes the one turn first)
    if step != "compile":
        place(model_files[1]["onnx"], blocker)
    for path in models_dir.rglob("*"):
        os.utime(path, (1, 1))  # old files: taken at once by the first scan
    config = server_config(models_dir, model_control_mode="poll", debounce_s=3600, settle_s=0.2,
                           load_concurrency=1, readiness="lenient", log_level="info")
    srv = ServerThread(config)
    starting = threading.Thread(target=srv.start, daemon=True)
    starting.start()  # (it listens once the first scan's loads have ended)
    try:
        wait_until(lambda: held_for(compile_holds, new if step == "compile" else blocker), "the compile holding")
        place(model_files[3][kind], new)  # another model (scale 3) in its place, by a rename
        for mark in compile_holds.iterdir():
            mark.unlink()
        starting.join(HANG_GUARD_S)
        assert srv.url, "the server never started"
        if step == "compile":  # (the new file's compile holds in its turn)
            wait_until(lambda: held_for(compile_holds, new), "the new file's compile holding")
            for mark in compile_holds.iterdir():
                mark.unlink()
        wait_until(lambda: index_of(srv).get(("m", "2"), ("",))[0] == "READY", "m/2 READY")
        index = index_of(srv)
        answers = answer(srv, "1"), answer(srv, "2")
        metrics = request(srv, "GET", "/metrics")[2].decode()
    finally:
        srv.close()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    stop = "compile" if step == "compile" else "load"
    assert ("INFO", f"m: the {stop} of version 2 was stopped (its file was replaced)") in said, said
    assert not [line for level, line in said if level == "ERROR"], said
    assert (index[("m", "1")], index[("m", "2")], answers) == (("READY", ""), ("READY", ""), (1.0, 3.0))
    assert 'aclserve_model_loads_total{model="m",result="failed"} 0.0' in metrics
    assert 'aclserve_model_load_failure{' not in metrics
