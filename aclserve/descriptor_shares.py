"""The process's descriptors (`ulimit -n`) as shared out between the connections and the model
files loaded versions keep open for their rebuilds (runtime/kept_file.py: one a version).

server/descriptors.py sets the shares once, as it fits the connection caps to the limit
(`share_out`): what refusals lingering take, a reserve for the server's own files, and each
endpoint's connections. Of the reserve, OWN_FILES are the server's own (measured, CPU runtime,
gRPC on, the models folder watched: 28 at rest, three of them the stderr relay's
(cli/stderr_relay.py), besides the models' files; the folder scan one or two more for a moment),
LOAD_FILES each load's at once (as many as load_concurrency lets run and the reserve fits, one at
least; a load past them waits for its turn: `loads_at_once`), COMPILE_FILES each compile's at
once: the rest is the model files' room. Past it each model file kept takes a connection from
HTTP's cap (gRPC's is fixed in grpc core as it starts), down to half of it; past that, versions
loaded keep no file open (they rebuild from their path only: kept_file.py). Before, the model
files came out of nothing: under `ulimit -n 256` with 160 models the process held 186 descriptors
at rest beside caps of 48 + 48 connections, and ran out (connections reset unanswered, grpc core
logging "File descriptor limit reached", the folder scan failing EMFILE). The compiles' room is for
as many at once as the loads it fits and the reserve beside them fit (one at least); a compile
past what it fits waits for a place (`take_compile_place`). The reserve is LEAST_RESERVE at least,
one load compiling beside the server's own (server/descriptors.py takes it from the connections
under a low limit). A process that fitted no caps (the Engine API, `aclserve infer`) keeps up to
MOST_MODEL_FILES and loads and compiles any number at once. Thread-safe: load threads take and
give back places, the loop reads the cap.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

# The reserve's descriptors for the server's own files (above): 28 at rest, the folder scan's two, a rebuild's one
# (it opens its kept file again), ONNX Runtime's first start one more than a load's (its look at the PCI devices, in
# the first load), one spare
OWN_FILES = 33
# A load's at its peak, measured (strace, CPU runtime): an .om's file opened by the runtime while it reads it (the
# file kept for rebuilds is the model files' share), an .onnx's cache entry lock with its manifest, or a header
# check's one for a moment beside; a compile's are COMPILE_FILES. One load's came out of OWN_FILES before, whatever
# load_concurrency said: under `ulimit -n 64`, both caps held, load_concurrency 4 and eight models dropped in at
# once (six .om, two .onnx), the compiles' processes failed to start, "Too many open files" (with twelve, .om
# loads and the folder scan too).
LOAD_FILES = 2
# A compile's (repository/compiler.py), measured: its cache entry's lock file and its process's two pipes
# (om/compile_process.py) for the compile's length, four more as that process starts (the child's ends of the
# pipes, subprocess's exec-error pipe); ATC runs in that process, its pipes are not the server's. They came out
# of nothing before: under `ulimit -n 64`, both caps held, four compiles at once (load_concurrency 4) failed
# to start their processes ("Too many open files").
COMPILE_FILES = 7
PLACE_POLL_S = 0.1  # a compile waiting for a place sees its stop within this
MOST_MODEL_FILES = 256  # model files kept open in a process, whatever its limit
LEAST_RESERVE = OWN_FILES + LOAD_FILES + COMPILE_FILES  # the server's own and one load compiling


@dataclass(frozen=True)
class Shares:
    limit: int  # the soft limit (ulimit -n), fitted
    reserve: int  # the server's own files and the model files' room
    http: int  # HTTP's connection cap before model files take from it
    http_wanted: int  # HTTP's max_connections
    grpc: int  # gRPC's (0: off)
    loads_wanted: int = 1  # load_concurrency: the reserve keeps room for the loads it lets run, if they fit

    @property
    def loads(self) -> int:
        """Loads at once the reserve fits of those wanted (loads_at_once): one past them waits for its turn."""
        return loads_fit(self.reserve, self.loads_wanted)

    @property
    def compiles(self) -> int:
        """Compiles at once the reserve fits beside its loads (compiles_fit): one past them waits for a place."""
        return compiles_fit(self.reserve, self.loads)

    @property
    def model_room(self) -> int:
        """Model files kept before they take from HTTP's cap."""
        compiles = min(self.compiles, self.loads)  # (no more compile at once than loads)
        return max(0, self.reserve - OWN_FILES - LOAD_FILES * self.loads - COMPILE_FILES * compiles)

    @property
    def most_model_files(self) -> int:
        """Model files kept at most: their room, and half of HTTP's cap."""
        return min(MOST_MODEL_FILES, self.model_room + self.http - max(1, self.http // 2))


_lock = threading.Lock()
_shares: Shares | None = None
_model_files = 0  # kept open now
_compiles = 0  # compiles holding a place now
_warned_cap = _warned_most = False


def share_out(shares: Shares) -> None:
    """The shares of the descriptor limit, as server/descriptors.py fits them."""
    global _shares
    with _lock:
        _shares = shares


def take_model_file() -> bool:
    """A place for one more model file kept open, or False (said once): none left."""
    global _model_files, _warned_cap, _warned_most
    with _lock:
        shares = _shares
        most = MOST_MODEL_FILES if shares is None else shares.most_model_files
        taken = _model_files < most
        if taken:
            _model_files += 1
        warn_most = not taken and not _warned_most
        _warned_most |= warn_most
        shrink = http_shrink()
        warn_cap = shrink > 0 and not _warned_cap
        _warned_cap |= warn_cap
        held = _model_files
    if warn_most:
        beside = "" if most == MOST_MODEL_FILES else (f", the most the descriptor limit of {shares.limit} (ulimit -n) "
                                                      "leaves them beside the connections")
        log.warning("%d model files kept open for rebuilds already%s: versions loaded from now on rebuild an "
                    "instance from their file's path only", most, beside)
    if warn_cap:
        grpc = f"; gRPC's stays {shares.grpc}" if shares.grpc else ""
        log.warning("the model files loaded versions keep open for rebuilds (one a version, %d now) take from HTTP's "
                    "connections: its cap is %d (max_connections %d; %d fit the descriptor limit%s), down to %d as "
                    "more load, under the descriptor limit of %d (ulimit -n; raise it to serve max_connections)",
                    held, shares.http - shrink, shares.http_wanted, shares.http, grpc,
                    shares.http - _most_shrink(shares), shares.limit)
    return taken


def give_back_model_file() -> None:
    global _model_files
    with _lock:
        _model_files -= 1


def loads_fit(reserve: int, wanted: int) -> int:
    """Loads at once, of `wanted` (load_concurrency), a reserve has room for beside OWN_FILES and one
    compile, one at least (a reserve is LEAST_RESERVE at least: server/descriptors.py)."""
    return max(1, min(wanted, (reserve - OWN_FILES - COMPILE_FILES) // LOAD_FILES))


def compiles_fit(reserve: int, loads: int) -> int:
    """Compiles at once a reserve has room for beside OWN_FILES and `loads` loads at once, one at least."""
    return max(1, (reserve - OWN_FILES - LOAD_FILES * loads) // COMPILE_FILES)


def loads_at_once(wanted: int) -> int:
    """Loads at once, of `wanted` (load_concurrency): those the reserve fits; `wanted` where no caps were
    fitted. Read as the repository's first load waits for its turn (repository/load_turn.py)."""
    shares = _shares
    return wanted if shares is None else loads_fit(shares.reserve, wanted)


def take_compile_place(stop, waiting: Callable[[], None]) -> bool:
    """A place for one more compile at once (Shares.compiles; any number where no caps were fitted):
    True once taken (give_back_compile_place), False when `stop` (a CompileStop) comes first;
    `waiting()` is called once, when none is free."""
    global _compiles
    said = False
    while True:
        with _lock:
            if _shares is None or _compiles < _shares.compiles:
                _compiles += 1
                return True
        if not said:
            waiting()
            said = True
        if stop.stopped or stop.wait(PLACE_POLL_S):
            return False


def give_back_compile_place() -> None:
    global _compiles
    with _lock:
        _compiles -= 1


def http_shrink() -> int:
    """Connections the model files kept past their room take from HTTP's cap now."""
    shares = _shares
    if shares is None:
        return 0
    return min(_most_shrink(shares), max(0, _model_files - shares.model_room))


def _most_shrink(shares: Shares) -> int:
    return shares.http - max(1, shares.http // 2)
