"""A large answer's JSON is written a slice of values at a time, the event loop given its turn
between slices (a tester's find: one answer of 8,388,608 FP32 values held the loop over a second),
and its bytes are those of the answer written in one call, for every datatype and for sizes on
either side of a slice. Pure functions on a loop of the test's own, then a real server: a large
answer by each of its paths, and a client that goes while its answer is written."""
from __future__ import annotations

import asyncio
import gzip
import http.client
import inspect
import json
import shutil
import socket
import threading
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.dtypes import kserve_to_numpy
from aclserve.runtime.types import TensorSpec
from aclserve.server import codec, encode, json_slices
from aclserve.server.json_tensors import dumps_response, output_entry

from tests.serving import ServerThread, server_config
from tests.tiny_models import compile_cpu_om, save_graph
from .hostile import metric, wait_for
from .test_server_statistics import _failures

SLICE = json_slices.SLICE_VALUES
NUMERIC = ("FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")


def values(datatype: str, count: int, seed: int = 0) -> np.ndarray:
    """`count` values of `datatype` that orjson writes in many ways: floats over the whole range
    (subnormals, the largest, NaN and both infinities included), integers at their type's ends."""
    rng = np.random.default_rng(seed)
    if not count:
        return np.zeros(0, object if datatype == "BYTES" else kserve_to_numpy(datatype))
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(bool)
    if datatype == "BYTES":  # text outputs (a classification's, a string model's): quotes, escapes, non-ASCII
        words = np.array(['a"b', "\\", "\n\t", "naïve", "日本", "", "null", "\x00", "x" * 40], dtype=object)
        return words[rng.integers(0, len(words), count)]
    dtype = kserve_to_numpy(datatype)
    if dtype.kind == "f":
        info = np.finfo(dtype)
        special = np.array([np.nan, np.inf, -np.inf, info.max, info.min, info.tiny, info.smallest_subnormal, -0.0])
        drawn = rng.standard_normal(count) * 10.0 ** rng.integers(info.minexp // 4, info.maxexp // 4, count)
        drawn[rng.integers(0, count, count // 50 + 1)] = special[rng.integers(0, len(special), count // 50 + 1)]
        with np.errstate(over="ignore"):
            return drawn.astype(dtype)
    info = np.iinfo(dtype)
    drawn = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    return np.concatenate([np.array([info.min, info.max], dtype), drawn])[:count]


def answer(outputs: dict[str, tuple[str, np.ndarray]], request_id: str | None = "r1") -> dict:
    """The document encode.encode_response builds: JSON outputs, one binary output's entry among them."""
    entries = [output_entry(name, datatype, arr) for name, (datatype, arr) in outputs.items()]
    entries.insert(1, {"name": "bin", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}})
    doc = {"model_name": "m", "model_version": "1", "outputs": entries}
    if request_id:
        doc["id"] = request_id
    return doc


def both_ways(outputs: dict, request_id: str | None = "r1") -> tuple[bytes, bytes]:
    """(written in one call as before, written in slices whatever its size)."""
    whole = dumps_response(answer(outputs, request_id))
    sliced = asyncio.run(json_slices.dumps_sliced(answer(outputs, request_id)))
    return whole, bytes(sliced)


@pytest.mark.parametrize("datatype", (*NUMERIC, "BOOL", "BYTES"))
def test_an_answer_written_in_slices_is_byte_for_byte_the_one_written_whole(datatype, monkeypatch):
    """Slices of 7 values: outputs of 0, 6, 7, 8 and 22 values (one short of a slice, one slice,
    one past it, three slices and a bit), one of them binary, an id and none."""
    monkeypatch.setattr(json_slices, "SLICE_VALUES", 7)
    for seed, counts in enumerate(((6, 7, 8, 22, 0), (22,), (8, 0))):
        outputs = {f"y{i}": (datatype, values(datatype, count, seed * 10 + i)) for i, count in enumerate(counts)}
        for request_id in ("r1", None):
            whole, sliced = both_ways(outputs, request_id)
            assert sliced == whole
    json.loads(whole)  # (strict JSON: a non-finite value is null)


@pytest.mark.parametrize("datatype", ("FP32", "FP64", "FP16", "INT64", "BYTES"))
def test_outputs_straddling_the_real_slice_are_written_as_before(datatype):
    counts = (SLICE - 1, SLICE, SLICE + 1, 2 * SLICE + 3)
    outputs = {f"y{i}": (datatype, values(datatype, count, i)) for i, count in enumerate(counts)}
    whole, sliced = both_ways(outputs)
    assert sliced == whole


def test_non_finite_values_in_every_slice_are_counted_once(monkeypatch):
    monkeypatch.setattr(json_slices, "SLICE_VALUES", 4)
    y = np.arange(18, dtype=np.float32)
    y[[0, 3, 4, 9, 17]] = [np.nan, np.inf, -np.inf, np.nan, np.inf]  # at slices' ends and starts
    z = np.ones(5, np.float64)  # all finite: no parameters
    whole, sliced = both_ways({"y": ("FP32", y), "z": ("FP64", z)})
    assert sliced == whole
    doc = json.loads(sliced)
    assert doc["outputs"][0]["parameters"] == {"non_finite_values": 5}
    assert "parameters" not in doc["outputs"][2]


def loop_turns_while(make):
    """(turns the event loop took while `make()`'s answer was written, the answer): a callback
    that schedules itself again each time it runs counts the loop's rounds meanwhile."""
    async def scenario():
        loop = asyncio.get_running_loop()
        turns, writing = [0], [True]

        def tick():
            if writing[0]:
                turns[0] += 1
                loop.call_soon(tick)
        loop.call_soon(tick)
        made = make()
        if inspect.isawaitable(made):
            made = await made
        writing[0] = False
        return turns[0], made
    return asyncio.run(scenario())


SIG = codec.Signature([TensorSpec("x", "FP32", np.dtype(np.float32), (-1, 1))],
                      [TensorSpec("y", "FP32", np.dtype(np.float32), (-1, 4 * SLICE))], 8)


def test_the_event_loop_takes_its_turns_while_a_large_answer_is_written():
    """Eight rows of 4 slices each: the loop runs its other work at least once a slice."""
    y = values("FP32", 8 * 4 * SLICE).reshape(8, 4 * SLICE)
    turns, (body, length) = loop_turns_while(
        lambda: encode.encode_response("m", "1", codec.InferRequest({}, 8), {"y": y}, SIG, batched=True))
    assert turns >= 8 * 4 - 1
    whole = dumps_response({"model_name": "m", "model_version": "1", "outputs": [output_entry("y", "FP32", y)]})
    assert length is None and bytes(body) == whole


def test_a_small_answer_is_written_in_one_call_without_a_coroutine():
    """(a coroutine, and looking at what an encoder returned, cost a small answer 1.3 us more)"""
    y = values("FP32", SLICE).reshape(1, SLICE)
    sig = codec.Signature(list(SIG.inputs.values()), [TensorSpec("y", "FP32", np.dtype(np.float32), (-1, SLICE))], 8)
    body, length = encode.encode_response("m", "1", codec.InferRequest({}, 1), {"y": y}, sig, batched=True)
    assert type(body) is bytes and length is None


# -- a real server ---------------------------------------------------------------------------------

def tiled_onnx(path) -> str:
    """y = x tiled SLICE_VALUES times (FP32 [N,1] -> [N,SLICE_VALUES])."""
    reps = numpy_helper.from_array(np.array([1, SLICE], np.int64), "reps")
    return save_graph(helper.make_graph(
        [helper.make_node("Tile", ["x", "reps"], ["y"])], "tiled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", SLICE])], [reps]), path)


@pytest.fixture(scope="module")
def tiled_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiled_models")
    compile_cpu_om(tiled_onnx(tmp_path_factory.mktemp("tiled_src") / "tiled.onnx"), root / "tiled.om", batch="1,2,4")
    return root


@pytest.fixture(scope="module")
def tiled_server(tiled_dir, tmp_path_factory):
    models = tmp_path_factory.mktemp("tiled_served")
    shutil.copytree(tiled_dir, models, dirs_exist_ok=True)
    with ServerThread(server_config(models, model_control_mode="none")) as srv:
        yield srv


TILED_BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1], "data": [1.5, -0.1]}]}).encode()


def request(headers: dict) -> bytes:
    """A POST of TILED_BODY with `headers` (no Accept-Encoding but theirs), head and body in one
    write: a plain request, whose body comes with its head, is answered by the guard itself."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (b"POST /v2/models/tiled/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s"
            % (len(TILED_BODY), head.encode(), TILED_BODY))


def post(url: str, headers: dict) -> tuple[bytes, str | None]:
    """(the answer's body, its Content-Encoding)."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as client:
        client.sendall(request(headers))
        got = http.client.HTTPResponse(client)
        got.begin()
        return got.read(), got.headers.get("Content-Encoding")


DIRECT = "aclserve_direct_infer_total"
PLAIN, VIA_AIOHTTP = {}, {"Accept-Encoding": "identity"}  # (the guard leaves a request with Accept-Encoding to aiohttp)


@pytest.mark.parametrize("headers", (PLAIN, VIA_AIOHTTP, {"Accept-Encoding": "gzip"}))
def test_a_large_json_answer_arrives_whole(tiled_server, headers):
    """Answered by the guard itself (plain), by aiohttp, by aiohttp compressed."""
    before = metric(tiled_server.url, DIRECT)
    raw, coding = post(tiled_server.url, headers)
    assert metric(tiled_server.url, DIRECT) == before + (headers is PLAIN)
    assert coding == ("gzip" if headers.get("Accept-Encoding") == "gzip" else None)
    doc = json.loads(gzip.decompress(raw) if coding else raw)
    y = np.array(doc["outputs"][0]["data"], np.float32).reshape(doc["outputs"][0]["shape"])
    np.testing.assert_array_equal(y, np.repeat(np.array([[1.5], [-0.1]], np.float32), SLICE, axis=1))


@pytest.mark.parametrize("headers", (PLAIN, VIA_AIOHTTP))
def test_a_client_gone_while_its_answer_is_written_counts_as_answered(tiled_dir, tmp_path, monkeypatch, headers):
    """Its outputs came, so the model's statistics count a success: the server's own counters
    must not count it cancelled besides. The answer's writing is held at its first turn until
    the client, seeing that, closes its connection (answered by the guard itself, and by aiohttp)."""
    writing = threading.Event()

    async def held(turns, count):  # (the loop's turn, on the server's loop: until the request is cancelled)
        writing.set()
        await asyncio.Event().wait()
    monkeypatch.setattr(json_slices._Turns, "wrote", held)
    models = tmp_path / "models"
    shutil.copytree(tiled_dir, models)
    with ServerThread(server_config(models, model_control_mode="none")) as srv:
        host, port = srv.url.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as client:
            client.sendall(request(headers))
            assert writing.wait(60)
        asyncio.run(wait_for(lambda: metric(srv.url, "aclserve_requests_in_flight") == 0))
        stats = json.loads(urllib.request.urlopen(f"http://{srv.url}/v2/models/tiled/stats", timeout=30).read())
        stats = stats["model_stats"][0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (1, 0)
        assert _failures(srv.url, "Cancelled") == 0
        assert metric(srv.url, DIRECT) == (headers is PLAIN)
