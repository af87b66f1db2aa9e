"""A request for a version waiting for its files to be complete (settle.py) is told what the index
says of it, "waiting for the file to be complete", not "not loaded": the index consulted the settle
state, a request's reason (VersionStates.describe) did not (found by a tester: a version folder
renamed in from outside waits settle_s, the index said it waited, a request for it was answered
503 "model tri version 2 is not ready (UNAVAILABLE: not loaded)"). A model whose only version
waits says the same of itself. Real server in poll mode on a real port; settle_s an hour, so the
files wait for good."""
from __future__ import annotations

import json
import os
import shutil

from tests.serving import ServerThread, index_of, request, server_config, wait_until

from .repo_helpers import place

WAITING = "waiting for the file to be complete"


def error_of(answer: tuple[int, dict, bytes]) -> tuple[int, str]:
    return answer[0], json.loads(answer[2])["error"]


def test_a_request_for_a_settling_version_is_told_it_waits_for_its_file(models_dir, model_files, tmp_path):
    place(model_files[1]["om"], models_dir / "tri" / "1" / "model.om")
    for path in models_dir.rglob("*"):
        os.utime(path, (1, 1))  # old: taken at once at start
    stage = tmp_path / "stage"
    place(model_files[2]["om"], stage / "tri" / "2" / "model.om")
    place(model_files[3]["om"], stage / "fresh" / "1" / "model.om")
    config = server_config(models_dir, model_control_mode="poll", settle_s=3600, debounce_s=0.05)
    with ServerThread(config) as srv:
        os.rename(stage / "tri" / "2", models_dir / "tri" / "2")  # a version folder renamed in from outside
        shutil.move(stage / "fresh", models_dir / "fresh")  # (a rename: the same filesystem)
        wait_until(lambda: [index_of(srv).get(key) for key in (("tri", "2"), ("fresh", "1"))]
                   == [("UNAVAILABLE", WAITING)] * 2, "the index saying they wait")
        version = error_of(request(srv, "GET", "/v2/models/tri/versions/2"))
        model = error_of(request(srv, "GET", "/v2/models/fresh"))
        serving = request(srv, "GET", "/v2/models/tri/ready")[0]
    assert version == (503, f"model tri version 2 is not ready (UNAVAILABLE: {WAITING})"), version
    assert model == (503, f"model fresh is not ready (UNAVAILABLE: {WAITING})"), model
    assert serving == 200  # (tri/1 serves on meanwhile)
