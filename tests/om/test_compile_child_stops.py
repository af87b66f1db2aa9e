"""A stop signal ends the compile's child (aclserve/om/compile_child.py, child_stop.py) wherever its
main thread is: exit status 128 + the signal's number, no result or error said, nothing on stderr,
the ATC it runs killed and ATC's work folder removed. Its handler raised KeyboardInterrupt
wherever the main thread was: inside a finalizer or a C library's callback Python drops it
("Exception ignored in _get_module_lock ... KeyboardInterrupt", about 1 stop in 60) and the child
compiled on until the server's SIGKILL 5 s later; inside onnx's C++ callbacks it aborted the
child (`terminate called after throwing an instance of 'nanobind::python_error'`); inside ONNX
Runtime's run it was never heard.

The child is started as compile_process starts it, with a sitecustomize on its path that holds its
main thread forever in such a place (HELD_IN) at a point of the compile (HELD_AT): the hold's
sleep (compile_holds) or the line saying ATC started. It is signalled once it is there; nothing
else ends it: there, the process ends by child_stop's watchdog (os._exit a second on).

How a signal that finds the main thread outside aclserve's code still ends the child by its
unwinding (KeyboardInterrupt at the next line of an aclserve frame; raised again when a finalizer
drops it) is shown where only that unwinding can have ended it: the child held inside the CPU
compile's work folder (HELD_AT work_folder: the ONNX Runtime session optimise makes there) in
aclserve's own loop (compile_child._hold) until the stop is heard. The unwinding removes the folder
without writing the OM; the watchdog leaves the folder to the next compile's sweep."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from aclserve.om import own_python
from aclserve.om.compile_process import CHILD_MODULE
from aclserve.om.work_folder import PREFIX as WORK_PREFIX
from tests.tiny_models import endless_loop_onnx

from .atc_stand_in import alive

HANG_GUARD_S = 60  # (not a timing: the fixed child ends within about a second; the old one never did)

HELD = textwrap.dedent("""\
    import ctypes, json, os, signal, threading, time, weakref

    _sleep, _dumps = time.sleep, json.dumps
    _flag, _place, _point = os.environ["HELD_FLAG"], os.environ["HELD_IN"], os.environ["HELD_AT"]
    _HOLD_ENV = "ACLSERVE_COMPILE_HOLD"  # (compile_child.HOLD_ENV: set in the work folder only)


    def _forever():
        open(_flag, "w").close()
        while True:
            _sleep(0.02)


    class _Finalized:
        def __del__(self):
            _forever()


    def _in_qsort():  # (its comparison, called back from C)
        compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(lambda a, b: _forever() or 0)
        ctypes.CDLL(None).qsort((ctypes.c_int * 2)(), 2, ctypes.sizeof(ctypes.c_int), compare)


    def _in_onnxruntime():  # (a run of a model that never ends)
        import numpy, onnxruntime
        session = onnxruntime.InferenceSession(os.environ["HELD_MODEL"])
        open(_flag, "w").close()
        session.run(None, {"x": numpy.zeros((1, 4), numpy.float32)})


    def _hold():
        {"finalizer": _Finalized, "c_callback": _in_qsort, "onnxruntime": _in_onnxruntime}[_place]()


    def sleep(seconds):
        if threading.current_thread() is not threading.main_thread():
            return _sleep(seconds)
        if _point == "hold":
            _hold()
        if _point == "work_folder" and _place == "returning_library" and os.environ.get(_HOLD_ENV):
            return _until_heard()  # (compile_child._hold's sleep)
        return _sleep(seconds)


    def _until_heard():  # (library code that returns once the child has heard the stop)
        stop = signal.getsignal(signal.SIGTERM).__self__  # (the handler's: child_stop.StopSignals)
        open(_flag, "w").close()
        while stop.signum is None:
            _sleep(0.02)


    class _Owner:
        pass


    def _in_work_folder(real):  # (onnxruntime.InferenceSession, first made by the CPU compile's optimise)
        def session(*args, **kwargs):
            onnxruntime.InferenceSession = real  # (once: the compile's later sessions are ONNX Runtime's own)
            from aclserve.om.compile_child import _hold  # (aclserve's loop: on while its mark exists)
            os.environ[_HOLD_ENV] = os.environ["HELD_HOLDS"]
            if _place == "own_finalizer":  # (aclserve's code run by a finalizer)
                weakref.finalize(owner := _Owner(), _hold, "")
                del owner
            else:
                _hold("")
            return real(*args, **kwargs)
        return session


    if _point == "work_folder":
        import onnxruntime
        onnxruntime.InferenceSession = _in_work_folder(onnxruntime.InferenceSession)


    def dumps(obj, **kwargs):
        if _point == "atc_started" and "ATC start working" in str(obj):
            _hold()
        return _dumps(obj, **kwargs)


    time.sleep, json.dumps = sleep, dumps
""")


@contextlib.contextmanager
def held_child(tmp_path, monkeypatch, onnx: str, options: dict, place: str, point: str):
    """The compile child of `onnx` (as compile_process starts it), held in `place` at `point` once
    tmp_path/held exists; its process group killed at the end if it still runs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HELD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    monkeypatch.setenv("HELD_FLAG", str(tmp_path / "held"))
    monkeypatch.setenv("HELD_IN", place)
    monkeypatch.setenv("HELD_AT", point)
    monkeypatch.setenv("HELD_MODEL", endless_loop_onnx(tmp_path / "loop.onnx"))
    out = tmp_path / "out"
    out.mkdir()
    request = {"onnx_path": onnx, "output": str(out / "m.om"), "options": options, "parent": os.getpid()}
    with subprocess.Popen(own_python.command(CHILD_MODULE, json.dumps(request)), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True) as child:
        try:
            yield child
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)


def held(child: subprocess.Popen, flag: Path) -> None:
    """Wait for `child` to be held (`flag` written)."""
    for _ in range(HANG_GUARD_S * 100):
        if flag.exists() or child.poll() is not None:
            break
        time.sleep(0.01)
    assert flag.exists(), f"the child ended (status {child.returncode}) before it was held"


def stopped(child: subprocess.Popen, flag: Path, sig: int) -> tuple[list[dict], bytes]:
    """Signal `child` once it is held; what it said (its JSON lines) and its stderr once it ended."""
    held(child, flag)
    os.kill(child.pid, sig)
    child.wait(HANG_GUARD_S)  # (its stdin kept open, as the server keeps it: closed, it is a second SIGTERM)
    said, err = child.stdout.read(), child.stderr.read()
    assert child.returncode == 128 + sig, (child.returncode, err)
    return [json.loads(line) for line in said.splitlines()], err


@pytest.mark.parametrize("place, sig", [("finalizer", signal.SIGTERM), ("c_callback", signal.SIGHUP),
                                        ("onnxruntime", signal.SIGTERM)])
def test_a_stop_signal_ends_a_child_held_where_an_exception_is_lost(tmp_path, monkeypatch, compile_holds,
                                                                     multi_io_onnx, place, sig):
    with held_child(tmp_path, monkeypatch, multi_io_onnx, {"target": "cpu"}, place, "hold") as child:
        said, err = stopped(child, tmp_path / "held", sig)
    assert said == []  # no word: a stop is not a failure to report
    assert err == b"", err.decode()  # no "Exception ignored", no traceback


def test_a_stop_signal_kills_the_atc_of_a_child_held_where_an_exception_is_lost(tmp_path, monkeypatch, fake_atc,
                                                                              multi_io_onnx):
    atc, record = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "sleep")  # (600 s)
    options = {"batch": "1", "soc_version": "Ascend310P3", "target": "npu", "timeout": 600, "atc": str(atc)}
    with held_child(tmp_path, monkeypatch, multi_io_onnx, options, "finalizer", "atc_started") as child:
        said, err = stopped(child, tmp_path / "held", signal.SIGTERM)
    assert [m for m in said if "log" not in m] == [] and err == b"", (said, err.decode())  # (its log lines said)
    assert not alive(json.loads(record.read_text())["pid"])
    assert os.listdir(tmp_path / "out") == []  # no .atc-* work folder, no partial OM


@pytest.mark.parametrize("place", ["returning_library", "own_finalizer"])
def test_a_stop_signal_ends_a_child_by_its_unwinding_not_by_its_watchdog(tmp_path, monkeypatch, multi_io_onnx, place):
    """Held in compile_child._hold (aclserve's loop) inside the CPU compile's work folder:
    - returning_library: in _hold's sleep, library code that returns once the stop is heard; the
      KeyboardInterrupt comes at _hold's next line (without that, _hold loops on until the
      watchdog, which leaves the folder);
    - own_finalizer: _hold run by a finalizer; the KeyboardInterrupt raised in it, which Python
      drops, is raised again at optimise's next line (without that: "Exception ignored ...
      KeyboardInterrupt" on stderr, and the compile goes on to write the OM).
    The unwinding removes the work folder, the OM unwritten."""
    temp, holds = tmp_path / "temp", tmp_path / "holds"
    temp.mkdir()
    holds.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # (the CPU compile's work folder made there)
    monkeypatch.setenv("HELD_HOLDS", str(holds))
    with held_child(tmp_path, monkeypatch, multi_io_onnx, {"target": "cpu"}, place, "work_folder") as child:
        flag = tmp_path / "held" if place == "returning_library" else holds / str(child.pid)  # (_hold's mark)
        held(child, flag)
        assert work_folders(temp) != []  # (held inside it)
        said, err = stopped(child, flag, signal.SIGTERM)
    assert [m for m in said if "log" not in m] == [] and err == b"", (said, err.decode())  # (its log lines said)
    assert os.listdir(tmp_path / "out") == []  # no OM: the compile did not go on
    assert work_folders(temp) == []  # removed by the unwinding (optimise's with-block)


def work_folders(temp: Path) -> list[str]:
    return [name for name in os.listdir(temp) if name.startswith(WORK_PREFIX)]
