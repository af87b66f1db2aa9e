"""An Engine's or the server's load refused for device memory while the model's own instances fill
the device said only "unload a model or lower memory_reserve_fraction" (a tester: a 136 MB model
with `instances: 7` over devices [0, 1] of 500M each). It now says how many of its instances hold memory there and
to give it fewer, as the refusal for streams and events says, and so does a rebuild's now; a
model none of whose instances are there is told as before. Two CPU devices of 200,000 bytes, in a
process of their own (the CPU runtime reads them at start): digits takes 48,768 bytes an
instance, so three fit on each."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from tests import REPO
from tests.processes import leashed_popen
from tests.runtime.own_process import run_script
from tests.serving import free_port, json_call

MEMORY = "200000"
OWN = ("3 instances of model {name} already hold memory there: give the model fewer instances or spread them over "
       "more devices, or unload a model or lower memory_reserve_fraction")
WAITS = " (the device short of memory: waits for room on device 0 (memory), tried again as models there unload)"
PLAIN = "are held in reserve (10%); unload a model or lower memory_reserve_fraction"

_SCRIPT = """
import json, sys
from aclserve import Engine, LoadError

def refusal(engine, name, instances, devices):
    try:
        engine.load(sys.argv[1], name=name, instances=instances, devices=devices, warmup=False)
    except LoadError as e:
        return str(e)
    return "loaded"

out = {}
with Engine(device="cpu") as engine:
    out["own"] = refusal(engine, "big", 7, (0, 1))  # the 7th, the 4th on device 0, finds 3 of its own there
    six = engine.load(sys.argv[1], name="six", instances=6, devices=(0, 1), warmup=False)
    out["other"] = refusal(engine, "one", 1, (0,))  # device 0 full of another model's instances
print(json.dumps(out))
"""


def test_an_engine_load_crowded_out_by_its_own_instances_is_told_to_have_fewer():
    out, _ = run_script(_SCRIPT, str(REPO / "models" / "digits.om"), devices=2, ACLSERVE_CPU_DEVICE_MEMORY=MEMORY)
    assert out["own"].startswith("model big#6 ") and out["own"].endswith(OWN.format(name="big")), out["own"]
    assert out["other"].startswith("model one#0 ") and out["other"].endswith(PLAIN), out["other"]


_REBUILD_SCRIPT = """
import json, logging, sys, time
import numpy as np
from aclserve import Engine
from aclserve.acl.cpu import faults

said = []
class Kept(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("aclserve").addHandler(Kept())
logging.getLogger("aclserve").setLevel(logging.INFO)
with Engine(device="cpu") as engine:
    model = engine.load(sys.argv[1], name="three", instances=3, devices=(0,), warmup=False, retry=False)
    faults.inject("execute", nth=1)  # an instance out of rotation: rebuilt beside the two others and itself
    try:
        model.infer({"x": np.zeros((1, 64), np.float32)}, timeout=60)
    except Exception:
        pass
    give_up = time.monotonic() + 60  # a hang guard
    while not any(line.endswith("rebuilt; serving again") for line in said) and time.monotonic() < give_up:
        time.sleep(0.01)
print(json.dumps({"failed": [line for line in said if line.endswith("; closing it first, then trying again")],
                  "rebuilt": any(line.endswith("rebuilt; serving again") for line in said)}))
"""


def test_a_rebuild_crowded_out_by_its_own_instances_is_told_to_have_fewer():
    """A first load's refusal said so, a rebuild's not: three instances fill device 0, one faults,
    and its rebuild, beside them (the faulted one is closed only once a try has failed), is
    refused for memory: its failure says the three hold memory there; once the old one is closed
    the next try fits."""
    out, _ = run_script(_REBUILD_SCRIPT, str(REPO / "models" / "digits.om"), devices=1,
                        ACLSERVE_CPU_DEVICE_MEMORY=MEMORY)
    failed = out["failed"]
    assert out["rebuilt"] and len(failed) == 1 and failed[0].startswith("three: rebuilding instance three#"), failed
    assert failed[0].endswith(OWN.format(name="three") + "); closing it first, then trying again"), failed


def test_a_server_load_crowded_out_by_its_own_instances_is_told_to_have_fewer(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(REPO / "models" / "digits.om", models / "big.om")
    (models / "big.yaml").write_text("instances: 7\ndevices: [0, 1]\n")
    port = free_port()
    env = dict(os.environ, ACLSERVE_CPU_DEVICES="2", ACLSERVE_CPU_DEVICE_MEMORY=MEMORY)
    env.pop("ACLSERVE_CPU_FAULTS", None)
    server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models), "--port", str(port),
                            "--grpc-port", "0", "--device", "cpu", "--log-level", "critical",
                            "--readiness", "lenient"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"127.0.0.1:{port}"
    try:
        for _ in range(6000):  # a hang guard, not a timing
            if server.poll() is not None or json_call(url, "/v2/health/live")[0] == 200:
                break
            time.sleep(0.01)
        status, answer = json_call(url, "/v2/repository/models/big/load", b"{}")
    finally:
        server.terminate()
        server.wait(60)
    # (503: it waits for room on device 0, which other models' unloads could make: room_waits.py)
    assert status == 503 and answer["error"].startswith("failed to load big: version 1: model big:1#6 "), answer
    assert answer["error"].endswith(OWN.format(name="big:1") + WAITS), answer
