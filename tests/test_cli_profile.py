"""`aclserve profile` against what it meets: more clients than the queue holds, refusals, servers
that hang or are not KServe, trace files it cannot read, outputs it cannot write."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from aclserve.cli.profile import _body
from aclserve.cli.profile_remote import TraceUnreadable, read_trace
from aclserve.cli.usage import UsageError
from tests import REPO
from tests.canned_server import canned_server, recording_server, redirect_to, web_server
from tests.serving import ServerThread, server_config


def _profile(*args, cwd, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "aclserve", "profile", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=timeout)


def _models(tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    return tmp_path / "models"


def _answered_and_rate(stdout: str) -> tuple[int, float]:
    """(answers, the printed rate over answers / the printed seconds): 1 give or take the
    seconds' rounding to a tenth (a run of 1.04 s printed as 1.0 reads 0.96)."""
    m = re.search(r"digits: ([\d,]+) requests? answered in ([\d.]+) s \(([\d,]+) req/s[;)]", stdout)
    assert m, stdout
    answered = int(m.group(1).replace(",", ""))
    return answered, float(m.group(3).replace(",", "")) / (answered / float(m.group(2)) or 1)


def test_more_clients_than_the_queue_holds_are_counted_as_refused_in_process(tmp_path):
    """Each client's QueueFull ended the run with a traceback after the warm-up."""
    _models(tmp_path)
    proc = _profile("digits", "--seconds", "1", "--clients", "400", "--models", "models", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(r"^refused: [\d,]+ \(QueueFull\)$", proc.stdout, re.M), proc.stdout
    assert "verdict" in proc.stdout


def _small_queue_server(tmp_path):
    batching = {"max_batch_size": 1, "default_queue_policy": {"max_queue_size": 1}}
    return ServerThread(server_config(_models(tmp_path), model_control_mode="none", trace_dir=str(tmp_path / "traces"),
                                      model_defaults={"batching": batching}))


def _get(server, path: str) -> dict:
    with urllib.request.urlopen(f"http://{server.url}{path}", timeout=10) as resp:
        return json.load(resp)


def _answered(server) -> int:
    return _get(server, "/v2/models/digits/stats")["model_stats"][0]["inference_stats"]["success"]["count"]


def test_url_counts_what_the_server_refused_and_rates_the_answered_only(tmp_path):
    """Refused requests (503: the queue was full) were counted as served: "10748 requests ...
    5,374 req/s" while the server failed 12,928 of them. The server's trace file is one name per
    model (a name per run used up the server's 1,024 names), removed once read; a stale one from an
    earlier run is not taken for this run's."""
    (tmp_path / "traces").mkdir()
    stale = tmp_path / "traces" / "profile-digits.json"
    stale.write_text("[]")
    with _small_queue_server(tmp_path) as server:
        proc = _profile("digits", "--url", f"http://{server.url}", "--trace-dir", "traces", "--seconds", "1",
                        "--clients", "32", "--trace", "out.json", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(r"^refused: [\d,]+ \(HTTP 503\)$", proc.stdout, re.M), proc.stdout
    answered, rate_over_answered = _answered_and_rate(proc.stdout)
    assert answered > 0 and rate_over_answered == pytest.approx(1.0, rel=0.1)  # (over all: 2 x and more)
    assert re.search(r"^[\d,]+ traced requests over [\d.]+ s \([\d,]+ more failed: left out of the figures below\)$",
                     proc.stdout, re.M), proc.stdout  # (their microseconds were averaged in)
    assert os.listdir(tmp_path / "traces") == []
    assert (tmp_path / "out.json").stat().st_size > 100


def test_url_says_the_warm_up_s_requests_beside_the_run_s_so_they_add_up_to_the_server_s(tmp_path):
    """The first line left out the untraced warm-up before the run (min(1 s, --seconds / 5)): an
    operator comparing it with the server's counts found a quarter more answered there (an
    independent tester's find). Now the warm-up's count is beside the run's, its first request
    included, and the two add up to what the server's statistics counted."""
    with ServerThread(server_config(_models(tmp_path), model_control_mode="none",
                                    trace_dir=str(tmp_path / "traces"))) as server:
        proc = _profile("digits", "--url", f"http://{server.url}", "--trace-dir", "traces", "--seconds", "1",
                        "--clients", "4", "--trace", "out.json", cwd=tmp_path)
        counted = _answered(server)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"^digits: ([\d,]+) requests? answered in [\d.]+ s \([\d,]+ req/s; after ([\d,]+) in a [\d.]+ s "
                  r"warm-up, not counted\), 4 clients", proc.stdout, re.M)
    assert m, proc.stdout
    run, warm = (int(n.replace(",", "")) for n in m.groups())
    assert warm > 1 and run + warm == counted, (run, warm, counted)


def test_url_opens_a_connection_for_each_client(tmp_path):
    """aiohttp's default connector limit held --clients 300 to 100 connections, silently."""
    peak = 0.0
    with ServerThread(server_config(_models(tmp_path), model_control_mode="none",
                                    trace_dir=str(tmp_path / "traces"))) as server:
        proc = subprocess.Popen([sys.executable, "-m", "aclserve", "profile", "digits", "--url", f"http://{server.url}",
                                 "--trace-dir", "traces", "--seconds", "2", "--clients", "150", "--trace", "out.json"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while proc.poll() is None:  # sampled for as long as the run lasts, however slow the machine
                metrics = urllib.request.urlopen(f"http://{server.url}/metrics", timeout=10).read()
                open_now = re.search(rb'^aclserve_connections\{transport="http"\} ([0-9.]+)', metrics, re.M)
                peak = max(peak, float(open_now.group(1)))
                time.sleep(0.05)
            _, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, stderr
    assert peak > 140, peak


def test_url_refuses_rows_past_the_model_s_max_batch_size_before_the_run(tmp_path):
    with ServerThread(server_config(_models(tmp_path), model_control_mode="none")) as server:
        proc = _profile("digits", "--url", f"http://{server.url}", "--rows", "100000", "--seconds", "1",
                        cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--rows 100000 exceeds the model's max_batch_size, " in proc.stderr, proc.stderr


def _http(body: bytes, content_type: str) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (content_type.encode(), len(body)) + body)


@pytest.mark.parametrize("reply, said", [
    (None, "no answer from {url} within 1 s (--timeout)"),  # (300 s, then a TimeoutError traceback)
    (b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\r\n\r\n", "{url} did not answer as a KServe v2 HTTP server: "
                                                      "Bad status line, not HTTP/1.1 (an HTTP/2 or gRPC port?)"),
    (_http(b"<html>hi</html>", "text/html"), "{url} did not answer as a KServe v2 HTTP server: its model "
                                             "metadata is not JSON"),
    (_http(b'{"inputs": 5}', "application/json"), "{url} did not answer as a KServe v2 HTTP server: its model "
                                                  "metadata has no list of inputs"),
    # (JSON nested past Python's stack: a RecursionError traceback)
    (_http(b"[" * 100_000 + b"]" * 100_000, "application/json"), "{url} did not answer as a KServe v2 HTTP server: "
                                                                 "its model metadata is not JSON"),
], ids=["hangs", "grpc-port", "html", "json-without-inputs", "json-nested-deeply"])
def test_url_that_hangs_or_is_not_kserve_is_one_line(tmp_path, reply, said):
    with canned_server(reply) as url:  # (the hang guard: a hung server held it 300 s)
        proc = _profile("digits", "--url", url, "--seconds", "1", "--timeout", "1", cwd=tmp_path, timeout=60)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert said.format(url=url) in proc.stderr, proc.stderr


@pytest.mark.parametrize("content, said", [
    (b"", "is not JSON"),
    (b"[]", "is not a Chrome trace (no traceEvents list)"),  # (Triton's format)
    (b'{"traceEvents": {"a": 1}}', "is not a Chrome trace (no traceEvents list)"),
    (b'{"traceEvents": [{"ph": "X"}]}', "event 0: a span needs name, ts, dur, pid and tid"),
    (b'{"traceEvents": [5]}', "event 0 is not an object"),
    (b'{"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": "x"}]}',
     "event 0: args is not an object"),
    (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}', "needs pid, tid and args.name"),
], ids=["empty", "triton-list", "events-dict", "span-missing-keys", "event-not-dict", "args-not-dict",
        "metadata-without-name"])
def test_a_malformed_trace_file_read_back_is_one_line_naming_it(tmp_path, content, said):
    """orjson, KeyError, TypeError and AttributeError tracebacks after the run."""
    path = tmp_path / "profile-m.json"
    path.write_bytes(content)
    with pytest.raises(TraceUnreadable, match=re.escape(said)) as raised:
        read_trace(str(path))
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_outputs_that_cannot_be_written_are_refused_before_the_run(tmp_path):
    """Both were a traceback after the whole run (its results lost)."""
    _models(tmp_path)
    proc = _profile("digits", "--seconds", "0.3", "--models", "models", "--trace", "/proc/x.json", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write /proc/x.json" in proc.stderr and "verdict" not in proc.stdout
    (tmp_path / "nompl" / "matplotlib").mkdir(parents=True)
    (tmp_path / "nompl" / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib (test)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "nompl"),
                                                                     os.environ.get("PYTHONPATH")]))}
    proc = _profile("digits", "--seconds", "0.3", "--models", "models", "--png", "t.png", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--png needs matplotlib: pip install -e '.[plot]'" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["models", "nompl"]  # (the check's files removed again)


def test_outputs_into_the_models_folder_or_over_a_model_are_refused(tmp_path):
    """`--trace srv/digits.om --models srv` wrote the trace over the model it profiled (tester t51);
    --png given the trace's path drew the timeline over the trace file."""
    models = _models(tmp_path)
    (tmp_path / "other.onnx").write_bytes((REPO / "models" / "digits.onnx").read_bytes())
    cases = [(("--trace", "models/digits.om"), "--trace models/digits.om is inside the models folder models"),
             (("--png", "models/t.png"), "--png models/t.png is inside the models folder models"),
             (("--trace", "other.onnx"), "--trace other.onnx is a model file"),
             (("--trace", "t.json", "--png", "./t.json"), "--png ./t.json is --trace t.json: give the timeline"),
             (("--png", "profile-digits.json"), "--png profile-digits.json is the trace's default path")]
    for args, said in cases:
        proc = _profile("digits", "--seconds", "0.3", "--models", "models", *args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert said in proc.stderr, proc.stderr
    proc = _profile("digits", "--seconds", "0.3", "--models", ".", cwd=models)  # (its default trace path there)
    assert proc.returncode == 2 and "the trace's default path, profile-digits.json, is inside" in proc.stderr
    assert (models / "digits.om").read_bytes() == (REPO / "models" / "digits.om").read_bytes()
    assert sorted(os.listdir(models)) == ["digits.om"]


def test_in_process_loads_the_model_profiled_alone(tmp_path):
    """Every model of the folder was loaded (an .onnx compiled) and warmed up to profile one: here a
    broken.om beside it was tried, its failed load said on stderr (tester t51)."""
    models = _models(tmp_path)
    (models / "broken.om").write_bytes(b"not an OM " * 100)
    proc = _profile("digits", "--seconds", "0.3", "--models", "models", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "requests answered" in proc.stdout
    nomodel = _profile("nomodel", "--seconds", "0.3", "--models", "models", cwd=tmp_path)
    assert nomodel.stderr == "aclserve profile: error: unknown model 'nomodel' (models in the models folder: " \
                             "broken, digits)\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_trace_write_that_fails_after_the_run_is_one_line_and_the_summary_is_printed(tmp_path):
    _models(tmp_path)
    proc = _profile("digits", "--seconds", "0.3", "--models", "models", "--trace", "/dev/full", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "aclserve profile: error: cannot write /dev/full: No space left on device" in proc.stderr
    assert "trace: not written" in proc.stdout and "verdict" in proc.stdout


def test_a_trace_whose_write_fails_after_the_run_is_not_left_behind(tmp_path):
    """On a full disk `--trace FILE` exited 1 and left FILE of 0 bytes, which looked like a trace
    (a tester, t87); `aclserve compile` leaves no partial OM. Here the disk's refusal is the
    RLIMIT_FSIZE of the profile's process (4 KB: a trace is larger): the write fails after the
    run, is said, and leaves nothing."""
    import resource
    _models(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "aclserve", "profile", "digits", "--seconds", "0.3", "--models",
                           "models", "--trace", "t.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == "aclserve profile: error: cannot write t.json: File too large\n", proc.stderr
    assert "trace: not written" in proc.stdout and "verdict" in proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["models"]


def test_rows_on_a_model_of_fixed_first_dimension_are_refused():
    """--rows 4 on a static batch was ignored (one row sent) but reported as 4 rows each."""
    with pytest.raises(UsageError, match=r"--rows 4: input 'x' has a fixed first dimension, 1 \(a static batch\)"):
        _body([("x", "FP32", [1, 64])], 4)
    _body([("x", "FP32", [1, 64])], 1)
    _body([("x", "FP32", [-1, 64])], 4)


def test_rows_past_what_can_be_made_are_refused_before_anything_is_allocated():
    """--rows 1000000000: numpy's MemoryError traceback, after 30 GB were asked for."""
    with pytest.raises(UsageError, match=r"--rows 1000000000: input 'x' would take 512,000,000,000 bytes"):
        _body([("x", "FP32", [-1, 64])], 1_000_000_000)


def test_rows_past_the_max_batch_size_are_refused_before_anything_is_made():
    """--rows 1000000 on a model of max_batch_size 32 made 850 MB of values before the server
    refused them."""
    with pytest.raises(UsageError, match=r"^--rows 1000000 exceeds the model's max_batch_size, 32$"):
        _body([("x", "FP32", [-1, 1 << 20])], 1_000_000, 32)
    assert _body([("x", "FP32", [-1, 4])], 32, 32)[1] > 0


def _sent(body: bytes, header_length: int) -> dict[str, np.ndarray]:
    """The arrays of a binary KServe request `_body` made."""
    from aclserve.dtypes import kserve_to_numpy
    header, rest = json.loads(body[:header_length]), memoryview(body)[header_length:]
    arrays = {}
    for tensor in header["inputs"]:
        size = tensor["parameters"]["binary_data_size"]
        arrays[tensor["name"]] = np.frombuffer(rest[:size], kserve_to_numpy(tensor["datatype"]))
        rest = rest[size:]
    return arrays


def test_integer_inputs_are_drawn_within_their_value_range_or_small_and_non_negative():
    """Every input was a standard normal cast to its type: ids of an embedding taking 0..49 came
    out negative (the model refused the first request), a UINT input's negatives wrapped to
    4,294,967,294 and the like, a BOOL input was True nearly everywhere."""
    meta = [("ids", "INT64", [-1, 4]), ("bytes", "UINT32", [-1, 64]), ("tiny", "INT8", [-1, 64]),
            ("mask", "BOOL", [-1, 64]), ("x", "FP32", [-1, 64])]
    unranged = _sent(*_body(meta, 8))
    assert 0 <= unranged["bytes"].min() and unranged["bytes"].max() <= 9
    assert 0 <= unranged["ids"].min() and unranged["ids"].max() <= 9
    assert set(unranged["mask"]) == {False, True}
    assert unranged["x"].min() < 0 < unranged["x"].max()  # (floats as before)
    ranged = _sent(*_body(meta, 8, 0, {"ids": (0, 49), "tiny": (-3, -1)}))
    assert 0 <= ranged["ids"].min() and ranged["ids"].max() <= 49
    assert set(ranged["tiny"]) == {-3, -2, -1}


def test_the_rate_is_over_the_time_the_answers_took_not_the_time_asked_for():
    """A run lasts until the requests sent before its end are answered: on a server taking 0.3 s
    an answer, a 0.05 s run reported its answers over 0.05 s, six times the real rate."""
    import asyncio

    from aclserve.cli.load import closed_loop

    async def slow(number):
        await asyncio.sleep(0.3)

    outcomes = asyncio.run(closed_loop(2, 0.05, slow))
    assert outcomes.answered == 2 and outcomes.seconds >= 0.3


@pytest.mark.parametrize("env, said", [
    ({"ACLSERVE_DEVICE": "gpu"}, "aclserve profile: error: ACLSERVE_DEVICE must be one of auto, npu, cpu, not 'gpu'"),
    ({"ACLSERVE_CPU_DEVICES": "0"}, "aclserve profile: error: ACLSERVE_CPU_DEVICES must be an integer from 1 to 64, "
                                    "got '0'"),
    ({"ACLSERVE_API_TOKEN": "two\nlines"}, "aclserve profile: error: bad configuration: ACLSERVE_API_TOKEN: must hold "
                                          "printable characters only, not a control character such as a newline or a "
                                          "tab: no client could send it"),
])
def test_a_bad_runtime_setting_in_the_environment_is_one_line_as_serve_says_it(tmp_path, env, said):
    """Each was a 20-line ValueError traceback from the runtime's start, exit 1, where `aclserve
    serve` says one line and exits 2 (a new user's report); a token no client could send, a
    ConfigError traceback from the server state's token check, after the models had loaded."""
    _models(tmp_path)
    proc = _profile("digits", "--seconds", "0.5", "--models", "models", cwd=tmp_path, env={**os.environ, **env})
    assert proc.returncode == 2 and proc.stderr == said + "\n", proc.stderr


def test_a_model_the_server_does_not_serve_is_exit_1_as_for_infer_said_once_with_the_models_it_has(tmp_path):
    """The same 404 was exit 1 from `infer` and 2 from `profile --url` (README: 1 when nothing was
    answered), and said "model 'nomodel': unknown model 'nomodel'"; a plain web server's 404
    page was "model 'digits': HTTP 404: <!DOCTYPE HTML>", exit 2."""
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    with ServerThread(server_config(_models(tmp_path), model_control_mode="none")) as server:
        url = f"http://{server.url}"
        profiled = _profile("nomodel", "--url", url, "--seconds", "0.5", cwd=tmp_path)
        inferred = subprocess.run([sys.executable, "-m", "aclserve", "infer", "nomodel", "-i", "x=x.npy", "--url", url],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=120)
    with web_server(tmp_path) as web:
        not_kserve = _profile("digits", "--url", web, "--seconds", "0.5", cwd=tmp_path)
    in_process = _profile("nomodel", "--seconds", "0.5", "--models", "models", cwd=tmp_path)
    assert inferred.returncode == 1 and "HTTP 404: unknown model 'nomodel'" in inferred.stderr, inferred.stderr
    assert profiled.returncode == 1, profiled.stderr
    assert profiled.stderr == f"aclserve profile: error: {url}: HTTP 404: unknown model 'nomodel' (models ready: " \
                              "digits)\n"
    assert not_kserve.returncode == 1, not_kserve.stderr
    assert f"{web} did not answer as a KServe v2 HTTP server: HTTP 404: <!DOCTYPE HTML>" in not_kserve.stderr
    # in-process the command judges the name against the folder itself: bad input, as --models is
    assert in_process.returncode == 2, in_process.stderr
    assert in_process.stderr == "aclserve profile: error: unknown model 'nomodel' (models in the models folder: " \
                                "digits)\n"


def test_url_follows_no_redirect_and_says_so_as_infer_does(tmp_path):
    """aiohttp followed a 307 to another port: the target was asked for the model's metadata and
    the repository index (README said `profile --url` follows no redirect). Now the redirect
    ends the run in infer's words, exit status 1, and nothing reaches its target."""
    env = dict(os.environ, ACLSERVE_API_TOKEN="s3cret")
    with recording_server() as (target, seen):
        elsewhere = f"{target}/v2/models/digits"
        with canned_server(redirect_to(elsewhere, 307)) as url:
            proc = _profile("digits", "--url", url, "--seconds", "1", "--timeout", "30", cwd=tmp_path, env=env)
    assert seen == []
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr == (f"aclserve profile: error: {url} redirects (HTTP 307) to {elsewhere}: not followed, so "
                           "that the API token goes to no other server; give the server's own URL as --url\n")


def test_requests_in_flight_a_drain_past_the_loop_s_end_are_cut_and_counted():
    """The loop waited for every request in flight at its end (a run of 10 s lasted 33 s at 100,000
    clients: a tester); those still in flight DRAIN_S past it are cancelled, counted as cut, the
    others as they came back. A hang guard, not a timing: without the drain the loop never ends."""
    import asyncio

    from aclserve.cli.load import closed_loop

    async def run():
        held = asyncio.Event()  # (never set: a server at a standstill)
        calls = 0

        async def one(number):
            nonlocal calls
            calls += 1
            if calls == 1:
                return None  # the first answered, then held as the others
            await held.wait()
        return await asyncio.wait_for(closed_loop(3, 2.0, one), 60)  # (2 s: time for the clients to start)
    outcomes = asyncio.run(run())
    assert (outcomes.answered, sum(outcomes.refused.values()), outcomes.cut, outcomes.sent) == (1, 0, 3, 4)
