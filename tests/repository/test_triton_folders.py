"""Triton model folders as a migration brings them (found by a tester migrating a Triton repository):
a folder with a config or a version folder but no model.onnx or model.om (an ensemble with an empty
1/, a Python model's model.py, a TensorRT model.plan) vanished from the index without a word, its
config never read, so the refusal the README promises (ensemble_scheduling, platform, backend,
default_model_filename) never showed; it is the model's problem now, named, and strict readiness
waits on it as on any refused config. Triton's layout of an ONNX model with external data,
<version>/model.onnx/ a folder holding model.onnx and its data files, is served (it was refused as
"a folder, not a regular file"). A preferred_batch_size over max_batch_size is refused, as Triton
refuses it. A version folder without the file default_model_filename names, the other one there,
is that version's failed load (its other versions serve), not the model's problem. The scan on
temporary folders; readiness, the index, the model's answers and the load call on the real server
(CPU runtime, real files)."""
from __future__ import annotations

import json
import logging
import os
import time
import urllib.request

import aiohttp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.parser import text_string_to_metric_families

from aclserve.config import ModelConfig
from aclserve.repository.layout import scan
from aclserve.repository.models_folder import OUTSIDE
from tests.serving import ServerThread, json_call, server_config

from .repo_helpers import http_index, place, started_on_old_files, write_in, x_rows

DEFAULTS = ModelConfig()
ENSEMBLE = ('platform: "ensemble"\nmax_batch_size: 8\n'
            'ensemble_scheduling { step [ { model_name: "m" model_version: -1 } ] }\n')


def touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_folder_with_no_model_file_is_a_problem_naming_why(tmp_path):
    touch(tmp_path / "ens" / "config.pbtxt", ENSEMBLE.encode())
    (tmp_path / "ens" / "1").mkdir()
    touch(tmp_path / "pre" / "config.pbtxt", b'backend: "python"\nmax_batch_size: 8\n')
    touch(tmp_path / "pre" / "1" / "model.py")
    touch(tmp_path / "trt" / "config.pbtxt", b'platform: "tensorrt_plan"\nmax_batch_size: 8\n')
    touch(tmp_path / "trt" / "1" / "model.plan")
    touch(tmp_path / "custom" / "config.pbtxt", b'default_model_filename: "light.onnx"\n')
    touch(tmp_path / "custom" / "1" / "light.onnx")
    touch(tmp_path / "plan" / "config.pbtxt", b"max_batch_size: 8\n")  # the platform left to the file's name
    touch(tmp_path / "plan" / "1" / "model.plan")
    touch(tmp_path / "plan" / "2" / "model.savedmodel" / "saved_model.pb")
    touch(tmp_path / "settings" / "config.yaml", b"instances: 2\n")
    (tmp_path / "bare" / "3").mkdir(parents=True)
    touch(tmp_path / "coming" / "1" / "model.onnx.part")  # being written: the model is coming
    (tmp_path / "empty").mkdir()  # a model folder being filled: passed over, as before
    result = scan(tmp_path, DEFAULTS)
    assert result.models == {}
    source = {name: str((tmp_path / name / "config.pbtxt").resolve()) for name in ("ens", "pre", "trt", "custom")}
    assert result.problems == {
        "ens": f"{source['ens']}: ensemble_scheduling: aclserve serves single models, not ensembles",
        "pre": f"{source['pre']}: backend: 'python': aclserve serves ONNX and OM models (backend onnxruntime, or none)",
        "trt": f"{source['trt']}: platform: 'tensorrt_plan': aclserve serves ONNX and OM models (platform "
               "onnxruntime_onnx, or none)",
        "custom": f"{source['custom']}: default_model_filename: 'light.onnx': aclserve serves <version>/model.om or "
                  "<version>/model.onnx (rename the files)",
        "plan": "no version folder holds model.om or model.onnx (plan/1/ holds model.plan; plan/2/ holds "
                "model.savedmodel/)",
        "settings": "no version folder: a versioned model's file goes in settings/<version>/model.om or model.onnx, "
                    "<version> a positive integer such as 1",
        "bare": "no version folder holds model.om or model.onnx (bare/3/ is empty)"}
    assert set(result.config_problems) == {"ens", "pre", "trt", "custom"}  # (one being written waits: planner.py)
    assert result.notes == []


@pytest.mark.parametrize("dynamic, problem", [
    ("dynamic_batching { preferred_batch_size: [ 4, 16 ] }", "16: must be positive and at most max_batch_size (8;"),
    ("dynamic_batching { preferred_batch_size: [ 0 ] }", "0: must be positive and at most max_batch_size (8;"),
])
def test_a_preferred_batch_size_triton_refuses_is_refused(tmp_path, dynamic, problem):
    tensors = ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
               'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    touch(tmp_path / "m" / "1" / "model.onnx")
    touch(tmp_path / "m" / "config.pbtxt", f"max_batch_size: 8\n{tensors}{dynamic}\n".encode())
    # max_batch_size 0 and no tensors listed: Triton's backend completes it from the model, so not here
    touch(tmp_path / "completed" / "1" / "model.onnx")
    touch(tmp_path / "completed" / "config.pbtxt", f"{dynamic}\n".encode())
    result = scan(tmp_path, DEFAULTS)
    assert set(result.models) == {"completed"}
    assert result.problems["m"].endswith(f"dynamic_batching.preferred_batch_size: {problem} Triton refuses it too)")


def _onnx_with_external_data(folder, scale: float, data_name: str = "model.onnx.data") -> None:
    """y = x * scale, `scale` kept in `data_name` beside `folder`/model.onnx (as exporters write
    models over 2 GB)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    init = numpy_helper.from_array(np.full(4, scale, np.float32), "scale")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "g", [x], [y], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location=data_name, size_threshold=0)


def test_a_model_onnx_folder_is_tritons_layout_checked_as_a_file_is(tmp_path):
    repo, outside = tmp_path / "models", tmp_path / "outside"
    _onnx_with_external_data(repo / "m" / "1" / "model.onnx", 2.0)
    (repo / "hollow" / "1" / "model.onnx").mkdir(parents=True)  # no model.onnx in it
    touch(repo / "hollow" / "1" / "model.onnx" / "weights.bin")
    _onnx_with_external_data(outside / "model.onnx", 3.0)
    (repo / "away" / "1").mkdir(parents=True)
    os.symlink(outside / "model.onnx", repo / "away" / "1" / "model.onnx")  # a folder elsewhere: never opened
    (repo / "linked" / "1" / "model.onnx").mkdir(parents=True)
    os.symlink(outside / "model.onnx" / "model.onnx", repo / "linked" / "1" / "model.onnx" / "model.onnx")
    result = scan(repo, DEFAULTS)
    assert set(result.models) == {"m"}
    found = result.models["m"].available["1"]
    inner = repo.resolve() / "m" / "1" / "model.onnx"
    assert (found.kind, found.path) == ("onnx", str(inner / "model.onnx"))
    assert [entry[0] for entry in found.data_stamp] == [str(inner / "model.onnx.data")]  # a new .data reloads it
    assert result.problems == {
        "hollow": "hollow/1/model.onnx is a folder without model.onnx in it (Triton's layout of an ONNX model with "
                  "external data: hollow/1/model.onnx/model.onnx, its data files beside it)",
        "away": f"away/1/model.onnx/model.onnx {OUTSIDE}",
        "linked": f"linked/1/model.onnx/model.onnx {OUTSIDE}"}


@pytest.mark.asyncio
async def test_a_model_onnx_folder_serves_with_its_external_data(make_repo, models_dir):
    _onnx_with_external_data(models_dir / "m" / "1" / "model.onnx", 2.0)
    write_in(models_dir / "m" / "config.pbtxt", 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
    repo, _ = await make_repo(model_control_mode="none")
    assert float((await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


@pytest.mark.asyncio
async def test_the_server_names_the_refused_folder_and_strict_readiness_waits_on_it(models_dir, model_files, caplog):
    caplog.set_level(logging.WARNING, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    (models_dir / "ens" / "1").mkdir(parents=True)  # an ensemble's version folder holds nothing
    write_in(models_dir / "ens" / "config.pbtxt", ENSEMBLE)
    runner, _, base, _, repo = await started_on_old_files(models_dir, "explicit")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                index = {(r["name"], r.get("version", "")): r for r in await resp.json()}
            async with session.get(f"{base}/v2/models/ens") as resp:
                ens_status, ens_error = resp.status, (await resp.json())["error"]
            async with session.post(f"{base}/v2/repository/models/ens/load", json={}) as resp:
                load_status, load_error = resp.status, (await resp.json())["error"]
            async with session.get(f"{base}/v2/health/ready") as resp:
                ready = resp.status
        reason = "<models>/ens/config.pbtxt: ensemble_scheduling: aclserve serves single models, not ensembles"
        assert index[("ens", "")]["state"] == "UNAVAILABLE" and index[("ens", "")]["reason"] == reason
        assert index[("m", "1")]["state"] == "READY"
        assert ens_status == 404 and ens_error.endswith(f"({reason})"), ens_error
        assert load_status == 400 and load_error == f"failed to load ens: {reason}"
        assert ready == 503  # strict readiness, as for any refused config
        assert (await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0] == 1.0
        warned = [r for r in caplog.records if "ensemble_scheduling" in r.getMessage()]
        assert [r.levelno for r in warned] == [logging.WARNING], [r.getMessage() for r in warned]  # once
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_default_model_filename_serves_the_file_it_names(models_dir, model_files, caplog):
    """Triton loads the version folder's file default_model_filename names: a model.onnx named beside
    a model.om is served (the .om was, as an .om wins over an .onnx without a name given), and a
    version folder without the named file fails that version's load, the index saying why."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    for name in ("onnx", "om", "missing"):
        place(model_files[1]["om"], models_dir / name / "1" / "model.om")
    for name in ("onnx", "om"):
        place(model_files[2]["onnx"], models_dir / name / "1" / "model.onnx")
    for name, named in (("onnx", "model.onnx"), ("om", "model.om"), ("missing", "model.onnx")):
        write_in(models_dir / name / "config.pbtxt", f'default_model_filename: "{named}"\n')
    runner, _, base, _, repo = await started_on_old_files(models_dir)
    try:
        index = await http_index(base)
        assert float((await repo.get("onnx").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0  # model.onnx's scale
        assert float((await repo.get("om").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0
        assert ("missing", "") not in index
        assert index[("missing", "1")] == ("UNAVAILABLE", "missing/1/model.om is not served: config.pbtxt's "
                                           "default_model_filename names model.onnx, which missing/1 has not (Triton "
                                           "loads only the file it names)")
        assert "onnx/1/model.onnx is served; onnx/1/model.om beside it is ignored (config.pbtxt's " \
               "default_model_filename names it)" in caplog.text
    finally:
        await runner.cleanup()


def _metrics(url: str) -> dict:
    """/metrics as (family, labels as sorted pairs) -> value."""
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=60) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _loads(url: str, model: str) -> dict[str, float]:
    """aclserve_model_loads_total of `model`, by result."""
    return {dict(labels)["result"]: value for (name, labels), value in _metrics(url).items()
            if name == "aclserve_model_loads_total" and dict(labels)["model"] == model}


def _rows(url: str) -> dict:
    """The repository index: (name, version) -> (state, reason)."""
    return {(r["name"], r["version"]): (r["state"], r.get("reason", ""))
            for r in json_call(url, "/v2/repository/index", b"{}")[1]}


def _until(check, what: str):
    for _ in range(3000):  # a hang guard, not a timing
        if found := check():
            return found
        time.sleep(0.01)
    raise AssertionError(f"never {what}")


def test_a_version_folder_without_the_named_file_fails_that_versions_load_alone(models_dir, model_files):
    """A reviewer's find: m/2/ holding model.om where config.pbtxt's default_model_filename names
    model.onnx made the whole model a problem (its row without a version, counted as the model's
    failed load) while m/1/model.onnx served, and version 2 was in no row. Triton fails that
    version's load. Now it is version 2's failed load, as a file that does not load is: UNAVAILABLE,
    its reason naming the missing file (relative to the folder), version 1 serving; counted once
    while it lasts (a rescan counts nothing), once more by a load call that tries it again."""
    place(model_files[1]["onnx"], models_dir / "m" / "1" / "model.onnx")
    place(model_files[2]["om"], models_dir / "m" / "2" / "model.om")
    write_in(models_dir / "m" / "config.pbtxt", 'default_model_filename: "model.onnx"\nversion_policy: { all { } }\n')
    for path in models_dir.rglob("*"):
        os.utime(path, (1, 1))
    reason = ("m/2/model.om is not served: config.pbtxt's default_model_filename names model.onnx, which m/2 has not "
              "(Triton loads only the file it names)")
    infer = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [3] * 4}]}).encode()
    with ServerThread(server_config(models_dir, model_control_mode="poll", settle_s=0.1, debounce_s=0.05)) as srv:
        index = _until(lambda: (rows := _rows(srv.url)).get(("m", "1"), ("",))[0] == "READY"
                       and (("m", "2") in rows or ("m", "") in rows) and rows, "m/1 served")
        status, answer = json_call(srv.url, "/v2/models/m/infer", infer)  # (no version: the latest serving)
        at_start = _loads(srv.url, "m")
        failure = {dict(labels)["version"]: dict(labels)["reason"] for (name, labels), _ in _metrics(srv.url).items()
                   if name == "aclserve_model_load_failure" and dict(labels)["model"] == "m"}
        place(model_files[1]["om"], models_dir / "other.om")  # another model's file: rescans
        _until(lambda: _rows(srv.url).get(("other", "1"), ("",))[0] == "READY", "other served")
        rescanned = _loads(srv.url, "m")
        load_status, load_answer = json_call(srv.url, "/v2/repository/models/m/load", b"{}")
        after_call = _loads(srv.url, "m")
    assert index == {("m", "1"): ("READY", ""), ("m", "2"): ("UNAVAILABLE", reason)}
    assert str(models_dir) not in reason
    assert (status, answer["model_version"], answer["outputs"][0]["data"]) == (200, "1", [3.0] * 4)
    assert failure == {"2": reason}
    assert load_status == 400 and load_answer["error"] == f"failed to load m: version 2: {reason}"
    assert [at_start, rescanned, after_call] == [{"ok": 1, "failed": n} for n in (1, 1, 2)]
