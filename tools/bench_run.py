"""How a benchmark tool of tools/ runs and ends: a SIGTERM unwinds it as a Ctrl-C does (its servers
stopped, its temp folders removed), a failure ends it in one line and exit status 1 (no figures
that read as a success), and the server it measures is checked alive after each window.

Its servers run in sessions of their own (bench_common.ManagedProcess), so that a terminal's
Ctrl-C reaches only the tool, which stops them; a SIGTERM's default action ended the tool where
it stood, its servers left running and its folders in /tmp (found by an independent tester).
"""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Awaitable, Callable, Iterator

# what a measurement's failure raises, besides BenchFailed: a file or socket refused, a command
# that failed (anything else, a NotImplementedError or RecursionError, is a bug: its traceback shows)
FAILURES: tuple[type[BaseException], ...] = (OSError, subprocess.CalledProcessError)


class BenchFailed(RuntimeError):
    """The run cannot give true figures; its message says why, in one line where it can."""


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """From now on a SIGTERM raises KeyboardInterrupt in the main thread, so the `finally` blocks
    and context managers that stop servers and remove folders run. Idempotent; a no-op outside
    the main thread, or where the process already handles SIGTERM its own way."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _interrupt):
        signal.signal(signal.SIGTERM, _interrupt)


def run_async(main: Awaitable) -> Any:
    """asyncio.run(main), where a SIGTERM or a Ctrl-C cancels `main` (its tasks unwind, their
    connections closed) and then raises KeyboardInterrupt, as asyncio.run does for a Ctrl-C where
    SIGINT is not ignored. sigterm_as_interrupt's handler raised KeyboardInterrupt in whichever
    task of the loop was running: "Task exception was never retrieved" and its traceback followed
    the tool's "interrupted" line. Outside the main thread, which no signal handler runs in, it
    is asyncio.run (the loop could not take a signal there: it raised RuntimeError). The signals
    are held back (blocked) while the loop is built and while it is taken down, and land once the
    loop's handlers or ours are in place: a SIGTERM inside the loop's construction raised there,
    and the half-built loop's and the unawaited coroutines' warnings and a traceback followed the
    tool's line (a full suite's run, once)."""
    # signal -> its handler, put back after the run (a signal another handler takes is left to it)
    handlers = {s: ours for s, ours in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, _interrupt))
                if signal.getsignal(s) is ours and threading.current_thread() is threading.main_thread()}
    interrupted = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, handlers)  # the mask before, put back at the end

    async def cancelled_when_interrupted():
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for s in handlers:
            loop.add_signal_handler(s, lambda: (interrupted.append(True), task.cancel()))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (one held back lands now, on the loop's handler)
        try:
            return await main
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, handlers)  # held again until the loop is gone
            for s, handler in handlers.items():
                loop.remove_signal_handler(s)  # (which leaves the signal's default action)
                signal.signal(s, handler)

    try:
        return asyncio.run(cancelled_when_interrupted())
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one held back lands here, as KeyboardInterrupt


def run_tool(name: str, body: Callable[[], int], failures: tuple[type[BaseException], ...] = (),
             cleaned: str = "its servers stopped and its temp folders removed") -> int:
    """`body()`'s exit status; a failure (BenchFailed, FAILURES, and `failures`: the errors the
    tool's own measurement raises, as an in-process runtime's) is one line `name: error: ...` and
    1, an interruption (Ctrl-C, SIGTERM) 130 once `body` has unwound, in one line `name:
    interrupted; ` and what the unwinding `cleaned`; anything else is a bug of the tool, raised with
    its traceback (every RuntimeError was one line once: a NotImplementedError or a RecursionError
    said nothing of where)."""
    sigterm_as_interrupt()
    try:
        return body()
    except KeyboardInterrupt:
        print(f"{name}: interrupted; {cleaned}", file=sys.stderr)
        return 130
    except (BenchFailed, *FAILURES, *failures) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def run_folder(prefix: str) -> Iterator[str]:
    """A folder of the run's own (tempfile.mkdtemp: a server log, copies of models) that a run
    ending early removes, interrupted or failed, as run_tool's line says (the error quotes the
    log's tail); a run that ends keeps it or not itself (bench_common.keep_if_failed). An
    interrupted attack_server.py left it in /tmp."""
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def exit_meaning(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"


def ensure_running(server, during: str) -> None:
    """Raise BenchFailed when `server` (a bench_common.ManagedProcess) has exited: what was
    measured `during` its death is no measurement of it (bench_overload.py printed plausible
    figures and exited 0 after its server was killed mid-run: a dead port's refusals are only
    connect errors to wrk and open_loop.py)."""
    code = server.proc.poll()
    if code is not None:
        tail = server.log_tail(8).strip()
        raise BenchFailed(f"the server {exit_meaning(code)} during {during}"
                          + (f"; its log's last lines:\n{tail}" if tail else " (its log says nothing)"))


def stop_server(server, tool: str) -> None:
    """Stop `server`; an exit status other than 0 is said on stderr (its figures were taken)."""
    code = server.close()
    if code not in (0, None):
        print(f"{tool}: warning: the server {exit_meaning(code)} when stopped:\n{server.log_tail()}",
              file=sys.stderr)
