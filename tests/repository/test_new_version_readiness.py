"""Strict readiness counts models, not versions (README, "Readiness"): a new version of a model that
serves another loads, or fails, with /v2/health/ready 200 throughout. Triton's strict readiness
(InferenceServer::IsReady) is false while any version is not READY, a new one LOADING or failed
included; aclserve differs on purpose: replicas sharing a models folder load a new version
together, and that rule took every one of them out of rotation at once for the length of a
compile, or for good when its load failed. This pins what the README says. Real server in poll
mode on a real port; the compile is held in its child (`compile_holds`, tests/conftest.py)."""
from __future__ import annotations

import json
import os

from tests.serving import ServerThread, index_of, request, server_config, wait_until

from .repo_helpers import place


def test_a_new_version_loading_or_failing_beside_a_serving_one_leaves_strict_readiness_200(
        models_dir, model_files, compile_holds):
    (models_dir / "m").mkdir()
    (models_dir / "m" / "config.yaml").write_text("version_policy: all\n")
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    for path in models_dir.rglob("*"):
        os.utime(path, (1, 1))  # old: taken at once at start
    config = server_config(models_dir, model_control_mode="poll", settle_s=0.2, debounce_s=0.05)
    assert config.readiness == "strict"
    with ServerThread(config) as srv:
        assert request(srv, "GET", "/v2/health/ready")[0] == 200
        place(model_files[2]["onnx"], models_dir / "m" / "2" / "model.onnx")
        wait_until(lambda: any(compile_holds.iterdir()), "m/2 compiling (held)")
        loading = index_of(srv)[("m", "2")]
        health_loading = request(srv, "GET", "/v2/health/ready")[0]
        model_loading = request(srv, "GET", "/v2/models/m/ready")[0]
        pinned = request(srv, "GET", "/v2/models/m/versions/2/ready")[0]
        asked = request(srv, "GET", "/v2/models/m/versions/2")
        for mark in compile_holds.iterdir():
            mark.unlink()
        wait_until(lambda: index_of(srv)[("m", "2")] == ("READY", ""), "m/2 serving")

        (models_dir / "m" / ".3.part").mkdir()
        (models_dir / "m" / ".3.part" / "model.om").write_bytes(b"not an OM")
        os.rename(models_dir / "m" / ".3.part", models_dir / "m" / "3")
        def refused() -> bool:  # (its load's reason: not "not loaded" nor a wait for the file)
            state, reason = index_of(srv).get(("m", "3"), ("", ""))
            return state == "UNAVAILABLE" and reason not in ("not loaded", "waiting for the file to be complete")
        wait_until(refused, "m/3 refused")
        health_failed = request(srv, "GET", "/v2/health/ready")[0]
    assert loading[0] == "LOADING", loading
    assert (health_loading, model_loading, pinned) == (200, 200, 503)
    assert (asked[0], json.loads(asked[2])["error"]) == (
        503, "model m version 2 is not ready (LOADING: compiling model.onnx for cpu)"), asked
    assert health_failed == 200
