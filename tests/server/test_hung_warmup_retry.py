"""A model whose warm-up the device does not finish leaves its instance abandoned (runtime/teardown.py),
holding streams, events and memory (here a thread running the model). Its load was retried as a
transient device error every load_retry_max_s, each attempt abandoning one more instance, until the
device ran out and other models could no longer reload. Now it is not retried while the instance
its load left is held: the index and /metrics say why and how to try again, and it is retried
once the device lets go of that instance.

The model is a real ONNX Loop (tiny_models.endless_loop_onnx) whose one run lasts a few seconds
(its loop count sized on this machine's ONNX Runtime), far past its 300 ms execution timeout and
100 ms reset timeout, and the load retries every 0.2-0.8 s: that run spans several retry periods.
The proof waits on the server's state (the retry counter, the abandoned instances gauge); the
time limits are hang guards. The retry's delay is also the window in which the gauge reads no
instance abandoned, between the device letting go and the retry's own warm-up: each look at the
server takes three requests, which on a machine busy with other work (a full suite beside
others) took longer than the 0.05-0.2 s the retries waited before, and the window was missed."""
from __future__ import annotations

import json
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from aclserve.om import container
from aclserve.runtime import teardown
from aclserve.server.health_metrics import reason_label

from tests.serving import ServerThread, request
from tests.tiny_models import compile_cpu_om, endless_loop_onnx

from .hostile import metric

HANG_S = 3.0  # how long the looping model's one run lasts, about (several retry periods)
NOT_RETRIED = "not retried: its load left 1 instance(s) abandoned on the device"


def iterations_lasting(seconds: float, folder) -> int:
    """The loop count whose run lasts about `seconds` on this machine's ONNX Runtime."""
    probe = 100_000
    session = ort.InferenceSession(endless_loop_onnx(folder / "probe.onnx", probe), providers=["CPUExecutionProvider"])
    x = np.zeros((1, 4), np.float32)
    took = []
    for _ in range(3):
        start = time.perf_counter()
        session.run(None, {"x": x})
        took.append(time.perf_counter() - start)
    return int(probe * seconds / min(took))


def looping_om(folder, seconds: float) -> str:
    """A CPU OM whose run lasts about `seconds`: compiled with a loop of 5 (the compile runs the
    model), then its loop count set in the payload."""
    om = container.read(compile_cpu_om(endless_loop_onnx(folder / "loop5.onnx", 5), folder / "loop5.om", batch="1,2"))
    model = onnx.load_from_string(bytes(om.payload))
    for init in model.graph.initializer:
        if init.name == "trips":
            init.CopyFrom(numpy_helper.from_array(np.array(iterations_lasting(seconds, folder), np.int64), "trips"))
    header = {k: v for k, v in om.header.items() if k not in ("payload_sha256", "header_sha256")}
    container.write(folder / "hang.om", header, model.SerializeToString())
    return str(folder / "hang.om")


def looks(server, abandoned_before: float) -> dict:
    """What the server says of the hanging model now: its index row, its automatic retries, the
    abandoned instances (beyond those held before the test)."""
    status, _, body = request(server, "POST", "/v2/repository/index")
    assert status == 200, body
    row = next(r for r in json.loads(body) if r["name"] == "hang")
    return {"state": row["state"], "reason": row["reason"],
            "retries": metric(server.url, "aclserve_model_load_retries_total", 'model="hang"'),
            "abandoned": metric(server.url, "aclserve_abandoned_instances") - abandoned_before}


def until(server, condition, seen: list, abandoned_before: float, guard_s: float = 120.0) -> dict:
    """Look at the server until `condition(look)`; at every look no more than one instance is
    abandoned (the load's one). `guard_s` is a hang guard."""
    deadline = time.monotonic() + guard_s
    while True:
        look = looks(server, abandoned_before)
        seen.append(look)
        assert look["abandoned"] <= 1, f"{look['abandoned']:g} instances abandoned: {seen[-3:]}"
        if condition(look):
            return look
        assert time.monotonic() < deadline, f"hang guard: {seen[-3:]}"
        time.sleep(0.02)


def test_a_load_whose_warm_up_hangs_is_not_retried_while_its_instance_is_abandoned(
        make_config, models_dir, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    looping_om(tmp_path, HANG_S)
    (tmp_path / "hang.om").rename(folder / "hang.om")
    (folder / "hang.yaml").write_text("execution_timeout_ms: 300\nreset_timeout_ms: 100\n")
    (folder / "affine.om").write_bytes((models_dir / "affine.om").read_bytes())  # an innocent model beside it
    abandoned_before = teardown.held()
    config = make_config(folder, load_retry_initial_s=0.4, load_retry_max_s=0.8)
    seen: list[dict] = []
    with ServerThread(config) as server:
        try:
            # its warm-up's run passed the execution timeout; the instance it hung on is abandoned
            first = until(server, lambda look: NOT_RETRIED in look["reason"], seen, abandoned_before)
            assert first["state"] == "UNAVAILABLE" and first["retries"] == 0, first
            assert "a change of the file or its config or a restart (a load call is refused" in first["reason"], first
            # a load call while the instance is held is refused at once, building nothing (each one
            # abandoned one more instance, the reason still saying 1)
            for _ in range(2):
                status, _, body = request(server, "POST", "/v2/repository/models/hang/load")
                assert status == 400 and b"1 instance(s) of its last load are still held by the device" in body, body
                assert looks(server, abandoned_before)["abandoned"] == 1
            failure = metric(server.url, "aclserve_model_load_failure",  # (the label: its first characters)
                             f'model="hang",reason="{reason_label(first["reason"])}",version="1"')
            assert failure == 1, first["reason"]
            # while that run goes on (many retry periods) the load is not tried again; once the
            # device has let go of the instance (the run ended), the retry comes
            retried = until(server, lambda look: look["retries"] >= 1, seen, abandoned_before)
            assert any(look["abandoned"] == 0 for look in seen[seen.index(first):]), seen
            assert retried["retries"] == 1, retried
            # it hangs again: one instance abandoned again, and again no retry while it is
            again = until(server, lambda look: look["state"] == "UNAVAILABLE" and NOT_RETRIED in look["reason"]
                          and look["abandoned"] == 1, seen, abandoned_before)
            assert again["retries"] == 1, again
            # the innocent model reloads beside it
            (folder / "affine.om").write_bytes((models_dir / "affine.om").read_bytes())
            status, _, body = request(server, "POST", "/v2/repository/models/affine/load")
            assert status == 200, body
        finally:
            request(server, "POST", "/v2/repository/models/hang/unload")
            freed(abandoned_before)


def freed(abandoned_before: int, guard_s: float = 120.0) -> None:
    """Until the instances abandoned here are freed (their runs end), for the tests after this one."""
    deadline = time.monotonic() + guard_s
    while teardown.release_recovered() > abandoned_before:
        assert time.monotonic() < deadline, f"hang guard: {teardown.held()} instance(s) still abandoned"
        time.sleep(0.05)
