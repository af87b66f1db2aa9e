"""The scheduling policy of the server's threads (thread_policy.py, `thread_scheduling`).

A policy belongs to each thread and is inherited by the threads it starts: apply() is run in a
child process (it sets every thread of its process), and a real `aclserve serve` is read thread
by thread."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port, request

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")

# a thread started before apply(), apply(), one started after; the policies of all three
CHILD = """
import json, logging, os, sys, threading
logging.basicConfig(level=logging.INFO)
policy, _, flag = sys.argv[2].partition("|")  # (pytest's own policy may be anything)
os.sched_setscheduler(0, getattr(os, policy) | (os.SCHED_RESET_ON_FORK if flag else 0), os.sched_param(0))
from aclserve import thread_policy
stop, ready, seen = threading.Event(), threading.Event(), {}
def before_apply():
    if flag:  # (a thread's own flag: the threads a flagged one starts do not inherit it)
        os.sched_setscheduler(0, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK, os.sched_param(0))
    ready.set(); stop.wait(); seen.update(before=os.sched_getscheduler(0))
before = threading.Thread(target=before_apply)
before.start(); ready.wait()
result = thread_policy.apply(sys.argv[1])
after = threading.Thread(target=lambda: seen.update(after=os.sched_getscheduler(0)))
after.start(); after.join(); stop.set(); before.join()
print(json.dumps(dict(seen, result=result, main=os.sched_getscheduler(0))))
"""


def _apply_in_a_child(choice: str, started_under: str = "SCHED_OTHER") -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", CHILD, choice, started_under], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_batch_is_set_for_the_threads_there_and_those_started_after():
    seen, _ = _apply_in_a_child("batch")
    assert seen == {"result": "SCHED_BATCH", "main": os.SCHED_BATCH, "before": os.SCHED_BATCH,
                    "after": os.SCHED_BATCH}


def test_inherited_leaves_the_policy_alone():
    seen, _ = _apply_in_a_child("inherited")
    assert seen == {"result": "SCHED_OTHER", "main": os.SCHED_OTHER, "before": os.SCHED_OTHER,
                    "after": os.SCHED_OTHER}


def test_batch_with_the_reset_on_fork_flag_is_named_as_batch():
    """`chrt -R -b 0`: the flag came back with the policy, which was said as "policy 1073741827"."""
    seen, log = _apply_in_a_child("batch", "SCHED_BATCH|RESET_ON_FORK")
    assert seen["result"] == "SCHED_BATCH" and "policy 1073" not in log and "was started under" not in log, log


def test_other_with_the_reset_on_fork_flag_is_taken_as_other():
    """`chrt -R -o 0`: the main thread went to batch, a thread carrying the flag did not."""
    seen, log = _apply_in_a_child("batch", "SCHED_OTHER|RESET_ON_FORK")
    assert seen == {"result": "SCHED_BATCH", "main": os.SCHED_BATCH, "before": os.SCHED_BATCH,
                    "after": os.SCHED_BATCH}
    assert "the server's threads run under SCHED_BATCH" in log


def test_a_policy_set_before_is_kept_and_said():
    seen, log = _apply_in_a_child("batch", "SCHED_IDLE")
    assert seen == {"result": "SCHED_IDLE", "main": os.SCHED_IDLE, "before": os.SCHED_IDLE,
                    "after": os.SCHED_IDLE}
    assert "started under SCHED_IDLE, which is kept" in log


@pytest.mark.parametrize("setting, policy", [(None, os.SCHED_OTHER), ("batch", os.SCHED_BATCH)],
                         ids=["default", "batch"])
def test_every_thread_of_a_serving_server_has_the_policy(tmp_path, setting, policy):
    """Read once the model serves: its instance's threads, the CPU runtime's stream threads, the
    loaders and the event loop."""
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    port = free_port()
    config = f"port: {port}\ngrpc_port: 0\ndevice: cpu\nmodels_dir: models\n"
    if setting is not None:
        config += f"thread_scheduling: {setting}\n"
    (tmp_path / "serve.yaml").write_text(config)
    log = open(tmp_path / "serve.log", "w")  # (not a pipe nobody reads while it serves)
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", "serve.yaml"], cwd=tmp_path,
                         stdout=log, stderr=subprocess.STDOUT,
                         preexec_fn=lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0)))
    log.close()  # (the server has its own copy)
    server = type("Server", (), {"url": f"127.0.0.1:{port}"})
    try:
        for _ in range(600):  # a hang guard
            try:
                if request(server, "GET", "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        else:
            pytest.fail("the server never became ready")
        assert request(server, "POST", "/v2/models/digits/infer", json={"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]})[0] == 200
        tasks = os.listdir(f"/proc/{proc.pid}/task")
        policies = {}
        for tid in tasks:
            try:
                policies[tid] = os.sched_getscheduler(int(tid))
            except ProcessLookupError:
                pass  # a thread that ended meanwhile
        assert len(policies) >= 5, policies  # loop, launcher, completion, the streams, at least
        assert set(policies.values()) == {policy}, policies
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
