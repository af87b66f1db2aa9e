"""`aclserve profile --url` runs cut short: a Ctrl-C, SIGTERM with SIGINT ignored, the server killed
mid-run, a --trace-dir that is not the server's trace folder, a run over before its clients started
(in-process too), requests still in flight a drain past the run's end. Each ends in one line (or
none) and its exit status, leaves the server's trace settings as they were and no trace file in
its folder, and no profile running on."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.processes import leashed_popen
from tests.serving import ServerThread, free_port, server_config
from tests.test_cli_profile import _answered, _get, _models, _profile, _small_queue_server

POLLS = 1500  # of a test's wait for a running profile: 30 s and more, a bound under the suite's 120 s hang guard


def _until(condition, what: str, profile: subprocess.Popen) -> None:
    """Poll `condition` while the profile runs, at most POLLS times: a wait without bound let the
    hang guard end the worker (os._exit) with the profile still running, orphaned."""
    for _ in range(POLLS):
        if condition():
            return
        assert profile.poll() is None, profile.communicate()
        time.sleep(0.02)
    pytest.fail(f"{what}: not seen in {POLLS} polls of the running profile")


def _tracing(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/v2/models/digits/trace/setting", timeout=10) as resp:
        return json.load(resp)["trace_level"] == ["TIMESTAMPS"]


def test_url_interrupted_while_tracing_turns_tracing_off_and_removes_the_server_s_file(tmp_path):
    """A Ctrl-C during the run put the settings back but left profile-MODEL.json (its traces so
    far, tens of MB) in the server's trace folder, where each later failed run appended to it."""
    traces = tmp_path / "traces"
    with ServerThread(server_config(_models(tmp_path), model_control_mode="none", trace_dir=str(traces))) as server:
        before = _get(server, "/v2/models/digits/trace/setting")
        # (--seconds: the run is interrupted long before; what an orphan of a failed test would outlive it by)
        proc = subprocess.Popen([sys.executable, "-m", "aclserve", "profile", "digits", "--url", f"http://{server.url}",
                                 "--trace-dir", "traces", "--seconds", "60", "--clients", "2", "--trace", "out.json"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _until(lambda: _tracing(f"http://{server.url}"), "tracing on", proc)
            # the warm-up's requests were all answered before tracing went on: one more is a traced one
            answered = _answered(server)
            _until(lambda: _answered(server) > answered, "a traced request answered", proc)
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert _get(server, "/v2/models/digits/trace/setting") == before  # off, and the model's own settings back
    # (the server closed: whatever it still held for the file is written by now)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert os.listdir(traces) == [] and not (tmp_path / "out.json").exists()


def test_url_with_a_trace_dir_that_does_not_exist_stops_before_anything_is_traced(tmp_path):
    """It ran the whole load, waited 30 s for the file and left it in the server's own folder."""
    traces = tmp_path / "traces"
    with ServerThread(server_config(_models(tmp_path), model_control_mode="none", trace_dir=str(traces))) as server:
        before = _get(server, "/v2/models/digits/trace/setting")
        proc = _profile("digits", "--url", f"http://{server.url}", "--trace-dir", "elsewhere", "--seconds", "1",
                        cwd=tmp_path)
        assert _get(server, "/v2/models/digits/trace/setting") == before
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == ("aclserve profile: error: --trace-dir elsewhere: no such folder here; it must be the "
                           "server's trace folder (its trace_dir), as seen from this machine\n")
    assert os.listdir(traces) == []


@pytest.mark.parametrize("remote", [True, False])
def test_a_run_over_before_its_clients_started_says_so_not_the_trace_folder(tmp_path, remote):
    """`--clients 100000 --seconds 1` sent nothing: starting the clients outlasted the run (a tester,
    t92). With --url the server then traced nothing, and the command waited 30 s for its trace and
    blamed --trace-dir, exit 2; in-process it said "no request was answered". Here by construction:
    a run of 1e-300 s ends where it starts, before any client does."""
    traces = tmp_path / "traces"
    args = ["--seconds", "1e-300", "--clients", "3", "--trace", "out.json"]
    if remote:
        with ServerThread(server_config(_models(tmp_path), model_control_mode="none", trace_dir=str(traces))) as server:
            before = _get(server, "/v2/models/digits/trace/setting")
            proc = _profile("digits", "--url", f"http://{server.url}", "--trace-dir", "traces", *args, cwd=tmp_path)
            assert _get(server, "/v2/models/digits/trace/setting") == before
        assert os.listdir(traces) == []
    else:
        _models(tmp_path)
        proc = _profile("digits", "--models", "models", *args, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout.startswith("digits: 0 requests answered in "), proc.stderr
    assert proc.stderr == ("aclserve profile: error: no request was sent: the run's 1e-300 s (--seconds) were over "
                           "before any of its 3 clients had started; give fewer --clients or more --seconds\n")


def test_url_whose_server_is_killed_mid_run_ends_at_once_in_one_line(tmp_path):
    """Every request was refused at once (ClientConnectorError), counted, and the closed loop spun
    through the rest of --seconds: an orphaned profile used 63 % of a core for 6 minutes. Nothing
    is asked of the server gone (tracing off, its settings back: a second error). The line says
    the run's answers with the warm-up's apart, as the summary line does (its count was both)."""
    _models(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    with open(tmp_path / "serve.log", "wb") as log:
        server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", "models", "--port",
                                url.rsplit(":", 1)[1], "--grpc-port", "0", "--device", "cpu",
                                "--model-control-mode", "none"], cwd=tmp_path, stdout=log, stderr=log)
    profile = None
    try:
        _until_serving(url, server, tmp_path / "serve.log")
        # --seconds 120: the old code ran them all, past the guard below
        profile = subprocess.Popen([sys.executable, "-m", "aclserve", "profile", "digits", "--url", url, "--seconds",
                                    "120", "--clients", "2", "--trace", "out.json"],
                                   cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _until(lambda: _tracing(url), "tracing on", profile)
        warmed = _successes(url)  # the warm-up's answers at most: tracing comes on once it is over
        _until(lambda: _successes(url) > warmed + 10, "requests of the run answered", profile)
        counted = _successes(url)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=60)
        _, stderr = profile.communicate(timeout=60)  # (a hang guard)
    finally:
        for proc in filter(None, (profile, server)):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert profile.returncode == 1 and "Traceback" not in stderr, stderr
    said = re.fullmatch(rf"aclserve profile: error: the server at {re.escape(url)} stopped answering \(connection "
                        r"refused\) after ([\d,]+) requests? answered \(after ([\d,]+)(?: answered and [\d,]+ "
                        r"refused)? in a [\d.]+ s warm-up, not counted\)\n", stderr)
    assert said, stderr
    run, warm = (int(figure.replace(",", "")) for figure in said.groups())
    # (an answer the server counted as it was killed may not have reached its client: one a client at most)
    assert 1 <= warm <= warmed and run + warm >= counted - 2, (run, warm, warmed, counted)
    assert not (tmp_path / "out.json").exists()


def _successes(url: str) -> int:
    with urllib.request.urlopen(f"{url}/v2/models/digits/stats", timeout=10) as resp:
        return json.load(resp)["model_stats"][0]["inference_stats"]["success"]["count"]


def _until_serving(url: str, server: subprocess.Popen, log) -> None:
    for _ in range(POLLS):
        try:
            with urllib.request.urlopen(f"{url}/v2/models/digits/ready", timeout=10) as resp:
                if resp.status == 200:
                    return
        except OSError:  # (not listening yet; the model not ready: 400)
            pass
        assert server.poll() is None, log.read_text()
        time.sleep(0.02)
    pytest.fail(f"the server did not get ready: {log.read_text()}")


def test_url_ended_by_sigterm_with_sigint_ignored_exits_143_having_turned_tracing_off(tmp_path):
    """SIGINT ignored, as in a background job of a script (`bash -c 'aclserve profile ... &'`):
    SIGTERM's handler raised KeyboardInterrupt inside whatever loop callback ran. Python dropped
    one raised in a weakref callback (an "Exception ignored in" line) and the run went on through
    its --seconds; elsewhere it was tracebacks, or a hang in asyncio.run's cancelling of the tasks
    left. One that found the loop asleep in select() went well, so three runs: one run in two
    failed (64 clients against a server whose 503s come back at once keep the profile's loop busy)."""
    traces = tmp_path / "traces"
    with _small_queue_server(tmp_path) as server:
        before = _get(server, "/v2/models/digits/trace/setting")
        for _ in range(3):
            _profile_ended_by_sigterm_with_sigint_ignored(server, tmp_path)
            assert _get(server, "/v2/models/digits/trace/setting") == before
            assert os.listdir(traces) == [] and not (tmp_path / "out.json").exists()


def _profile_ended_by_sigterm_with_sigint_ignored(server, tmp_path) -> None:
    """A profile --url, SIGTERM once tracing is on and a traced request answered: 143, nothing said."""
    proc = subprocess.Popen([sys.executable, "-m", "aclserve", "profile", "digits", "--url", f"http://{server.url}",
                             "--trace-dir", "traces", "--seconds", "60", "--clients", "64", "--trace", "out.json"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _until(lambda: _tracing(f"http://{server.url}"), "tracing on", proc)
        answered = _answered(server)
        _until(lambda: _answered(server) > answered, "a traced request answered", proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)  # (a hang guard)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM and stderr == "", stderr


def test_requests_still_in_flight_a_drain_past_the_run_s_end_are_cut_and_said(tmp_path):
    """A run waited for every request in flight at its end: 100,000 clients' last requests queued at
    a server answering some thousands a second made a run of 10 s last 33 s (a tester). Those still
    in flight DRAIN_S past it are cancelled and said, here a server at a standstill's: the warm-up's
    and the run's, every client's (without the drain each waited for --timeout, a refusal then). The
    run's seconds are the clients' time to start, not a timing asserted. The trace settings asked
    for after the run, refused once each, are tried again."""
    from tests.canned_server import stalling_kserve_server
    traces = tmp_path / "traces"
    traces.mkdir()
    with stalling_kserve_server(traces) as (url, infers, settings):
        proc = _profile("digits", "--url", url, "--trace-dir", "traces", "--seconds", "2", "--clients", "3",
                        "--timeout", "20", "--trace", "out.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("digits: 0 requests answered in "), proc.stdout
    assert "(0 req/s; after 1 answered and 3 cut in a " in proc.stdout, proc.stdout
    assert "\ncut: 3 requests still in flight 1 s past the run's 2 s (--seconds) were cancelled, counted neither " \
           "answered nor refused (the rate counts the answers of those 1 s, over the time to the last of them)\n" \
           in proc.stdout, proc.stdout
    assert "\nrefused:" not in proc.stdout, proc.stdout
    assert proc.stderr == ("aclserve profile: error: no request was answered within the run's 2 s (--seconds) and "
                           "1 s past it, and 3 in flight then were cancelled; give more --seconds or fewer --clients\n")
    assert len(infers) == 1 + 3 + 3  # (the first alone, answered; the warm-up's and the run's, each client's one)
    assert os.listdir(traces) == []  # (read back and removed)
    # refused once each after the run, as a server at max_connections refuses the cut requests' successors
    # (it broke off the exchange): tried again, tracing is turned off and the settings put back
    assert settings[-4:] == [{"trace_level": ["OFF"]}] * 2 + [settings[0]] * 2, settings


def test_url_a_run_cut_short_rates_and_summarises_the_requests_it_counts_alone(tmp_path, clean_faults):
    """A real server whose model stalls a moment into the run (an execute held): the requests in
    flight then are cut a drain past the run's end. Its rate counted the drain's whole second, in
    which nothing came back (the answers over --seconds + 1 s), and its trace summary the requests cut,
    which the server ran once its execute was let go, their clients gone. Now the window ends at the
    run's end (no answer came later) and the summary covers the answered requests alone, as many as the
    first line counts."""
    import threading

    from aclserve.acl.cpu import faults
    traces, gate = tmp_path / "traces", threading.Event()
    # (an execution timeout past the run: the held execute would fail its batch, 503, and no request be cut)
    config = server_config(_models(tmp_path), model_control_mode="none", trace_dir=str(traces),
                           model_defaults={"execution_timeout_ms": 120_000})
    with ServerThread(config) as server:
        url = f"http://{server.url}"
        proc = subprocess.Popen([sys.executable, "-m", "aclserve", "profile", "digits", "--url", url, "--trace-dir",
                                 "traces", "--seconds", "5", "--clients", "2", "--trace", "out.json"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _until(lambda: _tracing(url), "tracing on", proc)
            faults.inject("execute", nth=3, hold=gate)  # (two executes of the run answered, then a standstill)
            _until(lambda: not _tracing(url), "tracing off after the cut", proc)
            gate.set()  # the requests cut run now: the server writes their traces with the others'
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            gate.set()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    first = re.match(r"digits: ([\d,]+) requests? answered in ([\d.]+) s \(([\d,]+) req/s; ", stdout)
    assert first, stdout
    answered = int(first[1].replace(",", ""))
    assert answered >= 1 and first[2] == "5.0", stdout  # (the run's seconds: not 6.0, its drain's second with them)
    assert re.search(r"^cut: [12] requests? still in flight 1 s past the run's 5 s \(--seconds\) (were|was) cancelled, "
                     r"counted neither answered nor refused \(the rate counts the answers of those 1 s, over the "
                     r"time to the last of them\)$", stdout, re.M), stdout
    assert re.search(rf"^{answered:,} traced requests over [\d.]+ s$", stdout, re.M), stdout
    assert os.listdir(traces) == []
