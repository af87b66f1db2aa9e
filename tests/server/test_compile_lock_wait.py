"""A load whose .onnx another process is compiling into the same compile cache (a replica sharing
the folder: the cache entry's lock, repository/compiler.py) says so in its index reason while it
waits for that lock: it said "looking for the compile of m.onnx in the compile cache" for as long
as the other compile took. No path reaches the client. Real server on a real port, the lock held
by a real other process as a replica's compile holds it; released, the load uses or makes the entry.
An unload or a shutdown ends that wait as it ends a compile: they waited for the other process to
let go (up to its compile_timeout_s, an hour by default)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from aclserve.repository.compiler import cache_key
from tests import REPO
from tests.processes import leashed_popen
from tests.serving import ServerThread, free_port, in_thread, listened_by, request, server_config
from tests.tiny_models import double_onnx

WAITING = "waiting for another process compiling the same model"
HOLDER = """import sys
from aclserve.repository.entry_locks import exclusive
with exclusive(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


HANG_GUARD_S = 60  # (not a timing: the fixed server answers at once; the old one waited for the holder)


@contextlib.contextmanager
def holding(lock_path):
    """A real other process holding the compile cache entry's lock (as a replica compiling the
    model does) until the block ends."""
    with subprocess.Popen([sys.executable, "-c", HOLDER, str(lock_path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO))) as holder:
        try:
            assert holder.stdout.readline() == "held\n"
            yield holder
        finally:
            holder.kill()


def reason(srv, name: str) -> tuple[str, str] | None:
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    return next(((r["state"], r["reason"]) for r in json.loads(body) if r["name"] == name), None)


def test_a_load_waiting_for_another_process_compiling_its_model_says_so(tmp_path):
    folder, cache = tmp_path / "models", tmp_path / "cache"
    folder.mkdir()
    cache.mkdir()
    config = server_config(folder, compile_cache_dir=str(cache))  # (explicit mode: m loads by its call)
    with ServerThread(config) as srv:
        double_onnx(folder / "m.onnx")
        key = cache_key(folder / "m.onnx", config.model_defaults.compile, "cpu")
        with holding(cache / f".m-{key[:32]}.om.lock") as holder:
            load, answers = in_thread(lambda: request(srv, "POST", "/v2/repository/models/m/load"))
            seen = []
            for _ in range(300):  # a hang guard, not a timing (each read of the index is paced: 0.1 s or more)
                seen.append(reason(srv, "m"))
                if seen[-1] == ("LOADING", WAITING) or not load.is_alive():
                    break
            holder.stdin.close()  # the other process's compile ends, and its lock with it
            load.join(120)
        after = reason(srv, "m")
    assert seen[-1] == ("LOADING", WAITING), seen[-5:]
    status, _, body = answers[0]
    assert status == 200, body
    assert after == ("READY", "")


def test_an_unload_ends_a_load_waiting_for_another_process_compiling_its_model(tmp_path):
    """As an unload during the compile itself: the version UNAVAILABLE "unloaded", the load call
    answered that an unload arrived, the other process's lock untouched."""
    folder, cache = tmp_path / "models", tmp_path / "cache"
    folder.mkdir()
    cache.mkdir()
    config = server_config(folder, compile_cache_dir=str(cache))
    with ServerThread(config) as srv:
        double_onnx(folder / "m.onnx")
        key = cache_key(folder / "m.onnx", config.model_defaults.compile, "cpu")
        with holding(cache / f".m-{key[:32]}.om.lock") as holder:
            load, loaded = in_thread(lambda: request(srv, "POST", "/v2/repository/models/m/load"))
            for _ in range(300):  # a hang guard (each read of the index is paced: 0.1 s or more)
                if reason(srv, "m") == ("LOADING", WAITING) or not load.is_alive():
                    break
            assert reason(srv, "m") == ("LOADING", WAITING)
            unload, unloaded = in_thread(lambda: request(srv, "POST", "/v2/repository/models/m/unload"))
            unload.join(HANG_GUARD_S)
            assert unloaded and unloaded[0][0] == 200, unloaded  # (without the change: none while the lock is held)
            load.join(HANG_GUARD_S)
            after = reason(srv, "m")
            assert holder.poll() is None
    status, _, body = loaded[0]
    assert status == 400 and b"an unload request for it arrived during this load" in body, (status, body)
    assert after == ("UNAVAILABLE", "unloaded")


def _ready(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=5).status == 200
    except (OSError, urllib.error.URLError):
        return False


def _wait_listening(server: subprocess.Popen, port: int) -> None:
    """Until `server` answers on `port`; it, not another process on that port (listened_by)."""
    for _ in range(1200):  # a hang guard
        if _ready(port) or server.poll() is not None:
            break
        time.sleep(0.1)
    assert server.poll() is None, f"the server exited ({server.returncode})"
    assert listened_by(server.pid, port), f"another process than the server listens on {port}"


def _post(port: int, path: str, body: bytes = b"") -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                                           method="POST"), timeout=HANG_GUARD_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:  # (the server went as it answered)
        return 0, str(e).encode()


def test_a_shutdown_ends_a_load_waiting_for_another_process_compiling_its_model(tmp_path):
    """`aclserve serve` under SIGTERM exits while the other process still holds the lock; it
    waited the whole shutdown_timeout_s (an abandoned load's thread, blocked in flock, is what
    the shutdown waits for until its deadline)."""
    folder, cache = tmp_path / "models", tmp_path / "cache"
    folder.mkdir()
    cache.mkdir()
    double_onnx(folder / "m.onnx")
    port = free_port()
    (tmp_path / "serve.yaml").write_text(
        f"port: {port}\ngrpc_port: 0\ndevice: cpu\nmodels_dir: {folder}\ncompile_cache_dir: {cache}\n"
        f"model_control_mode: explicit\nshutdown_timeout_s: {HANG_GUARD_S * 10}\n")
    key = cache_key(folder / "m.onnx", server_config(folder).model_defaults.compile, "cpu")
    with holding(cache / f".m-{key[:32]}.om.lock") as holder, \
            leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "serve.yaml")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO))) as server:
        try:
            _wait_listening(server, port)
            in_thread(lambda: _post(port, "/v2/repository/models/m/load"))
            for _ in range(300):  # a hang guard (each read of the index is paced: 0.1 s or more)
                rows = json.loads(_post(port, "/v2/repository/index", b"{}")[1])
                if [(r["state"], r["reason"]) for r in rows if r["name"] == "m"] == [("LOADING", WAITING)]:
                    break
            else:
                raise AssertionError(rows)
            server.send_signal(signal.SIGTERM)
            out, _ = server.communicate(timeout=HANG_GUARD_S)  # (without the change: shutdown_timeout_s)
            assert holder.poll() is None
        finally:
            server.kill()
    assert server.returncode == 0, out[-3000:]


def test_a_load_call_waiting_for_another_process_compiling_its_model_is_answered_at_shutdown(tmp_path):
    """A load call's own load waits for the lock; SIGTERM: the call is answered 503 (not a failure
    of the model's) before its connection closes, and the stop of its load is said in one line,
    as an unload's is (the shutdown's said nothing)."""
    folder, cache = tmp_path / "models", tmp_path / "cache"
    folder.mkdir()
    cache.mkdir()
    port = free_port()
    (tmp_path / "serve.yaml").write_text(
        f"port: {port}\ngrpc_port: 0\ndevice: cpu\nmodels_dir: {folder}\ncompile_cache_dir: {cache}\n"
        f"model_control_mode: explicit\nshutdown_timeout_s: {HANG_GUARD_S * 10}\n")
    with leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", str(tmp_path / "serve.yaml")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO))) as server:
        try:
            _wait_listening(server, port)  # (its folder empty: nothing loads)
            double_onnx(folder / "m.onnx")
            key = cache_key(folder / "m.onnx", server_config(folder).model_defaults.compile, "cpu")
            with holding(cache / f".m-{key[:32]}.om.lock"):
                load, loaded = in_thread(lambda: _post(port, "/v2/repository/models/m/load"))
                for _ in range(300):  # a hang guard (each read of the index is paced: 0.1 s or more)
                    rows = json.loads(_post(port, "/v2/repository/index", b"{}")[1])
                    if [(r["state"], r["reason"]) for r in rows if r["name"] == "m"] == [("LOADING", WAITING)]:
                        break  # (the call's own load: nothing else loads m)
                else:
                    raise AssertionError(rows)
                server.send_signal(signal.SIGTERM)
                out, _ = server.communicate(timeout=HANG_GUARD_S)
                load.join(HANG_GUARD_S)
        finally:
            server.kill()
    assert server.returncode == 0, out[-3000:]
    assert loaded == [(503, b'{"error":"the model repository shut down before m was loaded"}')], (loaded, out[-3000:])
    # (its own compile never began: it was said "the compile of version 1 was stopped")
    assert out.count("m: the load of version 1 was stopped (the server is shutting down)") == 1, out[-3000:]
    assert "the compile of version 1 was stopped" not in out, out[-3000:]
