"""`aclserve serve` short of descriptors (a tester, t87). A load the ACL failed for want of reading
the file (145002) whose header the server reads a moment later was refused for good as "a CPU OM
... refused: on an Ascend host rebuild it", readiness 503 until the file was touched: it is the
host short, retried. And the file each loaded version keeps open for its rebuilds came out of no
share of the descriptor limit: under `ulimit -n 256` with 160 models, connections under the caps
were reset unanswered, grpc core logged "File descriptor limit reached", the folder scan failed;
now those files take from HTTP's cap (down to half of it, then no more are kept), a connection
over it is answered 503, and a load and the scan keep their descriptors. The loads load_concurrency
lets run at once came out of one load's share: each has its own now, and under a low limit those the
reserve does not fit wait for their turn. Real processes (the limit set in the child: preexec_fn),
real clients, the CPU runtime's own fault injection."""
from __future__ import annotations

import contextlib
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time

from aclserve.descriptor_shares import COMPILE_FILES, LOAD_FILES

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port, json_call
from tests.tiny_models import endless_loop_onnx, scale_onnx

from .hostile import metric

HANG_GUARD_S = 60  # (pytest.ini's timeout ends the whole run at 120)
ANSWER_GUARD_S = 20  # for the answers on held connections, all together
# server metadata: not a probe, which a connection over the cap is answered (spare_places.py)
ASK = b"GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
# each endpoint's connection cap under `ulimit -n 64`: 64 less 8 for refusals lingering and the reserve's 42
# (the server's own files, a load and a compile: descriptor_shares.LEAST_RESERVE), shared in two
CAP_64 = 7


@contextlib.contextmanager
def serving(tmp_path, models, limit: int | None = None, grpc_port: int = 0, env: dict | None = None,
            settings: str = ""):
    """`aclserve serve` of `models` (its log in tmp_path / "serve.log"): yields (process, url)
    once it answers; RLIMIT_NOFILE `limit` (soft and hard) when given; `settings`: more lines of
    its config. SIGTERM at the end (killed past the hang guard)."""
    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(f"port: {port}\ngrpc_port: {grpc_port}\ndevice: cpu\nmodels_dir: {models}\n"
                      "load_retry_initial_s: 0.2\nshutdown_timeout_s: 1\n" + settings)
    limits = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))) if limit else None
    with open(tmp_path / "serve.log", "w") as log:
        proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(config)], cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})), stdout=log,
                             stderr=subprocess.STDOUT, preexec_fn=limits)
    url = f"127.0.0.1:{port}"
    try:
        until(lambda: json_call(url, "/v2/health/live")[0] == 200 or proc.poll() is not None, "live", tmp_path)
        assert proc.poll() is None, log_of(tmp_path)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(HANG_GUARD_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def until(check, what: str, tmp_path) -> None:
    """Until `check()` holds; the limit is a hang guard, not a timing."""
    give_up = time.monotonic() + HANG_GUARD_S
    while not check():
        assert time.monotonic() < give_up, f"never {what}: {log_of(tmp_path)[-3000:]}"
        time.sleep(0.05)


def log_of(tmp_path) -> str:
    return (tmp_path / "serve.log").read_text()


def test_a_model_file_the_acl_could_not_read_is_retried_and_serves(models_dir, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    # the first load's query_size fails 145002 (what the CPU runtime answers for a descriptor it
    # could not get) while the file reads: before, UNAVAILABLE for good and readiness 503
    with serving(tmp_path, folder, env={"ACLSERVE_CPU_FAULTS": "query_size:nth=1,code=145002"}) as (_, url):
        until(lambda: "not loaded" in log_of(tmp_path), "failed the load", tmp_path)
        failed = [line for line in log_of(tmp_path).splitlines() if "not loaded" in line]
        assert "is a CPU OM" not in failed[0], failed
        until(lambda: json_call(url, "/v2/health/ready")[0] == 200, "ready", tmp_path)
        status, index = json_call(url, "/v2/repository/index", b"{}")
        assert status == 200 and [(m["name"], m["state"]) for m in index] == [("double", "READY")], index
    assert len(failed) == 1, failed
    assert "could not be read (acl.mdl.query_size failed with 145002: model file missing or unreadable) and " \
           "reads now: taken for the host short of descriptors or memory then (" in failed[0], failed
    assert "(the host short of resources: retry 1 in " in failed[0], failed


def test_model_files_kept_open_take_from_http_connections_and_every_connection_is_answered(models_dir, tmp_path):
    """Under `ulimit -n 64` (caps of 7 + 7), 20 models: their files take HTTP's cap down to 3,
    and past that versions keep none open. With gRPC's cap full, of 7 HTTP connections each is
    answered, 200 or 503 (before, those past the descriptors left hung unanswered); a model
    dropped in meanwhile loads (its descriptors and the scan's are kept free)."""
    folder = tmp_path / "models"
    folder.mkdir()
    for i in range(20):
        shutil.copy(models_dir / "double.om", folder / f"m{i}.om")
    grpc_port = free_port()
    with serving(tmp_path, folder, limit=64, grpc_port=grpc_port) as (proc, url):
        until(lambda: json_call(url, "/v2/health/ready")[0] == 200, "ready", tmp_path)
        grpc, http = _both_caps_held(url, grpc_port, tmp_path)
        try:
            for sock in http:
                sock.sendall(ASK)
            answers = _statuses(http)
            shutil.copy(models_dir / "double.om", folder / "late.om")  # a load and a scan while all is held
            until(lambda: "late: version 1 ready" in log_of(tmp_path), "loaded late.om", tmp_path)
        finally:
            for sock in grpc + http:
                sock.close()
        assert set(answers) <= {200, 503, "closed"}, answers  # ("closed": one idle 1 s given up for another)
        assert 503 in answers and 200 in answers, answers
        refused = metric(url, "aclserve_connections_closed_total", 'reason="refused"')
        assert refused >= answers.count(503), (refused, answers)
        held = len(os.listdir(f"/proc/{proc.pid}/fd"))
        # at rest: room for both caps (HTTP's down to 3, the kept files its other 4), the refusals lingering,
        # and a load compiling
        assert held <= 64 - 3 - CAP_64 - 8 - LOAD_FILES - COMPILE_FILES, held
    log = log_of(tmp_path)
    assert "take from HTTP's connections: its cap is 6 (max_connections 4096; 7 fit the descriptor limit; " \
           "gRPC's stays 7), down to 3 as more load, under the descriptor limit of 64 (ulimit -n" in log, log
    assert "4 model files kept open for rebuilds already, the most the descriptor limit of 64 (ulimit -n) " \
           "leaves them beside the connections" in log, log
    assert "Too many open files" not in log and "File descriptor limit" not in log, log


def test_compiles_at_once_take_no_descriptor_the_connections_were_promised(tmp_path):
    """Under `ulimit -n 64` with both connection caps held, four .onnx files dropped in at once, load_concurrency
    4: each compile holds its process's pipes and its cache entry's lock for its length (seven descriptors as its
    process starts), which came out of nothing (two of the four failed "could not start the compile's process:
    Too many open files", again at their retries while the others ran). Now the reserve keeps room for one load
    compiling there, the others wait for it: all four load, and every connection held is answered after."""
    compiles = 4
    folder = tmp_path / "models"
    folder.mkdir()
    grpc_port = free_port()
    with serving(tmp_path, folder, limit=64, grpc_port=grpc_port,
                 settings=f"load_concurrency: {compiles}\nmodel_control_mode: poll\n") as (_, url):
        grpc, http = _both_caps_held(url, grpc_port, tmp_path)
        try:
            for sock in http:
                sock.sendall(ASK)
            before = _statuses(http)
            stage = tmp_path / "stage"
            stage.mkdir()
            for i in range(compiles):  # (other bytes each: one compile would wait for another of the same)
                os.replace(scale_onnx(stage / f"s{i}.onnx", i + 2.0), folder / f"s{i}.onnx")
            until(lambda: log_of(tmp_path).count("compiled in") + log_of(tmp_path).count("not loaded") >= compiles,
                  "compiled", tmp_path)
            for sock in http:
                sock.sendall(ASK)
            after = _statuses(http)
        finally:
            for sock in grpc + http:
                sock.close()
    log = log_of(tmp_path)
    assert log.count("compiled in") == compiles, log
    assert before == after == [200] * CAP_64, (before, after)
    assert "Too many open files" not in log and "File descriptor limit" not in log, log


def test_a_compile_waiting_for_a_place_says_so_and_its_file_gone_ends_the_wait(tmp_path):
    """Under `ulimit -n 96` two loads at once fit, and one compile: a second .onnx waits for it, its index reason
    saying why, and removing its file ends that wait (as it ends a compile), the endless compile running on."""
    folder, stage = _folders(tmp_path)
    with serving(tmp_path, folder, limit=96, settings="load_concurrency: 2\nmodel_control_mode: poll\n") as (_, url):
        _compile_endlessly(folder, stage, tmp_path)
        os.replace(scale_onnx(stage / "second.onnx", 2.0), folder / "second.onnx")
        waiting = "waiting for another compile to end: the descriptor limit (ulimit -n) fits no more at once"
        until(lambda: waiting in str(json_call(url, "/v2/repository/index", b"{}")[1]), "waited", tmp_path)
        os.unlink(folder / "second.onnx")
        until(lambda: "second" not in str(json_call(url, "/v2/repository/index", b"{}")[1]), "ended the wait",
              tmp_path)
        status, index = json_call(url, "/v2/repository/index", b"{}")
    assert [(row["name"], row["state"]) for row in index] == [("endless", "LOADING")], index
    log = log_of(tmp_path)
    assert "second: the load of version 1 was stopped while it waited for another compile to end (its file is " \
           "gone)" in log, log
    assert "second: compiling" not in log and "second: version 1 from" not in log, log


def test_loads_at_once_under_a_low_limit_fail_none_for_want_of_descriptors(models_dir, tmp_path):
    """Under `ulimit -n 64`, load_concurrency 4, both caps held and refused connections lingering, eight models
    dropped in at once (two .onnx, six .om), each load held a second (the CPU runtime's fault injection): the
    reserve counted one load's descriptors whatever load_concurrency let run, and the compiles' processes failed to
    start, "Too many open files". One load at once fits there now, said as the server starts, the others wait
    for it: all eight load."""
    folder, stage = _folders(tmp_path)
    grpc_port = free_port()
    refused: list[socket.socket] = []
    with serving(tmp_path, folder, limit=64, grpc_port=grpc_port, env={"ACLSERVE_CPU_FAULTS": "load:delay_ms=1000"},
                 settings="load_concurrency: 4\n") as (_, url):
        grpc, http = _both_caps_held(url, grpc_port, tmp_path)
        try:
            for i in range(2):
                os.replace(scale_onnx(stage / f"s{i}.onnx", i + 2.0), folder / f"s{i}.onnx")
            for i in range(6):
                shutil.copy(models_dir / "double.om", stage / f"m{i}.om")
                os.replace(stage / f"m{i}.om", folder / f"m{i}.om")

            def loaded() -> bool:  # (a connection more at each look: refused at the cap, lingering)
                refused.append(socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))))
                log = log_of(tmp_path)
                return log.count("version 1 ready") + log.count("not loaded") >= 8

            until(loaded, "loaded", tmp_path)
        finally:
            for sock in grpc + http + refused:
                sock.close()
        until(lambda: json_call(url, "/v2/health/ready")[0] == 200, "ready", tmp_path)  # (none lingering now)
        refusals = metric(url, "aclserve_connections_closed_total", 'reason="refused"')
    log = log_of(tmp_path)
    assert log.count("version 1 ready") == 8, log
    assert refusals > 0  # (the premise: connections refused at the cap, lingering, while the models loaded)
    assert "one load at once fits the descriptor limit of 64 (ulimit -n) beside the connections, 2 descriptors " \
           "each and 7 more for a compile of an .onnx (load_concurrency 4): the others wait for one to end" in log, log
    assert "Too many open files" not in log and "File descriptor limit" not in log, log


def test_a_load_past_those_the_limit_fits_waits_for_its_turn_and_says_why(models_dir, tmp_path):
    """Under `ulimit -n 64`, load_concurrency 2, one load at once fits: an .om dropped in while an .onnx compiles
    waits for that load to end, its index reason saying it is the descriptor limit's doing, not load_concurrency's
    alone; removing the .onnx ends its compile, and the .om loads."""
    folder, stage = _folders(tmp_path)
    with serving(tmp_path, folder, limit=64, settings="load_concurrency: 2\nmodel_control_mode: poll\n") as (_, url):
        _compile_endlessly(folder, stage, tmp_path)
        shutil.copy(models_dir / "double.om", stage / "second.om")
        os.replace(stage / "second.om", folder / "second.om")
        waiting = "waiting: other versions are loading (load_concurrency 2; the descriptor limit (ulimit -n) fits 1 " \
                  "at once)"
        until(lambda: waiting in str(json_call(url, "/v2/repository/index", b"{}")[1]), "waited", tmp_path)
        os.unlink(folder / "endless.onnx")
        until(lambda: "second: version 1 ready" in log_of(tmp_path), "loaded second.om", tmp_path)
        status, index = json_call(url, "/v2/repository/index", b"{}")
    assert [(row["name"], row["state"]) for row in index] == [("second", "READY")], index


def _folders(tmp_path) -> tuple:
    """(tmp_path / "models", tmp_path / "stage": where a file is written before it is moved in), made."""
    folder, stage = tmp_path / "models", tmp_path / "stage"
    folder.mkdir()
    stage.mkdir()
    return folder, stage


def _compile_endlessly(folder, stage, tmp_path) -> None:
    """endless.onnx moved into `folder`, once it compiles (its compile's test runs never end)."""
    os.replace(endless_loop_onnx(stage / "endless.onnx"), folder / "endless.onnx")
    until(lambda: "endless: compiling" in log_of(tmp_path), "compiling endless.onnx", tmp_path)


def _both_caps_held(url: str, grpc_port: int, tmp_path) -> tuple[list[socket.socket], list[socket.socket]]:
    """Connections to gRPC and to HTTP, CAP_64 each (both caps under `ulimit -n 64`), gRPC's counted held."""
    grpc = [socket.create_connection(("127.0.0.1", grpc_port)) for _ in range(CAP_64)]
    until(lambda: metric(url, "aclserve_connections", 'transport="grpc"') == CAP_64, "held gRPC's", tmp_path)
    return grpc, [socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) for _ in range(CAP_64)]


def _statuses(socks: list[socket.socket]) -> list[int | str]:
    """The status of the answer read on each socket; "closed" or "reset": the server closed it
    unanswered; "none": nothing came within ANSWER_GUARD_S, all together (before, those past the descriptors
    left waited for good)."""
    received = {sock: b"" for sock in socks}
    statuses: dict[socket.socket, int | str] = {}
    give_up = time.monotonic() + ANSWER_GUARD_S
    with selectors.DefaultSelector() as waiting:
        for sock in socks:
            waiting.register(sock, selectors.EVENT_READ)
        while len(statuses) < len(socks) and time.monotonic() < give_up:
            for key, _ in waiting.select(timeout=max(0.0, give_up - time.monotonic())):
                sock = key.fileobj
                try:
                    chunk = sock.recv(4096)
                except ConnectionResetError:
                    statuses[sock] = "reset"
                else:
                    received[sock] += chunk
                    if chunk and b"\r\n" not in received[sock]:
                        continue
                    statuses[sock] = int(received[sock].split(b" ", 2)[1]) if chunk else "closed"
                waiting.unregister(sock)
    return [statuses.get(sock, "none") for sock in socks]
