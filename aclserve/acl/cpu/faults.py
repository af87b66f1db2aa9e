"""Fault injection for runtime tests: make model executions fail, slow down or hold.

    from aclserve.acl.cpu import faults
    f = faults.inject("execute", nth=3)                  # the 3rd execute from now fails 507011
    faults.inject("execute", probability=0.1, code=145000)
    faults.inject("execute", delay_ms=200)               # every execute sleeps 200 ms first
    faults.inject("query_size", nth=1, code=500002)      # the next query_size is refused
    gate = threading.Event()
    f = faults.inject("execute", nth=1, hold=gate)        # the next execute waits for gate.set()
    f.entered.wait()                                      # ... it has started (and holds the model)
    faults.clear()

Counting starts when the fault is injected and covers the whole process, or one model with
model_id=. A sync `execute` returns the code; an `execute_async` stores it on its stream, so it
surfaces at the next synchronize. `code` defaults to 507011, or to 0 (no failure) when only a
delay or hold is asked for. Delays and holds happen while the execution owns the model, so they
also provoke the non-re-entrancy error and stream/event timeouts.

Environment (read at acl.init): ACLSERVE_CPU_FAULTS="execute:nth=3,code=507011;execute:delay_ms=50"
- faults separated by ';', each `kind` then optional `:key=value,...` with keys nth,
probability, code, delay_ms, model_id.
"""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

from .. import constants as C

KINDS = ("execute", "query_size")  # query_size: refuse it, as CANN does for dynamic-shape OMs


@dataclass
class Fault:
    kind: str
    nth: int | None = None
    probability: float | None = None
    code: int = C.ACL_ERROR_RT_MODEL_EXECUTE
    delay_ms: float | None = None
    model_id: int | None = None
    hold: threading.Event | None = None
    from_env: bool = False
    seen: int = 0
    fired: int = 0
    entered: threading.Event = field(default_factory=threading.Event)

    def _matches(self, model_id: int) -> bool:
        if self.model_id is not None and self.model_id != model_id:
            return False
        self.seen += 1
        if self.nth is not None:
            return self.seen == self.nth
        if self.probability is not None:
            return random.random() < self.probability
        return True


_lock = threading.Lock()
_faults: list[Fault] = []


def inject(kind: str = "execute", nth: int | None = None, probability: float | None = None,
           code: int | None = None, delay_ms: float | None = None, model_id: int | None = None,
           hold: threading.Event | None = None, _from_env: bool = False) -> Fault:
    if kind not in KINDS:
        raise ValueError(f"fault kind must be one of {KINDS}, not {kind!r}")
    if nth is not None and nth < 1:
        raise ValueError("nth counts from 1")
    if code is None:
        code = 0 if (delay_ms or hold is not None) else C.ACL_ERROR_RT_MODEL_EXECUTE
    fault = Fault(kind, nth, probability, code, delay_ms, model_id, hold, _from_env)
    with _lock:
        _faults.append(fault)
    return fault


def clear(env_only: bool = False) -> None:
    with _lock:
        _faults[:] = [f for f in _faults if env_only and not f.from_env]


def active() -> bool:
    return bool(_faults)


def trigger(kind: str, model_id: int) -> int:
    """Called by the runtime at the start of an operation; applies delays/holds, returns a code."""
    with _lock:
        fired = [f for f in _faults if f.kind == kind and f._matches(model_id)]
        for f in fired:
            f.fired += 1
    code = 0
    for f in fired:
        f.entered.set()
        if f.delay_ms:
            time.sleep(f.delay_ms / 1000.0)
        if f.hold is not None:
            f.hold.wait()
        code = code or f.code
    return code


def parse(spec: str) -> list[dict]:
    """"execute:nth=3,code=507011;execute:delay_ms=5" -> keyword dicts for inject()."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, _, rest = part.partition(":")
        kwargs: dict = {"kind": kind.strip()}
        for item in filter(None, (i.strip() for i in rest.split(","))):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in ("nth", "probability", "code", "delay_ms", "model_id"):
                raise ValueError(f"ACLSERVE_CPU_FAULTS: bad item {item!r} in {part!r}")
            kwargs[key] = float(value) if key in ("probability", "delay_ms") else int(value)
        out.append(kwargs)
    return out


def load_env() -> None:
    """Replace the faults that came from ACLSERVE_CPU_FAULTS with its current value."""
    clear(env_only=True)
    for kwargs in parse(os.environ.get("ACLSERVE_CPU_FAULTS", "")):
        inject(**kwargs, _from_env=True)
