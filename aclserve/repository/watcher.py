"""File events -> one debounced reconcile on the event loop.

RepositoryWatcher owns a watchdog Observer thread that only forwards paths (with whether the
path was the destination of a rename) to the loop; it decides nothing. Debouncer runs the
reconcile coroutine once events have been quiet for `delay` seconds (a burst gives one run;
a burst that never pauses still runs at least every `max_wait` seconds), never two runs at
once, and one more run when events arrived during a run.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Awaitable, Callable

from watchdog.events import (DirCreatedEvent, DirDeletedEvent, DirMovedEvent, FileCreatedEvent, FileDeletedEvent,
                             FileMovedEvent, FileSystemEventHandler)
from watchdog.observers import Observer

from .layout import is_ignored_name

log = logging.getLogger(__name__)

# watchdog's recursive inotify watch registers a folder twice when a sub-folder appears in a new
# folder between the new folder's watch and its walk (`os.makedirs("m/2")` can do it); it then
# warns "Callback with id ... already exists ... It will be Overwritten." from its own thread. The
# callback it overwrites is the same one and no event is lost, so only that message is silenced.
warnings.filterwarnings("ignore", message=r"Callback with id .* already exists for watch",
                        category=RuntimeWarning, module=r"watchdog\.observers\.inotify")


class _StoppedEmitterNoise(logging.Filter):
    """watchdog's inotify emitter logs an ERROR, "queue_events() called when the thread is
    inactive", when its observer is stopped while it reads (a server that stops right after
    starting: a busy port). Nothing is lost then (the watch is being closed), so only that
    message is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


logging.getLogger("watchdog.observers.inotify").addFilter(_StoppedEmitterNoise())

_IGNORED_EVENTS = {"opened", "closed_no_write"}


def is_relevant(root: str, path: str) -> bool:
    """False for paths outside `root` and for hidden or temporary names at any depth."""
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return False
    if rel == "." or rel.startswith(".."):
        return False
    return not any(is_ignored_name(part) for part in Path(rel).parts)


class _Forwarder(FileSystemEventHandler):
    """Hands the paths `wanted` takes to `on_path` on the loop; on the models folder's own watch
    (`root`, `gone`), its own deletion sets `gone` and pokes a scan."""

    def __init__(self, wanted: Callable[[str], bool], loop: asyncio.AbstractEventLoop,
                 on_path: Callable[[str, bool], None], root: str = "", gone: threading.Event | None = None):
        self._wanted, self._loop, self._on_path = wanted, loop, on_path
        self._root, self._gone = root, gone

    def on_any_event(self, event) -> None:  # watchdog's thread
        if event.event_type in _IGNORED_EVENTS:
            return
        if self._gone is not None and event.event_type == "deleted" and os.fsdecode(event.src_path) == self._root:
            self._gone.set()  # the models folder itself (another made in its place may have its inode number)
            return self._post(self._root, False)
        for path, moved in _event_paths(event):
            if self._wanted(path):
                self._post(path, moved)

    def _post(self, path: str, moved: bool) -> None:
        _post(self._loop, self._on_path, path, moved)


def _event_paths(event) -> list[tuple[str, bool]]:
    """(path, whether it is a rename's destination) of each path an event names."""
    found = [(os.fsdecode(event.src_path), False)]
    if event.event_type == "moved":
        found.append((os.fsdecode(event.dest_path), True))
    return found


def _post(loop: asyncio.AbstractEventLoop, on_path: Callable[[str, bool], None], path: str, moved: bool) -> None:
    """Hand `path` to `on_path` on the loop, from watchdog's thread."""
    try:
        loop.call_soon_threadsafe(on_path, path, moved)
    except RuntimeError:  # loop closed during shutdown
        pass


# what the watches around the models folder hear: a name made, deleted or renamed (a storm of
# writes in the folder above cost the server seconds of CPU when every event reached Python)
AROUND_EVENTS = [FileCreatedEvent, FileDeletedEvent, FileMovedEvent, DirCreatedEvent, DirDeletedEvent, DirMovedEvent]


class _Around(FileSystemEventHandler):
    """The folders around the models folder: a link on the way swapped, the models folder made,
    moved or deleted (`root_moved` set: follow() watches it again), or one of these folders
    itself deleted (`stale` set too: the watches around are made again), each poking a scan."""

    def __init__(self, links: set[str], root: str, folders: set[str], loop: asyncio.AbstractEventLoop,
                 on_path: Callable[[str, bool], None], root_moved: threading.Event, stale: threading.Event):
        self._links, self._root, self._folders = links, root, folders
        self._loop, self._on_path = loop, on_path
        self._root_moved, self._stale = root_moved, stale

    def on_any_event(self, event) -> None:  # watchdog's thread
        for path, _ in _event_paths(event):
            if path in self._folders:  # (its own deletion: one made again may have its inode number)
                self._stale.set()
                self._root_moved.set()
            elif path == self._root:
                self._root_moved.set()
            elif path not in self._links:
                continue
            _post(self._loop, self._on_path, path, False)  # (a poke only: it completes no file)


def links_on_the_way(path: str, limit: int = 40) -> list[str]:
    """The links `path` passes through to where it really leads, its own components and those
    the links point through (`models -> current`, `current -> gen2`), in order; at most `limit`
    (a loop of links ends there)."""
    links: list[str] = []
    done, todo = "/", [part for part in os.path.abspath(path).split("/") if part]
    while todo and len(links) < limit:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, part)
        if not os.path.islink(here):
            done = here
            continue
        links.append(here)
        try:
            target = os.readlink(here)
        except OSError:
            break
        if target.startswith("/"):
            done = "/"
        todo[:0] = [p for p in target.split("/") if p]
    return links


def _identity(folder: str) -> tuple[int, int] | None:
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class RepositoryWatcher:
    """Owns the Observer thread. start() and close() are called on the loop, follow() in a
    worker thread (a new watch walks the folder tree); close() joins the thread (brief) and
    is idempotent.

    The folder is watched where it really is. A models path reached through links swapped for
    others (git-sync, a release switch: `models -> gen2`, or `app/current/models`) is followed:
    the folder holding each link on the way is watched for that link (its swap is an event), and
    follow(), which the repository calls before each scan, moves the watches to where the path
    leads now."""

    def __init__(self, root: str | os.PathLike, loop: asyncio.AbstractEventLoop,
                 on_path: Callable[[str, bool], None]):
        self._given = os.path.abspath(root)
        self._loop, self._on_path = loop, on_path
        self._lock = threading.Lock()  # follow() against close()
        self._observer = Observer()
        self._observer.daemon = True
        self.root = os.path.realpath(root)
        self._identity = _identity(self.root)  # which folder the watch is on: one put in its place is another
        # the models folder itself made, moved or deleted (seen from the folder above, or its
        # deletion from its own watch): another folder may be at its place with the same inode
        # number (ext4 reuses a freed one)
        self._root_moved = threading.Event()
        self._watch = self._observer.schedule(self._root_forwarder(self.root), self.root, recursive=True)
        self._around_stale = threading.Event()  # a folder around it deleted: its watch is gone
        self._around: tuple = ()  # what the watches around the models folder were made for
        self._around_watches: list = []
        self._unwatchable: set[str] = set()  # said once each
        self._watch_around()
        self._started = False
        self._closed = False

    def _root_forwarder(self, root: str) -> _Forwarder:
        """The handler of the models folder's own watch, on `root` (where the path leads)."""
        return _Forwarder(lambda path: is_relevant(root, path), self._loop, self._on_path, root, self._root_moved)

    def _watch_around(self) -> None:
        """Watch the folder of each link on the way for that link, and the folder above the
        models folder for the models folder itself (a swap, or a folder made in its place after
        `mv` or `rm -r`, pokes a scan only: it completes no file). Made again when one of those
        folders is another (its own folder replaced: the watch stayed on the old one)."""
        links = links_on_the_way(self._given)
        folders = sorted({os.path.dirname(path) for path in links + [self.root]})
        around = (links, self.root, [_identity(folder) for folder in folders])
        if around == self._around and not self._around_stale.is_set():
            return
        self._around_stale.clear()
        for watch in self._around_watches:
            self._unschedule(watch)
        self._around, self._around_watches = around, []
        handler = _Around(set(links), self.root, set(folders), self._loop, self._on_path, self._root_moved,
                          self._around_stale)
        for folder in folders:
            try:
                if os.path.isdir(folder) and not os.access(folder, os.R_OK):  # (watchdog drops this EACCES unsaid)
                    raise PermissionError(f"{folder} cannot be listed")
                self._around_watches.append(self._observer.schedule(handler, folder, recursive=False,
                                                                    event_filter=AROUND_EVENTS))
            except OSError as e:  # the safety rescan still runs (and tries again: stale)
                self._around_stale.set()
                (log.warning if folder not in self._unwatchable else log.debug)(
                    "models folder: cannot watch %s for the models folder or a link in it (%s); a folder put "
                    "in the models folder's place is seen by the rescan every 10 s", folder, e)
                self._unwatchable.add(folder)

    def start(self) -> None:
        self._observer.start()
        self._started = True

    def follow(self) -> None:
        """Watch where the models path leads now, if a link on the way was swapped or another
        folder was put at its place (the watch stayed on the old one, or on none: every change
        then waited for the safety rescan)."""
        with self._lock:
            if self._closed:
                return
            real = os.path.realpath(self._given)
            identity = _identity(real)
            moved = self._root_moved.is_set()
            if (real != self.root or identity != self._identity or moved) and os.path.isdir(real):
                self._root_moved.clear()
                replaced = real == self.root
                if replaced:  # (watchdog keeps one watch per path: scheduled again, it would be the old one)
                    self._unschedule(self._watch)
                try:
                    watch = self._observer.schedule(self._root_forwarder(real), real, recursive=True)
                except OSError as e:  # (gone again, or no watch left): the safety rescan still runs
                    log.warning("models folder: cannot watch %s, where %s now leads (%s)", real, self._given, e)
                else:
                    old, self._watch, self.root, self._identity = self._watch, watch, real, identity
                    if replaced:
                        log.info("models folder: %s is another folder now; watching it", real)
                    else:
                        self._unschedule(old)
                        log.info("models folder: %s now leads to %s; watching it", self._given, real)
            self._watch_around()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._started:
            try:
                self._observer.stop()
            except KeyError:  # (see _unschedule): the shutdown goes on, the threads end below
                log.debug("models folder: watchdog lost track of a watch while stopping", exc_info=True)
            self._observer.join(timeout=5)

    def _unschedule(self, watch) -> None:
        """watchdog's inotify raises KeyError removing a watch whose folders were moved out and
        back or deleted (its own table of subfolder watches is stale): that failed following a
        swapped link (the old folder kept serving) and, at close, ended serve with exit 1 and a
        traceback before the models were drained (a helper's fuzz of the models folder)."""
        try:
            self._observer.unschedule(watch)
        except (KeyError, OSError):
            log.debug("models folder: watchdog lost track of a watch while removing it", exc_info=True)


class Debouncer:
    """Owns at most one running task of `action`; all methods are called on the loop.

    poke(): an event happened (run `delay` after the last poke, at most `max_wait` after the
    first unanswered one). wake_after(s): make sure a run happens within `s` seconds (used to
    re-check files still settling). close() cancels the timer and waits for a running action."""

    def __init__(self, delay: float, action: Callable[[], Awaitable[None]], max_wait: float | None = None):
        self.delay = delay
        self.max_wait = max(max_wait if max_wait is not None else 10 * delay, delay)
        self._action = action
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._first_poke: float | None = None
        self._task: asyncio.Task | None = None
        self._again = False
        self._closed = False

    def poke(self) -> None:
        now = self._loop.time()
        if self._first_poke is None:
            self._first_poke = now
        self._arm(min(now + self.delay, self._first_poke + self.max_wait), force=True)

    def wake_after(self, seconds: float) -> None:
        self._arm(self._loop.time() + seconds, force=False)

    def _arm(self, when: float, force: bool) -> None:
        if self._closed:
            return
        if self._timer is not None:
            if not force and self._due <= when:
                return
            self._timer.cancel()
        self._due = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._first_poke = None
        if self._task is not None:
            self._again = True
            return
        self._task = self._loop.create_task(self._run(), name="aclserve-repository-reconcile")

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                try:
                    await self._action()
                except Exception:
                    log.exception("repository reconcile failed")
                if not self._again or self._closed:
                    break
        finally:
            self._task = None

    async def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            await asyncio.shield(self._task)
