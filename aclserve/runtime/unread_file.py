"""A model file the ACL could not read (GE's 145002, "model file missing or unreadable"), or one
whose header the server could not read to say why the ACL refused it: the file's fault, or the
host short of descriptors or memory.

The CPU runtime answers a failed open or read of the file 145002, EMFILE included, as a device's
GE does (its RealPath and read fail alike): the code cannot tell a host out of descriptors from
a file gone, and repository/retry.py takes 1xxxxx codes for the file's, never retried. Under
`ulimit -n 64` a burst of loads failed so for good, said "not a loadable OM", or "a CPU OM ...
refused: on an Ascend host rebuild it" when the server's own read of the header passed a moment
later. So the server looks at the file itself at once: it opens it and reads its header. That
failing with EMFILE, ENFILE or ENOMEM, the host is short; that reading it, the ACL's read failed
where the server's passes: the host was short then (descriptors others held, given back since).
Either is a LoadError raised from an OSError of the shortage (EMFILE when it has passed), which
retry.py's host_short takes as transient: retried with the backoff. Failing otherwise (the file
gone, no permission), it is the file's fault, said as such; and so is a file that reads but is
empty, which GE answers 145002 too (GetFileLength takes it for no file), or shorter than GE's
256-byte OM header: "the file is empty (0 bytes)", not retried as the host short (a tester, t91).
"""
from __future__ import annotations

import errno
import os
import resource

from ..om.atc_om import HEADER_SIZE, too_short_said
from ..regular_files import open_regular
from .device import LoadError

# a read failing with one of these is the host's want, not the file's
SHORT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def unread_file(name: str, path: str, refusal: Exception) -> LoadError:
    """The error of model `name`'s load whose ACL call could not read `path` (`refusal`, 145002)."""
    head = header_read_now(path)
    if isinstance(head, OSError):
        return _unreadable(name, path, head, refusal)
    if len(head) < HEADER_SIZE:  # (what the file holds, not a read failing: the same at every retry)
        error = LoadError(f"model {name}: {path} is {too_short_said(len(head))} ({refusal})")
        error.__cause__ = refusal  # (a file's code, 1xxxxx: not transient)
        return error
    shortage = OSError(errno.EMFILE, "the file reads now")
    error = _short(f"model {name}: {path} could not be read ({refusal}) and reads now: taken for the host "
                   f"short of descriptors or memory then ({descriptors_said()})", shortage)
    # a device's GE answers 145002 for a path or length check it fails too, which the server's read
    # passes: failing so again and again, it is the file's (retry.warm_up_failure's rule, a review)
    error.repeats_as = ("the ACL could not read a file that reads", path, str(refusal))
    return error


def _unreadable(name: str, path: str, failure: OSError, refusal: Exception) -> LoadError:
    """The error of a load whose file the server cannot read either (`failure`)."""
    if short_of_reading(failure):
        return host_short(name, path, failure, refusal)
    error = LoadError(f"model {name}: {path} cannot be read: {failure.strerror or failure} ({refusal})")
    error.__cause__ = failure
    return error


def host_short(name: str, path: str, failure: OSError, refusal: Exception) -> LoadError:
    """The error of a load that could not read `path` for the host's want (`failure`: short_of_reading)."""
    want = "memory" if failure.errno == errno.ENOMEM else "descriptors"
    return _short(f"model {name}: {path} could not be read ({refusal}): {failure.strerror or failure}, the host "
                  f"short of {want} ({descriptors_said()})", failure)


def header_read_now(path: str) -> bytes | OSError:
    """The first HEADER_SIZE bytes of `path` as the server reads them now (fewer: the whole of a
    shorter file), or why it cannot open and read them."""
    try:
        with open_regular(path) as file:
            return file.read(HEADER_SIZE)
    except OSError as e:
        return e


def short_of_reading(failure: OSError) -> bool:
    """A read of a model file failed for the host's want of descriptors or memory."""
    return failure.errno in SHORT_ERRNOS


def descriptors_said() -> str:
    """`N of ulimit -n L open`: the process's descriptors, as a reason says them."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    try:
        count = str(len(os.listdir("/proc/self/fd")) - 1)  # (less the listing's own)
    except OSError as e:  # (none left to list them with, or no /proc)
        count = "all" if e.errno in SHORT_ERRNOS else "?"
    return f"{count} of ulimit -n {limit} descriptors open"


def _short(message: str, cause: OSError) -> LoadError:
    error = LoadError(message)
    error.__cause__ = cause  # (retry.py's host_short: transient)
    return error
