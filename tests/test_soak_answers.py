"""tools/soak.py checks what its good clients get (an independent tester, t61): a 200 whose
outputs did not decode was counted as `client error ValueError`, not as a wrong answer; client
errors did not fail the run, nor did a run that checked no answer at all."""
from __future__ import annotations

import json
import socket

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from tests.soak_stub import ARGS, soak, stub_server

ROWS = np.zeros((2, 64), np.float32)
HEADER = json.dumps({"outputs": [{"name": "y", "shape": [2, 10], "datatype": "FP32"}]}).encode()

# 200s that are no answer to two rows: the tester's (a shape its data does not fill), an answer
# without outputs, a binary tensor cut short, a body that is no JSON
UNDECODABLE = [
    web.json_response({"outputs": [{"name": "y", "shape": [1, 10], "datatype": "FP32", "data": [0.1, 0.2]}]}),
    web.json_response({"model_name": "digits"}),
    web.Response(body=HEADER + bytes(12), headers={"Inference-Header-Content-Length": str(len(HEADER))}),
    web.Response(body=b"<html>ok</html>", content_type="text/html"),
]


async def ask_each(run, answers):
    """One good-client request for each canned answer, to a stub server giving them in turn."""
    given = iter(answers)

    async def handler(request):
        await request.read()
        return next(given)
    async with stub_server(handler) as url, aiohttp.ClientSession() as session:
        return [await run.ask(session, url, ROWS, binary=False) for _ in answers]


@pytest.mark.asyncio
async def test_a_200_that_does_not_decode_is_a_wrong_answer(tmp_path, capsys):
    run = soak.Soak(ARGS)
    assert await ask_each(run, UNDECODABLE) == [200] * len(UNDECODABLE)
    assert (run.tally.checked, run.tally.wrong, run.tally.undecodable) == (4, 4, 4)
    assert not run.tally.client_errors
    assert run.report(True, str(tmp_path / "run")) == 1
    printed = capsys.readouterr().out
    assert "FAILED: 4 wrong answers (4 of them undecodable)" in printed, printed


@pytest.mark.asyncio
async def test_right_answers_pass(tmp_path):
    run = soak.Soak(ARGS)
    want = run.reference.run(["y"], {"x": ROWS})[0]
    right = web.json_response({"outputs": [{"name": "y", "shape": list(want.shape), "datatype": "FP32",
                                            "data": want.ravel().tolist()}]})
    assert await ask_each(run, [right]) == [200]
    assert (run.tally.checked, run.tally.wrong) == (1, 0)
    assert run.report(True, str(tmp_path / "run")) == 0


@pytest.mark.asyncio
async def test_a_request_without_an_answer_fails_the_run(tmp_path, capsys):
    """No server on the port: the connection is refused, a client error of a good client."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed: nothing listens there)
    run = soak.Soak(ARGS)
    async with aiohttp.ClientSession() as session:
        assert await run.ask(session, f"http://127.0.0.1:{port}/v2/models/digits/infer", ROWS, False) is None
    assert run.tally.client_errors == {"ClientConnectorError": 1}
    assert run.report(True, str(tmp_path / "run")) == 1
    printed = capsys.readouterr().out
    assert "FAILED: 1 good-client requests got no answer (client errors)" in printed, printed


def test_a_run_that_checked_no_answer_fails(tmp_path, capsys):
    run = soak.Soak(ARGS)
    run.tally.status[503] += 3  # (answered, but not one 200)
    assert run.report(True, str(tmp_path / "run")) == 1
    assert "FAILED: no answer was checked (not one 200)" in capsys.readouterr().out


def test_an_undecodable_binary_answer_names_what_is_wrong():
    tally = soak.Tally()
    tally.check(np.zeros((2, 10), np.float32), str(len(HEADER)), HEADER + bytes(40))
    assert tally.wrong == 1 and tally.undecodable_said.startswith("ValueError: cannot reshape"), tally.undecodable_said
