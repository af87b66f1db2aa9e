"""The compile's child process: compile_process.py runs `main([REQUEST])` in a new interpreter
(`python -m aclserve.om.compile_child REQUEST` does the same).

REQUEST is JSON: {"onnx_path", "output", "options": compile_model's keyword arguments (aipp: the
config text aipp.render writes)}. The
child writes JSON lines to what its stdout was when it started: {"log": line} per line of the
compile's log, then {"result": {...}} or {"error": {"kind", "message", ...}} (one line, never a
traceback: the server shows it as the model's reason). Anything else printed (by Python or by
C code) goes to stderr, so nothing but the protocol reaches that pipe.

SIGTERM, SIGHUP or end-of-file on stdin (the server gone) end it as a Ctrl-C ends
`aclserve compile`: the ATC it started is killed, its partial files are removed; exit status
128 + the signal's number, no word said from the signal on. The KeyboardInterrupt that does it is
raised in aclserve's own code only, once, and the process ends by its own hand a grace later if
its unwinding has not ended it (child_stop.py: a KeyboardInterrupt raised wherever the main
thread was could be dropped by Python, or abort the process from onnx's C++).

It makes itself the kernel's out-of-memory killer's first pick as it starts (oom_first.py): the
compile's memory, not the server's, goes when the host runs short, and ATC inherits that.

On Linux the kernel also signals it when the server dies (PR_SET_PDEATHSIG: parent_death.py):
SIGKILL for a CPU compile, which inside ONNX Runtime's C calls heard SIGTERM or its stdin's end
only 1-3 s later (its work folder is swept afterwards); SIGTERM when ATC runs, whose wait hears
it at once and kills ATC, removing its work folder (ATC dies with a child killed outright too, on
its leash: atc_leash.py).

For tests: with ACLSERVE_COMPILE_HOLD=FOLDER set, the child writes FOLDER/<its pid> before it
compiles and waits while that file exists (a compile known to be running, as long as a test needs).
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback

from . import oom_first
from .child_stop import StopSignals
from .compile_process import Built, runs_atc
from .parent_death import die_with_parent

HOLD_ENV = "ACLSERVE_COMPILE_HOLD"


def main(argv: list[str]) -> int:
    unpicked = oom_first.volunteer()  # (first: before the compile's memory is taken)
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # print() and C code's stdout go to stderr from here on
    stop = StopSignals((signal.SIGTERM, signal.SIGHUP))

    def say(**message) -> None:
        if stop.signum is not None:
            return  # (stopped: no word, whatever the compile does until the process ends)
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    if unpicked is not None:
        say(log=f"the compile's process could not make itself the out-of-memory killer's first pick ({unpicked}): "
                "short of memory, the kernel may kill the server instead")
    try:
        return _compiled(argv[0], say, stop)
    except KeyboardInterrupt:  # (raised anywhere in _compiled, its own except and return lines too)
        return 128 + (stop.signum or signal.SIGINT)


def _compiled(request_text: str, say, stop: StopSignals) -> int:
    """Compile what REQUEST asks, say the result or the error; the exit status (128 + a stop
    signal's number when one came as it ended: nothing said of it)."""
    status = 0
    try:
        stop.install()
        threading.Thread(target=_end_with_parent, name="aclserve-compile-parent", daemon=True).start()
        request = json.loads(request_text)
        _die_with_parent(request.get("parent"), signal.SIGTERM if runs_atc(request["options"]) else signal.SIGKILL)
        _hold(request["onnx_path"])
        from .compile import compile_model  # (imported here: a signal during the ~1 s import ends it too)
        options = request["options"]
        if isinstance(options.get("aipp"), str):  # (AIPP ops travel as the config text aipp.render gives ATC)
            from . import aipp
            options["aipp"] = aipp.parse(options["aipp"], "AIPP config")
        result = compile_model(request["onnx_path"], request["output"], log=lambda line: say(log=line), **options)
        # the fields compile_process.Built takes back, from the CompileResult
        say(result={f.name: getattr(result, f.name) for f in dataclasses.fields(Built)} | {"path": str(result.path)})
    except KeyboardInterrupt:
        raise  # (main's: nothing said)
    except BaseException as e:  # (SystemExit included: said, not a silent exit)
        say(error=_described(e))
        status = 1
    return status if stop.signum is None else 128 + stop.signum


def _end_with_parent() -> None:
    """stdin is a pipe the server never writes: end-of-file means it is gone (or closed it)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _die_with_parent(parent: int | None, signum: int) -> None:
    """Linux: the kernel sends `signum` when the server's thread that started this process ends
    (it waits for this process: only the server's death ends it first). A server already gone
    before that was set is seen by its pid: then this process ends at once."""
    if not die_with_parent(signum):
        return  # (the stdin watch alone)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def _hold(onnx_path: str) -> None:
    folder = os.environ.get(HOLD_ENV)
    if not folder:
        return
    mark = os.path.join(folder, str(os.getpid()))
    with open(mark, "w", encoding="utf-8") as f:
        f.write(onnx_path)
    while os.path.exists(mark):
        time.sleep(0.02)


def _described(error: BaseException) -> dict:
    """The error in the terms compile_process._rebuilt makes it again from."""
    from .compile_error import AtcFailed, CompileError, NoBatchDimension, OpenDims

    if isinstance(error, AtcFailed):  # (signum: AtcKilled's, ATC killed by a signal)
        return {"kind": "atc", "message": _one_line(error), "signum": getattr(error, "signum", None)}
    if isinstance(error, NoBatchDimension):
        return {"kind": "no_batch_dimension", "message": _one_line(error)}
    if isinstance(error, OpenDims):  # (each open dimension, for the server to say in a config.pbtxt's words)
        return {"kind": "open_dims", "message": _one_line(error), "open_dims": error.open_dims,
                "shapes": error.shapes}
    if isinstance(error, CompileError):
        return {"kind": "compile", "message": _one_line(error)}
    if isinstance(error, MemoryError):
        return {"kind": "memory", "message": "out of host memory (MemoryError)"}
    if isinstance(error, OSError):
        return {"kind": "os", "message": _one_line(error), "errno": error.errno, "strerror": error.strerror,
                "filename": _path(error.filename), "filename2": _path(error.filename2)}
    return {"kind": "other", "message": _one_line(error), "traceback": traceback.format_exc()}


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _path(name) -> str | None:
    return os.fsdecode(name) if isinstance(name, (str, bytes)) else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
