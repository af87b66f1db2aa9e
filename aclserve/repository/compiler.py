"""Compile a dropped .onnx into a cached .om (content-addressed, so unchanged models are reused).

The cache key is the SHA-256 of the ONNX bytes (its external data files' too: external_data.py),
the compile options and the target, so the same file with the same options is compiled once,
even across restarts. Blocking: call it in an executor. The compile itself runs in a child
process (om/compile_process.py: the server's loop and its other models are not stalled by it,
and its memory goes back to the system when it ends), into a work folder of the cache folder,
`.<entry>.compiling-<random>`, whose OM is renamed onto the entry; the folder is removed
whatever happens, and one left by a server that died meanwhile goes at the next start
(entry_locks.sweep).
A `stop` (compile_process.CompileStop) ends the child: an unload, a shutdown, or (poll mode) the
model's file deleted or replaced (repository/running_compiles.py); so does
`timeout_s` (compile_timeout_s: a CPU compile's test runs of the model have no bound of their
own), the compile failing with a CompileError naming it. Progress goes to the log.

Several server processes may share one models folder (replicas behind a load balancer, on one
host or on a shared volume) and see the same dropped .onnx at once. Entries appear whole: the
compiler writes a temporary file and renames it into place (om/container.py, om/atc.py), so
a reader never sees a partial .om. And one process compiles while the others wait: an
exclusive flock on `.<entry>.lock` in the cache folder (entry_locks.py); whoever gets it next
finds the entry and uses it. The kernel drops the lock of a process that dies, so a crash leaves
no stale lock. A load waiting for that lock says so (`progress`: the index's reason), as another process compiling
the same model, and its `stop` ends the wait as it ends a compile (CompileStopped): an unload, a
shutdown or (poll mode) the model's file deleted or replaced waited for the other compile to let
go, up to its compile_timeout_s. The compiles of one repository (CompilesHere: its CompileCache's)
take an entry one at a time before its flock, so one waiting for another of them (another version
of the model whose file is the same) names it as such from the moment it waits; another server of
this process sharing the cache folder is another process to it (a set of the locks held in the
process named the other server's compile "another version", and a compile that had its flock but
not yet its mark "another process").

An entry holds the compile of the bytes its key hashed: the child reads the source later, so its
stat identity (source_identity, external data files' included) is taken before the hash and
again after the compile; changed, nothing is stored (SourceChanged: under the old bytes' key, the
old file put back, or a server sharing the cache with it, was served the other model). A hit
reads no source: its entry is the compile of bytes that hashed to its key.

Each entry's manifest (cache_entry.py: key, options, the OM's SHA-256) is written under that
lock (the entry removed when it cannot be: a full disk) and checked before the entry is used; an
entry that fails the check (edited, truncated, another model's OM copied over it, an empty folder
in place of one of its files) is deleted and compiled again, under the lock; a folder with files
in it is left alone and named (cache_entry.EntryBlocked).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Iterator

from ..config import CompileOptions
from ..descriptor_shares import give_back_compile_place, take_compile_place
from ..om.compile_error import ATC_NOT_ON_PATH, NO_BATCH_DIMENSION, CompileError, NoBatchDimension, OpenDims
from ..om.compile_process import CompileStop, CompileStopped, CompileTimedOut, compile_in_child
from ..regular_files import open_regular, stat_identity
from . import cache_entry, external_data
from .entry_locks import WORK_FOLDER, CompilesHere, exclusive

log = logging.getLogger(__name__)

# a load's step while another holds its cache entry's lock (the index's reason: no path)
WAITING_ELSEWHERE = "waiting for another process compiling the same model"
WAITING_HERE = "waiting for another version of the model compiling the same file"
# one past the compiles the descriptor limit leaves room for at once (descriptor_shares.take_compile_place)
WAITING_FOR_PLACE = "waiting for another compile to end: the descriptor limit (ulimit -n) fits no more at once"


def cache_key(onnx_path: str | os.PathLike, options: CompileOptions, target: str,
              declared_dims: dict | None = None) -> str:
    """The ONNX file's bytes, its external data files' (names and bytes), the options, the target, the rules,
    and the input dims a config.pbtxt declares (om/declared_dims.py), when it does. Not whether the batch
    sizes may be passed over (compiled_om's batch_optional): a dynamic model compiles alike either way,
    and its entries stay as they were; a model's own sizes finding a fixed model's entry compiled without
    them is refused at its load (loader.py)."""
    digest, source = hashlib.sha256(), os.fspath(onnx_path)
    _hash_file(digest, source)
    for path in external_data.named_files(source):
        digest.update(f"\0{os.path.basename(path)}\0".encode("utf-8", "surrogateescape"))
        with contextlib.suppress(FileNotFoundError):  # (one missing: the compile says so)
            _hash_file(digest, path)
    opts = dict(asdict(options), target=target, batch=list(options.batch) if options.batch else None)
    if declared_dims:  # (left out otherwise: the keys of models without them stay as they were)
        opts["declared_dims"] = {name: list(dims) for name, dims in declared_dims.items()}
    digest.update(json.dumps(dict(opts, rules=cache_entry.COMPILE_RULES), sort_keys=True).encode())
    return digest.hexdigest()


def source_identity(onnx_path: str | os.PathLike) -> tuple | None:
    """The .onnx's (size, mtime, ctime, inode) and its external data files' (external_data.stamp),
    as the compile reads them (links followed); None when the .onnx cannot be looked at."""
    source = os.fspath(onnx_path)
    try:
        st = os.stat(source)
    except OSError:
        return None
    return stat_identity(st) + external_data.stamp(source)


class SourceChanged(CompileError):
    """The source changed (replaced, written to or deleted) between its hash and the end of its
    compile: the OM may be of other bytes than the key's, so it is not kept."""


def _check_unchanged(onnx_path: str | os.PathLike, before: tuple | None, stop: CompileStop | None) -> None:
    """After the child's compile: raise unless the source is as `before` its hash (SourceChanged)."""
    if before is not None and source_identity(onnx_path) == before:
        return
    if stop is not None and stop.stopped:  # (an unload, a shutdown, poll mode's scan): who stopped it says why
        raise CompileStopped("the compile was stopped, and the model's file changed while it compiled")
    raise SourceChanged(f"{Path(onnx_path).name} changed while it compiled (replaced, written to or deleted), so "
                        "the compile was not kept: load it again once the file is complete (poll mode loads a new "
                        "file by itself)")


def _hash_file(digest, path: str) -> None:
    with open_regular(path) as f:  # swapped for a FIFO since the scan: refused, not waited on
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)


def compiled_om(onnx_path: str | os.PathLike, model_name: str, options: CompileOptions,
                runtime_kind: str, cache_dir: str | os.PathLike, soc_name: str | None = None,
                progress=None, stop: CompileStop | None = None, timeout_s: float | None = None,
                here: CompilesHere | None = None, declared_dims: dict | None = None,
                batch_optional: bool = False) -> Path:
    """Return the path of the .om for `onnx_path`, compiling it on a cache miss (blocking).
    `soc_name`: the NPU's SoC, used by ATC when the model's compile options name none;
    `progress(step)` hears a compile begin; `stop` ends it (compile_process.CompileStopped);
    `timeout_s` bounds it, ATC's own run included (None: no bound; ATC's default one); `here`:
    the compiles of its repository (None: none but this one); `declared_dims`: the input dims a
    config.pbtxt declares, which size the dimensions the model leaves variable (om/declared_dims.py);
    `batch_optional`: the batch sizes are model_defaults', which a model without a batch dimension
    compiles without (not refused: NoBatchDimension). A source changed while it compiled stores nothing:
    SourceChanged."""
    if runtime_kind == "npu" and options.soc_version is None and soc_name:
        options = replace(options, soc_version=soc_name)

    before = source_identity(onnx_path)  # (before the hash: a change from here on is seen after the compile)
    key = cache_key(onnx_path, options, runtime_kind, declared_dims)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{model_name}-{key[:32]}.om"
    if out.is_file() and cache_entry.problem(out, key) is None:  # complete, and what it says it is
        log.info("%s: using cached compile of %s (%s)", model_name, onnx_path, out.name)
        return out
    lock = cache / f".{out.name}.lock"

    def waiting(step: str) -> None:
        if step == WAITING_FOR_PLACE:
            log.info("%s: %s, to compile %s", model_name, step, onnx_path)
        else:
            log.info("%s: waiting for %s compiling %s (%s)", model_name, "another version" if step == WAITING_HERE
                     else "another process", onnx_path, lock)
        if progress is not None:
            progress(step)

    # a writer holds it until its manifest is written; the descriptors' place is taken last (a compile
    # waiting for another version's or process's compile of this entry holds none that others could use)
    with ((here or CompilesHere()).entry(str(lock), lambda: waiting(WAITING_HERE), stop),
          exclusive(lock, on_wait=lambda: waiting(WAITING_ELSEWHERE), stop=stop),
          _compile_place(stop, lambda: waiting(WAITING_FOR_PLACE))):
        if out.is_file():
            problem = cache_entry.problem(out, key)
            if problem is None:
                log.info("%s: using cached compile of %s (%s), made meanwhile by another compile",
                         model_name, onnx_path, out.name)
                return out
            log.warning("%s: cached compile %s not used: %s; deleting it and compiling again",
                        model_name, out.name, problem)
            cache_entry.remove(out)
        else:
            blocker = cache_entry.not_a_file(out)
            cache_entry.remove(out)  # whatever is left of the entry first (a compile's rename cannot replace a folder)
            if blocker is not None:
                log.warning("%s: cached compile %s not used: it was %s; removed, compiling again",
                            model_name, out.name, blocker)
        kwargs = {k: v for k, v in asdict(options).items() if v is not None}
        if options.batch:
            kwargs["batch"] = list(options.batch)
        if declared_dims:
            kwargs["declared_dims"] = {name: list(dims) for name, dims in declared_dims.items()}
        if batch_optional and options.batch:
            kwargs["batch_optional"] = True
        limit = {} if timeout_s is None else {"timeout_s": timeout_s}  # (ATC's own timeout too: compile_process)
        log.info("%s: compiling %s for %s into %s", model_name, onnx_path, runtime_kind, out)
        if progress is not None:
            progress(f"compiling {Path(onnx_path).name} for {runtime_kind}")
        work = tempfile.mkdtemp(prefix=f".{out.stem}{WORK_FOLDER}", dir=cache)
        began = time.monotonic()  # the child's start-up counted: the compile alone said 0.0 s for 0.25 s
        try:
            # (the line above says it begins: the child's own would say it again, less)
            result = compile_in_child(onnx_path, os.path.join(work, out.name), target=runtime_kind, stop=stop,
                                      log=lambda line: log.info("%s: %s", model_name, line), log_start=False,
                                      **limit, **kwargs)
            _check_unchanged(onnx_path, before, stop)  # (the child read it after the hash: maybe other bytes)
            os.replace(result.path, out)
        except CompileTimedOut as e:  # (not retried by itself: a new file or a load call compiles it again)
            raise CompileError(f"the compile did not finish within compile_timeout_s ({e.timeout_s:g} s) and its "
                               "process was ended; raise compile_timeout_s in the server's config if the model "
                               "needs longer") from None
        except SourceChanged:
            raise
        except CompileError as e:  # (said in the command's words: here the model's YAML gives them)
            raise _in_config_words(e) from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        recorded = {k: kwargs[k] for k in ("declared_dims",) if k in kwargs}
        try:
            cache_entry.record(out, key, dict(asdict(options), batch=kwargs.get("batch"), **recorded), runtime_kind,
                               result.index_bounds)
        except BaseException:  # (a full disk: the .om fitted, its manifest did not)
            # an entry without its manifest is never used: each retry deleted this one, saying it
            # had no manifest (a tester, t87); gone now, the failure is the manifest's alone
            with contextlib.suppress(OSError):
                cache_entry.remove(out)
            raise
    log.info("%s: compiled in %.1f s (%d bytes)", model_name, time.monotonic() - began, result.size)
    for warning in result.warnings:  # (a SoC or opset ATC would refuse, a model failing on zeros: compile.py)
        log.warning("%s: %s", model_name, _config_words(warning))
    return out


class PlaceWaitStopped(CompileStopped):
    """A compile's wait for a place among those the descriptor limit fits at once was stopped."""


@contextlib.contextmanager
def _compile_place(stop: CompileStop | None, waiting) -> Iterator[None]:
    """One of the places the descriptor reserve keeps for compiles at once (its lock file and its
    process's pipes: descriptor_shares.COMPILE_FILES), for the block; `waiting()` when it waits for one."""
    if not take_compile_place(stop or CompileStop(), waiting):
        raise PlaceWaitStopped("stopped while waiting for another compile to end (the descriptor limit)")
    try:
        yield
    finally:
        give_back_compile_place()


def source_index_bounds(onnx_path: str | os.PathLike) -> dict[str, int] | None:
    """The integer inputs of an .onnx indexing a table (om/index_bounds.py), its weights unread;
    None when it no longer reads (its compile stands: the bounds are a check, not the model)."""
    from ..om.index_bounds import index_bounds
    from ..om.spec import load_onnx
    try:
        return index_bounds(load_onnx(onnx_path, weights=False).graph)
    except (CompileError, OSError) as e:
        log.warning("%s: its integer inputs' bounds could not be read (%s); their values are not checked",
                    onnx_path, e)
        return None


# `aclserve compile`'s flags and the model YAML's keys for the same options
_CONFIG_WORDS = {"--input-shape": "compile.input_shape", "--batch": "compile.batch",
                 "--soc-version": "compile.soc_version", "--precision-mode": "compile.precision_mode"}
# no `atc` on PATH, in the server's words: it has no --atc to pass, nor asked for ATC (its NPU runtime needs it)
ATC_NOT_FOUND = ("the program `atc` (CANN's ATC, which compiles an .onnx for the NPU) was not found on the server's "
                 "PATH: install CANN's toolkit and source its set_env.sh before the server starts, or drop in an "
                 ".om compiled with ATC (aclserve compile --target npu)")


def no_batch_dimension() -> NoBatchDimension:
    """The compile's refusal of batch sizes for a model without a batch dimension, in the config's words."""
    return _in_config_words(NoBatchDimension(NO_BATCH_DIMENSION))


def _in_config_words(error: CompileError) -> CompileError:  # (NoBatchDimension, OpenDims stay so: pbtxt_refusals.py)
    if str(error).startswith(ATC_NOT_ON_PATH):
        return CompileError(ATC_NOT_FOUND)
    if isinstance(error, OpenDims):
        return OpenDims(_config_words(str(error)), error.open_dims, error.shapes)
    return (NoBatchDimension if isinstance(error, NoBatchDimension) else CompileError)(_config_words(str(error)))


def _config_words(message: str) -> str:
    """A compile's line with `aclserve compile`'s flags as the model YAML's keys."""
    # (a YAML list: `batch: 1` is refused)
    message = re.sub(r"--batch (\d+(?:,\d+)*)\b", r"compile.batch: [\1]", message)
    for flag, key in _CONFIG_WORDS.items():
        message = re.sub(rf"{flag}\b(?!-)", key, message)
    return message
