"""A dropped .onnx compiles in a child process (aclserve/om/compile_process.py): an unload or a
shutdown during the compile ends that process and leaves nothing in the cache folder, so does
compile_timeout_s, and how it failed (its error, the signal that killed it, its timeout) is the
version's one-line reason. Each
compile is held in its child by `compile_holds` (tests/conftest.py) for as long as a test needs."""
from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys

import pytest

from aclserve.om.compile_process import CHILD_MODULE
from aclserve.repository import ModelLoadFailed
from aclserve.repository.entry_locks import sweep

from tests import REPO
from tests.processes import kill_group_led_by, run_as_group
from tests.tiny_models import endless_loop_onnx

from .repo_helpers import place, serving, until, write_in


def held_child(holds) -> int:
    """The pid of the compile's process holding in `holds` (exactly one)."""
    (mark,) = holds.iterdir()
    return int(mark.name)


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # (a child not waited for would still be found: a zombie)
    except ProcessLookupError:
        return False
    return True


def row_of(repo, name: str) -> dict:
    (row,) = [r for r in repo.index() if r["name"] == name and r["version"]]
    return row


@pytest.mark.asyncio
async def test_an_unload_during_a_compile_kills_its_process(make_repo, models_dir, model_files, compile_holds):
    repo, events = await make_repo(model_control_mode="explicit")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    load = asyncio.ensure_future(repo.load("o"))
    await until(lambda: any(compile_holds.iterdir()), "the compile's process holding")
    pid = held_child(compile_holds)
    assert pid != os.getpid() and running(pid)
    assert (row_of(repo, "o")["state"], row_of(repo, "o")["reason"]) == ("LOADING", "compiling o.onnx for cpu")
    await repo.unload("o")  # (it waited for the compile, minutes for a large model)
    assert not running(pid)
    assert os.listdir(models_dir / ".cache") == []  # no work folder, partial OM nor lock
    with pytest.raises(ModelLoadFailed, match="an unload request for it arrived during this load"):
        await load
    assert (row_of(repo, "o")["state"], row_of(repo, "o")["reason"]) == ("UNAVAILABLE", "unloaded")
    assert repo.load_failures() == {} and events.count("load_failed", "o") == 0
    (compile_holds / str(pid)).unlink()  # (the killed child's mark)
    again = asyncio.ensure_future(repo.load("o"))  # loaded again, compiled from the start
    await until(lambda: any(compile_holds.iterdir()), "the new compile's process holding")
    (compile_holds / str(held_child(compile_holds))).unlink()
    await again
    assert float((await repo.get("o").infer({"x": [[1.0] * 4]}, 1)).outputs["y"][0, 0]) == 2.0


def oom_score_adj(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


@pytest.mark.asyncio
async def test_the_compile_s_process_is_the_out_of_memory_killer_s_first_pick(make_repo, models_dir, model_files,
                                                                              compile_holds):
    """In a 170 MB cgroup a 44 MB .onnx dropped in had the kernel kill the server (133 MB
    resident), every model down, rather than its compile's process (108 MB): both at
    oom_score_adj 0 (tester t87). Read from /proc while the compile runs (held): the child's is
    1000, the server's (this process) as it was; the compile then goes on and the model loads."""
    own = oom_score_adj(os.getpid())
    if own == 1000:
        pytest.skip("this process is the out-of-memory killer's first pick already: nothing to tell apart")
    repo, _ = await make_repo(model_control_mode="explicit")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    load = asyncio.ensure_future(repo.load("o"))
    await until(lambda: any(compile_holds.iterdir()), "the compile's process holding")
    pid = held_child(compile_holds)
    assert (oom_score_adj(pid), oom_score_adj(os.getpid())) == (1000, own)
    (compile_holds / str(pid)).unlink()
    await load
    assert float((await repo.get("o").infer({"x": [[1.0] * 4]}, 1)).outputs["y"][0, 0]) == 2.0


@pytest.mark.asyncio
async def test_a_shutdown_during_a_compile_kills_its_process(make_repo, models_dir, model_files, compile_holds):
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    repo, _ = await make_repo(start=False, model_control_mode="explicit")
    start = asyncio.ensure_future(repo.start())
    await until(lambda: any(compile_holds.iterdir()), "the compile's process holding")
    pid = held_child(compile_holds)
    await repo.close()
    await asyncio.gather(start, return_exceptions=True)
    assert not running(pid)
    assert os.listdir(models_dir / ".cache") == []



@pytest.mark.asyncio
async def test_a_compile_past_compile_timeout_s_is_ended_and_the_loads_behind_it_go_on(
        make_repo, models_dir, model_files, compile_holds, tmp_path):
    """A CPU compile whose test runs of the model never end (a Loop of 10**12 iterations) held
    the one load_concurrency turn for about a day: an .om beside it stayed LOADING ("waiting")
    and the server was never ready. Past compile_timeout_s its process is ended, the version
    fails naming the key, is not compiled again by itself (as a failed compile), and a load call
    compiles it again; the .om loads meanwhile."""
    place(endless_loop_onnx(tmp_path / "loop.onnx"), models_dir / "loop.onnx")
    place(model_files[2]["om"], models_dir / "m.om")
    repo, events = await make_repo(start=False, model_control_mode="explicit", load_concurrency=1,
                                   compile_timeout_s=3)
    start = asyncio.ensure_future(repo.start())
    await until(lambda: any(compile_holds.iterdir()), "the compile's process holding")
    pid = held_child(compile_holds)
    (compile_holds / str(pid)).unlink()  # on to its test runs of the model, which do not end
    await start
    await events.until(lambda: serving(repo) == ["m"] and events.count("load_failed", "loop") == 1)
    expected = ("the compile did not finish within compile_timeout_s (3 s) and its process was ended; raise "
                "compile_timeout_s in the server's config if the model needs longer")
    # (no automatic retry armed: the reason would say when it is due)
    assert (row_of(repo, "loop")["state"], row_of(repo, "loop")["reason"]) == ("UNAVAILABLE", expected)
    assert not running(pid)
    assert [name for name in os.listdir(models_dir / ".cache") if "loop" in name] == []
    assert float((await repo.get("m").infer({"x": [[1.0] * 4]}, 1)).outputs["y"][0, 0]) == 2.0

    again = asyncio.ensure_future(repo.load("loop"))
    await until(lambda: any(compile_holds.iterdir()), "the second compile's process holding")
    (compile_holds / str(held_child(compile_holds))).unlink()
    with pytest.raises(ModelLoadFailed, match=r"compile_timeout_s \(3 s\)"):
        await again
    assert events.count("load_failed", "loop") == 2


async def signalled_compile(make_repo, models_dir, model_files, compile_holds, sig: int) -> tuple:
    """Poll mode compiles o.onnx in its child; `sig` sent to the held child: (repo, events, the
    index's reason)."""
    repo, events = await make_repo(model_control_mode="poll")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    await until(lambda: any(compile_holds.iterdir()), "the compile's process holding")
    os.kill(held_child(compile_holds), sig)
    await events.wait("load_failed", "o")
    return repo, events, row_of(repo, "o")["reason"]


@pytest.mark.asyncio
async def test_how_a_compile_process_failed_is_one_line_in_the_index(make_repo, models_dir, model_files,
                                                                      compile_holds):
    """Killed (as the kernel's out-of-memory killer does): said with its signal, not retried;
    failed: its error's one line, as the compile said it in the child."""
    repo, events, reason = await signalled_compile(make_repo, models_dir, model_files, compile_holds, signal.SIGKILL)
    assert reason == ("the compile's process was killed by SIGKILL (signal 9; the kernel's out-of-memory "
                      "killer sends it when the host runs short of memory)"), reason
    assert os.listdir(models_dir / ".cache") == []

    for mark in compile_holds.iterdir():
        mark.unlink()
    write_in(models_dir / "bad.onnx", b"not a model")
    await until(lambda: any(compile_holds.iterdir()), "the second compile's process holding")
    (compile_holds / str(held_child(compile_holds))).unlink()  # let it compile: it fails in the child
    await events.wait("load_failed", "bad")
    reason = row_of(repo, "bad")["reason"]
    assert reason.endswith("bad.onnx: not an ONNX model (Error parsing message with type 'onnx.ModelProto')"), reason
    assert "\n" not in reason and "Traceback" not in reason
    assert [name for name in os.listdir(models_dir / ".cache") if not name.startswith("o-")] == []


def test_the_sweep_removes_a_work_folder_whose_compile_is_gone_not_one_at_work(tmp_path):
    """A server killed during a compile left its work folder (its child ended with it); a
    replica compiling now holds the entry's lock and keeps its own."""
    gone, busy = f"a-{'1' * 32}", f"b-{'2' * 32}"
    (tmp_path / f".{gone}.compiling-x1y2").mkdir()
    (tmp_path / f".{gone}.compiling-x1y2" / f"{gone}.om").write_bytes(b"half")
    (tmp_path / f".{busy}.compiling-z3").mkdir()
    (tmp_path / ".not-an-entry.compiling-q").mkdir()  # (not by an entry's name: not the cache's)
    held = os.open(tmp_path / f".{busy}.om.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert sweep(tmp_path) == 1
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{busy}.compiling-z3", f".{busy}.om.lock",
                                                          ".not-an-entry.compiling-q"]


def test_what_atc_would_refuse_is_said_in_the_servers_log(model_files, tmp_path, caplog):
    """A CPU compile's warnings (a SoC ATC would not take, an opset out of ATC's range) reach the
    server's log from its child: they were the CLI summary's only."""
    import logging

    from aclserve.config import CompileOptions
    from aclserve.repository.compiler import compiled_om

    caplog.set_level(logging.WARNING, logger="aclserve")
    compiled_om(model_files[1]["onnx"], "m", CompileOptions(soc_version="Bogus123"), "cpu", tmp_path / "cache")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # (in the model YAML's words: the server has no --soc-version)
    said_soc = "m: compile.soc_version 'Bogus123' does not look like a SoC ATC takes"
    assert any(line.startswith(said_soc) for line in said), said


def test_inputs_naming_the_batch_differently_are_said_in_the_servers_log(tmp_path, caplog):
    """Inputs [N, 4] and [M, 4] are taken for one batch: said in a WARNING line, in the model
    YAML's words (they were served so without a word: a tester, t85)."""
    import logging

    import onnx
    from onnx import TensorProto, helper

    from aclserve.config import CompileOptions
    from aclserve.repository.compiler import compiled_om

    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Neg", ["a"], ["ya"]), helper.make_node("Abs", ["b"], ["yb"])], "two",
                              [vi("a", TensorProto.FLOAT, ["N", 4]), vi("b", TensorProto.FLOAT, ["M", 4])],
                              [vi("ya", TensorProto.FLOAT, ["N", 4]), vi("yb", TensorProto.FLOAT, ["M", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "two.onnx")
    caplog.set_level(logging.WARNING, logger="aclserve")
    compiled_om(tmp_path / "two.onnx", "two", CompileOptions(), "cpu", tmp_path / "cache")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [line for line in said if "symbols" in line] == [
        "two: inputs 'a' (N) and 'b' (M) name their dimension 0 with different symbols: both are taken for the one "
        "batch dimension, as ATC takes every -1 first dimension under --dynamic_batch_size, so a request must give "
        "them the same number of rows; where they are not one batch, fix their sizes with compile.input_shape"], said


@pytest.mark.asyncio
async def test_a_compile_process_stopped_by_sigterm_alone_is_said_so(make_repo, models_dir, model_files,
                                                                     compile_holds):
    """A SIGTERM from outside (an operator's `kill`): the child ends as asked, status 128 + 15,
    said by its signal ("exited with status 143 without a result" before)."""
    _, _, reason = await signalled_compile(make_repo, models_dir, model_files, compile_holds, signal.SIGTERM)
    assert reason == "the compile's process was stopped by SIGTERM (exit status 143)", reason


# A server (this program, its arguments an ONNX file and an output) compiling in a child
SERVER = ("import sys; from aclserve.om.compile_process import compile_in_child; "
          "compile_in_child(sys.argv[1], sys.argv[2], log=print, target='cpu')")
# A subreaper (this program's arguments: the holds folder, the ONNX file, the output) starts that
# server, kills it outright once its child holds, and says how the child, now its own, ended
WATCHER = """
import ctypes, os, signal, subprocess, sys, time
from tests.processes import leashed_popen  # (the server dies with the watcher, as it dies with the test)
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the server's orphan is ours
holds = sys.argv[1]
server = leashed_popen([sys.executable, "-c", sys.argv[4], sys.argv[2], sys.argv[3]])
for _ in range(1200):  # a hang guard: until the child holds
    if os.listdir(holds):
        break
    time.sleep(0.05)
child = int(os.listdir(holds)[0])
os.kill(server.pid, signal.SIGKILL)
server.wait()
_, status = os.waitpid(child, 0)
print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_killed_outright_takes_its_compile_process_with_it_at_once(model_files, compile_holds, tmp_path):
    """The kernel kills the child when the server dies (SIGKILL: inside ONNX Runtime's C calls it
    heard its stdin's end only 1-3 s later); it ended by its own SIGTERM (status 143) before. Nothing
    is left whatever ends the watcher (its timeout killed it alone: its server ran on, an orphan):
    the watcher and its server are killed as a group, and the compile's child, in a session of its
    own, by its mark."""
    command = [sys.executable, "-c", WATCHER, str(compile_holds), str(model_files[2]["onnx"]),
               str(tmp_path / "o.om"), SERVER]
    try:
        watched = run_as_group(command, timeout=120, cwd=REPO)  # (REPO first on the watcher's sys.path: tests)
    finally:
        for mark in compile_holds.iterdir():
            kill_group_led_by(int(mark.name), CHILD_MODULE)
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.split()[-1] == str(int(signal.SIGKILL)), watched.stdout + watched.stderr
