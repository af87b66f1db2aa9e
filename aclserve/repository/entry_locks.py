"""Compile cache entries' locks and the sweep of what interrupted compiles left (compiler.py's).

One process compiles an entry while the others wait: an exclusive flock on `.<entry>.lock` in the
cache folder (`exclusive`), which the kernel drops when its process dies, so a crash leaves no
stale lock; within one process the compiles of one repository take an entry one at a time before
its flock (`CompilesHere`), so one waiting for another of them can say so. A `stop`
(compile_process.CompileStop) ends either wait (EntryWaitStopped). `sweep` removes, at a start,
what compiles interrupted by a dying server left, each only under its entry's lock.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Callable

from ..om.compile_process import CompileStop, CompileStopped
from . import cache_entry

log = logging.getLogger(__name__)

ENTRY_NAME = re.compile(r"[^.].*-[0-9a-f]{32}\.om")  # compiled_om's names: <model>-<key[:32]>.om
WORK_FOLDER = ".compiling-"  # compiled_om's work folders: .<model>-<key[:32]>.compiling-<random>
LOCK_POLL_S = 0.1  # a stoppable wait for an entry's lock tries it again this often (exclusive)
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW  # a link where a lock goes would have it made elsewhere


class EntryWaitStopped(CompileStopped):
    """Stopped while it waited for another compile of the same file (this repository's or another
    process's) to let go of the entry: nothing was compiled for it."""


class CompilesHere:
    """The compiles of one repository (its CompileCache's): they take a cache entry one at a time
    (a threading lock per entry, kept while one holds or waits for it), then its flock. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, list] = {}  # lock path -> [its lock, the compiles holding or waiting for it]

    @contextlib.contextmanager
    def entry(self, lock_path: str, on_wait=None, stop: CompileStop | None = None):
        """Hold `lock_path`'s entry against this repository's other compiles; `on_wait()` is called
        once before waiting for one of them, `stop` ends that wait (EntryWaitStopped)."""
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
        if ENTRY_NAME.fullmatch(name) and not cache_entry.manifest_path(folder / name).exists():
            if _unheld(folder / f".{name}.lock", functools.partial(_remove_if_unfinished, folder / name)):
                removed += 1
        elif (entry := work_entry(name)) is not None:
            if _unheld(folder / f".{entry}.lock", functools.partial(_remove_work, folder / name)):
                removed += 1
        elif name.startswith(".") and ENTRY_NAME.fullmatch(name[1:-len(".lock")]) and name.endswith(".lock"):
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
    return entry if ENTRY_NAME.fullmatch(entry) else None


def _remove_work(work: Path) -> bool:
    """Under its entry's lock: remove a work folder whose compile's server is gone."""
    shutil.rmtree(work)
    return True


def if_unheld(entry: Path, action: Callable[[], bool]) -> bool:
    """Run `action` under the lock of the cache entry at `entry` when no process holds it (one
    compiling that entry keeps it); what it returns, False when the lock is held."""
    return _unheld(entry.parent / f".{entry.name}.lock", action)


def _unheld(lock_path: Path, action) -> bool:
    """Run `action` under the lock at `lock_path` when nobody holds it, and remove the lock file,
    as `exclusive` does on release; what `action` returns (False when the lock is held)."""
    try:
        fd = os.open(lock_path, LOCK_FLAGS, 0o644)
    except OSError:  # (a link in its place too: never followed)
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
            log.warning("compile cache: could not remove or update what %s guards: %s", lock_path.name, e)
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
    ends that wait (EntryWaitStopped), the lock not taken."""
    while True:
        try:
            fd = os.open(lock_path, LOCK_FLAGS, 0o644)
        except IsADirectoryError:  # an empty folder goes; one with files in it: EntryBlocked
            cache_entry.clear(lock_path)
            continue
        except OSError as e:  # a symbolic link in its place goes, not followed (O_CREAT made its target)
            if e.errno != errno.ELOOP or not os.path.islink(lock_path):
                raise
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
    a shutdown) ends the wait at once, EntryWaitStopped, where it waited for the holder to let go."""
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
    once taken) until it takes the lock, or until `stop` is stopped: EntryWaitStopped, the lock not taken."""
    while not attempt():
        if stop is not None and stop.stopped:
            raise EntryWaitStopped("stopped while waiting for another compile of the same model to end")
