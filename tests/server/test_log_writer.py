"""The server's log lines go to stderr through a bounded queue and one writer thread (logs.py):
a stderr nobody reads (a stalled log shipper, a container's log driver) stalls no request, the
lines that did not fit are counted and said once the writer catches up, and the lines written
as the server stops still come out, in order. Real `aclserve serve` processes, stderr a pipe."""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.cli.stderr_relay import LINE_BYTES
from aclserve.logs import QUEUE_LINES, TEXT_FORMAT, TextFormatter

from tests.processes import leashed_popen
from tests.serving import free_port
from tests.tiny_models import TOKEN_ROWS, TOKEN_TABLE, compile_cpu_om, save_graph

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
# a refused request's log line is about 300 bytes: these fill the pipe (64 KiB) and the queue
LINES_PAST_THE_QUEUE = QUEUE_LINES + 2000
DROPPED = "log line(s) dropped: stderr was not read as fast as they came"
TIMEOUT = aiohttp.ClientTimeout(total=20)  # a request stalled behind stderr fails the test, not hangs it


def _serve(models_dir, *flags, stdout=subprocess.DEVNULL, grpc_port=0, env=None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models_dir),
                          "--port", str(port), "--grpc-port", str(grpc_port), "--device", "cpu",
                          "--model-control-mode", "none", *flags],
                         stdout=stdout, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # (the start's few lines fit in the pipe, read or not)
        try:
            urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"not ready: {proc.communicate()[1]}")


async def _flood(url: str, count: int) -> None:
    """`count` requests for a model that does not exist: a 404 and a request log line each."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async def client(n):
            for i in range(n):
                async with session.post(f"{url}/v2/models/nothere/infer", json=BODY,
                                        headers={"X-Request-Id": f"flood-{i}-" + "r" * 200}) as resp:
                    assert resp.status == 404
        await asyncio.gather(*(client(count // 16) for _ in range(16)))


async def _still_serving(url: str) -> str:
    """Live, an infer answered, and /metrics' text."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.get(f"{url}/v2/health/live") as resp:
            assert resp.status == 200
        async with session.post(f"{url}/v2/models/double/infer", json=BODY) as resp:
            assert resp.status == 200 and (await resp.json())["outputs"][0]["data"] == [2.0] * 16
        async with session.get(f"{url}/metrics") as resp:
            assert resp.status == 200
            return await resp.text()


def _messages(lines: list[str], fmt: str) -> list[str]:
    if fmt == "json":
        return [json.loads(line)["message"] for line in lines]
    return [line.split(": ", 1)[1] for line in lines if ": " in line]  # (a traceback's lines have none)


def _read_until_caught_up(proc: subprocess.Popen) -> tuple[list[str], threading.Thread]:
    """Read stderr from now on, in a thread; return once the writer has caught up (its line
    saying what it dropped has come): the lines read, growing until stderr ends."""
    lines: list[str] = []
    caught_up = threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if DROPPED in line:
                caught_up.set()
        caught_up.set()  # (ended without it: the assertions say so)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    caught_up.wait(timeout=120)
    return lines, reader


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_stderr_nobody_reads_stalls_no_request_and_the_dropped_lines_are_counted(models_dir, fmt):
    """With stderr a pipe whose reader stalled, the event loop blocked on its ~200th request log
    line: every request, /v2/health/live and /metrics stalled until the reader went on (a
    liveness probe would have restarted a healthy server). The lines written as the server
    stops, once the reader goes on, come last and in order."""
    proc, url = _serve(models_dir, "--request-log", "--log-format", fmt)
    reader = None
    try:
        asyncio.run(_flood(url, LINES_PAST_THE_QUEUE))  # nobody reads stderr meanwhile
        metrics = asyncio.run(_still_serving(url))
        [dropped] = [float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("aclserve_log_lines_dropped_total ")]
        assert dropped > 0, metrics
        lines, reader = _read_until_caught_up(proc)  # the reader goes on
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        proc.wait()
        if reader is not None:
            reader.join(timeout=60)
        proc.stderr.close()
    messages = _messages(lines, fmt)
    said = [int(m.split()[0]) for m in messages if DROPPED in m]
    assert said and sum(said) == dropped, messages[-10:]
    assert any("request_id=flood-" in m for m in messages[:10])  # the first lines queued, not dropped
    shutdown = ["SIGTERM received: shutting down", "draining", "runtime closed"]
    positions = [messages.index(m) for m in shutdown]
    assert positions == sorted(positions) and positions[-1] == len(messages) - 1, messages[-10:]


def test_the_lines_of_a_stop_while_the_queue_is_full_come_out_once_the_reader_goes_on(models_dir):
    """The request log's lines filled the whole queue while stderr's reader stalled, so the lines
    saying why and how the server stopped were dropped, where the README promises them after the
    queued ones once the reader goes on within STOP_WAIT_S (a tester): the request log leaves the
    server's own lines room."""
    proc, url = _serve(models_dir, "--request-log")
    try:
        asyncio.run(_flood(url, LINES_PAST_THE_QUEUE))  # the queue full of its lines, nobody reading
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # (stopping, waiting for the reader meanwhile)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
        proc.wait()
    messages = _messages(err.splitlines(), "text")
    assert any(DROPPED in m for m in messages), messages[-10:]
    shutdown = ["SIGTERM received: shutting down", "draining", "runtime closed"]
    assert all(m in messages for m in shutdown), messages[-10:]
    positions = [messages.index(m) for m in shutdown]
    assert positions == sorted(positions), messages[-10:]
    assert not any("request_id=flood-" in m for m in messages[positions[0]:]), messages[-10:]


def test_a_text_line_s_time_says_its_utc_offset():
    """A text line began with local time and no zone ("2026-12-01 08:52:10,120"): read in another
    zone, or next to the JSON log's UTC, it was hours off."""
    record = logging.LogRecord("aclserve", logging.INFO, __file__, 1, "hello", None, None)
    line = TextFormatter(TEXT_FORMAT).format(record)
    stamp = datetime.datetime.fromisoformat(line[:line.index(" INFO ")])
    assert stamp.tzinfo is not None, line
    assert abs(stamp.timestamp() - record.created) < 0.001, line


def test_a_server_whose_stderr_nobody_reads_still_exits_on_sigterm(models_dir):
    """stop_queue() waited for stderr's reader for good, with the server's signals ignored by then:
    only SIGKILL ended it (a reviewer). Now it gives up after STOP_WAIT_S, the lines left dropped,
    and the process ends without flushing stderr."""
    proc, url = _serve(models_dir, "--request-log")
    try:
        asyncio.run(_flood(url, LINES_PAST_THE_QUEUE))  # nobody reads stderr, now or later
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0  # (a hang guard: the wait is STOP_WAIT_S at most)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def _dropped_total(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        [dropped] = [float(line.split()[-1]) for line in resp.read().decode().splitlines()
                     if line.startswith("aclserve_log_lines_dropped_total ")]
    return dropped


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_lines_a_gone_reader_never_got_are_counted_and_its_going_said_once_on_stdout(models_dir, fmt):
    """`aclserve serve 2>&1 | head -3`: every line once head had gone was lost to EPIPE, while
    aclserve_log_lines_dropped_total stayed 0 and nothing said so (a tester, t84)."""
    proc, url = _serve(models_dir, "--request-log", "--log-format", fmt, stdout=subprocess.PIPE)
    try:
        proc.stderr.close()  # its reader gone
        asyncio.run(_flood(url, 32))
        for _ in range(600):  # (the writer thread's pace: a hang guard, not a time limit)
            dropped = _dropped_total(url)
            if dropped >= 32:
                break
            time.sleep(0.1)
        asyncio.run(_still_serving(url))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        out = proc.stdout.read().splitlines()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert dropped >= 32
    assert _messages(out, fmt) == ["stderr's reader has gone (Broken pipe): log lines are lost from here on, "
                                   "counted in aclserve_log_lines_dropped_total"], out


def _json_objects(lines: list[str]) -> list[dict]:
    """Each line's JSON object: every line one (the lines that are not, said)."""
    not_json = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not not_json, not_json[:5]
    return [json.loads(line) for line in lines]


def _json_served(models_dir, env: dict, call) -> list[dict]:
    """`aclserve serve --log-format json` of `models_dir`, gRPC on, `env` its environment's too: `call(address)`
    (gRPC's host:port) made, the server stopped (SIGTERM, exit status 0), its stderr's objects (each line one)."""
    grpc_port = free_port()
    proc, _ = _serve(models_dir, "--log-format", "json", grpc_port=grpc_port, env=env)
    try:
        call(f"127.0.0.1:{grpc_port}")
        proc.send_signal(signal.SIGTERM)
        lines = proc.communicate(timeout=120)[1].splitlines()
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
    return _json_objects(lines)


def _offset_tokens_om(folder) -> str:
    """ids INT64 [N, 3] + 0, then a Gather of the [50, 2] token table: ids reaching the table
    through arithmetic, which the value range finder does not follow (README "Value ranges"), so
    an id past the table reaches ONNX Runtime and fails there."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", ["ids", "offset"], ["shifted"]),
             helper.make_node("Gather", ["table", "shifted"], ["emb"], axis=0)]
    graph = helper.make_graph(nodes, "offset_tokens", [vi("ids", TensorProto.INT64, ["N", 3])],
                              [vi("emb", TensorProto.FLOAT, ["N", 3, 2])],
                              [numpy_helper.from_array(TOKEN_TABLE, "table"),
                               numpy_helper.from_array(np.array(0, np.int64), "offset")])
    save_graph(graph, folder / "offset_tokens.onnx")
    return compile_cpu_om(folder / "offset_tokens.onnx", folder / "models" / "offset_tokens.om")


def test_a_run_onnx_runtime_fails_is_said_in_one_json_line_not_in_onnx_runtime_s_own(tmp_path):
    """ONNX Runtime logged a failed run itself at ERROR, straight to stderr in colour past
    aclserve's log ("\\x1b[1;31m... [E:onnxruntime:, sequential_executor.cc ...]"): with
    --log-format json a line that is not JSON. Its reason still reaches aclserve's own line."""
    (tmp_path / "models").mkdir()
    _offset_tokens_om(tmp_path)
    proc, url = _serve(tmp_path / "models", "--log-format", "json")
    try:
        body = json.dumps({"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 3],
                                       "data": [0, 1, TOKEN_ROWS + 10]}]}).encode()
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(urllib.request.Request(f"{url}/v2/models/offset_tokens/infer", data=body),
                                   timeout=60)
        failed.value.close()
        assert failed.value.code >= 500
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    said = [doc["message"] for doc in _json_objects(stderr.splitlines())]
    assert any("execution failed" in m and "indices element out of data bounds" in m for m in said), said


def _grpc_double(address: str, calls: int) -> None:
    """`calls` gRPC ModelInfer calls of double, each answered (a call stalled fails at its deadline)."""
    import tritonclient.grpc as grpcclient
    with grpcclient.InferenceServerClient(address) as client:
        for _ in range(calls):
            x = grpcclient.InferInput("x", [1, 16], "FP32")
            x.set_data_from_numpy(np.ones((1, 16), np.float32))
            answer = client.infer("double", [x], client_timeout=60)  # (a hang guard)
            assert answer.as_numpy("y").tolist() == [[2.0] * 16]


GRPC_TRACED = "filter_stack_call.cc"  # in grpc core's GRPC_TRACE=api lines of each call
GRPC_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ")  # (absl's prefix: I1207 13:16:44.606371 6241 a.cc:33])


def test_what_grpc_core_writes_to_a_stderr_nobody_reads_stalls_no_grpc_call(models_dir):
    """grpc core's C code writes its lines to fd 2 itself, past the log's queue: with stderr a pipe
    nobody read, the thread that wrote one blocked, and every gRPC infer got DEADLINE_EXCEEDED while
    HTTP served on (a tester, t87: grpc's "File descriptor limit reached"; here GRPC_TRACE's lines).
    fd 2 is now a pipe the server drains into that queue: the calls are answered, and grpc's lines
    come out once the reader goes on, with aclserve's, up to the server's exit."""
    grpc_port = free_port()
    proc, url = _serve(models_dir, "--request-log", grpc_port=grpc_port,
                       env={"GRPC_TRACE": "api", "GRPC_VERBOSITY": "debug"})
    try:
        asyncio.run(_flood(url, 1024))  # aclserve's own lines fill the pipe (64 KiB), nobody reading
        _grpc_double(f"127.0.0.1:{grpc_port}", 40)  # each call's trace lines about 4 KiB
        proc.send_signal(signal.SIGTERM)
        lines = proc.communicate(timeout=120)[1].splitlines()  # the reader goes on
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
    # (the premise: grpc's lines alone were more than the pipe holds, so that one of them waited for it)
    assert sum(len(line) + 1 for line in lines if GRPC_LINE.match(line)) > 1 << 16, lines[-10:]
    # in order with the log's lines: after the flood's, before and after the first call's request log line
    last_flood = max(i for i, line in enumerate(lines) if "request_id=flood-" in line)
    first_call = next(i for i, line in enumerate(lines) if "protocol=grpc" in line)
    assert any(GRPC_TRACED in line for line in lines[last_flood:first_call]), lines[last_flood:first_call]
    assert any(GRPC_TRACED in line for line in lines[first_call:]), lines[first_call:first_call + 5]
    assert any(line.endswith("runtime closed") for line in lines), lines[-10:]


ABSL_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}


def test_under_json_grpc_core_s_own_lines_are_json_objects_too(models_dir):
    """grpc core writes its lines to fd 2 itself (here GRPC_VERBOSITY=debug's warning as it starts):
    under --log-format json they came out as written, lines that a pipeline parsing each stderr line
    as JSON failed on. Each is an object, logger "native", the line its `message`, its level the one
    its absl prefix's letter names. (GRPC_TRACE's lines of grpc's teardown at the interpreter's exit, after the
    server has stopped, are written as they are: README "Where the log lines go".)"""
    docs = _json_served(models_dir, {"GRPC_VERBOSITY": "debug"}, lambda address: _grpc_double(address, 1))
    native = [doc for doc in docs if doc["logger"] == "native"]
    # (grpc 1.85 warns "Log level DEBUG is not suitable for production" as it starts; any line of its serves)
    assert native, docs[:5]
    for doc in native:
        assert GRPC_LINE.match(doc["message"]) and doc["level"] == ABSL_LEVELS[doc["message"][0]], doc
    assert docs[-1]["message"] == "runtime closed", docs[-3:]


def test_under_json_a_native_line_cut_in_pieces_says_so_and_keeps_its_level(models_dir):
    """grpc core traces each header a call sends in a line of its own (GRPC_TRACE=chttp2_hpack_parser, at debug):
    with a metadata value of 9,000 bytes, a line past the relay's LINE_BYTES. Under --log-format json it came
    out as two objects with nothing joining them, the first `info` (absl's I) and the second `warning`. Each
    piece but the last says `"continued": true` now, each has the line's level, and joined they are the line."""
    import tritonclient.grpc as grpcclient
    value = "v" * 9000

    def call(address: str) -> None:
        with grpcclient.InferenceServerClient(address) as client:
            assert client.is_server_live(headers={"x-long": value}, client_timeout=60)

    docs = _json_served(models_dir, {"GRPC_TRACE": "chttp2_hpack_parser", "GRPC_VERBOSITY": "debug"}, call)
    native = [doc for doc in docs if doc["logger"] == "native"]
    first = next(i for i, doc in enumerate(native) if "x-long: v" in doc["message"])
    pieces = [native[first]]
    while pieces[-1].get("continued") and first + len(pieces) < len(native):
        pieces.append(native[first + len(pieces)])
    assert len(pieces) > 1, {k: v for k, v in pieces[0].items() if k != "message"}  # (its first says it goes on)
    assert GRPC_LINE.match(pieces[0]["message"]) and len(pieces[0]["message"]) == LINE_BYTES, pieces[0]["message"][:80]
    assert [doc.get("continued") for doc in pieces] == [True] * (len(pieces) - 1) + [None], pieces
    assert [doc["level"] for doc in pieces] == ["info"] * len(pieces), pieces
    assert "".join(doc["message"] for doc in pieces).endswith(f"x-long: {value}"), pieces[-1]["message"][-80:]
