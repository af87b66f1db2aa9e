"""compile_model in a child process (aclserve/om/compile_process.py), the server's way to compile
a dropped .onnx, on the ATC path (the stand-in `atc`): the child streams ATC's lines back, says
ATC's failure in one line, and a stop ends the ATC it started, leaving no work folder behind; so
does its timeout, which ends a CPU compile whose test runs of the model never end too; a child
killed outright takes its ATC with it."""
from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from onnx import TensorProto, helper

from aclserve.om.compile import compile_model
from aclserve.om.compile_error import CompileError, NoBatchDimension
from aclserve.om.compile_process import CompileStop, CompileStopped, CompileTimedOut, compile_in_child
from tests.tiny_models import endless_loop_onnx, save_graph

OPTIONS = {"batch": "1", "soc_version": "Ascend310P3", "target": "npu", "timeout": 600}


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"  # (a zombie: ended, its reaper late)
    except FileNotFoundError:
        return True


def compiling(onnx, output, atc, **options) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    """compile_in_child of `onnx` with the stand-in `atc`, begun in a thread: the thread, an event
    set once ATC has started (its first line), and what the compile raised (once the thread ends)."""
    started, ended = threading.Event(), []

    def compile_it():
        try:
            compile_in_child(onnx, output, atc=str(atc), **OPTIONS, **options,
                             log=lambda line: started.set() if "ATC start working" in line else None)
        except BaseException as e:
            ended.append(e)

    thread = threading.Thread(target=compile_it)
    thread.start()
    return thread, started, ended


def test_atc_in_the_child_builds_and_its_lines_come_back(tmp_path, fake_atc, multi_io_onnx):
    atc, _ = fake_atc
    lines: list[str] = []
    built = compile_in_child(multi_io_onnx, tmp_path / "m.om", log=lines.append, atc=str(atc), **OPTIONS)
    assert built.target == "npu" and built.path == tmp_path / "m.om" and built.path.read_bytes()[:4] == b"IMOD"
    assert any("ATC run success" in line for line in lines), lines


def test_an_atc_failure_in_the_child_is_its_one_line(tmp_path, fake_atc, multi_io_onnx, monkeypatch):
    atc, _ = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "fail")
    with pytest.raises(CompileError) as failed:
        compile_in_child(multi_io_onnx, tmp_path / "m.om", log=lambda line: None, atc=str(atc), **OPTIONS)
    assert str(failed.value).startswith("ATC failed (exit status 1): E10001: Value [x:-1,4]"), failed.value
    assert "\n" not in str(failed.value)
    assert sorted(os.listdir(tmp_path)) == ["bin", "multi.onnx", "record.json"]  # no m.om, no work folder


def test_batch_sizes_for_a_model_without_a_batch_dimension_come_back_as_no_batch_dimension(tmp_path):
    """The child's refusal keeps its type: the server words it for a config.pbtxt's max_batch_size
    by it (repository/loader.py), where it matched the refusal's text."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    static = save_graph(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "static", [x], [y]),
                        tmp_path / "static.onnx")
    with pytest.raises(NoBatchDimension) as refused:
        compile_in_child(static, tmp_path / "m.om", log=lambda line: None, target="cpu", batch=[1, 2])
    assert str(refused.value) == ("--batch given but the model has no batch dimension (no input has a dynamic first "
                                  "dimension; -1 marks it in --input-shape)")


def test_a_stop_ends_the_atc_the_child_runs_and_leaves_nothing(tmp_path, fake_atc, multi_io_onnx, monkeypatch):
    atc, record = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "sleep")  # (600 s)
    out = tmp_path / "out"
    out.mkdir()
    stop = CompileStop()
    thread, started, ended = compiling(multi_io_onnx, out / "m.om", atc, stop=stop)
    assert started.wait(120)  # (a hang guard)
    stop.stop()
    thread.join(120)
    assert len(ended) == 1 and isinstance(ended[0], CompileStopped), ended
    assert _gone(json.loads(record.read_text())["pid"])
    assert os.listdir(out) == []  # no .atc-* work folder, no partial OM


def _environment_and_parent(pid: int) -> tuple[set[str], int]:
    """The names in a process's environment, and its parent's pid."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        names = {entry.partition(b"=")[0].decode() for entry in f.read().split(b"\0") if entry}
    with open(f"/proc/{pid}/stat") as f:
        return names, int(f.read().rpartition(")")[2].split()[1])


def _read_up_from_atc(read, tmp_path, fake_atc, onnx, monkeypatch, in_child: bool) -> list:
    """`read(pid)` of each process from ATC up to this one (ATC, its leash, and the compile's child
    with `in_child`, else the Python API's compile_model in this process), while ATC runs."""
    atc, record = fake_atc
    gate = tmp_path / "gate"
    monkeypatch.setenv("FAKE_ATC_MODE", "gate")  # (ATC waits for the file `gate`)
    monkeypatch.setenv("FAKE_ATC_GATE", str(gate))
    seen: list = []

    def log(line: str) -> None:
        if "waiting for the gate" in line:
            pid = json.loads(record.read_text())["pid"]
            while pid != os.getpid():
                seen.append(read(pid))
                pid = _parent(pid)
            gate.touch()
    if in_child:
        compile_in_child(onnx, tmp_path / "m.om", log=log, atc=str(atc), **OPTIONS)
    else:
        compile_model(onnx, tmp_path / "m.om", batch="1", soc_version="Ascend310P3", atc=str(atc), timeout=600,
                      log=log)
    return seen


@pytest.mark.parametrize("in_child", [True, False], ids=["compile_in_child", "compile_model"])
def test_neither_the_compile_nor_its_atc_gets_the_api_token(tmp_path, fake_atc, multi_io_onnx, monkeypatch, in_child):
    """The compile's child and ATC (a vendor binary) inherited the server's whole environment, its
    API token included (a tester, t59). Each process from ATC up to this one (ATC, its leash, and
    the compile's child, or the Python API's compile_model in this process) is read while ATC
    runs: none holds ACLSERVE_API_TOKEN; the rest is kept."""
    monkeypatch.setenv("ACLSERVE_API_TOKEN", "s3cret-for-the-server-alone")
    seen = _read_up_from_atc(lambda pid: _environment_and_parent(pid)[0], tmp_path, fake_atc, multi_io_onnx,
                             monkeypatch, in_child)
    assert len(seen) == (3 if in_child else 2) and all("FAKE_ATC_RECORD" in names for names in seen), seen
    assert not any("ACLSERVE_API_TOKEN" in names for names in seen)


def _oom_score_adj(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


@pytest.mark.parametrize("in_child", [True, False], ids=["compile_in_child", "compile_model"])
def test_the_compile_and_its_atc_are_the_out_of_memory_killer_s_first_pick(tmp_path, fake_atc, multi_io_onnx,
                                                                           monkeypatch, in_child):
    """The compile's child inherited the server's oom_score_adj (0): short of memory, the kernel
    killed the server, larger, rather than the compile (tester t87). Each process from ATC up to
    this one (ATC, its leash, and the compile's child, or the Python API's compile_model in this
    process) is read from /proc while ATC runs: each is at 1000, this process as it was."""
    own = _oom_score_adj(os.getpid())
    if own == 1000:
        pytest.skip("this process is the out-of-memory killer's first pick already: nothing to tell apart")
    scores = _read_up_from_atc(_oom_score_adj, tmp_path, fake_atc, multi_io_onnx, monkeypatch, in_child)
    assert scores == [1000] * (3 if in_child else 2), scores
    assert _oom_score_adj(os.getpid()) == own


def test_a_cpu_compile_whose_test_runs_never_end_is_ended_at_its_timeout(tmp_path):
    """A Loop of 10**12 iterations: the CPU compile's test runs of the model went on for about a
    day, inside ONNX Runtime (SIGTERM unheard), the child waited for without a deadline."""
    lines: list[str] = []
    with pytest.raises(CompileTimedOut, match=r"^the compile did not finish within 3 s and its process was ended$"):
        compile_in_child(endless_loop_onnx(tmp_path / "loop.onnx"), tmp_path / "loop.om", log=lines.append,
                         target="cpu", timeout_s=3)
    assert any("compiling" in line for line in lines), lines  # (it was compiling, not starting)
    assert sorted(os.listdir(tmp_path)) == ["loop.onnx"]  # no OM, partial or whole


def test_a_timeout_ends_the_atc_the_child_runs_and_leaves_nothing(tmp_path, fake_atc, multi_io_onnx, monkeypatch):
    atc, record = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "sleep")  # (600 s, within ATC's own timeout)
    out = tmp_path / "out"
    out.mkdir()
    # (4 s: ATC has started by then, its child's SIGTERM first; it started 0.3 s in on a loaded 2-core machine)
    with pytest.raises(CompileTimedOut):
        compile_in_child(multi_io_onnx, out / "m.om", log=lambda line: None, atc=str(atc), timeout_s=4, **OPTIONS)
    assert record.exists(), "ATC did not start within the compile's timeout"
    assert _gone(json.loads(record.read_text())["pid"])
    assert os.listdir(out) == []  # no .atc-* work folder, no partial OM


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def _wait_gone(pids: list[int]) -> None:
    for _ in range(3000):  # (a hang guard: the kernel's signal is at once)
        if all(_gone(pid) for pid in pids):
            return
        threading.Event().wait(0.01)


def test_a_compile_process_killed_outright_takes_its_atc_with_it(tmp_path, fake_atc, multi_io_onnx, monkeypatch):
    """The server SIGKILLs a child still there STOP_GRACE_S after its SIGTERM (a shutdown, an
    unload), and the out-of-memory killer may pick one: nothing of it ran to kill its ATC, which
    went on (its own processes too) until its timeout, an hour by default."""
    atc, record = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "sleep_with_helper")  # (600 s, and a process of its own)
    thread, started, ended = compiling(multi_io_onnx, tmp_path / "m.om", atc)
    assert started.wait(120)  # (a hang guard)
    ran = json.loads(record.read_text())
    atc_processes = [ran["pid"], ran["helper"]]
    try:
        child = ran["pid"]
        while _parent(child) != os.getpid():  # (ATC's ancestor this process started: the compile child)
            child = _parent(child)
        os.kill(child, signal.SIGKILL)
        thread.join(120)
        assert len(ended) == 1 and "killed by SIGKILL" in str(ended[0]), ended
        _wait_gone(atc_processes)
        assert [pid for pid in atc_processes if not _gone(pid)] == []
    finally:
        for pid in atc_processes:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
