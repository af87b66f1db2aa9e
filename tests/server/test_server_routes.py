"""The real server's routes beyond inference's answers: health bodies, a load's null config, a
version that is no number, the KServe v1 protocol, CONNECT, the generate extension, unknown routes
and methods, and the infer paths as the templates route them."""
import json
import socket

from tests.serving import request

from .affine_requests import doc, infer_json


def test_health_bodies(server):
    status, _, raw = request(server, "GET", "/v2/health/live")
    assert status == 200 and json.loads(raw) == {"live": True}
    status, _, raw = request(server, "GET", "/v2/health/ready")
    assert status == 200 and json.loads(raw) == {"ready": True}
    status, _, raw = request(server, "POST", "/v2/repository/index", data=b"")
    assert status == 200 and isinstance(json.loads(raw), list)
    status, _, raw = request(server, "POST", "/v2/repository/index", data=b"[" * 100_000)
    assert status == 400 and "not valid JSON" in json.loads(raw)["error"]


def test_a_load_whose_config_parameter_is_null_loads_as_one_without_it(server):
    """null is none elsewhere: `{"config": null}` was refused as a config override."""
    status, _, raw = request(server, "POST", "/v2/repository/models/double/load", json={"parameters": {"config": None}})
    assert status == 200, raw
    status, _, raw = request(server, "POST", "/v2/repository/models/double/load", json={"parameters": {"config": "{}"}})
    assert status == 400 and "config override" in json.loads(raw)["error"], raw


def test_a_version_that_is_not_a_number_is_a_bad_request(server):
    """As Triton (GetModelVersionFromString): 400, not the 404 of a version it does not have."""
    for path in ("/v2/models/affine/versions/abc", "/v2/models/affine/versions/abc/ready"):
        status, _, raw = request(server, "GET", path)
        assert status == 400 and json.loads(raw) == {"error": "version must be a positive integer, got 'abc'"}, raw
    for zero in ("0", "00"):  # (no version folder is 0: it was a 404 beside -1's 400)
        status, _, raw = request(server, "GET", f"/v2/models/affine/versions/{zero}")
        assert status == 400 and json.loads(raw) == {"error": f"version must be a positive integer, got '{zero}'"}
    status, _, raw = request(server, "GET", "/v2/models/affine/versions/7")
    assert status == 404 and "no version 7" in json.loads(raw)["error"]


def test_the_kserve_v1_protocol_is_refused_saying_to_use_v2(server):
    """The KServe SDK's InferenceRESTClient speaks v1 unless told (its is_server_live is GET /):
    a bare "no route" left a KServe user guessing (a KServe user's check)."""
    for method, path in (("POST", "/v1/models/affine:predict"), ("GET", "/v1/models/affine"), ("GET", "/"),
                         ("GET", "/v1")):
        status, _, raw = request(server, method, path)
        said = json.loads(raw)["error"]
        assert status == 404 and said == (f"no route for {method} {path} (the KServe v1 protocol is not served: "
                                          "use /v2/models/{model}/infer, with the KServe SDK "
                                          "RESTConfig(protocol='v2'))"), said
    status, _, raw = request(server, "GET", "/v2/nothing")
    assert status == 404 and json.loads(raw)["error"] == "no route for GET /v2/nothing"


def test_a_connect_request_is_told_no_route_naming_its_target(server):
    """CONNECT's target is an authority (`h:443`), whose path is empty: the 404 said "no route for
    CONNECT " (a tester, t90)."""
    host, port = server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:  # (the timeout: a hang guard)
        sock.sendall(b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n")
        got = b""
        while b'"}' not in got:
            got += sock.recv(65536)
    assert got.startswith(b"HTTP/1.1 404 ") and got.endswith(b'{"error":"no route for CONNECT h:443"}'), got


def test_the_generate_extension_is_refused_naming_itself_as_the_other_extensions_not_offered(server):
    """Triton's generate and generate_stream answered a bare 404 "no route", where shared memory
    and logging answer a 400 naming their extension and what to do instead (a tester): generate
    is refused in the same words, on a model's and a version's routes, whatever the model."""
    status, _, raw = request(server, "POST", "/v2/logging", json={})
    assert status == 400 and json.loads(raw)["error"].startswith("/v2/logging: the logging extension is not supported")
    for path in ("/v2/models/affine/generate", "/v2/models/affine/generate_stream",
                 "/v2/models/affine/versions/1/generate", "/v2/models/nope/generate_stream"):
        status, _, raw = request(server, "POST", path, json={"text_input": "hello", "parameters": {"stream": False}})
        assert status == 400 and json.loads(raw) == {"error": f"{path}: the generate extension is not supported by "
                                                              "aclserve (send the inputs as tensors to the model's "
                                                              "infer route)"}, raw


def test_unknown_model_route_and_method(server):
    status, _, raw = infer_json(server, doc(), model="ghost")
    assert status == 404 and "ghost" in json.loads(raw)["error"]
    status, _, raw = request(server, "GET", "/v2/nothing/here")
    assert status == 404 and "error" in json.loads(raw)
    status, _, raw = request(server, "DELETE", "/v2/health/live")
    assert status == 405 and "error" in json.loads(raw)
    status, _, raw = request(server, "GET", "/v2/models/ghost/config")
    assert status == 404


def test_infer_paths_route_as_the_templates_say(server):
    ok = request(server, "POST", "/v2/models/affine/versions/1/infer", data=json.dumps(doc()).encode())
    assert ok[0] == 200 and json.loads(ok[2])["model_version"] == "1"
    status, _, raw = request(server, "POST", "/v2/models/affine/versions/9/infer", data=json.dumps(doc()).encode())
    assert status == 404 and "9" in json.loads(raw)["error"]
    # Not an infer path: it names version "infer" of the model's metadata route, which is GET only.
    status, _, raw = request(server, "POST", "/v2/models/affine/versions/infer", data=json.dumps(doc()).encode())
    assert status == 405 and "error" in json.loads(raw)
    status, headers, raw = request(server, "GET", "/v2/models/affine/infer")
    assert status == 405 and "error" in json.loads(raw)
    assert headers.get("Allow") == "POST"  # RFC 9110: a 405 names the methods the path takes
    # An Expect header: the route's expect handler answers 100 Continue, then the same answer.
    status, _, raw = request(server, "POST", "/v2/models/affine/infer", data=json.dumps(doc()).encode(),
                             headers={"Expect": "100-continue"})
    assert status == 200 and json.loads(raw)["model_name"] == "affine"
    status, _, raw = request(server, "POST", "/v2/models/ghost/infer", data=json.dumps(doc()).encode(),
                             headers={"Expect": "100-continue"})
    assert status == 404 and "ghost" in json.loads(raw)["error"]
