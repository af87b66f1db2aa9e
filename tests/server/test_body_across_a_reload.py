"""A request whose body is still arriving when its model is replaced by one with other inputs.

The server looks the serving version up when a request's head arrives and decodes its body
against that version's tensors once it has come. An independent tester held a [1, 4] body for a
[-1, 8] model while the file was replaced by a [-1, 4] model: the request was refused 400 "shape
[1, 4] does not match the model's [-1, 8]", naming a model that no longer served, for a request
the serving one takes (the reverse swap was already refused 503 "... send it again"). Now a
request the retired version refuses as invalid gets the same 503 hand-over answer when the
version that took over checks requests otherwise, and sent again it is answered by that one.

The app runs on the test's own loop (nothing here is timed): the request is in flight once the
server counts it, and the reload has happened once the load call returns."""
from __future__ import annotations

import asyncio
import os
import shutil

import orjson

from tests.serving import server_config, started_app
from tests.tiny_models import compile_cpu_om, scale_onnx

BODY = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
HEAD = (b"POST /v2/models/sw/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY))


async def _until(predicate, limit_s: float = 60.0):
    async def loop():
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(loop(), limit_s)  # a hang guard, not a timing check


async def _answer(reader) -> tuple[int, object]:
    """(status, JSON body) of one HTTP/1.1 answer with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return int(head.split(b" ", 2)[1]), orjson.loads(await reader.readexactly(length))


def _held_across_a_reload(models_dir, tmp_path, new_model,
                          body: bytes = BODY) -> tuple[tuple[int, object], tuple[int, object]]:
    """sw serves double.om (x [-1, 16]); a [1, 4] request's head and part of its body are sent,
    `new_model(tmp_path)` (an OM's path) replaces sw.om and is loaded, the rest of the body is
    sent, then the whole request once more: the two answers' (status, JSON)."""
    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "double.om", own / "sw.om")
    new = new_model(tmp_path)
    config = server_config(own, shutdown_timeout_s=120)

    async def scenario():
        runner, state, url, runtime, repo = await started_app(config)
        try:
            host, port = url.removeprefix("http://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            head = HEAD.replace(b"%d" % len(BODY), b"%d" % len(body))
            writer.write(head + body[:10])
            await _until(lambda: state.infer_requests.count == 1)  # its version looked up, its body awaited
            looked_up = repo.get("sw")
            shutil.copy(new, own / ".sw.tmp")
            os.replace(own / ".sw.tmp", own / "sw.om")
            await repo.load("sw")
            assert repo.get("sw") is not looked_up  # the new file serves now
            writer.write(body[10:])
            held = await _answer(reader)
            writer.write(head + body)  # sent again, on the same connection
            again = await _answer(reader)
            writer.close()
        finally:
            await runner.cleanup()
        return held, again

    return asyncio.run(scenario())


def test_a_body_that_arrives_across_a_reload_to_other_inputs_is_sent_again(models_dir, tmp_path):
    (status, answer), (status_again, answer_again) = _held_across_a_reload(
        models_dir, tmp_path, lambda folder: compile_cpu_om(scale_onnx(folder / "scale.onnx", 3.0),
                                                            folder / "scale.om"))  # x [-1, 4]
    assert (status, answer) == (503, {"error": (
        "model sw version 1 was replaced by one with other inputs, input value ranges, outputs or batch limit "
        "while this request arrived; send it again")})
    assert status_again == 200
    assert answer_again["outputs"][0]["data"] == [3.0, 6.0, 9.0, 12.0]


def test_a_body_that_arrives_across_a_reload_to_the_same_inputs_stays_refused(models_dir, tmp_path):
    """The version that took over checks requests alike (another file of the same model): it
    would refuse the request too, so its 400 stands, and sent again it is refused alike."""
    def same_model(folder):
        shutil.copy(models_dir / "double.om", folder / "double.om")
        return folder / "double.om"

    held, again = _held_across_a_reload(models_dir, tmp_path, same_model)
    refused = (400, {"error": "input 'x': shape [1, 4] does not match the model's [-1, 16]"})
    assert held == again == refused


def test_a_body_that_is_no_json_stays_refused_across_a_reload_to_other_inputs(models_dir, tmp_path):
    """A body refused whatever model it is for (not JSON) was answered 503 "send it again", and
    sent again refused 400 (reviewer r21): its 400 stands."""
    def other_inputs(folder):
        return compile_cpu_om(scale_onnx(folder / "scale.onnx", 3.0), folder / "scale.om")  # x [-1, 4]

    held, again = _held_across_a_reload(models_dir, tmp_path, other_inputs, body=b"this body is not JSON at all")
    assert held == again and held[0] == 400 and held[1]["error"].startswith("request body is not valid JSON"), held
