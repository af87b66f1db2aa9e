"""compile_model() in a child process, for the server and `aclserve compile` (the child runs compile_child.main).

Loading an ONNX model, its shape inference and its serialisation hold the GIL for seconds (8.5 s
at a time for a 1.2 GiB model), and what they allocate was the server's (6.1 GB at its peak):
run in the server's own threads, a compile stalled every other model's requests. The child is a
fresh interpreter (a subprocess: it inherits no socket, thread or lock of the server) of the
same Python, importing aclserve from where the server did, with the server's environment
(ACLSERVE_CPU_* among it) but for the API token (own_python.environment); its memory goes back
to the system when it exits. It costs about a second to start (numpy, onnx, ONNX Runtime), which
a compile can afford.

The two talk in JSON lines on the child's stdout: {"log": line} for each line of the compile's
log, then {"result": ...} or {"error": ...}. A compile quiet for STILL_COMPILING_EVERY_S says it
still runs, in a log line of the parent's own (`still compiling big.onnx: 20 s`): a CPU compile
says nothing between its first line and its last (55-70 s for a 1.2 GB model), so a slow compile
looked hung, where ATC's lines came with their elapsed time. Its stderr is the server's (what
ONNX Runtime or ATC print goes where it went when the compile ran in the server). Its stdin is a pipe the
server never writes: the child ends when it reads end-of-file, so a server that dies leaves no
compile running; on Linux the kernel ends it too (PR_SET_PDEATHSIG: compile_child.py), at once.

Stopping (CompileStop, from any thread): SIGTERM first, which the child turns into the
interruption a Ctrl-C of `aclserve compile` is (the ATC it runs killed, its partial files
removed), ending by its own hand a second later where that does not end it (child_stop.py), then
SIGKILL to its process group after STOP_GRACE_S (a child inside C code that holds the GIL hears
SIGTERM only once that returns; the ATC it runs dies with it: atc_leash.py). The caller removes
the folder it had the child compile into. A compile past its `timeout_s` fails with
CompileTimedOut: a CPU compile's test runs of the model have no bound of their own (a Loop of
10**12 iterations ran for a day, and the server's other loads waited behind it for their turn).
Its process group is SIGKILLed at once (a timed-out compile has nothing to keep, and inside ONNX
Runtime's run SIGTERM ends the child only a grace later); one running ATC is ended as a stop ends
it, SIGTERM first, so that it kills ATC and removes ATC's files.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from . import own_python
from .compile_error import AtcFailed, AtcKilled, CompileError, CompileKilled, NoBatchDimension, OpenDims, killed_by

logger = logging.getLogger(__name__)

CHILD_MODULE = "aclserve.om.compile_child"  # the child's program: its main (own_python.py says how it is run)
STOP_GRACE_S = 5.0
# a compile whose log has said nothing this long (seconds) says it still runs, and again as long as it stays quiet
STILL_COMPILING_EVERY_S = 10.0


class CompileStopped(Exception):
    """The compile was stopped (CompileStop.stop): an unload, a shutdown or (poll mode) its file
    deleted or replaced, not a failure."""


class CompileTimedOut(CompileError):
    """The compile did not end within its timeout; its process was ended."""

    def __init__(self, timeout_s: float):
        super().__init__(f"the compile did not finish within {timeout_s:g} s and its process was ended")
        self.timeout_s = timeout_s


@dataclass
class Built:
    """What the child built (compile.CompileResult's facts, without importing the compiler)."""
    path: Path
    target: str
    seconds: float
    size: int
    index_bounds: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)  # what ATC would refuse, what serving it needs (compile.py)
    header: dict = field(default_factory=dict)  # the CPU OM header or the ATC OM's facts (`aclserve compile` shows it)
    fp32_operators: bool = True  # an operator of the model computes in FP32 (the summary's precision note)
    float_operators: bool = True  # one computes in floating point at all (the note too)


class CompileStop:
    """Stops the compile it is given to: ends its child (SIGTERM, SIGKILL after STOP_GRACE_S),
    or keeps one from starting, or ends a wait for it (`wait`: the compile cache entry's lock
    another process holds; `telling`: a load's wait for its turn, on the loop). `stop()` may be
    called from any thread, any number of times."""

    def __init__(self):
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._stopped = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self._compiling = False  # a child started under it, its result not yet taken (`compiling`)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def compiling(self) -> bool:
        """Whether what a stop ends now is a compile: its child started under this stop and the
        compile's caller has not taken the result yet (`compiled`). Before it (a wait, the hash) and
        after it (the OM opened), a stop or a failure ends a load in which nothing was compiling."""
        return self._compiling

    def compiled(self) -> None:
        """The compile's result was taken (or a cached one used): what follows is no compile."""
        self._compiling = False

    def stop(self) -> None:
        with self._lock:
            first = not self._stopped.is_set()
            self._stopped.set()
            child = self._child
            listeners = list(self._listeners) if first else []
        for listener in listeners:
            listener()
        if child is not None:
            _end(child)

    def wait(self, timeout_s: float) -> bool:
        """Block until stopped (True) or for `timeout_s` (False)."""
        return self._stopped.wait(timeout_s)

    @contextlib.contextmanager
    def telling(self, listener: Callable[[], None]) -> Iterator[None]:
        """`listener()` hears a stop during the block (in the stopping thread), or at once when
        stopped already: a wait that is no thread's to block (an asyncio one) ends by it."""
        with self._lock:
            stopped = self._stopped.is_set()
            if not stopped:
                self._listeners.append(listener)
        try:
            if stopped:
                listener()
            yield
        finally:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

    def _attach(self, child: subprocess.Popen) -> bool:
        """Follow `child`; False when stopped already (the caller ends it)."""
        with self._lock:
            if self.stopped:
                return False
            self._child = child
            self._compiling = True
            return True

    def _detach(self) -> None:
        with self._lock:
            self._child = None


class _Children:
    """The compile children of this process, ended when it exits (a compile a shutdown abandoned)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen] = set()

    def add(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._children.add(child)

    def discard(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._children.discard(child)

    def end_all(self) -> None:
        with self._lock:
            children = list(self._children)
        for child in children:
            _end(child, grace_s=None)


_CHILDREN = _Children()
atexit.register(_CHILDREN.end_all)


def runs_atc(options: dict) -> bool:
    """Whether compile_model will run ATC (its choice, without importing it: the import takes ~1 s)."""
    if options.get("target", "auto") not in ("auto", "npu"):
        return False
    return bool(options.get("atc") or shutil.which("atc"))


def compile_in_child(onnx_path: str | os.PathLike, output: str | os.PathLike | None, *, log: Callable[[str], None],
                     stop: CompileStop | None = None, timeout_s: float | None = None, **options) -> Built:
    """compile.compile_model(onnx_path, output, log=log, **options) run in a child process
    (blocking until it ends). Raises what compile_model raises, rebuilt from the child's word:
    CompileError (one line; AtcFailed for an ATC that failed, AtcKilled for one killed by a signal,
    NoBatchDimension for batch sizes given to a model without one, OpenDims for dimensions left
    open, each named), OSError with its errno and file, MemoryError, RuntimeError for anything
    else; CompileKilled when the child ends without a word by a signal (the kernel's out-of-memory
    killer's SIGKILL among them), CompileError when it exits without one otherwise; CompileStopped
    when `stop` ended it; CompileTimedOut when it was still running `timeout_s` seconds after it
    started (None: no limit), its process group killed at once (SIGTERM first when it runs ATC);
    ATC's own timeout is `timeout_s` too unless `options` say another."""
    if timeout_s is not None:
        options.setdefault("timeout", timeout_s)
    stop = stop or CompileStop()
    if stop.stopped:
        raise CompileStopped("stopped before the compile began")
    # parent: the child makes sure the server it was started by is still there once it will die with it
    request = {"onnx_path": os.fspath(onnx_path), "output": None if output is None else os.fspath(output),
               "options": options,
               "parent": os.getpid()}
    try:
        child = subprocess.Popen(own_python.command(CHILD_MODULE, json.dumps(request)), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, start_new_session=True, env=own_python.environment())
    except OSError as e:  # (no process to be had: EAGAIN, ENOMEM; the host short of resources)
        raise OSError(e.errno, f"could not start the compile's process: {e.strerror}") from None
    _CHILDREN.add(child)
    outcome: dict = {}
    timed_out = threading.Event()
    with_atc = runs_atc(options)
    began, name = time.monotonic(), os.path.basename(os.fspath(onnx_path))

    def quiet() -> None:
        log(f"still compiling {name}: {time.monotonic() - began:.0f} s")

    def expire() -> None:
        timed_out.set()
        _end(child) if with_atc else _kill(child)

    deadline = None
    if timeout_s is not None:
        deadline = threading.Timer(timeout_s, expire)
        deadline.daemon = True
        deadline.start()
    try:
        if not stop._attach(child):
            _end(child)
        assert child.stdout is not None
        for raw in _lines(child.stdout, quiet):
            try:
                message = json.loads(raw)
            except ValueError:
                continue  # (only the child's protocol writes here)
            if "log" in message:
                log(str(message["log"]))
            else:
                outcome = message
        child.wait()
    except BaseException:  # a failing log callback: the child is not left running
        _end(child)
        child.wait()
        raise
    finally:
        if deadline is not None:
            deadline.cancel()
        stop._detach()
        _CHILDREN.discard(child)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    if stop.stopped:
        raise CompileStopped("the compile was stopped")
    if timed_out.is_set() and "result" not in outcome:  # (a result said just in time stands)
        raise CompileTimedOut(timeout_s)
    if "result" in outcome and child.returncode == 0:
        return Built(**(outcome["result"] | {"path": Path(outcome["result"]["path"])}))
    if "error" in outcome:
        raise _rebuilt(outcome["error"])
    raise _ended_without_word(child.returncode)


def _lines(pipe, quiet: Callable[[], None]) -> Iterator[bytes]:
    """The lines of `pipe` (the child's stdout) as they come, to its end; `quiet()` each time
    STILL_COMPILING_EVERY_S pass without one (read from the fd: a buffered reader's lines block)."""
    fd, pending = pipe.fileno(), bytearray()
    poller = select.poll()  # (not select(): a server's fds may number past FD_SETSIZE)
    poller.register(fd, select.POLLIN)
    said = time.monotonic()
    while True:
        left = said + STILL_COMPILING_EVERY_S - time.monotonic()
        if left <= 0:
            quiet()
            said = time.monotonic()
            continue
        if not poller.poll(math.ceil(left * 1000)):
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        searched = len(pending)  # (only the new bytes are searched: a long line is not split again per chunk)
        pending += chunk
        end = pending.rfind(b"\n", searched)
        if end < 0:
            continue
        lines = bytes(pending[:end]).split(b"\n")
        del pending[:end + 1]
        said = time.monotonic()
        yield from lines
    if pending:
        yield bytes(pending)


def _end(child: subprocess.Popen, grace_s: float | None = STOP_GRACE_S) -> None:
    """SIGTERM to `child`, then SIGKILL after `grace_s` if it still runs (None: no SIGKILL)."""
    try:
        child.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return
    if grace_s is not None:
        timer = threading.Timer(grace_s, _kill, (child,))
        timer.daemon = True
        timer.start()


def _kill(child: subprocess.Popen) -> None:
    """SIGKILL to the child's process group (start_new_session: its pid is the group's id), what
    it started there included, unless the child has been waited for (its pid may be reused)."""
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _rebuilt(error: dict) -> BaseException:
    """The child's error as the exception compile_model raised (what retries and messages read)."""
    kind, message = error.get("kind"), str(error.get("message") or "the compile failed")
    if kind == "compile":
        return CompileError(message)
    if kind == "no_batch_dimension":
        return NoBatchDimension(message)
    if kind == "open_dims":
        return OpenDims(message, error.get("open_dims") or (), error.get("shapes"))
    if kind == "atc":
        return AtcFailed(message) if error.get("signum") is None else AtcKilled(message, int(error["signum"]))
    if kind == "memory":
        return MemoryError()
    if kind == "os" and error.get("errno") is not None:
        args = [error["errno"], error.get("strerror") or message]
        if error.get("filename") is not None:
            args += [error["filename"]] + ([None, error["filename2"]] if error.get("filename2") else [])
        return OSError(*args)
    if error.get("traceback"):  # (an unexpected error: its traceback for whoever debugs it)
        logger.debug("the compile's process failed:\n%s", error["traceback"])
    return RuntimeError(message)


def _ended_without_word(status: int) -> CompileError:
    """Why a child that said neither result nor error ended, in one line."""
    if status < 0:
        return CompileKilled(f"the compile's process was killed by {killed_by(-status)}", -status)
    if status - 128 in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # its own handlers: 128 + the signal
        return CompileKilled(f"the compile's process was stopped by {signal.Signals(status - 128).name} "
                             f"(exit status {status})", status - 128)
    return CompileError(f"the compile's process exited with status {status} without a result (the server's "
                        "stderr may say why)")
