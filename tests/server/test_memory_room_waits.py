"""A load refused for device memory waits for room on that device, as one refused for streams and
events does: a tester (t97) saw x (instances: 2) refused beside a, told to "unload a model", and x
stayed UNAVAILABLE for good once a was unloaded (no retry), strict readiness 503. Now the unload's
give-back tries x again, without a load call nor the backoff's timer (set to an hour). A model one
instance of which is larger than the whole device stays refused for good, and so does one larger than the
device less its reserve, told so (not to unload a model). A real server process of
its own (the CPU runtime reads its device's capacity at start): digits takes 48,768 bytes an
instance, so 150,000 bytes less the 10 % reserve hold two instances, not three."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port, json_call, wait_until as until

WAITS = " (the device short of memory: waits for room on device 0 (memory), tried again as models there unload)"


@pytest.fixture
def serve(tmp_path):
    """serve(memory, *models) starts `aclserve serve` on a folder of digits copies, (name, instances)
    each, its device `memory` bytes: (the process, its address, the folder). Stopped at the test's
    end, and killed by the kernel should pytest end first (pytest-timeout: leashed_popen)."""
    servers = []

    def start(memory: str, *models: tuple[str, int]):
        folder = tmp_path / "models"
        folder.mkdir()
        for name, instances in models:
            shutil.copy(REPO / "models" / "digits.om", folder / f"{name}.om")
            (folder / f"{name}.yaml").write_text(f"instances: {instances}\n")
            # (old: served at once, without the settle wait, whose UNAVAILABLE "waiting for its config file"
            # was taken for a refusal)
            for written in (f"{name}.om", f"{name}.yaml"):
                os.utime(folder / written, (1, 1))
        config = tmp_path / "server.yaml"
        config.write_text("load_retry_initial_s: 3600\nload_retry_max_s: 3600\n")  # (no timer's retry in the test)
        port = free_port()
        env = dict(os.environ, ACLSERVE_CPU_DEVICE_MEMORY=memory)
        env.pop("ACLSERVE_CPU_FAULTS", None)
        servers.append(leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(folder), "--port",
                                      str(port), "--grpc-port", "0", "--device", "cpu", "--log-level", "critical",
                                      "--config", str(config)],
                                     cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return servers[-1], f"127.0.0.1:{port}", folder
    yield start
    for server in servers:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def row(url: str, name: str) -> tuple[str, str]:
    status, rows = json_call(url, "/v2/repository/index", b"{}")
    if status != 200:  # (not listening yet)
        return "", ""
    return next(((r["state"], r["reason"]) for r in rows if r["name"] == name), ("", ""))


@pytest.mark.parametrize("how", ["file deleted", "unload call"])
def test_a_load_refused_for_memory_loads_once_another_model_unloads(serve, how):
    server, url, folder = serve("150000", ("a", 1), ("x", 2))
    # (refused for memory, not UNAVAILABLE for another reason on the way: not loaded yet, settling)
    until(lambda: server.poll() is not None or any(row(url, name)[1].endswith(WAITS) for name in "ax"),
          "one of a and x refused for memory")
    assert server.poll() is None
    refused, served = sorted("ax", key=lambda name: not row(url, name)[1].endswith(WAITS))
    until(lambda: row(url, served)[0] == "READY", f"{served} ready")
    state, reason = row(url, refused)
    assert state == "UNAVAILABLE" and "bytes of device 0 memory" in reason and reason.endswith(WAITS), reason
    assert json_call(url, "/v2/health/ready")[0] == 503
    if how == "file deleted":
        (folder / f"{served}.om").unlink()
    else:
        assert json_call(url, f"/v2/repository/models/{served}/unload", b"{}")[0] == 200
    until(lambda: row(url, refused)[0] == "READY" or server.poll() is not None, f"{refused} loaded")
    assert row(url, refused) == ("READY", "")


def refused_alone(serve, memory: str) -> tuple[str, str, int, dict]:
    """Model big, served alone on a device of `memory` bytes: its row's state and reason once refused for memory
    (not the UNAVAILABLE "not loaded" before its load begins), then a load call's status and answer."""
    server, url, _ = serve(memory, ("big", 1))
    until(lambda: server.poll() is not None or "bytes of device 0" in row(url, "big")[1], "big refused")
    state, reason = row(url, "big")
    return state, reason, *json_call(url, "/v2/repository/models/big/load", b"{}")


def test_a_model_larger_than_the_device_stays_refused_without_waiting(serve):
    """(Not changed by the waits: their guard.) digits' model memory alone is 29,568 bytes."""
    _, reason, status, answer = refused_alone(serve, "20000")
    assert "more than the device's whole memory" in reason and "waits for room" not in reason, reason
    assert status == 400 and "waits for room" not in answer["error"], answer


def test_a_model_larger_than_the_device_less_its_reserve_is_told_so_without_waiting(serve):
    """digits' model memory (29,568 bytes) fits 32,000 bytes but not 28,800, what is left of them beside the 10 %
    reserve: it was refused as if others held the room, "unload a model", which no unload can make. Its reason
    says the piece is more than the device's memory less its reserve, with the numbers and what can help, and it
    waits for no room: a load call is refused for it (400)."""
    state, reason, status, answer = refused_alone(serve, "32000")
    told = ("model big:1#0 needs 29,568 bytes of device 0 memory, more than the device's memory less its reserve "
            "(28,800 of 32,000 bytes, 10% held in reserve): no unload makes room; lower memory_reserve_fraction, or "
            "raise ACLSERVE_CPU_DEVICE_MEMORY")
    assert state == "UNAVAILABLE" and reason.startswith(told), reason
    assert "unload a model" not in reason and "waits for room" not in reason and "retry" not in reason, reason
    assert status == 400 and answer["error"].startswith(f"failed to load big: version 1: {told}"), answer


@pytest.mark.parametrize("memory, beyond", [("32000", "memory less its reserve"), ("20000", "whole memory")])
def test_a_reload_no_unload_makes_room_for_is_not_told_to_unload_the_model_first(serve, models_dir, memory, beyond):
    """m serves affine, then its file is replaced by digits', whose model memory (29,568 bytes) is more than the
    28,800 bytes a 32,000-byte device's reserve leaves (or than a 20,000-byte device): the reload is refused, the
    old file's serving on, told so. It was told too that a reload loads beside the version it replaces: "unload
    the model first", which makes no room for it either."""
    server, url, folder = serve(memory)
    shutil.copy(models_dir / "affine.om", folder / "m.om")
    until(lambda: server.poll() is not None or row(url, "m")[0] == "READY", "m served")
    shutil.copy(REPO / "models" / "digits.om", folder / "m.new")
    os.replace(folder / "m.new", folder / "m.om")  # (whole: a half-written file is no reload)
    until(lambda: server.poll() is not None or "bytes of device 0" in row(url, "m")[1], "the reload refused")
    state, reason = row(url, "m")
    assert state == "READY" and "the new one failed" in reason and f"more than the device's {beyond}" in reason, reason
    assert "unload the model first" not in reason, reason
