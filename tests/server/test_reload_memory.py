"""A reload loads the new file beside the serving version, which holds its device memory until the
swap: a reload refused for memory says so, as one refused for streams or events does. It said
only "...; unload a model or lower memory_reserve_fraction", though the device had room for the
new file alone (a tester's find). A real server process of its own (the CPU runtime reads its
device's capacity at start) on a device with room for one copy of the model; the file replaced."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port, json_call, listened_by

BESIDE = ("; unload a model or lower memory_reserve_fraction; a reload loads beside the serving version it replaces, "
          "whose instances hold theirs until the swap: if the new configuration fits alone, unload the model first")
WAITS = " (the device short of memory: waits for room on device 0 (memory), tried again as models there unload)"


def until(check, what: str) -> None:
    for _ in range(6000):  # a hang guard, not a timing
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"never {what}")


def test_a_reload_refused_for_device_memory_says_it_loads_beside_the_serving_version(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(REPO / "models" / "digits.om", models / "digits.om")
    os.utime(models / "digits.om", (1, 1))  # (old: served at once, without the settle wait)
    port = free_port()
    # digits takes 48,768 bytes a copy: 80,000 less the 10 % reserve hold one, not two
    env = dict(os.environ, ACLSERVE_CPU_DEVICE_MEMORY="80000")
    server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models), "--port", str(port),
                            "--grpc-port", "0", "--device", "cpu", "--log-level", "warning"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"127.0.0.1:{port}"
    try:
        until(lambda: json_call(url, "/v2/health/ready")[0] == 200 or server.poll() is not None, "ready")
        assert server.poll() is None and listened_by(server.pid, port)
        shutil.copy(REPO / "models" / "digits.om", models / ".digits.om.part")
        os.replace(models / ".digits.om.part", models / "digits.om")  # (a new file: a reload)

        def row() -> tuple[str, str]:
            status, rows = json_call(url, "/v2/repository/index", b"{}")
            assert status == 200, rows
            return next((r["state"], r["reason"]) for r in rows if r["name"] == "digits")
        until(lambda: row()[1] != "", "the reload refused")
        state, reason = row()
    finally:
        server.terminate()
        server.wait(60)
    assert state == "READY" and reason.startswith("serving the previous file; the new one failed: model digits"), reason
    # (waiting for room there: another model's unload may make it)
    assert "bytes of device 0 memory" in reason and reason.endswith(BESIDE + WAITS), reason


def test_a_model_larger_than_the_whole_device_memory_is_told_to_raise_it_not_to_unload(tmp_path):
    """A model needing more than the device has in all was told "unload a model or lower
    memory_reserve_fraction", neither of which could make room (a tester's find, 256M and a
    320 MB model): on the CPU runtime, ACLSERVE_CPU_DEVICE_MEMORY is what to raise."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(REPO / "models" / "digits.om", models / "digits.om")
    os.utime(models / "digits.om", (1, 1))
    port = free_port()
    env = dict(os.environ, ACLSERVE_CPU_DEVICE_MEMORY="20000")  # (digits' model memory alone: 29,568 bytes)
    server = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models), "--port", str(port),
                            "--grpc-port", "0", "--device", "cpu", "--log-level", "warning",
                            "--readiness", "lenient"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"127.0.0.1:{port}"

    def row() -> tuple[str, str]:
        status, rows = json_call(url, "/v2/repository/index", b"{}")
        assert status == 200, rows
        return next(((r["state"], r["reason"]) for r in rows if r["name"] == "digits"), ("", ""))
    try:
        # (UNAVAILABLE alone is not the refusal: a version waiting for its first load is too)
        until(lambda: server.poll() is not None or (json_call(url, "/v2/health/live")[0] == 200
                                                    and row()[0] == "UNAVAILABLE" and "memory" in row()[1]),
              "refused")
        state, reason = row()
    finally:
        server.terminate()
        server.wait(60)
    assert "bytes of device 0 memory, more than the device's whole memory (20,000 bytes): raise " \
           "ACLSERVE_CPU_DEVICE_MEMORY" in reason, reason
    assert "unload a model" not in reason and ": retry " not in reason, reason
