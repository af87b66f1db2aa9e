"""CompileError, apart from the compiler's modules: the server raises it for a compile run in a
child process (compile_process.py) without importing onnx itself; CompileKilled, a process of
the compile killed by a signal (the child, or ATC: atc.py), with how such a signal is named;
ATC's own (AtcFailed, AtcKilled), which the server raises again for a child's ATC that failed
(atc.py imports onnx, as its spec does); and a compile's timeout: its default (the config's
compile_timeout_s and `aclserve compile --timeout` take it from here, without importing onnx) and
its check, which `aclserve compile` makes before its child starts as compile_model makes it."""
from __future__ import annotations

import signal

DEFAULT_TIMEOUT_S = 3600.0
MAX_TIMEOUT_S = 30 * 24 * 3600
# how compile_model's error begins when ATC is needed and no `atc` is on PATH (the server, which has no
# --atc, says the rest in its own words: repository/compiler.py)
ATC_NOT_ON_PATH = "ATC asked for but not found: no `atc` on PATH"


class CompileError(ValueError):
    """Bad compile input or a failed build; the message is one line naming the problem."""


class OptionRefused(CompileError):
    """A compile option's text refused before the model is read (compile.input_shape,
    compile.precision_mode): its message names the flag; `problem` says the same without it, for
    the config's reader, which names the option by its dotted key (model_defaults.compile.input_shape)."""

    def __init__(self, flag: str, said):
        """`said(named)`: the sentence, with `named` where the option is named (the flag and a blank, or "")."""
        super().__init__(said(f"{flag} "))
        self.problem = said("")


class NoBatchDimension(CompileError):
    """Batch sizes given (--batch, compile.batch) for a model without a batch dimension: no input
    has a dynamic first dimension. Typed so that what asked for them in other words (a
    config.pbtxt's max_batch_size: repository/pbtxt_refusals.py) can say it in its own."""


class OpenDims(CompileError):
    """Input dimensions left open past the batch (open_dims.py): `open_dims` lists each as (input,
    axis, its symbol or None), for what gave the model its sizes in other words (a config.pbtxt's
    dims: repository/pbtxt_refusals.py) to name every one in its own, as the message does; `shapes`
    the model's inputs' shapes, -1 for a variable dimension (dims of another rank: named so there)."""

    def __init__(self, message: str, open_dims=(), shapes=None):  # (defaults: pickled, made again of the message)
        super().__init__(message)
        self.open_dims = [(str(name), int(axis), symbol) for name, axis, symbol in open_dims]
        self.shapes = {str(name): [int(d) for d in dims] for name, dims in (shapes or {}).items()}


# its message (om/spec.py's resolve; the server says it too of a compile the cache gives: repository/loader.py)
NO_BATCH_DIMENSION = ("--batch given but the model has no batch dimension (no input has a dynamic first dimension; "
                      "-1 marks it in --input-shape)")


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


def check_timeout(timeout: float | None) -> None:
    """CompileError unless `timeout` is a positive number of seconds, at most MAX_TIMEOUT_S."""
    if timeout is None or not 0 < timeout <= MAX_TIMEOUT_S:  # (NaN fails it; inf was a Timer's OverflowError)
        raise CompileError(f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:,} (30 days), "
                           f"got {timeout!r}")
