"""Automatic load retries after transient device errors, with exponential backoff and jitter.

Transient: the device failed a warm-up batch (not the host code that packs and launches it, nor
GE refusing its run for what it was given, 145xxx: acl.check.model_refused, refused again) or
did not finish one within the model's execution timeout (a later attempt builds a new instance;
while the hung one is abandoned, no attempt is made: failures.py), or an
ACL call failed with a resource or runtime code (2xxxxx: memory, streams, events; 5xxxxx:
internal, execution, timeouts), which a later attempt may not meet, or the device's ledger
refused the streams and events its instances need (runtime/limits.py: others hold them, and give
them back as they unload, so its retry waits for that instead of a timer: room_waits.py; not when
the device has not so many at all, nor when the model's own serving instances hold what it lacks,
which only its unload gives back), or its memory, beyond the reserve (runtime/device.py NoRoom: it
waits for room there the same way; not when the device cannot spare so much at all); where the model's own
memory is taken or its load runs (a LoadError caused by the code), only memory, resource and
runtime codes are (GE answers a file it cannot build with its catch-all 500002). Parameter and
file errors (1xxxxx), bad files and bad models are not retried: the same file would fail the
same way. The host running short is transient too (host_short: its memory, the disk a compile
writes to, threads or descriptors): it fails any file, and passes. A device that failed as a
whole (DeviceFailed) is not: nothing runs on it again until a restart of the process resets it.

A warm-up run failing with a runtime code is transient, as a device fault may be, until the same
run fails the same way, code and device's words alike (their ids and times aside: same_words),
SAME_FAILURES attempts in a row or more, each on a new instance (warm_up_failure), the first of them
at least `max_s` before the last: that is the model's failure, not the device's (an integer division
by zero in a model warmed up on zeros: ONNX Runtime's reason on the CPU runtime, 507011), and it was
retried every `max_s` for good. failures.py stops its retries then. A run past the execution timeout
is not under this rule (warm_up_failure). The time
matters as much as the count: the first delays are short, so three attempts take a few seconds, and
a device fault lasting longer than that (the same code and words at its first warm-up run) would
have been given up for good.

The delay doubles per attempt from `initial_s` up to `max_s`, and each is drawn uniformly from
its upper half ("equal jitter"), so models that failed together (one device fault during a
start-up) do not retry in lockstep, and a failure that persists costs one load per `max_s`.
Owned by LoadFailures (failures.py); loop thread only.
"""
from __future__ import annotations

import asyncio
import errno
import random
import re
from typing import Callable

from ..acl.check import DEVICE_SAYS, AclError, model_refused
from ..errors import DeviceFailed, DeviceTimeout, ExecutionFailed
from ..runtime.device import LoadError, NoRoom, RoomPromised
from ..runtime.limits import BesideItsOwn, BeyondTheDevice, ResourceLimitError, without_in_use


# the attempts in a row a warm-up run fails the same way (over `max_s` at least) before it is taken as the model's
SAME_FAILURES = 3
# the host short of memory, disk space or quota, descriptors, or processes and threads
_SHORT_ERRNOS = {errno.ENOMEM, errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EAGAIN}
# A number standing alone in a device's message (not inside a name: a letter, digit, `_`, `.` or
# `/` before it, as in Add-op8, layers.3, /layers/11/MatMul): an address or register value
# (0xffff441cc970), a bare hex id of 8 digits or more (a thread's ffff4effd1e0), a UUID, a decimal
# one, or a run of them joined by - . : _ T (a timestamp, 2026-08-03-20:55:35.272.841; a pool
# thread's 0_1); and a run of 6 digits or more after a `.` (a time in a dump file's name,
# Add.Add-op8.13.14.1659524415123456: its task and stream ids before it stay). A hex value given
# as a code (error code = 0x10, retCode=0x31) is kept: it tells one failure from another.
_VOLATILE = re.compile(r"""
    (?P<code>(?i:code)\s*[=:]?\s*0[xX][0-9a-fA-F]+)
  | (?<![\w./])(?:
        0[xX][0-9a-fA-F]+
      | [0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}
      | (?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}(?!\w)
      | \d+(?:[-.:_T]\d+)*
    )
  | (?<=\.)\d{6,}(?!\w)""", re.VERBOSE)


# the memory free and promised a refusal for memory names, which change from one attempt to the next
_FREE_NOW = re.compile(r" (but only )[\d,]+( of [\d,]+ are free)(?:, [\d,]+ promised to loads under way)?")


def host_short(error: BaseException) -> bool:
    """The error, or one it was raised from, is the host running short of something."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, MemoryError) or (isinstance(error, OSError) and error.errno in _SHORT_ERRNOS):
            return True
        if isinstance(error, RuntimeError) and "can't start new thread" in str(error):
            return True
        # (a context hidden with `from None` counts too: the file checks hide the OSError they
        # turn into "cannot read the file", EMFILE included)
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def is_transient(error: BaseException) -> bool:
    if isinstance(error, DeviceFailed):  # not in this process: the device is reset only by a restart
        return False
    if host_short(error):
        return True
    if isinstance(error, DeviceTimeout):
        return True
    if isinstance(error, ExecutionFailed):
        # the device failed the batch (an ACL error), or its instance closed under it (no cause);
        # an exception of the host code that packs or launches it fails the same way again, and so
        # does a run GE refused for what it was given (145xxx: an OM its graph does not compute)
        if model_refused(error):
            return False
        return error.__cause__ is None or _device_error(error) is not None
    if isinstance(error, RoomPromised):  # room other loads under way may not take in the end
        return True
    if isinstance(error, NoRoom):  # memory others hold comes back as they go; not more than the device can spare
        return error.device is not None
    if isinstance(error, ResourceLimitError):  # streams and events other models hold: theirs come back as they go
        return not isinstance(error, (BeyondTheDevice, BesideItsOwn))
    if isinstance(error, LoadError):  # a load's own ACL call (the model's memory, its load) failed
        cause = error.__cause__
        return isinstance(cause, AclError) and _short_of_something(cause.ret)
    return isinstance(error, AclError) and error.ret // 100000 in (2, 5)


def transient_kind(error: BaseException) -> str:
    """What a transient failure was, as its reason says before its retry (`...: retry 2 in 1.9 s`)."""
    if host_short(error):
        return "the host short of resources"
    if isinstance(error, ResourceLimitError):  # (not the device failing: what others hold)
        return "the device short of streams or events"
    if isinstance(error, NoRoom):
        return "the device short of memory"
    return "transient device error"


def warm_up_failure(error: BaseException) -> tuple | None:
    """What tells a failed warm-up run from another: the run (its gear and number, which
    runtime/warmup.py records), the ACL code and what the device said of it (same_words); None but
    for a run the device failed with a runtime code (5xxxxx). A shortage (2xxxxx: memory, streams)
    is not the model's however often it comes back: what other models hold changes, and neither is a
    run past the execution timeout: a host busy for a while (other models compiling or warming up)
    slows a run as surely as the model does, and giving up costs the model until someone acts,
    where a retry costs one run each `max_s`. A load error may say what it repeats as itself
    (`repeats_as`: a file the ACL could not read while the server reads it, runtime/unread_file.py)."""
    repeats_as = getattr(error, "repeats_as", None)  # (runtime/unread_file.py: a file the ACL could not read)
    if repeats_as is not None:
        return repeats_as
    run = getattr(error, "warm_up_run", None)
    if run is None or not isinstance(error, ExecutionFailed):
        return None
    acl = _device_error(error)
    if acl is None or acl.ret // 100000 != 5:
        return None
    return run, acl.ret, same_words(acl.said)


def same_words(said: str | None) -> str | None:
    """What the device said of a failure, without what changes from one attempt to the next when it
    fails alike: GE's and the runtime's messages carry ids and times (task, stream, model and process
    ids, addresses, a thread's id, a timestamp), and a model failing the same way at every attempt
    was retried for good on a device. Its words stay, and so do the codes and names a number is part
    of (EZ9999, E19999, Add-op8, layers.3, add_1357..._0__kernel0), and hex values given as codes:
    they tell one failure from another. All of the message (GE names the kernel and node at its end)."""
    return None if said is None else _VOLATILE.sub(_volatile_out, said)


def steady_reason(reason: str, error: BaseException | None = None) -> str:
    """A load failure's `reason` with what changes at every attempt of one failure taken out of the
    device's words (same_words), and out of the ledger's refusal (`error` a ResourceLimitError: the
    streams and events in use), for /metrics, where each text is a series of its own (failures.py
    `versions`): the index, the load call and the log say it whole."""
    if isinstance(error, ResourceLimitError):
        reason = without_in_use(reason)
    elif isinstance(error, NoRoom):
        reason = _FREE_NOW.sub(r" \1#\2", reason)
    ours, says, device = reason.partition(DEVICE_SAYS)
    return ours + says + same_words(device)


def _volatile_out(match: re.Match) -> str:
    return match["code"] or "#"


def _device_error(error: ExecutionFailed) -> AclError | None:
    """The ACL error a failed batch was raised from, directly or through one error between (the
    completion's wrapping); None for a batch the host code failed, or one without a cause."""
    cause = error.__cause__
    if isinstance(cause, AclError):
        return cause
    inner = getattr(cause, "__cause__", None)
    return inner if isinstance(inner, AclError) else None


def _short_of_something(code: int) -> bool:
    """A load's own code that a later attempt may not meet: out of memory or of another device
    resource (200000, 207xxx but 207000 "not supported", GE's allocation 245000) or a runtime
    fault (507xxx). GE's catch-all 500002 and "not supported" are the file's (an operator
    package, another SoC): it would fail the same way again."""
    return code in (200000, 245000) or code // 1000 == 507 or (code // 1000 == 207 and code != 207000)


class RetrySchedule:
    """One timer per failed (model, version, file); `on_due(name, version, identity)` runs on the loop."""

    def __init__(self, initial_s: float, max_s: float, on_due: Callable[[str, str, tuple], None],
                 rng: random.Random | None = None):
        self.initial_s, self.max_s = initial_s, max_s
        self._on_due = on_due
        self._rng = rng or random.Random()
        self._attempts: dict[tuple, int] = {}
        self._timers: dict[tuple, asyncio.TimerHandle] = {}
        self.retries: dict[str, int] = {}  # model -> retries started (for /metrics)

    @property
    def enabled(self) -> bool:
        return self.initial_s > 0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.max_s, self.initial_s * 2.0 ** min(attempt, 64))  # a float past 2**1024 overflows
        return self._rng.uniform(ceiling / 2, ceiling)

    def longest_delay(self) -> float:
        """A delay drawn as the backoff's longest are (`max_s`'s upper half): a slow fallback's."""
        return self._rng.uniform(self.max_s / 2, self.max_s)

    def schedule(self, name: str, version: str, identity: tuple) -> tuple[int, float]:
        """Arm the next retry of this file; returns (attempt number, delay in seconds)."""
        key = (name, version, identity)
        attempt = self._attempts.get(key, 0)
        self._attempts[key] = attempt + 1
        delay = self.delay(attempt)
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._due, key)
        return attempt + 1, delay

    def _due(self, key: tuple) -> None:
        self._timers.pop(key, None)
        self.started(key[0])
        self._on_due(*key)

    def started(self, name: str) -> None:
        """One more automatic retry of `name` begins (this timer's, or another's: a wait for room)."""
        self.retries[name] = self.retries.get(name, 0) + 1

    def attempts(self, key: tuple) -> int:
        """Failures of (name, version, identity) so far, since its version last loaded."""
        return self._attempts.get(key, 0)

    def pending(self, key: tuple) -> bool:
        """A retry of (name, version, identity) is due later."""
        return key in self._timers

    def due_in(self, key: tuple) -> float | None:
        """Seconds until the retry of (name, version, identity) is due, or None: none pending."""
        timer = self._timers.get(key)
        return None if timer is None else max(0.0, timer.when() - asyncio.get_running_loop().time())

    def first_pending(self, key: tuple) -> bool:
        """The first retry of (name, version, identity) is due later (no retry of it has failed)."""
        return key in self._timers and self._attempts.get(key) == 1

    def succeeded(self, name: str, version: str) -> None:
        """The version loaded: forget its failures (the next failure starts from initial_s)."""
        for key in [k for k in self._attempts if k[:2] == (name, version)]:
            del self._attempts[key]
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()

    def cancel(self, key: tuple) -> None:
        """No retry of (name, version, identity) is due any more (its failure is the model's)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def cancel_model(self, name: str) -> None:
        """No retry of `name` is due any more (it was unloaded through the API)."""
        for key in [k for k in self._timers if k[0] == name]:
            self._timers.pop(key).cancel()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
