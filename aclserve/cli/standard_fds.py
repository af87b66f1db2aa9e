"""Standard streams that a command was started without: fds 0-2 reopened onto /dev/null.

A process started with one of them closed (`aclserve serve <&-`, `>&-`, `2>&-`) handed that low
fd to the next file it opened; libuv's epoll fd (grpc's) took it, and libuv asserts on closing
an fd <= 2, so `serve` ended with SIGABRT (exit 134) at its shutdown or after a refused start
(libuv/libuv#4558: a program is to reopen 0-2 before anything else). A stream that was closed
then reads as empty and writes nowhere, as if redirected to /dev/null.
"""
from __future__ import annotations

import io
import os
import sys

_STREAMS = ("stdin", "stdout", "stderr")


def reopen_closed() -> None:
    """Reopen each closed fd of 0-2 onto /dev/null (O_RDWR), and give Python a stream on it
    where it had none (None: a print to it, or .fileno(), would otherwise fail)."""
    for fd, name in enumerate(_STREAMS):
        try:
            os.fstat(fd)
            continue
        except OSError:  # EBADF: closed
            pass
        opened = os.open(os.devnull, os.O_RDWR)
        if opened != fd:  # (the lowest free fd, which is `fd` as they are reopened in order)
            os.dup2(opened, fd)
            os.close(opened)
        if getattr(sys, name) is None:
            mode = "r" if fd == 0 else "w"
            setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, mode, closefd=False), write_through=fd == 2))
