"""The request log (one line per infer request) and JSON log lines; request ids from the KServe
`id` or the X-Request-Id header, in the log and the trace."""
from __future__ import annotations

import asyncio
import json
import logging
import sys

import aiohttp
import numpy as np
import pytest

from aclserve.logs import JsonFormatter

from tests.processes import leashed_popen
from tests.serving import ServerThread, free_port, server_config

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}


@pytest.fixture(scope="module")
def logged(models_dir):
    with ServerThread(server_config(models_dir, request_log=True)) as srv:
        yield srv


def _post(url, body, headers=None):
    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://{url}/v2/models/double/infer", data=json.dumps(body),
                                    headers=headers or {}) as resp:
                return resp.status
    return asyncio.run(go())


def _fields(caplog):
    return [r.fields for r in caplog.records if r.name == "aclserve.requests"]


def test_one_line_per_request_with_its_id_status_and_durations(logged, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    assert _post(logged.url, dict(BODY, id="from-body"), {"X-Request-Id": "from-header"}) == 200
    assert _post(logged.url, BODY, {"X-Request-Id": "h-1"}) == 200
    bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    assert _post(logged.url, bad, {"X-Request-Id": "h-2"}) == 400
    first, second, third = _fields(caplog)
    assert first["request_id"] == "from-body"  # the KServe id wins over the header
    assert second["request_id"] == "h-1"
    for line in (first, second):
        assert line["model"] == "double" and line["version"] == "1" and line["status"] == 200
        assert line["protocol"] == "http"
        assert line["duration_ms"] >= line["queue_ms"] >= 0 and line["compute_ms"] > 0
        assert line["duration_ms"] >= line["decode_ms"] + line["encode_ms"]
    assert third["status"] == 400 and third["request_id"] == "h-2"  # refused, still named
    assert "input 'x'" in third["error"]
    assert _post(logged.url, dict(BODY, id="evil\nstatus=200 " + "x" * 400)) == 200
    forged = _fields(caplog)[-1]["request_id"]
    assert forged.startswith("evil?status=200 ") and len(forged) == 256
    # in the text line the id is quoted: it cannot pass for fields of its own
    text = [r.getMessage() for r in caplog.records if r.name == "aclserve.requests"][-1]
    assert text.startswith('infer request_id="evil?status=200 x') and text.count(" status=") == 1, text[:80]


def test_a_text_log_line_escapes_what_would_start_a_line_of_its_own():
    """A name a client sent (a path) or a file dropped into the models folder, with a newline in
    it, stays on its line in a text log; a traceback still follows on lines of its own."""
    from aclserve.logs import TEXT_FORMAT, TextFormatter
    record = logging.LogRecord("aclserve.x", logging.ERROR, __file__, 1, "internal error on %s %s",
                               ("POST", "/v2/x\n2026-12-02 19:00:00,000 WARNING forged\r\x1b[31m"), None)
    line = TextFormatter(TEXT_FORMAT).format(record)
    assert "\n" not in line and line.endswith("/v2/x\\n2026-12-02 19:00:00,000 WARNING forged\\r\\x1b[31m")
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert TextFormatter(TEXT_FORMAT).format(record).count("\n") >= 2  # the traceback's own lines


def test_a_refused_request_is_named_by_its_own_id(logged, caplog, models_dir):
    """A body whose tensors do not fit the model was logged without its KServe id (found by an
    independent check: the failed requests are the ones people look for); so was a gRPC
    request refused while decoding."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    bad = {"id": "rl-bad", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    assert _post(logged.url, bad, {"X-Request-Id": "header"}) == 400
    bad_param = dict(BODY, id="rl-param", parameters={"priority": "high"})
    assert _post(logged.url, bad_param) == 400
    first, second = _fields(caplog)[-2:]
    assert (first["status"], first["request_id"]) == (400, "rl-bad")
    assert (second["status"], second["request_id"]) == (400, "rl-param")
    caplog.clear()
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    config = server_config(models_dir, request_log=True, grpc_port=free_port())
    with ServerThread(config):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{config.grpc_port}")
        x = grpcclient.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(np.ones((1, 3), np.float32))
        with pytest.raises(InferenceServerException, match=r"input 'x': shape \[1, 3\] does not match the model's \[-1, 16\]") as bad:
            client.infer("double", [x], request_id="g-bad")
        assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(Exception, match="unknown model"):  # refused before its body is decoded
            client.infer("nosuch", [x], request_id="g-none")
        client.close()
    line, unknown = _fields(caplog)[-2:]
    assert (line["protocol"], line["request_id"]) == ("grpc", "g-bad") and line["status"] == 400
    assert (unknown["model"], unknown["request_id"], unknown["status"]) == ("nosuch", "g-none", 404)


def test_a_request_for_a_model_or_version_nobody_serves_has_its_line(logged, caplog):
    """Refused before any model version is found: logged by the names the client asked for."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")

    async def go():
        async with aiohttp.ClientSession() as session:
            statuses = []
            for i, path in enumerate(("nosuch", "double/versions/7", "bad\u2028name")):
                async with session.post(f"http://{logged.url}/v2/models/{path}/infer", data=json.dumps(BODY),
                                        headers={"X-Request-Id": f"r-{i}"}) as resp:
                    statuses.append(resp.status)
            return statuses
    assert asyncio.run(go()) == [404, 404, 404]
    lines = _fields(caplog)[-3:]
    assert [(line["model"], line["version"], line["status"]) for line in lines] == [
        ("nosuch", "", 404), ("double", "7", 404), ("bad?name", "", 404)]
    assert all(line["protocol"] == "http" and line["error"] for line in lines)
    assert [line["request_id"] for line in lines] == ["r-0", "r-1", "r-2"]  # the header's, known before the body


def test_json_formatter_writes_one_object_per_line_with_the_fields():
    record = logging.LogRecord("aclserve.requests", logging.INFO, __file__, 1, "infer %s", ("x",), None)
    record.fields = {"request_id": "abc", "status": 200, "duration_ms": 1.5}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "infer x" and doc["level"] == "info" and doc["logger"] == "aclserve.requests"
    assert doc["request_id"] == "abc" and doc["status"] == 200 and doc["ts"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    doc = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in doc["exc"]


def test_json_formatter_writes_a_lone_surrogate_escaped():
    """aiohttp decodes header values with surrogateescape: a byte that is not UTF-8 in a header
    the access log quotes reached the JSON formatter as a lone surrogate, which orjson refuses,
    and the line was lost ("--- Logging error ---" with a traceback on stderr instead)."""
    record = logging.LogRecord("aiohttp.access", logging.DEBUG, __file__, 1, '"GET / HTTP/1.1" 200 "%s"', ("\udcff",), None)
    record.fields = {"request_id": "a\udc80", "status": 200}
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == '"GET / HTTP/1.1" 200 "\\udcff"' and doc["request_id"] == "a\\udc80" and doc["status"] == 200


def _serve_one_request(models_dir, cwd, *flags) -> str:
    """`aclserve serve ... *flags` answering one infer request (X-Request-Id cli-1): its stderr."""
    import os
    import signal
    import subprocess
    import time
    import urllib.request

    port = free_port()
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models_dir),
                          "--port", str(port), "--grpc-port", "0", "--device", "cpu", "--model-control-mode", "none",
                          "--log-format", "json", *flags], cwd=cwd, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1]  # (it refused its flags, say)
                time.sleep(0.1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/double/infer", data=json.dumps(BODY).encode(),
                                     headers={"X-Request-Id": "cli-1", "Content-Type": "application/json"})
        assert urllib.request.urlopen(req, timeout=30).status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    return err


def test_serve_log_format_json_from_the_command_line(models_dir, tmp_path):
    """`aclserve serve --log-format json --request-log`: every stderr line is a JSON object."""
    err = _serve_one_request(models_dir, tmp_path, "--request-log", "--log-level", "warning")
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any(line.get("request_id") == "cli-1" and line["status"] == 200 for line in lines), err


def test_no_request_log_turns_off_the_request_log_a_config_file_turns_on(models_dir, tmp_path):
    """`request_log: true` in the config file could not be turned off from the command line: the
    flag could only turn it on (a configuration tester's finding)."""
    (tmp_path / "s.yaml").write_text("request_log: true\n")
    err = _serve_one_request(models_dir, tmp_path, "--config", "s.yaml", "--no-request-log")
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any("ready" in line["message"] for line in lines), err  # (logging at info, the request served)
    assert not [line for line in lines if line["logger"] == "aclserve.requests"], err


def test_a_request_refused_before_its_body_is_decoded_keeps_its_header_id(models_dir, caplog):
    """A request refused while its body is read (413 here; a full queue's 503 from
    shedding.refuse_undecoded and a 408 too) was logged with request_id null although its
    X-Request-Id header was known from the start (found under overload: every queue-full 503
    of the request log lost its id)."""
    caplog.set_level(logging.INFO, logger="aclserve.requests")

    async def go(url):
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://{url}/v2/models/double/infer", data=json.dumps(BODY) + " " * 4000,
                                    headers={"X-Request-Id": "big-1"}) as resp:
                return resp.status
    with ServerThread(server_config(models_dir, request_log=True, max_body_bytes=2000,
                                    max_json_bytes=2000)) as srv:
        assert asyncio.run(go(srv.url)) == 413
    line = _fields(caplog)[-1]
    assert (line["status"], line["request_id"]) == (413, "big-1")


def test_a_client_s_long_names_are_cut_in_the_log_line_and_a_long_model_name_refused_early(models_dir, caplog):
    """A gRPC model_name of 7 MiB of '\\x01' (unknown model) wrote the name whole, twice, into
    a 14.7 MB line (`model=` and `error=`) and escaped it one character at a time on the
    event loop; an input named "A" * 10 MiB gave a 10 MB `error=` (the client's answer was cut
    at 8,192 characters). Model and version are cut at 256 characters, the error where the
    client's is, each marked; a model name longer than any model's is unknown at once, unquoted
    (gRPC's ModelReady: false, as for any unknown name)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from aclserve.logs import TEXT_FORMAT, TextFormatter
    from aclserve.server.redact import MAX_TEXT
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    config = server_config(models_dir, request_log=True, grpc_port=free_port())
    x = grpcclient.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))

    async def http(url):
        async with aiohttp.ClientSession() as session:
            named = {"inputs": [dict(BODY["inputs"][0], name="A" * 300_000)]}
            async with session.post(f"http://{url}/v2/models/double/infer", data=json.dumps(named)) as resp:
                first = resp.status, (await resp.json())["error"]
            async with session.post(f"http://{url}/v2/models/{'%01' * 2000}/infer", data=json.dumps(BODY)) as resp:
                return first, (resp.status, (await resp.json())["error"])
    with ServerThread(config) as srv:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{config.grpc_port}") as client:
            with pytest.raises(InferenceServerException) as refused:
                client.infer("\x01" * 300_000, [x], request_id="g-long")
            assert client.is_model_ready("\x01" * 300_000) is False
        (input_status, input_error), (name_status, name_error) = asyncio.run(http(srv.url))
    assert refused.value.status() == "StatusCode.NOT_FOUND"
    assert refused.value.message() == "unknown model: a name of 300,000 characters (at most 128)"
    assert (name_status, name_error) == (404, "unknown model: a name of 2,000 characters (at most 128)")
    assert input_status == 400 and input_error.startswith("unknown input 'AAAA") and len(input_error) < MAX_TEXT + 50
    records = [r for r in caplog.records if r.name == "aclserve.requests"][-3:]
    grpc_line, input_line, name_line = (r.fields for r in records)
    assert grpc_line["model"] == "?" * 256 + "... (299,744 more characters)" and grpc_line["status"] == 404
    assert grpc_line["request_id"] == "g-long" and grpc_line["error"] == refused.value.message()
    assert name_line["model"] == "?" * 256 + "... (1,744 more characters)"
    assert input_line["error"] == input_error  # cut where the client's answer is, and marked
    for record in records:  # both formats
        assert len(TextFormatter(TEXT_FORMAT).format(record)) < MAX_TEXT + 1000
        assert len(JsonFormatter().format(record)) < 2 * MAX_TEXT + 1000


def test_a_load_or_unload_of_a_name_longer_than_any_model_s_says_it_by_its_length(models_dir):
    """As metadata and infer do: the load (400) and unload (404) calls quoted the whole name, a
    5,131-byte and a 5,028-byte answer for a name of 5,000 characters, over HTTP and gRPC."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from tests.serving import request
    name = "a" * 5000
    said = "a name of 5,000 characters (at most 128)"
    with ServerThread(server_config(models_dir, grpc_port=free_port())) as srv:
        answers = [request(srv, "POST", f"/v2/repository/models/{name}/{call}", json={})
                   for call in ("load", "unload")]
        with grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}") as client:
            refused = []
            for call in (client.load_model, client.unload_model):
                with pytest.raises(InferenceServerException) as error:
                    call(name)
                refused.append((error.value.status(), error.value.message()))
    assert [(status, json.loads(body)) for status, _, body in answers] == [
        (400, {"error": f"invalid model name: {said}"}), (404, {"error": f"unknown model: {said}"})]
    assert refused == [("StatusCode.INVALID_ARGUMENT", f"invalid model name: {said}"),
                       ("StatusCode.NOT_FOUND", f"unknown model: {said}")]


def test_unprintable_characters_are_replaced_as_isprintable_says_at_any_length():
    """client_text.printable replaces by regular expression what the per-character loop it
    replaced did (every 7th code point, surrogates and astral planes included), and cuts first."""
    from aclserve.server.client_text import printable
    text = "".join(chr(c) for c in range(0, 0x110000, 7))
    assert printable(text, len(text)) == "".join(c if c.isprintable() else "?" for c in text)
    assert printable("\x01\u2028a" * 100_000, 4) == "??a?... (299,996 more characters)"
    assert printable("plain", 5) == "plain"
