"""Every model's instances began at its list's first device (`devices[k % len(devices)]`), so a tester's
four one-instance models over `devices: [0, 1, 2, 3]` all went on device 0, devices 1-3 idle, and
with a small device memory the third and fourth were refused for device 0's memory while 1-3 were empty.
Each instance now goes on the device of its list holding the fewest instances now (every model's), ties
by the list's order, and one without the memory for it is passed over for one that has. The CPU
runtime's devices are read at its start, so each case runs in a process of its own."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request

from tests import REPO
from tests.processes import leashed_popen
from tests.runtime.own_process import run_script
from tests.serving import free_port, json_call, wait_until

from .metrics_samples import samples


def test_four_one_instance_models_over_four_devices_go_on_four_devices(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    names = ("a", "b", "c", "d")
    for name in names:
        shutil.copy(REPO / "models" / "digits.om", models / f"{name}.om")
    config = tmp_path / "s.yaml"
    config.write_text("model_defaults:\n  devices: [0, 1, 2, 3]\n")
    port = free_port()
    env = dict(os.environ, ACLSERVE_CPU_DEVICES="4")
    env.pop("ACLSERVE_CPU_FAULTS", None)
    server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(config), "--models",
                            str(models), "--port", str(port), "--grpc-port", "0", "--device", "cpu",
                            "--log-level", "critical"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"127.0.0.1:{port}"
    try:
        wait_until(lambda: server.poll() is not None or json_call(url, "/v2/health/ready")[0] == 200,
                   "the server ready, its four models loaded")
        found = samples(urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode())
    finally:
        server.terminate()
        server.wait(60)
    placed = {s.labels["model"]: s.labels["device"] for s in found["aclserve_compute_busy_ratio"]}
    assert set(placed) == set(names) and set(placed.values()) == {"0", "1", "2", "3"}, placed


_SCRIPT = """
import json, sys
from aclserve import Engine, LoadError

def devices_of(engine, name, instances, devices):
    try:
        model = engine.load(sys.argv[1], name=name, instances=instances, devices=devices, warmup=False)
    except LoadError as e:
        return str(e)
    return [instance.device.id for instance in model.pool.instances]

out = {}
with Engine(device="cpu") as engine:  # one model alone: its list's order, again and again
    out["alone"] = devices_of(engine, "three", 3, (1, 2))
# another Engine's instances fill device 0's memory (the CPU runtime's devices are the process's): this one's
# ledgers hold nothing there, so device 0 is its first choice, and has no room
with Engine(device="cpu") as other, Engine(device="cpu") as engine:
    other.load(sys.argv[1], name="hog", instances=3, devices=(0,), warmup=False)
    out["late"] = devices_of(engine, "late", 1, (0, 1))
    other.load(sys.argv[1], name="hog1", instances=2, devices=(1,), warmup=False)
    out["none"] = devices_of(engine, "none", 1, (0, 1))
print(json.dumps(out))
"""


def test_placement_round_robin_alone_and_past_a_device_without_memory():
    """Digits takes 48,768 bytes an instance: three fit a device of 200,000."""
    out, _ = run_script(_SCRIPT, str(REPO / "models" / "digits.om"), devices=3, ACLSERVE_CPU_DEVICE_MEMORY="200000")
    assert out["alone"] == [1, 2, 1], out
    assert out["late"] == [1], out
    assert out["none"].startswith("model none#0 ") and "of device 0 memory" in out["none"], out
    assert "nor had device 1 of its devices room for it; unload a model" in out["none"], out
