"""The compute-stream busy fraction: a sliding window over device times from events, ~0 when idle
and near 1 when batches keep the compute stream fed."""
from __future__ import annotations

import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from aclserve.runtime import open_pool
from aclserve.runtime.busy import BusyWindow
from aclserve.runtime.futures import BatchFutures

from tests.tiny_models import compile_cpu_om, save_graph


def test_busy_window_over_a_fake_clock():
    now = [0]
    window = BusyWindow(window_s=1.0, clock=lambda: now[0])
    now[0] = 2_000_000_000
    assert window.fraction() == 0.0
    window.add(300_000_000)  # 0.3 s of compute ending at t = 2 s
    assert abs(window.fraction() - 0.3) < 1e-9
    now[0] = 2_500_000_000  # half of that span has left the window
    assert abs(window.fraction() - 0.3) < 1e-9
    now[0] = 2_850_000_000
    assert abs(window.fraction() - 0.15) < 1e-9  # [1.85, 2.0] of [1.7, 2.0] is inside
    now[0] = 3_100_000_000
    assert window.fraction() == 0.0
    for k in range(30):  # more work than wall time (spans placed late) is capped at 1
        window.add(100_000_000, now[0] - k)
    assert window.fraction() == 1.0
    for k in range(1000):  # without reads it keeps only the window's spans
        now[0] += 10_000_000
        window.add(1_000_000)
    assert len(window._spans) <= 101


def heavy_onnx(path) -> str:
    """x [N,512] through eight 512x512 MatMul+Relu: milliseconds of compute per batch of 16."""
    rng = np.random.default_rng(3)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 512])
    inits, nodes, prev = [], [], "x"
    for k in range(8):
        inits.append(numpy_helper.from_array((rng.standard_normal((512, 512)) / 23).astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"]), helper.make_node("Relu", [f"m{k}"], [f"r{k}"])]
        prev = f"r{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    return save_graph(helper.make_graph(nodes, "heavy", [x], [y], inits), path)


def test_busy_fraction_is_near_zero_idle_and_high_at_saturation(runtime, tmp_path):
    om = compile_cpu_om(heavy_onnx(tmp_path / "heavy.onnx"), tmp_path / "heavy.om", batch="8,16")
    pool = open_pool(runtime, om, "heavy", slots=2)
    done = BatchFutures(pool)
    try:
        instance = pool.instances[0]
        batch = {"x": np.ones((16, 512), np.float32)}
        done.submit([batch], 16).result(60)  # ran once, long before the window below
        time.sleep(0.6)  # let that run leave a 0.5 s window: the idle state
        instance.compute_busy = BusyWindow(window_s=0.5)
        instance.compute_busy.add(1)  # a tick, so the window is not empty by construction
        time.sleep(0.6)
        idle = instance.compute_busy.fraction()
        assert idle < 0.2
        assert pool.utilisation()[0]["compute_busy"] < 0.2
        in_flight = [done.submit([batch], 16) for _ in range(2)]
        finished = 0
        start = time.monotonic()
        while time.monotonic() - start < 1.5 or finished < 20:  # keep both slots busy
            in_flight.pop(0).result(60)
            finished += 1
            in_flight.append(done.submit([batch], 16))
        saturated = instance.compute_busy.fraction()
        for future in in_flight:
            future.result(60)
        print(f"compute busy: idle {idle:.3f}, saturated {saturated:.3f}")
        assert saturated > 0.5, (idle, saturated)
    finally:
        pool.close()
