"""tools/open_loop.py, the open-loop load of bench_overload.py: against the real server, it
counts each answer by status and the 200s' latency, whatever the server says."""
from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys

import pytest

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import open_loop  # noqa: E402

ONE_ROW = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                                 {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1] * 3}]}).encode()


def run(url: str, path: str, rate: float) -> dict:
    return asyncio.run(open_loop.run(f"http://{url}{path}", ONE_ROW, rate, seconds=1.0, warmup=0.2,
                                     headers=["Content-Type: application/json"], max_conns=50, timeout=5.0))


def test_answers_are_counted_by_status(server):
    served = run(server.url, "/v2/models/affine/infer", 100)
    assert served["per_s"].get("200", 0) > 0 and set(served["per_s"]) == {"200"}
    assert served["ok_per_s"] == served["per_s"]["200"]
    assert 0 < served["p50_ms"] <= served["p99_ms"]
    missing = run(server.url, "/v2/models/nope/infer", 100)
    assert missing["per_s"].get("404", 0) > 0 and missing["ok_per_s"] == 0


def test_a_connection_the_server_closed_while_idle_frees_its_place_and_the_query_is_sent():
    """A kept connection the server then closed was dropped from the idle ones but still counted
    open, so past --max-conns such closes every later request found "no connection"; and the URL's query
    was left out of the request line (a tester). The server here answers each request on a
    connection of its own, keep-alive said, then closes it."""
    targets = []

    async def scenario():
        async def answer_once(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            targets.append(head.split(b" ")[1])
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await open_loop.run(f"http://127.0.0.1:{port}/v2/models/m/infer?x=1", ONE_ROW, 20, seconds=1.0,
                                       warmup=0.2, headers=[], max_conns=4, timeout=5.0)
    counted = asyncio.run(scenario())
    assert set(counted["per_s"]) == {"200"}, counted
    assert set(targets) == {b"/v2/models/m/infer?x=1"}, targets


def open_loop_tool(url: str, body_file, *options: str) -> subprocess.CompletedProcess:
    """tools/open_loop.py run as bench_overload.py runs it (a process of its own: it installs uvloop)."""
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "open_loop.py"), url, str(body_file), *options],
                          capture_output=True, text=True, timeout=60)  # (a hang guard: --rate -5 looped for ever)


def test_options_it_cannot_run_are_refused_in_one_line(tmp_path):
    """A rate of -5 looped for ever creating tasks, a rate or a window of 0 ended in a
    ZeroDivisionError traceback (an independent tester)."""
    body = tmp_path / "body.json"
    body.write_bytes(ONE_ROW)
    for option, value in (("--rate", "-5"), ("--rate", "0"), ("--seconds", "0"), ("--warmup", "-1"),
                          ("--timeout", "0"), ("--max-conns", "0")):
        options = {"--rate": "100", "--seconds": "0.2", option: value}
        ran = open_loop_tool("http://127.0.0.1:9/v2/models/affine/infer", body, *sum(options.items(), ()))
        assert ran.returncode == 2 and f"error: argument {option}: " in ran.stderr, (option, value, ran.stderr)
        assert "Traceback" not in ran.stderr and ran.stdout == "", (option, value, ran.stderr)


def test_no_answer_is_no_figure_and_fails_the_run(tmp_path):
    """With nothing listening it printed ok_per_s 0.0, p50_ms 0.0, p99_ms 0.0 and exited 0: a
    latency of no answer is null, and a window without one 200 exits 1, saying why."""
    body = tmp_path / "body.json"
    body.write_bytes(ONE_ROW)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed: nothing listens there)
    ran = open_loop_tool(f"http://127.0.0.1:{port}/v2/models/affine/infer", body, "--rate", "50", "--seconds", "0.3",
                         "--warmup", "0")
    assert ran.returncode == 1, ran.stderr
    printed = json.loads(ran.stdout)
    assert printed["ok_per_s"] == 0 and printed["p50_ms"] is None and printed["p99_ms"] is None, printed
    assert printed["per_s"].get("connect error", 0) > 0, printed
    assert "no request of the window was answered 200" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr


def test_a_host_no_resolver_takes_is_a_connect_error_as_an_unknown_one(tmp_path):
    """The resolver's idna encoding refuses an empty label with a UnicodeError, not an OSError:
    each request's task ended in a traceback, "Task exception was never retrieved" (a tester, t92)."""
    body = tmp_path / "body.json"
    body.write_bytes(ONE_ROW)
    ran = open_loop_tool("http://a..b:9/v2/models/affine/infer", body, "--rate", "50", "--seconds", "0.3",
                         "--warmup", "0")
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert json.loads(ran.stdout)["per_s"].get("connect error", 0) > 0, ran.stdout


def test_a_url_or_a_header_it_cannot_send_is_refused_in_one_line(tmp_path):
    """A URL with no host printed "Task exception was never retrieved" and a traceback for every
    request (794 lines in 1 s at 10/s), then exited 1; an https:// URL was sent plain HTTP; a
    header without its colon was sent as given, and every answer was 400 (a tester, t80)."""
    body = tmp_path / "body.json"
    body.write_bytes(ONE_ROW)
    for url, options, option in (("notaurl", [], "url"), ("http:///v2/models/affine/infer", [], "url"),
                                 ("https://127.0.0.1:9/v2/models/affine/infer", [], "url"),
                                 ("http://127.0.0.1:9/v2/models/affine/infer", ["--header", "no colon"], "--header")):
        ran = open_loop_tool(url, body, "--rate", "10", "--seconds", "1", "--warmup", "0", *options)
        assert ran.returncode == 2 and f"error: argument {option}: " in ran.stderr, (url, options, ran.stderr)
        assert ran.stderr.startswith("usage: ") and ran.stderr.count("error") == 1, ran.stderr  # (argparse's, alone)
        assert "Traceback" not in ran.stderr and ran.stdout == "", ran.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interruption_ends_it_in_one_line(signum, tmp_path):
    """Ctrl-C printed a KeyboardInterrupt traceback; a SIGTERM ended it by its default action, in
    silence. Now both give up the requests in flight, close their connections and end it with one
    line, exit status 130. Its server here holds every request unanswered."""
    body = tmp_path / "body.json"
    body.write_bytes(ONE_ROW)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v2/models/affine/infer"
        # (-W: a connection left open is a ResourceWarning on stderr)
        tool = subprocess.Popen([sys.executable, "-W", "always::ResourceWarning",
                                 os.path.join(REPO, "tools", "open_loop.py"), url, str(body),
                                 "--rate", "20", "--seconds", "120", "--timeout", "120"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert select.select([listener], [], [], 120)[0], "the tool never connected"  # (a hang guard)
            with listener.accept()[0]:  # (held unanswered)
                tool.send_signal(signum)
                out, err = tool.communicate(timeout=60)
        finally:
            tool.kill()
    assert (tool.returncode, out, err) == (130, "", "open_loop: interrupted; its connections closed\n")
