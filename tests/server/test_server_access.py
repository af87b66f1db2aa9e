"""Access to the repository API (and optionally inference) with a bearer token; no token on a
non-loopback host refuses load/unload; errors never show this machine's absolute paths; the
repository routes answer 400, not 500, to hostile bodies and URLs."""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as triton

from aclserve.server.auth import Access

from tests.serving import ServerThread, free_port, started_app

TOKEN = "s3cret-t0ken-for-tests"
GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()


def call(url: str, path: str, body: bytes | None = None, token: str | None = None, method: str = "POST"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://{url}{path}", data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def guarded(models_dir, make_config):
    with ServerThread(make_config(models_dir, api_token=TOKEN)) as srv:
        yield srv


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/repository/models/double/unload",
                                  "/v2/repository/models/double/load"])
def test_the_repository_api_needs_the_token(guarded, path):
    status, headers, doc = call(guarded.url, path, b"{}")
    assert status == 401 and "Bearer" in headers.get("WWW-Authenticate", "") and "token" in doc["error"]
    status, _, doc = call(guarded.url, path, b"{}", token="wrong")
    assert status == 401 and doc["error"] == "the API token is not valid"
    status, _, _ = call(guarded.url, path, b"{}", token=TOKEN)
    assert status == 200
    if path.endswith("unload"):
        assert call(guarded.url, "/v2/repository/models/double/load", b"{}", token=TOKEN)[0] == 200


@pytest.mark.parametrize("action", ["load", "unload"])
def test_a_load_or_unload_naming_a_repository_is_a_400_as_triton_answers(guarded, action):
    """Triton's /v2/repository/<name>/models/m/load answers 400 with this message; it was a 404
    "no route" here. Guarded as load/unload are; the model is untouched."""
    path = f"/v2/repository/other/models/double/{action}"
    assert call(guarded.url, path, b"{}")[0] == 401
    status, headers, doc = call(guarded.url, path, b"{}", token=TOKEN)
    assert (status, doc) == (400, {"error": "'repository_name' specification is not supported"})
    assert headers["Content-Type"].startswith("application/json")
    status, _, doc = call(guarded.url, "/v2/repository/index", b"{}", token=TOKEN)
    assert [row["state"] for row in doc if row["name"] == "double"] == ["READY"]


def test_the_index_naming_a_repository_answers_the_index_as_triton_does(guarded):
    """Triton's HTTP server takes /v2/repository/<name>/index and ignores the name (its
    HandleRepositoryIndex never reads it; its gRPC RepositoryIndex refuses one): it was a 404
    "no route" here. Guarded as the index is, its body read as the index's."""
    path = "/v2/repository/other/index"
    assert call(guarded.url, path, b"{}")[0] == 401
    for body in (b"{}", b'{"ready": true}', b""):
        named, plain = call(guarded.url, path, body, token=TOKEN), call(guarded.url, "/v2/repository/index", body,
                                                                        token=TOKEN)
        assert named[0] == plain[0] == 200 and named[2] == plain[2]
        assert named[1]["Content-Type"].startswith("application/json")
    status, _, doc = call(guarded.url, path, b'{"ready": 1}', token=TOKEN)
    assert (status, doc) == (400, {"error": "ready must be a boolean"})


def auth_refusals(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=60).read().decode()
    return {line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("aclserve_auth_refusals_total{")}


def test_refused_tokens_are_counted_and_a_wrong_one_logged_once_a_minute(models_dir, make_config, caplog,
                                                                        monkeypatch):
    """200 calls with a wrong token left no trace in the log or /metrics (an operator's check):
    each refusal is counted by reason, and wrong tokens are said in one WARNING line a minute
    (here 0.3 s), those held back when the time is up (they waited for the next wrong token,
    maybe days: a review), never the token."""
    from aclserve.server import auth
    monkeypatch.setattr(auth, "LOG_EVERY_S", 0.3)
    caplog.set_level(logging.WARNING, logger="aclserve.server.auth")
    with ServerThread(make_config(models_dir, api_token=TOKEN)) as srv:
        assert auth_refusals(srv.url) == {"no_token": 0, "invalid_token": 0, "repeated_header": 0,
                                          "no_token_configured": 0, "web_page": 0}
        for _ in range(3):
            assert call(srv.url, "/v2/repository/index", b"{}", token="guess-1234")[0] == 401
        for _ in range(2):
            assert call(srv.url, "/v2/repository/index", b"{}")[0] == 401
        assert call(srv.url, "/v2/repository/index", b"{}", token=TOKEN)[0] == 200
        assert auth_refusals(srv.url) == {"no_token": 2, "invalid_token": 3, "repeated_header": 0,
                                          "no_token_configured": 0, "web_page": 0}

        def lines():
            return [r.getMessage() for r in caplog.records if "invalid API token" in r.getMessage()]
        for _ in range(3000):  # hang guard: the held-back line comes 0.3 s after the first
            if len(lines()) > 1:
                break
            time.sleep(0.01)
    said = "with an invalid API token{} (/metrics aclserve_auth_refusals_total counts them all)"
    assert lines()[0] == "refused 1 request(s) " + said.format("")
    assert lines()[1] in ["refused 2 request(s) " + said.format(f" in the last {s} s") for s in (0, 1)], lines()
    assert len(lines()) == 2
    assert not any("guess-1234" in r.getMessage() or TOKEN in r.getMessage() for r in caplog.records)


def test_wrong_tokens_held_back_are_said_at_shutdown(models_dir, make_config, caplog):
    """Their counter goes with the process: those held back for the minute were never said when
    the server stopped within it (a review)."""
    caplog.set_level(logging.WARNING, logger="aclserve.server.auth")
    with ServerThread(make_config(models_dir, api_token=TOKEN)) as srv:
        for _ in range(3):
            assert call(srv.url, "/v2/repository/index", b"{}", token="guess-5678")[0] == 401
    lines = [r.getMessage() for r in caplog.records if "invalid API token" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("refused 1 request(s) ") and \
        lines[1].startswith("refused 2 request(s) with an invalid API token in the last "), lines


def test_inference_stays_open_unless_asked(guarded):
    assert call(guarded.url, "/v2/models/double/infer", GOOD)[0] == 200


def test_inference_can_require_the_token(models_dir, make_config):
    srv = ServerThread(make_config(models_dir, api_token=TOKEN, auth_inference=True)).start()
    try:
        assert call(srv.url, "/v2/models/double/infer", GOOD)[0] == 401  # the access middleware covers infer too
        assert call(srv.url, "/v2/models/double", method="GET")[0] == 401
        assert call(srv.url, "/v2/health/ready", method="GET")[0] == 200
        assert call(srv.url, "/metrics", method="GET")[0] == 401  # (it names every model: test_model_readings_token)
        client = triton.InferenceServerClient(srv.url)
        x = triton.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        with pytest.raises(Exception, match="401|token"):
            client.infer("double", [x])
        y = client.infer("double", [x], headers={"Authorization": f"Bearer {TOKEN}"}).as_numpy("y")
        assert (y == 2).all()
        client.close()
    finally:
        srv.close()


def test_token_from_the_environment_is_used_and_never_logged(models_dir, make_config, monkeypatch, caplog):
    monkeypatch.setenv("ACLSERVE_API_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    config = make_config(models_dir)
    assert TOKEN not in repr(config)
    srv = ServerThread(config).start()
    try:
        assert call(srv.url, "/v2/repository/index", b"{}")[0] == 401
        assert call(srv.url, "/v2/repository/index", b"{}", token=TOKEN)[0] == 200
    finally:
        srv.close()
    assert not any(TOKEN in r.getMessage() for r in caplog.records)


def test_the_start_up_line_of_a_token_says_what_it_enables_in_each_control_mode(models_dir, make_config, caplog):
    """In model_control_mode none the line said the repository API needed the token, as if it
    enabled load and unload there, which that mode disables with a token or without (a tester)."""
    caplog.set_level(logging.INFO, logger="aclserve.server.auth")
    Access(make_config(models_dir, api_token="secret", model_control_mode="none")).log_startup()
    said = caplog.text
    assert "the repository index, trace setting changes need it" in said and "repository API" not in said, said
    assert "model load/unload stays disabled: model_control_mode is none" in said, said
    caplog.clear()
    Access(make_config(models_dir, api_token="secret", model_control_mode="explicit")).log_startup()
    assert "API token set: the repository API, trace setting changes need it" in caplog.text, caplog.text
    assert "stays disabled" not in caplog.text


def test_without_a_token_load_and_unload_are_refused_off_loopback(models_dir, make_config, caplog):
    """host 0.0.0.0 in the config (the test still listens on 127.0.0.1 only)."""
    caplog.set_level(logging.WARNING, logger="aclserve.server.auth")

    async def scenario():
        config = make_config(models_dir, host="0.0.0.0")
        runner, state, url, _, _ = await started_app(config)
        state.auth.log_startup()
        try:
            import aiohttp
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{url}/v2/repository/models/double/unload") as r:
                    unload = r.status, await r.json()
                async with s.post(f"{url}/v2/repository/index") as r:
                    index = r.status
                # trace settings decide how many trace files are written: changed on loopback only
                async with s.post(f"{url}/v2/trace/setting", json={"trace_rate": "1"}) as r:
                    trace = r.status, await r.json()
                async with s.get(f"{url}/v2/trace/setting") as r:
                    trace_read = r.status, (await r.json())["trace_rate"]
            return unload, index, trace, trace_read, dict(state.auth.refused)
        finally:
            await runner.cleanup()
    (status, doc), index, (trace_status, trace_doc), trace_read, refused = asyncio.run(scenario())
    assert status == 403 and "ACLSERVE_API_TOKEN" in doc["error"] and index == 200
    assert trace_status == 403 and "trace setting changes are disabled" in trace_doc["error"]
    assert refused == {"no_token": 0, "invalid_token": 0, "repeated_header": 0,
                       "no_token_configured": 2, "web_page": 0}  # (/metrics)
    assert trace_read == (200, "1000")  # read as ever, unchanged
    assert any("api_token" in r.getMessage() and "trace setting" in r.getMessage() for r in caplog.records)


def test_without_a_token_grpc_trace_changes_are_refused_off_loopback(models_dir, make_config):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    srv = ServerThread(make_config(models_dir, host="0.0.0.0", grpc_port=free_port())).start()
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}") as client:
            with pytest.raises(InferenceServerException, match="trace setting changes are disabled") as refused:
                client.update_trace_settings(settings={"trace_rate": "7"})
            assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
            assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
    finally:
        srv.close()


@pytest.mark.parametrize("token", [None, TOKEN])
def test_in_control_mode_none_load_and_unload_get_that_modes_refusal_token_or_not(models_dir, make_config,
                                                                                   caplog, token):
    """Every KServe pod runs with --model-control-mode none, which takes no load/unload: without a
    token the start-up line promised that one would enable them and an unload got 403 "set
    api_token", while with one the same unload got 400 (a tester, t59). Now both get the mode's
    400, over HTTP and gRPC, and the line says a token enables trace setting changes alone.
    (host 0.0.0.0: gRPC listens there, so this runs under `unshare -n`.)"""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    caplog.set_level(logging.INFO, logger="aclserve.server.auth")
    config = make_config(models_dir, host="0.0.0.0", model_control_mode="none", grpc_port=free_port(),
                         api_token=token or "")
    with ServerThread(config) as srv:
        url = srv.url.replace("0.0.0.0", "127.0.0.1")
        for action in ("load", "unload"):
            status, _, doc = call(url, f"/v2/repository/models/double/{action}", b"{}", token=token)
            assert (status, doc) == (400, {"error": f"model {action} is disabled (model_control_mode is none)"})
        with grpcclient.InferenceServerClient(f"127.0.0.1:{config.grpc_port}") as client:
            auth = {"authorization": f"Bearer {token}"} if token else None
            with pytest.raises(InferenceServerException, match=r"model unload is disabled \(model_control_mode "
                                                               r"is none\)") as refused:
                client.unload_model("double", headers=auth)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        trace = call(url, "/v2/trace/setting", json.dumps({"trace_rate": "1"}).encode())[0]
        assert trace == (401 if token else 403)  # (a token still guards trace setting changes)
    said = [r.getMessage() for r in caplog.records if r.name == "aclserve.server.auth"]
    assert not any("load/unload requests" in line for line in said)
    if not token:
        assert any("trace setting changes are refused (403)" in line and "model_control_mode is none" in line
                   for line in said)


def test_a_token_that_is_not_utf8_is_refused_401_not_500(guarded):
    """aiohttp hands a header's non-UTF-8 bytes over as surrogates; the token check compared
    them as text and failed with a 500 (and a traceback in the log)."""
    import socket
    host, port = guarded.url.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer \xff\xfe\r\n"
                     b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401") and b"not valid" in answer, answer[:300]


def test_the_trace_file_read_back_shows_no_absolute_path(models_dir, make_config, tmp_path):
    """The operator's --trace may name any path; a client reading the settings sees its name."""
    config = make_config(models_dir, **{"trace.file": str(tmp_path / "deep" / "boot.json")})
    with ServerThread(config) as srv:
        status, _, doc = call(srv.url, "/v2/trace/setting", method="GET")
    assert status == 200 and doc["trace_file"] == "boot.json", doc


def test_errors_do_not_show_absolute_paths(guarded, models_dir):
    status, _, doc = call(guarded.url, "/v2/repository/models/nosuch/load", b"{}", token=TOKEN)
    assert status == 400 and str(models_dir) not in doc["error"] and "<models>" in doc["error"]


def test_a_client_cannot_probe_for_paths_through_error_messages(guarded, tmp_path):
    """A client's own value that looks like a path is rewritten by the text alone: an input named
    after a file that exists here reads the same as one under a folder that does not."""
    (tmp_path / "secret").write_text("x")
    answers = []
    for name in (str(tmp_path / "secret"), "/aclserve-no-such-folder/secret"):
        body = json.dumps({"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
        status, _, doc = call(guarded.url, "/v2/models/double/infer", body.encode())
        assert status == 400 and "/" not in doc["error"].partition("(")[0]
        answers.append(doc["error"])
    assert answers[0] == answers[1] and "unknown input 'secret'" in answers[0]


def test_a_deeply_nested_repository_body_is_a_400(guarded):
    status, _, doc = call(guarded.url, "/v2/repository/index", b"[" * 100_000 + b"]" * 100_000, token=TOKEN)
    assert status == 400 and "not valid JSON" in doc["error"]


@pytest.mark.parametrize("path,body,error", [
    ("load", {"parameters": []}, "parameters must be an object"),  # ([] was taken as none)
    ("unload", {"parameters": "x"}, "parameters must be an object"),  # (the unload body went unread)
    ("unload", {"parameters": {"unload_dependents": "yes"}}, "parameters.unload_dependents must be a boolean"),
])
def test_repository_parameters_that_are_not_what_triton_takes_are_a_400(guarded, path, body, error):
    status, _, doc = call(guarded.url, f"/v2/repository/models/double/{path}", json.dumps(body).encode(), token=TOKEN)
    assert (status, doc["error"]) == (400, error)
    assert call(guarded.url, "/v2/models/double/ready", method="GET")[0] == 200  # (nothing unloaded)


def test_a_5000_digit_version_is_a_400(guarded):
    status, _, doc = call(guarded.url, f"/v2/models/double/versions/{'9' * 5000}", method="GET")
    assert status == 400 and "version" in doc["error"]
    status, _, doc = call(guarded.url, f"/v2/models/double/versions/{'1' * 5000}/infer", GOOD)
    assert status == 400 and "version" in doc["error"]


def test_grpc_repository_and_model_rpcs_need_the_token_too(models_dir, make_config):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    srv = ServerThread(make_config(models_dir, api_token=TOKEN, auth_inference=True, grpc_port=free_port())).start()
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
        with pytest.raises(InferenceServerException, match="token") as refused:
            client.unload_model("double")
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException, match="not valid"):
            client.get_model_repository_index(headers={"authorization": "Bearer wrong"})
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        with pytest.raises(InferenceServerException, match="token"):
            client.infer("double", [x])
        auth = {"authorization": f"Bearer {TOKEN}"}
        client.unload_model("double", headers=auth)
        client.load_model("double", headers=auth)
        assert (client.infer("double", [x], headers=auth).as_numpy("y") == 2).all()
        client.close()
    finally:
        srv.close()


@pytest.mark.parametrize("path", ["/v2/trace/setting", "/v2/models/double/trace/setting"])
def test_changing_the_trace_settings_needs_the_token_when_one_is_set(guarded, path):
    """They decide which requests write trace files, and where: management, like the repository
    API (reading them stays open, as inference does)."""
    change = json.dumps({"trace_rate": "1000"}).encode()
    status, headers, doc = call(guarded.url, path, change)
    assert status == 401 and "Bearer" in headers.get("WWW-Authenticate", "") and "token" in doc["error"]
    assert call(guarded.url, path, method="GET")[0] == 200
    status, _, doc = call(guarded.url, path, change, token=TOKEN)
    assert status == 200 and doc["trace_rate"] == "1000"


def test_grpc_trace_setting_changes_need_the_token_too(models_dir, make_config):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    srv = ServerThread(make_config(models_dir, api_token=TOKEN, grpc_port=free_port())).start()
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}") as client:
            assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
            with pytest.raises(InferenceServerException, match="token") as refused:
                client.update_trace_settings(settings={"trace_rate": "7"})
            assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
            client.update_trace_settings(settings={"trace_rate": "7"}, headers={"authorization": f"Bearer {TOKEN}"})
            assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["7"]
    finally:
        srv.close()


def test_a_trace_file_name_with_a_control_character_is_refused(server):
    status, _, doc = call(server.url, "/v2/trace/setting", json.dumps({"trace_file": "t\nforged"}).encode())
    assert status == 400 and "trace_file" in doc["error"]


def test_grpc_errors_do_not_show_absolute_paths(models_dir, make_config, tmp_path):
    """As over HTTP: a model file that failed, or a model not in the folder, is named relative to
    <models>, in a call's status and in a stream's error_message alike."""
    import queue

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    shutil.copy(models_dir / "double.om", tmp_path / "double.om")
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx model")
    srv = ServerThread(make_config(tmp_path, grpc_port=free_port(), model_control_mode="explicit")).start()
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}") as client:
            errors = []
            for call_it in (lambda: client.load_model("broken"), lambda: client.load_model("nosuch")):
                with pytest.raises(InferenceServerException) as e:
                    call_it()
                errors.append(e.value.message())
            answers = queue.Queue()
            client.start_stream(lambda result, error: answers.put(error))
            x = grpcclient.InferInput("x", [1, 16], "FP32")
            x.set_data_from_numpy(np.ones((1, 16), np.float32))
            client.async_stream_infer("broken", [x])
            errors.append(answers.get(timeout=60).message())
            client.stop_stream()
    finally:
        srv.close()
    assert "<models>/broken.onnx" in errors[0] and "<models>" in errors[1] and "<models>/broken.onnx" in errors[2]
    assert not any(str(tmp_path) in e for e in errors), errors
