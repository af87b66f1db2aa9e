"""Fault injection for runtime tests: make model executions or memory copies fail, slow down or hold.

    from aclserve.acl.cpu import faults
    f = faults.inject("execute", nth=3)                  # the 3rd execute from now fails 507011
    faults.inject("execute", count=4)                     # the next 4 executes fail
    faults.inject("memcpy", nth=2, count=3)               # copies 2, 3 and 4 from now fail 507011
    faults.inject("execute", probability=0.1, code=145000)
    faults.inject("execute", delay_ms=200)               # every execute sleeps 200 ms first
    faults.inject("query_size", nth=1, code=500002)      # the next query_size is refused
    faults.inject("load", nth=1, code=207001)            # the next model load fails (device memory)
    faults.inject("mem_info", count=3, code=507899)      # the next 3 get_mem_info calls fail
    gate = threading.Event()
    f = faults.inject("execute", nth=1, hold=gate)        # the next execute waits for gate.set()
    f.entered.wait()                                      # ... it has started (and holds the model)
    faults.inject("execute_call", nth=2, hold=gate)       # the 2nd execute_async call itself blocks
    faults.inject("dvpp", nth=1, hold=gate)               # the next JPEGD/VPC task hangs on its stream
    faults.inject("stream", delay_ms=2, probability=0.3)  # 30 % of all streams' tasks start 2 ms late
    faults.clear()

Counting starts when the fault is injected and covers the whole process, or one model: with
model= (execute, execute_call, describe and load) the OMs whose header gives that name (or the
server's compile-cache entries of the model: <model>-<key>), whichever instance, rebuild, reload
or retry loaded them; with model_id= (execute, execute_call and describe) one loaded model id,
which a new load of the same file does not get (ids are given in load order, never twice).
`nth` picks the first call that fails (default: the next one) and `count` how many in a row from
there (default 1 with nth, else every call). A
sync `execute` or `memcpy` returns the code; an `execute_async` or `memcpy_async` stores it on
its stream, so it surfaces at the next synchronize, as does a `dvpp` task's (acl.media's JPEGD
and VPC tasks). `execute_call` is the execute_async call
itself, on the calling thread, before it queues the work: its code is the call's return value,
and a delay or hold there is a driver call that does not return. `code` defaults to 507011, or
to 0 (no failure) when only a delay or hold is asked for. Delays and holds of `execute` happen
while the execution owns the model, so they also provoke the non-re-entrancy error and
stream/event timeouts. `stream` delays or holds every task any stream runs before it starts,
event records and waits included (it takes no code: such a task does not fail): it widens the
windows between a call and its task, where a host touching a buffer an async copy owns is
caught (_async_host.py).

    faults.inject("execute", nth=5, code=507054, device=True)  # the 5th execute fails its whole device

`device` (execute and memcpy only, with a code a device failed as a whole reports: 507054,
507053, 507015 or 107022, acl.constants.WHOLE_DEVICE_FAILURES): the fault fails the whole
device, as an HBM multi-bit ECC error (507054), a sustained page fault (507015) or a memory
error (507053) does on one
(hicann/runtime ContextManage::SetGlobalFailureErr): the call that fires it fails with the code,
and from then on every task submitted in any context of that device, one made later included,
is refused with it (execute and execute_async, memcpy_async, memset_async, record_event,
stream_wait_event, reset_event, launch_callback, acl.media's tasks: Stream.enqueue), the work
its streams still held fails with it (a synchronize of a stream with work in flight reports it),
and every context in stop-on-failure mode stops on it. malloc, free, the synchronous memcpy and
get_mem_info still work (no status check of theirs is known). It clears only once the device's
count is back to 0: no context of it left and reset_device called for each set_device
(_state.fail_device).

    faults.inject("execute", code=507011, says=True)     # every execute fails, saying so as CANN does

`says` (execute only, with a code): the failed run says what CANN's runtime says of a task the
device failed (acl.get_recent_err_msg: EZ9999, the process id, the time, the device and a task id),
where it says nothing otherwise. As on a device, the time and the task id change at every fault
(what repository/retry.py same_words takes out to tell one failure from another).

Environment (read at acl.init): ACLSERVE_CPU_FAULTS="execute:nth=3,code=507011;memcpy:count=2"
- faults separated by ';', each `kind` then optional `:key=value,...` with keys nth, count,
probability, code (at most MAX_CODE), delay_ms (finite, at most MAX_DELAY_MS), model (a name;
NAMED_KINDS only: "execute:model=resnet,count=30"), model_id (0..MAX_MODEL_ID; MODEL_KINDS only),
device (0 or 1: "execute:nth=5,code=507054,device=1"), says (0 or 1; SAYING_KINDS only). A bad spec
raises ValueError with one line saying what is wrong (`aclserve serve` checks it before starting).
"""
from __future__ import annotations

import itertools
import math
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field

from .. import constants as C
from . import _err_msg

# query_size: refuse it, as CANN does for dynamic-shape OMs; load: a model's load_from_* (GE
# allocating what query_size does not count, say); describe: a loaded model's mdl.get_desc (GE
# failing to read its description, 500002 on a device); mem_info: get_mem_info; execute_call: the
# call, not the work; dvpp: a JPEGD or VPC task of acl.media, when it runs on its stream; stream:
# every task of every stream as it starts (a delay or hold only)
KINDS = ("execute", "execute_call", "memcpy", "query_size", "load", "describe", "mem_info", "dvpp", "stream")
_KEYS = {"nth": int, "count": int, "probability": float, "code": int, "delay_ms": float, "model": str,
         "model_id": int, "device": int, "says": int}
DEVICE_KINDS = ("execute", "memcpy")  # the kinds that may fail their whole device (`device`)
SAYING_KINDS = ("execute",)  # the kinds whose failure may say what a device says of it (`says`)
# the kinds whose calls name a model (`model_id`): the others pass none to trigger(), so a
# model_id there never matched (memcpy, dvpp) or matched every call as model 0 (load, query_size)
MODEL_KINDS = ("execute", "execute_call", "describe")
# the kinds whose calls know the model's name (`model`): a load has read the OM's header too
NAMED_KINDS = MODEL_KINDS + ("load",)
# what follows <model> in the name of the server's compile-cache entry of it: "-" and 32 hex digits
# of its key (repository/compiler.py compiled_om names the OM so, and the compile its header)
_CACHE_KEY = re.compile(r"-[0-9a-f]{32}")
_FORMAT = "kind[:key=value,...][;...] with kind " + "|".join(KINDS) + " and keys " + ", ".join(_KEYS)
# About 31 years: as good as never returning, and within what time.sleep takes (an infinite or NaN
# delay made every faulted call raise in time.sleep instead of sleeping).
MAX_DELAY_MS = 1e12
MAX_CODE = 2**31 - 1  # aclError is a C int (acl_base.h): pyACL returns no larger code
MAX_MODEL_ID = 2**32 - 1  # a model id is a uint32_t (aclmdlLoadFromFile's modelId): no model has a larger one


@dataclass
class Fault:
    kind: str
    nth: int | None = None
    count: int | None = None
    probability: float | None = None
    code: int = C.ACL_ERROR_RT_MODEL_EXECUTE
    delay_ms: float | None = None
    model: str | None = None
    model_id: int | None = None
    hold: threading.Event | None = None
    from_env: bool = False
    device: bool = False  # it fails its whole device (the caller's, named to trigger())
    says: bool = False  # its failure says what CANN's runtime says of a task the device failed (_device_says)
    seen: int = 0
    fired: int = 0
    entered: threading.Event = field(default_factory=threading.Event)

    def _matches(self, model_id: int, name: str) -> bool:
        if self.model_id is not None and self.model_id != model_id:
            return False
        if self.model is not None and not names_model(name, self.model):
            return False
        self.seen += 1
        first = self.nth or 1
        if self.seen < first:
            return False
        if self.count is not None:
            if self.fired >= self.count:
                return False
        elif self.nth is not None and self.seen != self.nth:
            return False
        if self.probability is not None:
            return random.random() < self.probability
        return True


_lock = threading.Lock()
_faults: list[Fault] = []
# the kinds of _faults: trigger() returns at once for any other (a stream calls it for its every task)
_kinds: frozenset[str] = frozenset()
# (device, code) -> None: the runtime's, called when a `device` fault fires (_state.fail_device;
# set by it, as _state imports this module)
device_failed = None
_task_ids = itertools.count(1)  # the task ids a `says` fault's words give, one per fault (next() is atomic)


def inject(kind: str = "execute", nth: int | None = None, probability: float | None = None,
           code: int | None = None, delay_ms: float | None = None, model_id: int | None = None,
           hold: threading.Event | None = None, count: int | None = None, device: bool = False,
           model: str | None = None, says: bool = False, _from_env: bool = False) -> Fault:
    inject_check(kind, nth, count, probability, delay_ms, code, hold, device=device, model_id=model_id, model=model,
                 says=says)
    if code is None:
        code = 0 if (delay_ms or hold is not None) else C.ACL_ERROR_RT_MODEL_EXECUTE
    fault = Fault(kind, nth, count, probability, code, delay_ms, model, model_id, hold, _from_env, bool(device),
                  bool(says))
    with _lock:
        _faults.append(fault)
        _set_kinds()
    return fault


def clear(env_only: bool = False) -> None:
    with _lock:
        _faults[:] = [f for f in _faults if env_only and not f.from_env]
        _set_kinds()


def _set_kinds() -> None:
    global _kinds
    _kinds = frozenset(f.kind for f in _faults)


def trigger(kind: str, model_id: int, device: int | None = None, name: str = "") -> int:
    """Called by the runtime at the start of an operation; applies delays/holds, returns a code
    (0 at once, without the lock, while no fault of `kind` is injected: the hot paths call it). A
    `device` fault that fires fails `device` as a whole (device_failed). `name`: the model's, from
    its OM's header (NAMED_KINDS)."""
    if kind not in _kinds:
        return 0
    with _lock:
        fired = [f for f in _faults if f.kind == kind and f._matches(model_id, name)]
        for f in fired:
            f.fired += 1
    code = 0
    for f in fired:
        f.entered.set()
        if f.delay_ms:
            time.sleep(f.delay_ms / 1000.0)
        if f.hold is not None:
            f.hold.wait()
        if f.says and f.code and not code:  # (said in the calling thread: the task's, its stream's worker)
            _err_msg.report(_device_says(f.code, device))
        code = code or f.code
        if f.device and f.code and device is not None and device_failed is not None:
            device_failed(device, f.code)
    return code


def _device_says(code: int, device: int | None) -> str:
    """What CANN's runtime says of a task the device failed with `code` (EZ9999 on one line), with
    what changes at every fault on a device: the time and the task's id."""
    now = time.time_ns() // 1000  # (microseconds)
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime(now // 1_000_000))
    stamp += f".{now // 1000 % 1000:03d}.{now % 1000:03d}"  # (CANN's: 2026-08-03-20:55:35.272.841)
    return (f"EZ9999: Inner Error! EZ9999: [PID: {os.getpid()}] {stamp} The error from device(chipId:{device or 0}, "
            f"dieId:0), an exception occurred during task execution (injected fault, code {code}), "
            f"task_id={next(_task_ids)}")


def names_model(name: str, model: str) -> bool:
    """Whether an OM whose header names it `name` is the model `model`: that name, or the name the
    server's compile gives the model's cache entry (<model>-<key>)."""
    return name == model or (name.startswith(model) and _CACHE_KEY.fullmatch(name, len(model)) is not None)


def parse(spec: str) -> list[dict]:
    """"execute:nth=3,code=507011;memcpy:count=2" -> keyword dicts for inject(). Raises
    ValueError with one line naming the bad part."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, _, rest = part.partition(":")
        kwargs: dict = {"kind": kind.strip().lower()}  # kinds and keys in any case; a model= value is a name
        try:
            for item in filter(None, (i.strip() for i in rest.split(","))):
                key, eq, value = item.partition("=")
                key = key.strip().lower()
                if not eq or key not in _KEYS:
                    raise ValueError(f"unknown item {item!r}")
                if key in kwargs:
                    raise ValueError(f"{key} given twice")
                try:
                    kwargs[key] = _KEYS[key](value.strip())
                except ValueError:
                    raise ValueError(f"{key} must be a{'n integer' if _KEYS[key] is int else ' number'}, "
                                     f"got {value.strip()!r}") from None
            inject_check(**kwargs)
        except ValueError as e:
            raise ValueError(f"ACLSERVE_CPU_FAULTS: {e} in {part!r} (format: {_FORMAT})") from None
        out.append(kwargs)
    return out


def inject_check(kind: str, nth=None, count=None, probability=None, delay_ms=None, code=None, hold=None,
                 device=False, model_id=None, model=None, says=False, **_) -> None:
    """The argument checks of inject(), without injecting."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    if device not in (0, 1):  # (True and False are 1 and 0)
        raise ValueError(f"device must be 0 or 1, got {device!r}")
    if device and kind not in DEVICE_KINDS:
        raise ValueError(f"device=1 is for the kinds {' and '.join(DEVICE_KINDS)}, not {kind!r}")
    if device and code not in C.WHOLE_DEVICE_FAILURES:  # (what a device failed as a whole reports)
        raise ValueError(f"device=1 needs the code of a device failed as a whole, one of "
                         f"{', '.join(map(str, sorted(C.WHOLE_DEVICE_FAILURES)))}, "
                         f"{'given none (code=...)' if code is None else f'got {code}'}")
    if says not in (0, 1):
        raise ValueError(f"says must be 0 or 1, got {says!r}")
    if says and (kind not in SAYING_KINDS or code == 0 or (code is None and (delay_ms or hold is not None))):
        raise ValueError(f"says=1 is for a failing {' or '.join(SAYING_KINDS)} (a code), not {kind!r}"
                         f"{' without one' if kind in SAYING_KINDS else ''}")
    if code is not None and (code < 0 or code > MAX_CODE or (code == 0 and not delay_ms and hold is None)):
        raise ValueError(f"code must be an ACL error code (a positive number, at most {MAX_CODE}: aclError is a "
                         f"C int; 0 only with a delay_ms), got {code}")
    if kind == "stream" and (code or (not delay_ms and hold is None)):
        raise ValueError("a stream fault delays (delay_ms) every task a stream runs; it takes no code "
                         f"(its tasks do not fail), got {'code=' + str(code) if code else 'no delay_ms'}")
    if model_id is not None and kind not in MODEL_KINDS:
        raise ValueError(f"model_id={model_id} is for the kinds {', '.join(MODEL_KINDS)}: a {kind!r} call names "
                         "no model")
    if model is not None and kind not in NAMED_KINDS:
        raise ValueError(f"model={model} is for the kinds {', '.join(NAMED_KINDS)}: a {kind!r} call names no model")
    if model is not None and not model:
        raise ValueError("model must be a model's name, got none")
    if model_id is not None and not 0 <= model_id <= MAX_MODEL_ID:
        raise ValueError(f"model_id must be a model id (0..{MAX_MODEL_ID}: a uint32), got {model_id}")
    if delay_ms is not None and not math.isfinite(delay_ms):
        raise ValueError(f"delay_ms must be a finite number of milliseconds, got {delay_ms!r}")
    if delay_ms is not None and delay_ms > MAX_DELAY_MS:
        raise ValueError(f"delay_ms must be at most {MAX_DELAY_MS:.0e}")
    for name, value, low in (("nth", nth, 1), ("count", count, 1), ("delay_ms", delay_ms, 0)):
        if value is not None and value < low:
            raise ValueError(f"{name} must be >= {low}")
    if probability is not None and not 0 <= probability <= 1:
        raise ValueError("probability must be within 0..1")


def load_env() -> None:
    """Replace the faults that came from ACLSERVE_CPU_FAULTS with its current value."""
    clear(env_only=True)
    for kwargs in parse(os.environ.get("ACLSERVE_CPU_FAULTS", "")):
        inject(**kwargs, _from_env=True)
