"""What the commands print, and the rule when a standard stream cannot be written.

A failing stdout (a pipe whose reader left: EPIPE; `> /dev/full`: ENOSPC) fails no command's work
and is blamed on nothing else: what could not be written is dropped, the command runs to its end
(a compile still writes its OM), then cli.main ends with 141 for EPIPE, as a shell's SIGPIPE
death says it, or 74 (EX_IOERR) and one line on stderr for any other error (`stdout_status`). A
failing stderr drops its lines: notes and warnings were all it held, and there is nowhere left to
say more. Before, the OSError of a print was taken for the command's own: "cannot write out.om:
Broken pipe" (the compile thrown away), "broke off the exchange" (infer), or a traceback.
"""
from __future__ import annotations

import errno
import os
import sys

# the first error writing each standard stream, by its name in sys
_lost: dict[str, OSError] = {}


def print_out(*values, flush: bool = False) -> None:
    """print() to stdout; dropped once stdout cannot be written."""
    _write("stdout", values, flush)


def print_err(*values) -> None:
    """print() to stderr (flushed); dropped when stderr cannot be written."""
    _write("stderr", values, True)


def _write(name: str, values, flush: bool) -> None:
    try:
        print(*values, file=getattr(sys, name), flush=flush)
    except OSError as e:
        _drop_from_now_on(name, e)


def _drop_from_now_on(name: str, error: OSError) -> None:
    """Point the stream's fd at /dev/null: later writes, its buffered bytes and the interpreter's
    last flush then succeed, where each failed again (at exit "Exception ignored ...", status 120)."""
    _lost.setdefault(name, error)
    try:
        fd = getattr(sys, name).fileno()
    except (OSError, ValueError):  # (a stream without an fd: pytest's capture, say)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def stdout_status(command: str, status: int) -> int:
    """The command's exit status once stdout is flushed: `status` when stdout took everything or
    the command failed anyway; else 141 (EPIPE) or 74 with a line on stderr."""
    try:
        sys.stdout.flush()
    except OSError as e:
        _drop_from_now_on("stdout", e)
    lost = _lost.pop("stdout", None)
    if lost is None or status != 0:
        return status
    if lost.errno == errno.EPIPE:  # (`aclserve compile ... | head`: the reader left, as it may)
        return 141
    print_err(f"aclserve {command}: error: cannot write its output to stdout: {lost.strerror or lost}")
    return 74
