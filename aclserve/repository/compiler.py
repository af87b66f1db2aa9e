"""Compile a dropped .onnx into a cached .om (content-addressed, so unchanged models are reused).

The cache key is the SHA-256 of the ONNX bytes (its external data files' too: external_data.py),
the compile options and the target, so the same file with the same options is compiled once,
even across restarts. Blocking: call it in an executor. The compile itself runs in a child
process (om/compile_process.py: the server's loop and its other models are not stalled by it,
and its memory goes back to the system when it ends), into a work folder of the cache folder,
`.<entry>.compiling-<random>`, whose OM is renamed onto the entry; the folder is removed
whatever happens, and one left by a server that died meanwhile goes at the next start (sweep).
A `stop` (compile_process.CompileStop) ends the child: an unload, a shutdown, or (poll mode) the
model's file deleted or replaced (repository/running_compiles.py); so does
`timeout_s` (compile_timeout_s: a CPU compile's test runs of the model have no bound of their
own), the compile failing with a CompileError naming it. Progress goes to the log.

Several server processes may share one models folder (replicas behind a load balancer, on one
host or on a shared volume) and see the same dropped .onnx at once. Entries appear whole: the
compiler writes a temporary file and renames it into place (om/container.py, om/atc.py), so
a reader never sees a partial .om. And one process compiles while the others wait: an
exclusive flock on `.<entry>.lock` in the cache folder; whoever gets it next finds the entry
and uses it. The kernel drops the lock of a process that dies, so a crash leaves no stale lock.
A load waiting for that lock says so (`progress`: the index's reason), as another process compiling
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
lock and checked before the entry is used; an entry that fails the check (edited, truncated,
another model's OM copied over it, an empty folder in place of one of its files) is deleted and
compiled again, under the lock; a folder with files in it is left alone and named
(cache_entry.EntryBlocked).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from ..config import CompileOptions
from ..om.compile_error import CompileError, NoBatchDimension
from ..om.compile_process import CompileStop, CompileStopped, CompileTimedOut, compile_in_child
from ..regular_files import open_regular, stat_identity
from . import cache_entry, external_data

log = logging.getLogger(__name__)

# a load's step while another holds its cache entry's lock (the index's reason: no path)
WAITING_ELSEWHERE = "waiting for another process compiling the same model"
WAITING_HERE = "waiting for another version of the model compiling the same file"
ENTRY_NAME = re.compile(r"^[^.].*-[0-9a-f]{32}\.om$")  # compiled_om's names: <model>-<key[:32]>.om
WORK_FOLDER = ".compiling-"  # compiled_om's work folders: .<model>-<key[:32]>.compiling-<random>
LOCK_POLL_S = 0.1  # a stoppable wait for an entry's lock tries it again this often (exclusive)


def cache_key(onnx_path: str | os.PathLike, options: CompileOptions, target: str) -> str:
    """The ONNX file's bytes, its external data files' (names and bytes), the options, the target, the rules."""
    digest, source = hashlib.sha256(), os.fspath(onnx_path)
    _hash_file(digest, source)
    for path in external_data.named_files(source):
        digest.update(f"\0{os.path.basename(path)}\0".encode("utf-8", "surrogateescape"))
        with contextlib.suppress(FileNotFoundError):  # (one missing: the compile says so)
            _hash_file(digest, path)
    opts = dict(asdict(options), target=target, batch=list(options.batch) if options.batch else None)
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


class CompilesHere:
    """The compiles of one repository (its CompileCache's): they take a cache entry one at a time
    (a threading lock per entry, kept while one holds or waits for it), then its flock. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, list] = {}  # lock path -> [its lock, the compiles holding or waiting for it]

    @contextlib.contextmanager
    def entry(self, lock_path: str, on_wait=None, stop: CompileStop | None = None):
        """Hold `lock_path`'s entry against this repository's other compiles; `on_wait()` is called
        once before waiting for one of them, `stop` ends that wait (CompileStopped)."""
        with self._lock:
            held = self._entries.setdefault(lock_path, [threading.Lock(), 0])
            held[1] += 1
        try:
            if not held[0].acquire(blocking=False):
                if on_wait is not None:
                    on_wait()
                _take_unless_stopped(lambda: held[0].acquire(timeout=LOCK_POLL_S), stop)
            try:
                yield
            finally:
                held[0].release()
        finally:
            with self._lock:
                held[1] -= 1
                if not held[1]:
                    del self._entries[lock_path]


def compiled_om(onnx_path: str | os.PathLike, model_name: str, options: CompileOptions,
                runtime_kind: str, cache_dir: str | os.PathLike, soc_name: str | None = None,
                progress=None, stop: CompileStop | None = None, timeout_s: float | None = None,
                here: CompilesHere | None = None) -> Path:
    """Return the path of the .om for `onnx_path`, compiling it on a cache miss (blocking).
    `soc_name`: the NPU's SoC, used by ATC when the model's compile options name none;
    `progress(step)` hears a compile begin; `stop` ends it (compile_process.CompileStopped);
    `timeout_s` bounds it, ATC's own run included (None: no bound; ATC's default one); `here`:
    the compiles of its repository (None: none but this one). A source changed while it compiled
    stores nothing: SourceChanged."""
    if runtime_kind == "npu" and options.soc_version is None and soc_name:
        options = replace(options, soc_version=soc_name)

    before = source_identity(onnx_path)  # (before the hash: a change from here on is seen after the compile)
    key = cache_key(onnx_path, options, runtime_kind)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{model_name}-{key[:32]}.om"
    if out.is_file() and cache_entry.problem(out, key) is None:  # complete, and what it says it is
        log.info("%s: using cached compile of %s (%s)", model_name, onnx_path, out.name)
        return out
    lock = cache / f".{out.name}.lock"

    def waiting(step: str) -> None:
        log.info("%s: waiting for %s compiling %s (%s)", model_name, "another version" if step == WAITING_HERE
                 else "another process", onnx_path, lock)
        if progress is not None:
            progress(step)

    # a writer holds it until its manifest is written
    with ((here or CompilesHere()).entry(str(lock), lambda: waiting(WAITING_HERE), stop),
          exclusive(lock, on_wait=lambda: waiting(WAITING_ELSEWHERE), stop=stop)):
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
        limit = {} if timeout_s is None else {"timeout_s": timeout_s}  # (ATC's own timeout too: compile_process)
        log.info("%s: compiling %s for %s into %s", model_name, onnx_path, runtime_kind, out)
        if progress is not None:
            progress(f"compiling {Path(onnx_path).name} for {runtime_kind}")
        work = tempfile.mkdtemp(prefix=f".{out.stem}{WORK_FOLDER}", dir=cache)
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
        cache_entry.record(out, key, dict(asdict(options), batch=kwargs.get("batch")), runtime_kind,
                           result.index_bounds)
    log.info("%s: compiled in %.1f s (%d bytes)", model_name, result.seconds, result.size)
    for warning in result.warnings:  # (a SoC or opset ATC would refuse: atc_options.cpu_warnings)
        log.warning("%s: %s", model_name, warning)
    return out


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


def _in_config_words(error: CompileError) -> CompileError:  # (a NoBatchDimension stays one: loader.py)
    message = re.sub(r"--batch (\d+)\b", r"compile.batch: [\1]", str(error))  # (a YAML list: `batch: 1` is refused)
    for flag, key in _CONFIG_WORDS.items():
        message = re.sub(rf"{flag}\b(?!-)", key, message)
    return (NoBatchDimension if isinstance(error, NoBatchDimension) else CompileError)(message)


def sweep(cache_dir: str | os.PathLike) -> int:
    """Remove what interrupted compiles left in `cache_dir` (a process that exited between an
    entry's rename and its manifest, or killed in it): an entry's .om without its manifest, its
    work folders, and lock files, each only when no process holds that entry's lock (a replica
    compiling it now keeps it) and only by the names entries have (`<model>-<32 hex digits>.om`:
    an OM of the user's own in a configured folder is never taken for one). Returns how many
    entries and work folders went."""
    folder = Path(cache_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    removed = 0
    for name in names:
        if ENTRY_NAME.match(name) and not cache_entry.manifest_path(folder / name).exists():
            if _unheld(folder / f".{name}.lock", functools.partial(_remove_if_unfinished, folder / name)):
                removed += 1
        elif (entry := work_entry(name)) is not None:
            if _unheld(folder / f".{entry}.lock", functools.partial(_remove_work, folder / name)):
                removed += 1
        elif name.startswith(".") and ENTRY_NAME.match(name[1:-len(".lock")]) and name.endswith(".lock"):
            _unheld(folder / name, lambda: True)  # a lock left by a process killed while holding it
    return removed


def _remove_if_unfinished(entry: Path) -> bool:
    """Under the entry's lock: remove it if it still has no manifest (a compile may have
    finished it between the listing and the lock)."""
    if cache_entry.manifest_path(entry).exists():
        return False
    cache_entry.remove(entry)
    return True


def work_entry(name: str) -> str | None:
    """The entry whose work folder `name` is (`.<model>-<key>.compiling-<random>`), else None."""
    if not name.startswith(".") or WORK_FOLDER not in name:
        return None
    entry = name[1:name.rindex(WORK_FOLDER)] + ".om"
    return entry if ENTRY_NAME.match(entry) else None


def _remove_work(work: Path) -> bool:
    """Under its entry's lock: remove a work folder whose compile's server is gone."""
    shutil.rmtree(work)
    return True


def _unheld(lock_path: Path, action) -> bool:
    """Run `action` under the lock at `lock_path` when nobody holds it, and remove the lock file,
    as `exclusive` does on release; what `action` returns (False when the lock is held)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if os.stat(lock_path).st_ino != os.fstat(fd).st_ino:
            return False  # replaced meanwhile: its holder is at work
        try:
            return action()
        except OSError as e:
            log.warning("compile cache: could not remove what %s guards: %s", lock_path.name, e)
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive(lock_path: Path, on_wait=None, stop: CompileStop | None = None):
    """Hold an exclusive flock on `lock_path` (blocking), across processes and threads alike;
    the file is removed on release. A waiter that wakes on a file already removed (or
    replaced) by the previous holder retries on the current one, so two holders never meet.
    `on_wait()` is called once, before the first wait for a lock someone else holds; `stop`
    ends that wait (CompileStopped), the lock not taken."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:  # an empty folder goes; one with files in it: EntryBlocked
            cache_entry.clear(lock_path)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                    on_wait = None
                _wait_for_lock(fd, stop)
            try:
                current = os.stat(lock_path)
            except FileNotFoundError:
                current = None
            if current is not None and current.st_ino == os.fstat(fd).st_ino:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder before us removed this file: lock the new one
    try:
        yield
    finally:
        try:
            os.unlink(lock_path)
        except FileNotFoundError:
            pass
        os.close(fd)  # closing releases the lock


def _wait_for_lock(fd: int, stop: CompileStop | None) -> None:
    """Take the flock on `fd` that another holds now. With a `stop`, tried again every LOCK_POLL_S
    rather than blocked in flock(), which nothing of this process interrupts: a stop (an unload,
    a shutdown) ends the wait at once, CompileStopped, where it waited for the holder to let go."""
    if stop is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return

    def flocked_after_a_poll() -> bool:  # (asleep on the stop: it wakes the wait at once)
        if stop.wait(LOCK_POLL_S):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    _take_unless_stopped(flocked_after_a_poll, stop)


def _take_unless_stopped(attempt: Callable[[], bool], stop: CompileStop | None) -> None:
    """Call `attempt()` (tries to take a lock another compile holds, waiting at most LOCK_POLL_S: True
    once taken) until it takes the lock, or until `stop` is stopped: CompileStopped, the lock not taken."""
    while not attempt():
        if stop is not None and stop.stopped:
            raise CompileStopped("stopped while waiting for another compile of the same model to end")
