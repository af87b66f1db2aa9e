"""Several server processes sharing one models folder, as replicas behind a load balancer:
a dropped .onnx compiled by all of them at once ends as one valid cache entry that every
replica serves, compiled once; readiness is false while a replica starts and while it drains.

Real `aclserve serve` processes on 127.0.0.1, real clients. Waits are for states, bounded by a
deadline so a broken server fails the test instead of hanging it; nothing asserts a duration.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from aclserve.om import container
from aclserve.repository.entry_locks import exclusive

from tests.processes import leashed_popen
from tests.serving import free_port
from tests.tiny_models import affine_onnx, affine_reference

DEADLINE_S = 120
REPLICAS = 3
CONFIG = "model_control_mode: poll\nsettle_s: 0.2\ndebounce_s: 0.05\nshutdown_timeout_s: 20\n"
# gears 1,2,4,8 and a 2 s window: a 3-row request stays queued long enough to watch a drain
MODEL_YAML = "compile: {batch: [1, 2, 4, 8]}\nbatching: {max_queue_delay_ms: 2000}\n"


class Replica:
    """One `aclserve serve` process; its log goes to a file the test reads."""

    def __init__(self, models: Path, work: Path, index: int):
        self.http, self.grpc = free_port(), free_port()
        self.log_path = work / f"replica{index}.log"
        config = work / "server.yaml"
        config.write_text(CONFIG)
        argv = [sys.executable, "-m", "aclserve", "serve", "--config", str(config), "--models", str(models),
                "--port", str(self.http), "--grpc-port", str(self.grpc), "--device", "cpu"]
        with open(self.log_path, "wb") as log:
            self.proc = leashed_popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text()

    def ready(self) -> int | None:
        """HTTP status of /v2/health/ready, None while nothing listens."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, ConnectionError):
            return None

    def wait_until(self, predicate, what: str):
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"replica exited ({self.proc.returncode}) waiting for {what}:\n{self.log()}")
            time.sleep(0.05)
        pytest.fail(f"replica not {what} after {DEADLINE_S} s:\n{self.log()}")

    def model_ready(self, name: str) -> bool:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc}") as c:
            try:
                return c.is_model_ready(name)
            except InferenceServerException:  # NOT_FOUND until the file is taken
                return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def infer(replica: Replica, rows: int = 2):
    x = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8) / 10
    idx = np.arange(rows * 3, dtype=np.int64).reshape(rows, 3)
    inputs = [grpcclient.InferInput("x", [rows, 8], "FP32"), grpcclient.InferInput("idx", [rows, 3], "INT64")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(idx)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{replica.grpc}") as c:
        result = c.infer("m", inputs)
    np.testing.assert_allclose(result.as_numpy("y"), affine_reference(x, idx)["y"], rtol=1e-5)
    return result


def drop_model(models: Path, source: Path) -> None:
    (models / "m.yaml").write_text(MODEL_YAML)
    part = models / ".m.onnx.part"
    part.write_bytes(source.read_bytes())
    os.rename(part, models / "m.onnx")  # complete at once: every replica takes it on the event


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    work = tmp_path_factory.mktemp("replicas")
    models = work / "models"
    models.mkdir()
    source = Path(affine_onnx(work / "affine.onnx"))
    group = [Replica(models, work, i) for i in range(REPLICAS)]
    try:
        for r in group:
            r.wait_until(lambda r=r: r.ready() == 200, "ready")
        drop_model(models, source)
        for r in group:
            r.wait_until(lambda r=r: r.model_ready("m"), "serving m")
        yield models, group
    finally:
        for r in group:
            r.stop()


def test_replicas_compile_a_dropped_onnx_once_into_one_valid_entry(replicas):
    models, group = replicas
    entries = sorted(os.listdir(models / ".cache"))
    assert len(entries) == 2 and entries[0].startswith("m-") and entries[0].endswith(".om"), entries
    assert entries[1] == entries[0] + ".json"  # its manifest (repository/cache_entry.py)
    header = container.read_header(models / ".cache" / entries[0])  # a whole, valid CPU OM
    assert [t["name"] for t in header["inputs"]][:2] == ["x", "idx"] and header["gears"] == [1, 2, 4, 8]
    def said(logs):  # (once each replica's line is written: its log writer's thread may be behind)
        return [sum(log.count("m: compiled in") for log in logs), sum("using cached compile" in log for log in logs)]

    group[0].wait_until(lambda: sum(said([r.log() for r in group])) >= REPLICAS, "logging each load")
    logs = [r.log() for r in group]
    assert said(logs) == [1, REPLICAS - 1], "\n".join(logs)
    for r in group:
        assert infer(r).get_response().model_name == "m"


def test_a_draining_replica_is_not_ready_and_finishes_its_requests(replicas):
    _, group = replicas
    leaving, staying = group[-1], group[0]
    answers = []
    worker = threading.Thread(target=lambda: answers.append(infer(leaving, rows=3)))  # waits 2 s
    worker.start()
    leaving.wait_until(lambda: "aclserve_queue_depth{" in metrics(leaving) and queued(leaving) > 0, "queued")
    leaving.proc.send_signal(signal.SIGTERM)
    statuses = []
    while worker.is_alive():  # the drain waits for the queued request
        statuses.append(leaving.ready())
        time.sleep(0.02)
    worker.join()
    assert len(answers) == 1  # the in-flight request was answered, not dropped
    assert 503 in statuses and 200 not in statuses[statuses.index(503):], statuses
    assert leaving.proc.wait(60) == 0
    assert staying.ready() == 200 and staying.model_ready("m")
    infer(staying)


def metrics(replica: Replica) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{replica.http}/metrics", timeout=10) as r:
        return r.read().decode()


def queued(replica: Replica) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics(replica).splitlines()
               if line.startswith("aclserve_queue_depth{") and 'model="m"' in line)


def test_readiness_is_false_until_the_models_are_loaded(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.yaml").write_text(MODEL_YAML)
    affine_onnx(models / "m.onnx")  # compiled at start-up: the replica is slow to become ready
    replica = Replica(models, tmp_path, 0)
    try:
        seen = []
        replica.wait_until(lambda: seen.append(replica.ready()) or seen[-1] == 200, "ready")
        # the first 200 came only after the model was loaded: it answers at once, and every probe
        # before it failed (its log line may come later: the server's lines go through a writer thread)
        infer(replica)
        assert set(seen[:-1]) <= {None, 503}, seen
        replica.wait_until(lambda: "m: version 1 ready" in replica.log(), "logging the load")
    finally:
        assert replica.stop() == 0


def test_exclusive_lock_admits_one_holder_at_a_time(tmp_path):
    holders, most = [0], [0]
    guard = threading.Lock()

    def work():
        for _ in range(20):
            with exclusive(tmp_path / ".x.lock"):
                with guard:
                    holders[0] += 1
                    most[0] = max(most[0], holders[0])
                time.sleep(0.001)
                with guard:
                    holders[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and not (tmp_path / ".x.lock").exists()
