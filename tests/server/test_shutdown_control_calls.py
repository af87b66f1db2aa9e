"""`aclserve serve` under SIGTERM answers the repository loads and unloads in flight (503 "the model
repository shut down before m was loaded", or "... unloaded") before it closes their connections,
and a load whose compile the shutdown stops says so in one line, as an unload's stop does.

A load or unload waiting for the start's load of its model got its connection closed without an
answer (the client's RemoteDisconnected): the shutdown cancels the start, whose CancelledError
reached the call's handler. A call still at work when the repository had closed (reading the
folder) lost its answer as the connections closed: the close waited for inference alone. Real
server processes, real clients; the only time limits are hang guards."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port
from tests.tiny_models import double_onnx

HANG_GUARD_S = 120
STOPPED = "m: the compile of version 1 was stopped (the server is shutting down)"


class Serving:
    """`aclserve serve` with its log read as it comes (`wait_for_line`)."""

    def __init__(self, config: str, env: dict):
        self.lines: list[str] = []
        self._new_line = threading.Condition()
        self.proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", config],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(REPO), **env))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()
        with self._new_line:
            self.lines.append("")  # (the end)
            self._new_line.notify_all()

    def wait_for_line(self, text: str) -> None:
        with self._new_line:
            found = self._new_line.wait_for(lambda: any(text in line for line in self.lines) or "" in self.lines,
                                            HANG_GUARD_S)
        assert found and any(text in line for line in self.lines), self.log()

    def stop(self) -> str:
        """SIGTERM; the log once it has exited (0)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(HANG_GUARD_S)
        self._reader.join(HANG_GUARD_S)
        assert self.proc.returncode == 0, self.log()
        return self.log()

    def log(self) -> str:
        return "".join(self.lines)[-4000:]


@contextlib.contextmanager
def serving(tmp_path, models, env=None, **config):
    port = free_port()
    settings = {"port": port, "grpc_port": 0, "device": "cpu", "models_dir": models,
                "compile_cache_dir": tmp_path / "cache", "shutdown_timeout_s": 60} | config
    (tmp_path / "serve.yaml").write_text("".join(f"{key}: {value}\n" for key, value in settings.items()))
    server = Serving(str(tmp_path / "serve.yaml"), env or {})
    try:
        server.wait_for_line(f"listening on http://127.0.0.1:{port}")
        yield server, port
    finally:
        server.proc.kill()
        server.proc.wait()
        server._reader.join(HANG_GUARD_S)
        server.proc.stdout.close()


def post(port: int, path: str, answers: list) -> threading.Thread:
    """POST `path` in a thread of its own; (status, body) or the error the client saw lands in `answers`."""
    def call():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_GUARD_S)
        try:
            connection.request("POST", path, body=b"")
            answer = connection.getresponse()
            answers.append((answer.status, answer.read()))
        except (OSError, http.client.HTTPException) as e:  # (RemoteDisconnected: no answer)
            answers.append((0, repr(e).encode()))
        finally:
            connection.close()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def wait_for_warm_up(port: int, name: str) -> None:
    """Until the repository index says `name` warms up (a hang guard)."""
    for _ in range(HANG_GUARD_S * 10):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_GUARD_S)
        try:
            connection.request("POST", "/v2/repository/index", body=b"{}")
            rows = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        if any(row["name"] == name and row["reason"].startswith("warming up") for row in rows):
            return
        time.sleep(0.1)
    raise AssertionError(rows)


def wait_for_hold(holds) -> None:
    for _ in range(HANG_GUARD_S * 50):  # a hang guard: until a compile's child holds
        if any(holds.iterdir()):
            return
        time.sleep(0.02)
    raise AssertionError("no compile began")


def grpc_load(port: int, name: str, answers: list) -> threading.Thread:
    """RepositoryModelLoad of `name` in a thread of its own; (code, details) lands in `answers`."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pbg

    def call():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                pbg.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                    pb.RepositoryModelLoadRequest(model_name=name), timeout=HANG_GUARD_S)
                answers.append(("OK", ""))
            except grpc.RpcError as e:
                answers.append((e.code().name, e.details()))
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_load_waiting_for_the_starts_compile_of_its_model_is_answered_at_shutdown(tmp_path, compile_holds,
                                                                                    transport):
    """The start compiles m (held: a compile known to be running); a load call of m waits for that
    load; SIGTERM. Its HTTP connection was closed without an answer (its gRPC call ended by grpc's
    own stop, "Cancelling all calls"), and the compile's stop said nothing."""
    models = tmp_path / "models"
    models.mkdir()
    double_onnx(models / "m.onnx")
    grpc_port = free_port()
    with serving(tmp_path, models, model_control_mode="explicit", grpc_port=grpc_port) as (server, port):
        wait_for_hold(compile_holds)
        answers: list = []
        if transport == "http":
            load = post(port, "/v2/repository/models/m/load", answers)
        else:
            load = grpc_load(grpc_port, "m", answers)
        server.wait_for_line("m: load asked through the repository API")
        out = server.stop()
        load.join(HANG_GUARD_S)
    expected = (503, b'{"error":"the model repository shut down before m was loaded"}') if transport == "http" \
        else ("UNAVAILABLE", "the model repository shut down before m was loaded")
    assert answers == [expected], (answers, out)
    assert out.count(STOPPED) == 1, out


def test_a_load_whose_compile_runs_is_answered_at_shutdown_and_its_stop_said(tmp_path, compile_holds):
    """A load call's own compile running (held) at SIGTERM: answered 503; the stop of its compile
    said in one line (it said nothing, where an unload's stop is said)."""
    models = tmp_path / "models"
    models.mkdir()
    with serving(tmp_path, models, model_control_mode="explicit") as (server, port):
        double_onnx(models / "m.onnx")
        answers: list = []
        load = post(port, "/v2/repository/models/m/load", answers)
        wait_for_hold(compile_holds)
        out = server.stop()
        load.join(HANG_GUARD_S)
    assert answers == [(503, b'{"error":"the model repository shut down before m was loaded"}')], (answers, out)
    assert out.count(STOPPED) == 1, out


def test_an_unload_waiting_for_the_starts_load_of_its_model_is_answered_at_shutdown(models_dir, tmp_path):
    """The start warms affine up (each run slowed to a second: a step no stop ends); an unload call
    waits for that load; SIGTERM. Its connection was closed without an answer."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(models_dir / "affine.om", models / "affine.om")
    with serving(tmp_path, models, env={"ACLSERVE_CPU_FAULTS": "execute:delay_ms=1000"},
                 model_control_mode="explicit") as (server, port):  # (the start loads it: poll mode waits for settle_s)
        wait_for_warm_up(port, "affine")
        answers: list = []
        unload = post(port, "/v2/repository/models/affine/unload", answers)
        server.wait_for_line("affine: unload asked through the repository API")
        out = server.stop()
        unload.join(HANG_GUARD_S)
    assert answers == [(503, b'{"error":"the model repository shut down before affine was unloaded (its shutdown '
                             b'unloads every model)"}')], (answers, out)


def test_a_load_still_reading_the_folder_is_answered_before_its_connection_closes(tmp_path):
    """A load call reads the models folder first (3,000 models: a scan of tenths of a second), and
    SIGTERM comes meanwhile: the repository closes at once (nothing loads), and the connections
    closed with it, before the call could answer (the shutdown waited for inference alone)."""
    models = tmp_path / "models"
    models.mkdir()
    with serving(tmp_path, models, model_control_mode="explicit") as (server, port):
        for i in range(3000):  # (models no call loads)
            (models / f"x{i}" / "1").mkdir(parents=True)
            (models / f"x{i}" / "1" / "model.om").write_bytes(b"x")
        double_onnx(models / "m.onnx")
        answers: list = []
        load = post(port, "/v2/repository/models/m/load", answers)
        server.wait_for_line("m: load asked through the repository API")
        out = server.stop()
        load.join(HANG_GUARD_S)
    assert answers == [(503, b'{"error":"the model repository shut down before m was loaded"}')], (answers, out)
