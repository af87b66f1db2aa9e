"""CompileError, apart from the compiler's modules: the server raises it for a compile run in a
child process (compile_process.py) without importing onnx itself; CompileKilled, a process of
the compile killed by a signal (the child, or ATC: atc.py), with how such a signal is named; and
ATC's own (AtcFailed, AtcKilled), which the server raises again for a child's ATC that failed
(atc.py imports onnx, as its spec does)."""
from __future__ import annotations

import signal


class CompileError(ValueError):
    """Bad compile input or a failed build; the message is one line naming the problem."""


class CompileKilled(CompileError):
    """A process of the compile ended by a signal without a word (the out-of-memory killer's SIGKILL,
    a `kill` of it alone): the compile's own process, or ATC (AtcKilled). `signum` is that
    signal, for `aclserve compile`'s exit status (128 + it, as shells say it)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class AtcFailed(CompileError):
    """ATC ran but did not produce a valid OM (non-zero exit, timeout, or a bad output file)."""


class AtcKilled(AtcFailed, CompileKilled):
    """ATC was killed by a signal not of the compile's sending (the out-of-memory killer's SIGKILL:
    ATC is the compile's largest process): no verdict of ATC's on the model, so `aclserve compile`
    exits 128 + `signum`, as for its own process killed."""


def killed_by(signum: int) -> str:
    """The signal named for a one-line error, e.g. "SIGKILL (signal 9; the kernel's out-of-memory
    killer sends it when the host runs short of memory)"."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = "; the kernel's out-of-memory killer sends it when the host runs short of memory" \
        if signum == signal.SIGKILL else ""
    return f"{name} (signal {signum}{why})"
