"""Shutdown while a model's load or warm-up hangs on the device: the server stops within the
reach of `shutdown_timeout_s` (the load's own bounds, the execution and reset timeouts, are
ten minutes here), abandons the load with one line naming it, leaves the device and ACL alone
under it, and `aclserve serve` exits 0. The load is held by a CPU-runtime fault (a model load
held in query_size; a warm-up's first execution held) until the test ends; the only time
limits are hang guards."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from aclserve.acl.cpu import faults
from aclserve.runtime import teardown

from tests.processes import leashed_popen
from tests.serving import free_port, request

# the CPU runtime's fault that holds each step: the model load asks query_size first, and the
# warm-up's first batch is the first execution
HOLDS = {"load": "query_size", "warm-up": "execute"}


@pytest.fixture
def hung_model(models_dir, tmp_path):
    (tmp_path / "affine.om").write_bytes((models_dir / "affine.om").read_bytes())
    (tmp_path / "affine.yaml").write_text("execution_timeout_ms: 600000\n")
    return tmp_path


def load_threads_done(timeout_s: float = 30) -> None:
    """A hang guard: the abandoned load's thread has come back and closed what it opened."""
    for _ in range(int(timeout_s * 100)):
        if teardown.release_recovered() == 0 and teardown.unreleased() == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"{teardown.unreleased()} load(s) or instance(s) still on the device")


@pytest.mark.parametrize("step", list(HOLDS))
def test_shutdown_while_a_load_hangs_abandons_it_by_the_deadline(hung_model, make_config, clean_faults, caplog, step):
    from aclserve.app import build_repository
    from aclserve.runtime import AclRuntime
    from aclserve.server.app import create_app, make_runner

    gate, closed = threading.Event(), threading.Event()
    held = faults.inject(HOLDS[step], nth=1, hold=gate)
    config = make_config(hung_model, shutdown_timeout_s=0.5)
    errors: list[BaseException] = []

    async def scenario():
        runtime = AclRuntime(device="cpu")
        app = create_app(config, build_repository(config, runtime), runtime)
        runner = make_runner(app)
        await runner.setup()  # starts the runtime and the models' loading
        await asyncio.get_running_loop().run_in_executor(None, held.entered.wait, 30)
        await runner.cleanup()  # the shutdown: drain, close the models, close the runtime
        closed.set()

    def run():
        try:
            asyncio.run(scenario())
        except BaseException as e:
            errors.append(e)
            closed.set()

    server = threading.Thread(target=run, daemon=True)
    server.start()
    try:
        assert held.entered.wait(30)
        closed.wait(30)  # a hang guard: the shutdown waited for the load (ten minutes, or for good)
        assert closed.is_set() and not errors, errors
        assert not gate.is_set()
        abandoned = [m for m in (r.getMessage() for r in caplog.records) if "affine" in m and "abandoned" in m]
        assert len(abandoned) == 1, abandoned
        assert "ACL not finalized" in caplog.text
    finally:
        gate.set()
        server.join(30)
    load_threads_done()  # once it comes back, the load closes what it opened


# `aclserve serve` with an exit hook that says the interpreter's teardown ran
SERVE_WITH_TEARDOWN_MARK = ("import atexit, sys; atexit.register(print, 'interpreter teardown', flush=True); "
                            "from aclserve.cli import main; sys.exit(main())")


def serve_process(tmp_path, models: str, shutdown_timeout_s: float, faults_spec: str = "") -> subprocess.Popen:
    """`aclserve serve` of `models`, its output in `proc.log` (read while it runs)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ACLSERVE_CPU_FAULTS"}
    if faults_spec:
        env["ACLSERVE_CPU_FAULTS"] = faults_spec
    (tmp_path / "serve.yaml").write_text(f"port: {port}\ngrpc_port: 0\ndevice: cpu\nlog_level: info\n"
                                         f"shutdown_timeout_s: {shutdown_timeout_s}\nmodels_dir: {models}\n")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = leashed_popen([sys.executable, "-c", SERVE_WITH_TEARDOWN_MARK, "serve", "--config",
                              str(tmp_path / "serve.yaml")], env=env, stdout=out, stderr=subprocess.STDOUT)
    proc.server, proc.log = types.SimpleNamespace(url=f"127.0.0.1:{port}"), log
    return proc


def ended(proc: subprocess.Popen, timeout_s: float) -> str:
    """Its output, once it has exited (`timeout_s`: a hang guard)."""
    proc.wait(timeout_s)
    return proc.log.read_text()


def wait_for_index(proc: subprocess.Popen, wanted: bytes) -> None:
    """A hang guard: until the server answers and its index shows `wanted`."""
    for _ in range(1200):
        try:
            if request(proc.server, "GET", "/v2/health/live")[0] == 200:
                break
        except OSError:
            time.sleep(0.1)
    for _ in range(1200):
        if wanted in request(proc.server, "POST", "/v2/repository/index")[2]:
            return
        time.sleep(0.05)


@pytest.mark.parametrize("step", list(HOLDS))
def test_sigterm_while_a_load_hangs_ends_the_process(hung_model, tmp_path, step):
    """`aclserve serve` whose model load, or warm-up, sleeps ten minutes: SIGTERM ends the
    process (exit 0) with the load still running, its log written to the end, and without the
    interpreter's teardown: that freed the memory the load's thread still copied weights into
    (SIGSEGV after "runtime closed", or SIGABRT as ONNX Runtime's threads were destroyed)."""
    proc = serve_process(tmp_path, hung_model, 0.5, f"{HOLDS[step]}:delay_ms=600000,nth=1")
    try:
        # until the model is in the step that hangs: opening on the device (LOADING alone came before
        # steps that look for a stop), or its warm-up's first run begun (the index says so once the
        # warm-up can no longer stop before that run)
        wait_for_index(proc, b"opening on the device" if step == "load" else b"warming up")
        proc.send_signal(signal.SIGTERM)
        out = ended(proc, 60)  # a hang guard: it waited for the load before
        assert proc.returncode == 0, out
        assert "abandoned" in out and "not finalized" in out, out
        assert out.rstrip().endswith("runtime closed") and "interpreter teardown" not in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_clean_shutdown_keeps_the_interpreters_teardown(hung_model, tmp_path):
    """Nothing abandoned: the process exits as any Python program does, its exit hooks run."""
    proc = serve_process(tmp_path, hung_model, 0.5)
    try:
        wait_for_index(proc, b"READY")
        proc.send_signal(signal.SIGTERM)
        out = ended(proc, 60)  # a hang guard
        assert proc.returncode == 0 and "runtime closed" in out and "interpreter teardown" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_signal_ends_the_wait_for_an_abandoned_load(hung_model, tmp_path):
    """SIGTERM while a load hangs: the repository's close waits for it until the deadline
    (shutdown_timeout_s: ten minutes here); a second signal ends that wait at once, as it ends
    the drain: the load is abandoned then, as at the deadline, and the process exits 0."""
    proc = serve_process(tmp_path, hung_model, 600, "query_size:delay_ms=600000,nth=1")
    try:
        # (the step the hang is in: at LOADING alone, a signal could stop the load before it, at a
        # step that looks for a stop; nothing was left running then, and the process tore down)
        wait_for_index(proc, b"opening on the device")
        proc.send_signal(signal.SIGTERM)
        for _ in range(1200):  # a hang guard: until the close waits for the load (it said it abandons it)
            if proc.poll() is not None or b"abandoned" in proc.log.read_bytes():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out = ended(proc, 60)  # a hang guard: it waited the ten minutes before
        assert proc.returncode == 0 and "SIGTERM received again: the drain ends now" in out, out[-3000:]
        assert "not finalized" in out and out.rstrip().endswith("runtime closed"), out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
