"""`aclserve infer` against what is not a healthy KServe v2 server (one that never answers,
another protocol on the port, a wrong answer) and with inputs it cannot send as they are: one
line each, no traceback, and no wait past --timeout."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from aclserve.cli.infer_metadata import cast_to_model
from aclserve.cli.usage import UsageError

from tests.canned_server import canned_server, recording_server, redirect_to, web_server

# what each fake server answers once it has read a request's head (None: nothing, ever)
ANSWERS = {
    "silent": None,
    "grpc port": b"\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage\r\n\r\n",
    "html": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\n<html/>\r\n",
    "bad header length": b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: abc\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n{}",
    "outputs not a list": b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"outputs\": \"y\"}"[:-1],
    # (taken for an answer of no outputs: nothing printed, exit 0)
    "no outputs": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    # an empty list of outputs, and a header length past the body: nothing printed, exit 0 (a tester, t86)
    "empty outputs": b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"outputs\": []}",
    "header past the body": b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: 99999\r\nContent-Length: 15\r\n"
                            b"Connection: close\r\n\r\n{\"outputs\": []}",
    # JSON nested past Python's stack: a RecursionError traceback (a tester's find)
    "nested deeply": b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\nConnection: close\r\n\r\n"
                     + b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("case", list(ANSWERS))
def test_infer_against_what_is_not_a_kserve_server_is_one_line(tmp_path, case):
    """A gRPC port was http.client's BadStatusLine traceback, HTML a JSONDecodeError, a server that
    never answered held the command 330 s (30 s of metadata, then 300 s)."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    # (a short --timeout for the server that never answers; the others' answers must not meet it on a
    # loaded machine: the 200 KB one missed 0.5 s once, "no answer from")
    timeout = "0.5" if case == "silent" else "30"
    with canned_server(ANSWERS[case]) as url:
        proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--url", url,
                               "--timeout", timeout], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr[:-1].isprintable()  # one printable line
    expected = "no answer from" if case == "silent" else "did not answer as a KServe v2 HTTP server"
    assert expected in proc.stderr, proc.stderr
    if case == "grpc port":  # (its frames were printed as "??????ÿÿ????@?þ")
        assert proc.stderr.endswith(": binary data, not HTTP/1.1 text (an HTTP/2 or gRPC port?)\n"), proc.stderr


def test_a_model_name_of_bytes_that_are_not_utf8_is_sent_for_the_server_to_judge(tmp_path):
    """It was a UnicodeEncodeError traceback (quoting a str holding surrogate escapes)."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    with canned_server(ANSWERS["html"]) as url:
        proc = subprocess.run([sys.executable.encode(), b"-m", b"aclserve", b"infer", b"m\xff", b"-i", b"x=x.npy",
                               b"--url", url.encode(), b"--timeout", b"5"], cwd=tmp_path, capture_output=True,
                              timeout=60)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"did not answer as a KServe v2 HTTP server" in proc.stderr, proc.stderr


def test_infer_refuses_a_timeout_past_30_days_in_one_line(tmp_path):
    """--timeout 1e10 was the socket's OverflowError traceback (timestamp out of range)."""
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    runs = {timeout: subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--url",
                                     "http://127.0.0.1:1", "--timeout", timeout], cwd=tmp_path, capture_output=True,
                                    text=True, timeout=60) for timeout in ("1e10", "2592000")}
    assert runs["1e10"].returncode == 2 and runs["1e10"].stderr == (
        "aclserve infer: error: --timeout must be a positive number of seconds, at most 2,592,000 (30 days)\n")
    assert runs["2592000"].returncode == 1 and "cannot reach http://127.0.0.1:1" in runs["2592000"].stderr


def test_infer_refuses_a_npy_whose_header_asks_for_more_memory_than_there_is(tmp_path):
    from aclserve.cli.infer import _load_inputs
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000000, 64), }".ljust(117).encode() + b"\n"
    (tmp_path / "huge.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)
    with pytest.raises(UsageError, match="huge.npy: its header's shape needs more memory than there is"):
        _load_inputs([f"x={tmp_path / 'huge.npy'}"])


@pytest.mark.parametrize("given, datatype, expected", [
    (np.array([[2**40 + 5, -2**33]]), "INT32", "input x holds -8589934592, outside int32's range"),
    (np.array([[1e6, 1.0]], np.float32), "FP16", r"input x holds 1000000.0, which rounds to inf as float16 \(its "
                                                  r"largest is 65504\): convert it first"),
    # (the refusal said "values past float16's largest (65504)", but 65505 to 65519.99 round to 65504 and go:
    # it names the first value that becomes inf; a tester, t93)
    (np.array([[65519.99, -65520.0]]), "FP16", r"input x holds -65520.0, which rounds to -inf as float16"),
    (np.array([[-1, 2]]), "UINT8", r"input x holds -1, outside uint8's range \[0, 255\]"),
    (np.array([[0, 2]]), "BOOL", r"input x holds 2, outside bool's range \[0, 1\]"),
    # (float data for an integer input was sent as it was, for the server's 400: exit 1, not 2)
    (np.array([[1.0, 2.5]], np.float32), "INT64", "input x is float32, the model takes int64: a cast would change"),
    (np.array([[0.0, 1.0]]), "BOOL", "input x is float64, the model takes bool: a cast would change"),
])
def test_infer_refuses_a_cast_that_would_change_values(given, datatype, expected):
    """int64 [[2**40+5, -2**33]] went to an INT32 model as [[5, 0]]; 1e6 to FP16 as inf."""
    inputs = {"x": given}
    with pytest.raises(UsageError, match=expected):
        cast_to_model(inputs, {"inputs": [{"name": "x", "datatype": datatype}]})


def test_infer_casts_integers_of_either_sign_whose_values_fit():
    """int64 data (numpy's default) for a UINT8 or BOOL input was sent as it was and refused by
    the server (numpy calls int64 -> uint8 unsafe); the values decide (found by a helper)."""
    inputs = {"u": np.array([[0, 255]]), "b": np.array([[1, 0]])}
    notes = cast_to_model(inputs, {"inputs": [{"name": "u", "datatype": "UINT8"}, {"name": "b", "datatype": "BOOL"}]})
    assert inputs["u"].dtype == np.uint8 and inputs["u"].tolist() == [[0, 255]]
    assert inputs["b"].dtype == np.bool_ and inputs["b"].tolist() == [[True, False]] and len(notes) == 2


def test_infer_ignores_metadata_of_another_shape():
    inputs = {"x": np.zeros(2)}
    assert cast_to_model(inputs, {"inputs": 5}) == [] and cast_to_model(inputs, [1]) == []
    assert cast_to_model(inputs, {"inputs": [5, {"name": "x", "datatype": 3}]}) == []


def test_infer_json_writes_non_finite_outputs_as_null_like_the_server():
    """--json wrote bare NaN / Infinity tokens, which strict JSON parsers refuse."""
    from aclserve.cli.infer import _json_data
    assert _json_data(np.array([[1.0, np.nan], [np.inf, -2.0]], np.float32)) == [[1.0, None], [None, -2.0]]
    assert _json_data(np.array([3, 4], np.int64)) == [3, 4]


def test_a_line_with_tabs_or_colours_is_text_not_binary():
    """(the review of the binary rule: tabs and ESC counted as binary bytes)"""
    from aclserve.cli.usage import one_line
    assert one_line("error:\tbad value\tx") == "error: bad value x"
    assert one_line("\x1b[31mred\x1b[0m") == "?[31mred?[0m"
    assert one_line("\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage").startswith("binary data")


@pytest.mark.parametrize("scheme, said", [
    ("http", "(a TLS port? try https://)"),  # the server closes without a word: a TLS port's way
    ("http-reset", "(a TLS port? try https://)"),  # ... or resets, closing with bytes unread (a CI run met it)
    ("https", "(not a TLS port? try http://)"),  # a plain HTTP answer to the TLS hello
])
def test_a_url_of_the_wrong_scheme_gets_a_hint(tmp_path, scheme, said):
    """Plain HTTP to the TLS port ended in "Remote end closed connection without response" (or a
    reset), TLS to a plain port in "[SSL: WRONG_VERSION_NUMBER]", neither saying what to change."""
    import contextlib
    import socket
    import struct
    import threading
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    if scheme == "http-reset":  # closed with an RST, as with bytes unread
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    if scheme == "https":
                        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"{scheme.split('-')[0]}://127.0.0.1:{listener.getsockname()[1]}"
        proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--url", url,
                               "--timeout", "5"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        listener.close()
    assert proc.returncode == 1 and proc.stderr.rstrip("\n").endswith(said), proc.stderr


def test_infer_sends_an_image_and_asks_for_its_classes(tmp_path):
    """`-i x=digit.png` was "not a .npy file", and a classification's BYTES output "not
    supported by this client": the README's image model could not be used from the CLI (found
    by a helper). Either file given to the other kind of input is refused before it is sent (exit 2):
    a .npy for the image input went to the server, whose 400 was exit 1 (tester t69)."""
    import shutil
    from PIL import Image
    from tests import REPO
    from tests.serving import ServerThread, server_config
    (tmp_path / "models").mkdir()
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt", "digits.om"):
        shutil.copy(REPO / "models" / name, tmp_path / "models" / name)
    x = np.load(REPO / "tests" / "data" / "digits_test.npz")["x"][0]
    Image.fromarray((x.reshape(8, 8) * 255 / 16).astype("uint8")).resize((32, 32)).save(tmp_path / "digit.png")
    np.save(tmp_path / "x.npy", x[None].astype(np.float32))
    with ServerThread(server_config(tmp_path / "models")) as server:
        def infer(*more, model="digits_image", given="x=digit.png"):
            return subprocess.run([sys.executable, "-m", "aclserve", "infer", model, "-i", given,
                                   "--url", f"http://{server.url}", "--json", *more], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)
        scores, top, not_an_image_input = infer(), infer("--classification", "2"), infer(model="digits")
        not_an_image = infer(given="x=x.npy")
    assert not_an_image_input.returncode == 2 and "input x takes FP32 tensors: an image (JPEG, PNG) goes to " \
        "an image input (BYTES)" in not_an_image_input.stderr, not_an_image_input.stderr
    assert not_an_image.returncode == 2 and not_an_image.stderr == (
        "aclserve infer: error: input x takes BYTES (encoded images): give a JPEG or PNG file here; a .npy file "
        "goes to a numeric input\n"), not_an_image.stderr
    assert scores.returncode == 0 and top.returncode == 0, scores.stderr + top.stderr
    y = json.loads(scores.stdout)["y"]
    assert y["shape"] == [1, 10] and y["dtype"] == "float32"
    best = np.argsort(y["data"][0])[::-1][:2]
    classes = json.loads(top.stdout)["y"]
    assert classes["shape"] == [1, 2] and classes["dtype"] == "BYTES"
    assert [c.split(":")[1:] for c in classes["data"][0]] == [[str(i), str(i)] for i in best]


def _infer(url: str, *args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "aclserve", "infer", *args, "--url", url], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_web_server_that_is_not_kserve_is_said_so(tmp_path):
    """`python -m http.server` answers the metadata GET 404 (the infer POST 501) with an HTML page:
    "HTTP 501: <!DOCTYPE HTML>" said nothing of what was wrong (a new user's report)."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    with web_server(tmp_path) as url:
        proc = _infer(url, "m", "-i", "x=x.npy", cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{url} did not answer as a KServe v2 HTTP server: HTTP 404: <!DOCTYPE HTML>" in proc.stderr, proc.stderr


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(tmp_path):
    """urllib followed a 302 to another server and sent it the ACLSERVE_API_TOKEN header (a
    security tester's find): the redirect is reported instead, and nothing reaches its target."""
    import os

    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    with recording_server() as (target, seen):
        elsewhere = f"{target}/v2/models/m"
        with canned_server(redirect_to(elsewhere)) as url:
            proc = _infer(url, "m", "-i", "x=x.npy", cwd=tmp_path, env=dict(os.environ, ACLSERVE_API_TOKEN="s3cret"))
    assert seen == []
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{url} redirects (HTTP 302) to {elsewhere}: not followed" in proc.stderr, proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout


def test_infer_prints_an_output_whole_or_says_that_values_were_elided(tmp_path):
    """A [32, 10] output was printed with "..." in place of most of its values (numpy's
    threshold of 200), without a word: README says it prints the outputs."""
    from tests import REPO
    from tests.serving import ServerThread, server_config
    from tests.tiny_models import compile_cpu_om, double_onnx
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    compile_cpu_om(double_onnx(tmp_path / "double.onnx"), tmp_path / "models" / "double.om", batch="64")
    np.save(tmp_path / "x.npy", np.ones((32, 64), np.float32))
    np.save(tmp_path / "x16.npy", np.arange(64 * 16, dtype=np.float32).reshape(64, 16))
    with ServerThread(server_config(tmp_path / "models", model_control_mode="none")) as server:
        whole = _infer(f"http://{server.url}", "digits", "-i", "x=x.npy", cwd=tmp_path)
        elided = _infer(f"http://{server.url}", "double", "-i", "x=x16.npy", cwd=tmp_path)
    assert whole.returncode == 0 and elided.returncode == 0, whole.stderr + elided.stderr
    head, *values = whole.stdout.splitlines()
    assert head == "y float32 [32, 10]" and "..." not in whole.stdout
    assert len(" ".join(values).replace("[", " ").replace("]", " ").split()) == 320
    assert elided.stdout.splitlines()[0] == ("y float32 [64, 16] (1,024 values: the middle ones elided here; "
                                             "--json prints them all)")
    assert "..." in elided.stdout and elided.stdout.endswith("2.046e+03]]\n")  # (the last value, 2 x 1023)


def _tls_digits_server(tmp_path, **validity):
    """The digits model behind TLS with a certificate for 127.0.0.1 (`validity`: trustme's
    not_before / not_after), an x.npy for it, and the environment trusting its CA:
    (ServerThread, env)."""
    import os
    import trustme
    from tests import REPO
    from tests.serving import ServerThread, server_config
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", **validity)
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    (tmp_path / "cert.pem").write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    np.save(tmp_path / "x.npy", np.ones((1, 64), np.float32))
    env = {**os.environ, "SSL_CERT_FILE": str(tmp_path / "ca.pem")}
    config = server_config(tmp_path / "models", model_control_mode="none", tls_cert_file=str(tmp_path / "cert.pem"),
                           tls_key_file=str(tmp_path / "key.pem"))
    return ServerThread(config), env


def test_a_certificate_for_another_host_is_said_so_not_taken_for_an_untrusted_one(tmp_path):
    """A certificate for 127.0.0.1 met at https://localhost with its CA trusted was "Hostname
    mismatch ... (the server's certificate is not trusted here: SSL_CERT_FILE=<the CA that
    signed it>)": trusting the CA was done, and would not help."""
    server, env = _tls_digits_server(tmp_path)
    with server:
        port = server.url.rsplit(":", 1)[1]
        by_address = _infer(f"https://127.0.0.1:{port}", "digits", "-i", "x=x.npy", cwd=tmp_path, env=env)
        by_name = _infer(f"https://localhost:{port}", "digits", "-i", "x=x.npy", cwd=tmp_path, env=env)
        profiled = subprocess.run([sys.executable, "-m", "aclserve", "profile", "digits", "--url",
                                   f"https://localhost:{port}", "--seconds", "0.5"], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=120)
    assert by_address.returncode == 0, by_address.stderr
    said = "(the server's certificate does not name localhost, the host in the URL: use a host name or address it " \
           "was issued for)"
    for proc in (by_name, profiled):
        assert proc.returncode == 1 and proc.stderr.rstrip("\n").endswith(said), proc.stderr
        assert "not trusted" not in proc.stderr


def test_an_expired_server_certificate_is_said_so(tmp_path):
    """An expired certificate, its CA trusted, was "certificate has expired ... (the server's
    certificate is not trusted here: SSL_CERT_FILE=<the CA that signed it>)": that was done."""
    import datetime
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    server, env = _tls_digits_server(tmp_path, not_before=past, not_after=past + datetime.timedelta(days=1))
    with server:
        proc = _infer(f"https://{server.url}", "digits", "-i", "x=x.npy", cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "certificate has expired" in proc.stderr, proc.stderr
    assert proc.stderr.rstrip("\n").endswith("(the server's certificate is outside its dates of validity: the server "
                                             "needs a current one, or this machine's clock is wrong)"), proc.stderr


def test_infer_takes_an_input_whose_name_holds_an_equals_sign(tmp_path):
    """`-i "a=b=/path/e.npy"` was split at the first '=': input "a" from file "b=/path/e.npy". The
    model's input names (its metadata) say where NAME ends; the first '=' otherwise."""
    from onnx import TensorProto, helper, numpy_helper
    from tests.serving import ServerThread, server_config
    from tests.tiny_models import compile_cpu_om, save_graph
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Mul", ["a=b", "two"], ["y"]), helper.make_node("Neg", ["c"], ["z"])],
                              "equals", [vi("a=b", TensorProto.FLOAT, ["N", 4]), vi("c", TensorProto.FLOAT, ["N", 4])],
                              [vi("y", TensorProto.FLOAT, ["N", 4]), vi("z", TensorProto.FLOAT, ["N", 4])],
                              [numpy_helper.from_array(np.array(2, np.float32), "two")])
    (tmp_path / "models").mkdir()
    compile_cpu_om(save_graph(graph, tmp_path / "equals.onnx"), tmp_path / "models" / "equals.om")
    np.save(tmp_path / "e.npy", np.arange(4, dtype=np.float32).reshape(1, 4))
    np.save(tmp_path / "c=.npy", np.ones((1, 4), np.float32))  # (a file holding "=" after a name that holds none)
    with ServerThread(server_config(tmp_path / "models")) as server:
        proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "equals", "-i", f"a=b={tmp_path / 'e.npy'}",
                               "-i", "c=c=.npy", "--url", f"http://{server.url}", "--json"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    outputs = json.loads(proc.stdout)
    assert outputs["y"]["data"] == [[0.0, 2.0, 4.0, 6.0]] and outputs["z"]["data"] == [[-1.0] * 4], outputs


def test_an_input_the_model_does_not_take_is_bad_input(tmp_path):
    """`-i z=x.npy` for a model of input x went to the server, whose 400 was "a server's error"
    (exit 1): the metadata read first names the inputs, so it is bad input (exit 2), in the server's words."""
    from tests import REPO
    from tests.serving import ServerThread, server_config
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    with ServerThread(server_config(tmp_path / "models")) as server:
        unknown = _infer(f"http://{server.url}", "digits", "-i", "z=x.npy", cwd=tmp_path)
        known = _infer(f"http://{server.url}", "digits", "-i", "x=x.npy", "--json", cwd=tmp_path)
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr.strip() == "aclserve infer: error: unknown input 'z' (model inputs: 'x')", unknown.stderr
    assert known.returncode == 0 and json.loads(known.stdout)["y"]["shape"] == [1, 10], known.stderr


@pytest.mark.parametrize("version", ["abc", "0", "-1", "1" * 19, "١"])
def test_a_version_no_model_can_have_is_refused_before_anything_is_sent(tmp_path, version):
    """`--version abc` went to the server, whose 400 was exit 1 (a server's error); it is the
    command line's, exit 2, as other bad arguments are (a tester, t86). Nothing listens at the URL."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--version", version,
                           "--url", "http://127.0.0.1:1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--version must be a positive integer of at most 18 digits" in proc.stderr, \
        proc.stderr


@pytest.mark.parametrize("args, said", [
    (("--priority", "-1"), "--priority must be a level from 1 (the highest), or 0 for the model's default, at most "
                           "18446744073709551615 (a uint64), got -1"),
    (("--priority", str(2**64)), "--priority must be a level from 1 (the highest), or 0 for the model's default, at "
                                 "most 18446744073709551615 (a uint64), got 18446744073709551616"),
    # (it went on, read past 64 bits as a float, for the server's untrue "must be a non-negative integer")
    (("--classification", "99999999999999999999"), "--classification must be a number of classes from 1 to 65,536, "
                                                   "the most class strings an answer holds, got 99999999999999999999"),
    (("--classification", "0"), "--classification must be a number of classes from 1 to 65,536"),
])
def test_a_priority_or_classification_the_server_refuses_is_refused_before_anything_is_sent(tmp_path, args, said):
    """`--priority -1` was refused by the server alone, exit 1 (a server's error), where the other
    arguments' mistakes are the command line's, exit 2 (a tester, t92). Nothing listens at the URL."""
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", *args,
                           "--url", "http://127.0.0.1:1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(f"aclserve infer: error: {said}"), proc.stderr


@pytest.mark.parametrize("target, said", [(("nomodel",), "HTTP 404: unknown model 'nomodel'"),
                                          (("digits", "--version", "7"), "HTTP 404: model digits has no version 7")])
def test_a_refused_metadata_request_is_the_answer_and_nothing_is_sent_after_it(tmp_path, caplog, target, said):
    """A metadata request the server refused (404 here; 503 for a model loading) was taken for "no
    metadata": the checks it feeds were skipped (a picture for a numeric input) and the inference
    sent anyway, for the server's reading of it (a tester, t86). The refusal ends the command."""
    import logging
    from PIL import Image
    from tests import REPO
    from tests.serving import ServerThread, server_config
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    Image.new("L", (8, 8)).save(tmp_path / "digit.png")
    with ServerThread(server_config(tmp_path / "models", request_log=True)) as server:
        proc = _infer(f"http://{server.url}", *target, "-i", "x=digit.png", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == f"aclserve infer: error: {said}\n", proc.stderr
    assert [r for r in caplog.records if r.name == "aclserve.requests"] == []  # (no inference request came)


def test_bool_bytes_other_than_0_and_1_are_refused_before_anything_is_sent(tmp_path, caplog):
    """A BOOL .npy of uint8 data holding a 2 went to the server, whose 400 was exit 1 (a server's
    error), where Engine refuses it locally: it is bad input (exit 2), in the same words, unsent (i211)."""
    import logging
    from tests.serving import ServerThread, server_config
    from tests.tiny_models import compile_cpu_om, kinds_onnx
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    (tmp_path / "models").mkdir()
    compile_cpu_om(kinds_onnx(tmp_path / "kinds.onnx"), tmp_path / "models" / "kinds.om")
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    np.save(tmp_path / "b.npy", np.array([[0, 1, 2]], np.uint8).view(bool))
    with ServerThread(server_config(tmp_path / "models", request_log=True)) as server:
        proc = _infer(f"http://{server.url}", "kinds", "-i", "x=x.npy", "-i", "b=b.npy", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "aclserve infer: error: input 'b': BOOL elements must be the bytes 0 or 1\n", proc.stderr
    assert [r for r in caplog.records if r.name == "aclserve.requests"] == []  # (no inference request came)
