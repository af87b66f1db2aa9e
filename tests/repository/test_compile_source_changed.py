"""A dropped .onnx replaced while it compiles (after its cache key was hashed, before the
compile's child read it): the compile is not kept. It was stored under the old bytes' key, so
the old file put back (a rollback), or another server with the old file sharing the cache, was
served the new file's model. Explicit mode and direct compiles: poll mode's scan stops such a
compile when it sees the change (test_compile_file_gone.py), but not before it sees it. Real
server on a real port and the CPU runtime; each compile is held in its child by `compile_holds`
(tests/conftest.py) while the test replaces the file."""
from __future__ import annotations

import concurrent.futures
import json
import os
import time

import pytest

from aclserve.config import CompileOptions
from aclserve.repository.compiler import SourceChanged, cache_key, compiled_om
from tests.serving import ServerThread, request, server_config

from .repo_helpers import place
from .test_compile_process import held_child
from .test_external_data import _export

CHANGED = ("o.onnx changed while it compiled (replaced, written to or deleted), so the compile was not kept: "
           "load it again once the file is complete (poll mode loads a new file by itself)")


def holding(holds) -> int:
    """The pid of the one compile holding in `holds`, once it holds (a hang guard, not a timing)."""
    for _ in range(6000):
        if any(holds.iterdir()):
            return held_child(holds)
        time.sleep(0.01)
    raise AssertionError("no compile's process ever held")


def answer(srv) -> float:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
    status, _, out = request(srv, "POST", "/v2/models/o/infer", json=body)
    assert status == 200, out
    return json.loads(out)["outputs"][0]["data"][0]


def entries(cache) -> list[str]:
    return sorted(os.listdir(cache))


def test_a_file_replaced_while_it_compiles_is_not_cached_and_its_load_call_says_so(
        tmp_path, model_files, compile_holds):
    folder, cache = tmp_path / "models", tmp_path / "cache"
    folder.mkdir()
    config = server_config(folder, compile_cache_dir=str(cache))
    options = config.model_defaults.compile
    with ServerThread(config) as srv, concurrent.futures.ThreadPoolExecutor(1) as calls:
        place(model_files[2]["onnx"], folder / "o.onnx")  # (after the start, which loads every model)
        old_key = cache_key(folder / "o.onnx", options, "cpu")
        load = calls.submit(request, srv, "POST", "/v2/repository/models/o/load")
        held = holding(compile_holds)  # its key hashed, its child not yet reading the file
        place(model_files[3]["onnx"], folder / "o.onnx")  # another model (scale 3) in its place
        (compile_holds / str(held)).unlink()
        status, _, body = load.result()
        assert (status, json.loads(body)) == (400, {"error": f"failed to load o: version 1: {CHANGED}"})
        assert entries(cache) == []  # nothing under the old key (nor a work folder or lock left)
        assert not (cache / f"o-{old_key[:32]}.om").exists()

        again = calls.submit(request, srv, "POST", "/v2/repository/models/o/load")  # the file as it is now
        (compile_holds / str(holding(compile_holds))).unlink()
        assert again.result()[0] == 200
        assert answer(srv) == 3.0
        new_key = cache_key(folder / "o.onnx", options, "cpu")
        assert entries(cache) == [f"o-{new_key[:32]}.om", f"o-{new_key[:32]}.om.json"]

        place(model_files[2]["onnx"], folder / "o.onnx")  # the old file put back: its own model, compiled
        back = calls.submit(request, srv, "POST", "/v2/repository/models/o/load")
        (compile_holds / str(holding(compile_holds))).unlink()
        assert back.result()[0] == 200
        assert answer(srv) == 2.0


def test_an_external_data_file_replaced_while_it_compiles_is_not_cached(tmp_path, compile_holds):
    """The weights beside the .onnx (o.onnx.data) are read by the child as the .onnx is: replaced
    meanwhile, the compile is not kept either; compiled again, it is the new weights' entry."""
    folder, other, cache = tmp_path / "models", tmp_path / "other", tmp_path / "cache"
    folder.mkdir()
    other.mkdir()
    _export(folder, "o", 2.0)
    _export(other, "o", 3.0)  # the same graph, other weights
    options = CompileOptions()
    old_key = cache_key(folder / "o.onnx", options, "cpu")
    with concurrent.futures.ThreadPoolExecutor(1) as compiles:
        compile = compiles.submit(compiled_om, folder / "o.onnx", "o", options, "cpu", cache)
        held = holding(compile_holds)
        os.replace(other / "o.onnx.data", folder / "o.onnx.data")
        (compile_holds / str(held)).unlink()
        with pytest.raises(SourceChanged, match="^o.onnx changed while it compiled"):
            compile.result()
        assert entries(cache) == []

        again = compiles.submit(compiled_om, folder / "o.onnx", "o", options, "cpu", cache)
        (compile_holds / str(holding(compile_holds))).unlink()
        new_key = cache_key(folder / "o.onnx", options, "cpu")
        assert new_key != old_key
        assert again.result() == cache / f"o-{new_key[:32]}.om"
        assert entries(cache) == [f"o-{new_key[:32]}.om", f"o-{new_key[:32]}.om.json"]
