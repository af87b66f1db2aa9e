"""Which repeated warm-up failures stop the automatic retries (repository/retry.py warm_up_failure):
the same run failing with the same code and the device's same words (its ids and times aside) at
three attempts in a row or more, the first of them at least `load_retry_max_s` before the last, is
the model's failure (not a run past the execution timeout, however often); an
injected device fault is retried as before, unless it repeats identically that long (its count
says so), and so is one that fails the same way three times within `load_retry_max_s` (a device
fault lasting a few seconds)."""
from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

from aclserve.acl import compat
from aclserve.acl import cpu as cpu_acl
from aclserve.acl.check import AclError
from aclserve.acl.cpu import _err_msg, faults
from aclserve.errors import ExecutionFailed
from aclserve.repository.failures import LoadFailures
from aclserve.repository.layout import VersionFile
from aclserve.repository.retry import same_words
from aclserve.runtime.left_on_device import LeftOnDevice, note_left

from tests.tiny_models import compile_cpu_om, scale_onnx

from .repo_helpers import serving

# the stopped reason's end: the attempts in a row (three at least) and the seconds they spanned
STOPPED = re.compile(r"\(failed the same way ([3-9]|\d\d+) times in a row over \d+\.\d s: the model's failure")

pytestmark = pytest.mark.asyncio


def _reason(repo, name: str) -> str:
    return next((r["reason"] for r in repo.index() if r["name"] == name), "")


async def test_only_the_same_failure_of_the_same_run_for_max_s_stops_the_retries(make_repo, models_dir,
                                                                                  tmp_path, clean_faults):
    """`same` fails its first warm-up run 507011 at every attempt; `moving` fails three times,
    at another run each time (runs 1, 2 and 3 of gear 1), as a device fault striking anywhere does."""
    src = scale_onnx(tmp_path / "scale.onnx", 2.0)
    for name in ("same", "moving"):
        compile_cpu_om(src, models_dir / f"{name}.om", batch="1,2")
    faults.inject("execute", model="same")  # (no count: every execute of the model, each attempt's first run)
    for nth in (1, 3, 6):  # (each fault counts the model's runs since it was injected)
        faults.inject("execute", model="moving", nth=nth, count=1)
    repo, events = await make_repo(start=False, model_control_mode="poll", load_retry_initial_s=0.05,
                                   load_retry_max_s=0.1)
    await repo.start()
    await events.wait("loaded", "moving", limit_s=60)  # (a hang guard)
    await events.until(lambda: "not retried" in _reason(repo, "same"), limit_s=60)  # (a hang guard)
    reason = _reason(repo, "same")
    stopped = STOPPED.search(reason)
    assert "failed with 507011" in reason and stopped, reason
    assert repo.load_retries["moving"] == 3 and repo.load_retries["same"] == int(stopped[1]) - 1
    assert serving(repo) == ["moving"]


async def test_the_same_failure_three_times_within_max_s_is_retried_still(make_repo, models_dir, tmp_path,
                                                                          clean_faults):
    """A device fault that fails the same run alike three times in a row, all within `load_retry_max_s`
    (here its first three attempts, well under 30 s), is retried still: the 4th attempt loads. They were
    taken as the model's failure, and a fault of a few seconds on a device stopped its retries for good."""
    compile_cpu_om(scale_onnx(tmp_path / "scale.onnx", 2.0), models_dir / "brief.om", batch="1,2")
    faults.inject("execute", model="brief", count=3)  # each of the first three attempts' first run
    repo, events = await make_repo(start=False, model_control_mode="poll", load_retry_initial_s=0.05,
                                   load_retry_max_s=30)
    await repo.start()
    await events.until(lambda: serving(repo) == ["brief"] or "not retried" in _reason(repo, "brief"),
                       limit_s=60)  # (a hang guard)
    assert serving(repo) == ["brief"], _reason(repo, "brief")
    assert repo.load_retries["brief"] == 3


class _Abandoned:
    """What LeftOnDevice tracks of an instance: its device, and a word once the device let go of it
    (a real one is abandoned only when the device hangs on its work: test_warmup_timeout.py)."""

    def __init__(self):
        self.device, self._freed = SimpleNamespace(id=0), []

    def when_freed(self, callback) -> None:
        self._freed.append(callback)

    def let_go(self) -> None:
        for callback in self._freed:
            callback()


def _warm_up_failed(left: LeftOnDevice) -> ExecutionFailed:
    """The first warm-up run failed 507011 with the device's words, its closed pool having left `left`."""
    error = ExecutionFailed("batch of 1 row (gear 1) failed on device 0")
    error.__cause__ = AclError("rt.synchronize_event_with_timeout", 507011, said="Integer division by zero")
    error.warm_up_run = (1, 0)
    note_left(error, left)
    return error


async def test_a_stopped_failure_still_holds_a_load_call_back_while_its_load_left_instances():
    """The third identical failure's closed pool left an instance abandoned: its retries stop, and
    the model is counted as holding it (a load call is refused: repository.py _refuse_while_held)
    until the device lets go, when no retry is armed. The stopped path skipped that bookkeeping."""
    now = [0.0]
    failures = LoadFailures(0.05, 1.0, lambda name, version: None, clock=lambda: now[0])
    file = VersionFile("/models/m.om", "om", 1, 1)
    abandoned, left = _Abandoned(), LeftOnDevice()
    left.track(abandoned)
    try:
        for attempt, on_device in enumerate((LeftOnDevice(), LeftOnDevice(), left)):
            now[0] = attempt * 0.6  # (the third 1.2 s after the first: past max_s)
            reason = failures.record("m", "1", file, _warm_up_failed(on_device))
        assert STOPPED.search(reason) and failures.refused_for_good("m"), reason
        assert failures.held_by("m", {"1": file.identity}) == 1
        abandoned.let_go()
        await asyncio.sleep(0)  # (the word reaches the loop)
        assert failures.held_by("m", {"1": file.identity}) == 0
        assert failures.refused_for_good("m") and failures.retry_due_in("m", ["1"]) is None  # not retried
    finally:
        failures.close()


# What GE and the runtime say of an AI Core fault (acl.get_recent_err_msg), in the shapes CANN's
# messages have (mindspore's CANN error cases: "Aicore kernel execute failed, device_id=0,
# stream_id=14, ..."; RecentErrMsg lines in CI logs: "EZ9999[PID: 3058434] 2026-08-03-20:55:35.272.841
# (EZ9999): The error from device(chipId:0, dieId:1), serial number is 2569, ..."), ids in braces;
# over SAID_CHARS long, the kernel's name past it, as in the real ones
_AICORE = ("{code}: Inner Error! {code}[PID: {pid}] {stamp} ({code}): The error from device(chipId:0, dieId:1), "
           "serial number is {serial}, there is an exception of aivec error, core id is {core}, error code = 0x10, "
           "dump info: pc start: {pc}, current: {pc}, vec error info: 0xdf00005f59, para base: {base}."
           "[FUNC:PrintCoreInfo][FILE:device_error_core_proc.cc][LINE:645] TraceBack (most recent call last): "
           "The extend info: errcode:(0x10, 0, 0) errorStr: Illegal instruction, which is usually caused by "
           "unaligned UUB addresses. fsmId:0, tslot:{slot}, thread:0, ctxid:0, blk:0, sublk:0, subErrType:4."
           "[FUNC:PrintCoreInfo][FILE:device_error_core_proc.cc][LINE:658] Kernel task happen error, "
           "retCode=0x31, [vector core exception].[FUNC:PreCheckTaskErr][FILE:davinci_kernel_task.cc][LINE:1729] "
           "Aicore kernel execute failed, device_id=0, stream_id={stream}, report_stream_id={stream}, "
           "task_id={task}, fault kernel_name={kernel}, program id=8, hash=14046644073217913723"
           "[FUNC:GetError][FILE:stream.cc][LINE:701] Dump node ({node}) task error, tid: {tid} "
           "Stream synchronize failed, stream = {address}[FUNC:ReportError][FILE:logger.cc][LINE:566]")
_KERNEL = "add_13570952190744021808_0__kernel0"
# the ids of three attempts: each differs from the others', in length too
_IDS = [dict(pid=3058434, stamp="2026-08-03-20:55:35.272.841", serial=2569, core=18, pc="0x124200000168",
             base="0x12c100400000", slot=6, stream=14, task=13, tid="Thread-7", address="0xffff441cc970"),
        dict(pid=91583, stamp="2026-08-03-20:56:41.003.5", serial=8, core=3, pc="0x1000408008b8",
             base="0x12c100000080", slot=1, stream=2, task=58052, tid="Thread-12", address="0xfffe1c182e70"),
        dict(pid=805553, stamp="2026-08-03-20:58:02.914.230", serial=147, core=40, pc="0x12420000038c",
             base="0x12c1000", slot=3, stream=117, task=2, tid="Thread-3", address="0xffff2effd1e0")]


def _device_failed(said: str, ret: int = 507011) -> ExecutionFailed:
    """The first warm-up run failed with `ret`, the device having said `said` to the wait that
    failed (the CPU runtime's acl.get_recent_err_msg, read by compat.told as on a device)."""
    _err_msg.report(said)
    try:
        compat.told(cpu_acl, "rt.synchronize_event_with_timeout", ret)
    except AclError as e:
        cause = e
    error = ExecutionFailed(f"batch of 1 row (gear 1) failed on device 0: {cause}")
    error.__cause__ = cause
    error.warm_up_run = (1, 0)
    return error


def _three_attempts(failures: list[ExecutionFailed]) -> str:
    """`failures` recorded as the attempts of one file, 0.6 s apart (the third past `max_s`, 1 s):
    the reason of the last."""
    now = [0.0]
    recorded = LoadFailures(0.05, 1.0, lambda name, version: None, clock=lambda: now[0])
    file = VersionFile("/models/m.om", "om", 1, 1)
    try:
        for attempt, error in enumerate(failures):
            now[0] = attempt * 0.6
            reason = recorded.record("m", "1", file, error)
        return reason
    finally:
        recorded.close()


async def test_a_device_message_differing_only_in_its_ids_is_the_same_failure():
    """GE's message of one AI Core fault differs at every attempt in its process id, timestamp, task
    and stream ids, addresses and thread: the same failure, compared as it was, never came three
    times in a row, and a model that cannot warm up was retried for good on a device. Cut to what an
    error's message shows (600 chars), ids of another length left a different end each time."""
    said = [_AICORE.format(code="EZ9999", kernel=_KERNEL, node="Default/Add-op8", **ids) for ids in _IDS]
    assert len(set(said)) == 3 and min(map(len, said)) > 700
    reason = _three_attempts([_device_failed(text) for text in said])
    assert STOPPED.search(reason) and "failed with 507011: " in reason and _KERNEL not in reason, reason


@pytest.mark.parametrize("ids", ["same", "other"])
@pytest.mark.parametrize("differs", ["kernel", "node", "GE code", "ACL code"])
async def test_a_device_message_naming_another_op_or_code_is_another_failure(differs, ids):
    """Its ids aside, a message naming another kernel or node, another GE error code or another ACL
    code at the second attempt is another failure: retried still. The kernel and node come past what
    an error's message shows (600 chars), where no difference was seen: with the same ids at each
    attempt the three were taken for one failure. The codes differ in a digit only (E19999, E39999)."""
    words = {"kernel": ("kernel", _KERNEL, "mul_13570952190744021808_0__kernel0"),
             "node": ("node", "Default/Add-op8", "Default/Add-op9"), "GE code": ("code", "E19999", "E39999"),
             "ACL code": ("code", "EZ9999", "EZ9999")}
    key, usual, other = words[differs]

    def attempt(number: int) -> ExecutionFailed:
        said = dict(code="EZ9999", kernel=_KERNEL, node="Default/Add-op8", **_IDS[number if ids == "other" else 0])
        said[key] = other if number == 1 else usual
        return _device_failed(_AICORE.format(**said), 507015 if differs == "ACL code" and number == 1 else 507011)
    reason = _three_attempts([attempt(number) for number in range(3)])
    assert "transient device error: retry 3 in" in reason and "not retried" not in reason, reason


async def test_a_message_s_ids_and_times_go_and_its_names_and_codes_stay():
    """Pairs a device may say at two attempts of one failure compare alike; pairs naming another
    node (a number in its path), another hex error code or another kernel (its hash) do not."""
    alike = [("Add.Add-op8.13.14.1659524415123456.bin", "Add.Add-op8.13.14.1659524415999999.bin"),
             ("session 123e4567-e89b-12d3-a456-426614174000 failed",
              "session 9f1c2d3e-0000-4bbb-8ccc-0123456789ab failed"),
             ("EZ9999[PID: 3058434] 2026-08-03-20:55:35.272.841", "EZ9999[PID: 91583] 2026-08-03-20:56:41.003.5"),
             ("Thread-7 stream = 0xffff441cc970", "Thread-12 stream = 0xfffe1c182e70")]
    for first, second in alike:
        assert same_words(first) == same_words(second), (first, second)
    apart = [("node /model/layers/0/attn/MatMul", "node /model/layers/11/attn/MatMul"),
             ("error code = 0x10", "error code = 0x20"), ("retCode=0x31", "retCode=0x32"),
             ("errorCode=0x800000", "errorCode=0x28"), (_KERNEL, "add_13570952190744021809_0__kernel0"),
             ("E19999", "E39999"), ("layers.3", "layers.4")]
    for first, second in apart:
        assert same_words(first) != same_words(second), (first, second)


async def test_a_warm_up_run_past_the_execution_timeout_is_retried_however_often(make_repo, models_dir, tmp_path,
                                                                                 clean_faults):
    """The first four runs of `slow` take 600 ms, over its 200 ms execution timeout, then runs are
    quick again, as when a busy host (other models compiling or warming up) slowed them for a
    while: the same warm-up run timed out at three attempts in a row and more, over more than
    `load_retry_max_s`, and the model loads once its runs are quick. Taken for the model's failure
    as a run failing alike is, it stayed UNAVAILABLE for good."""
    compile_cpu_om(scale_onnx(tmp_path / "scale.onnx", 2.0), models_dir / "slow.om", batch="1,2")
    (models_dir / "slow.yaml").write_text("execution_timeout_ms: 200\nreset_timeout_ms: 5000\n")
    faults.inject("execute", model="slow", delay_ms=600, count=4)
    repo, events = await make_repo(start=False, model_control_mode="poll", load_retry_initial_s=0.05,
                                   load_retry_max_s=0.1)
    await repo.start()
    await events.until(lambda: "not retried" in _reason(repo, "slow") or serving(repo) == ["slow"],
                       limit_s=120)  # (a hang guard)
    assert serving(repo) == ["slow"], _reason(repo, "slow")
    assert repo.load_retries["slow"] >= 3
