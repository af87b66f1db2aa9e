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
import warnings
from pathlib import Path
from typing import Awaitable, Callable

from watchdog.events import FileSystemEventHandler
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
    """Hands the paths `wanted` takes to `on_path` on the loop."""

    def __init__(self, wanted: Callable[[str], bool], loop: asyncio.AbstractEventLoop,
                 on_path: Callable[[str, bool], None]):
        self._wanted, self._loop, self._on_path = wanted, loop, on_path

    def on_any_event(self, event) -> None:  # watchdog's thread
        if event.event_type in _IGNORED_EVENTS:
            return
        found = [(os.fsdecode(event.src_path), False)]
        if event.event_type == "moved":
            found.append((os.fsdecode(event.dest_path), True))
        for path, moved in found:
            if self._wanted(path):
                try:
                    self._loop.call_soon_threadsafe(self._on_path, path, moved)
                except RuntimeError:  # loop closed during shutdown
                    return


class RepositoryWatcher:
    """Owns the Observer thread. start(), follow() and close() are called on the loop; close()
    joins the thread (brief) and is idempotent.

    The folder is watched where it really is. A models path that is a link swapped for another
    (git-sync, a release switch: `models -> gen2`) is followed: the folder holding the link is
    watched for the link itself (its swap is an event), and follow(), which the repository calls
    after each scan, moves the watch to the folder the path now leads to. Before, the old target
    stayed watched for the life of the process, and only the safety rescan saw any change."""

    def __init__(self, root: str | os.PathLike, loop: asyncio.AbstractEventLoop,
                 on_path: Callable[[str, bool], None]):
        self._given = os.path.abspath(root)
        self.root = os.path.realpath(root)
        self._observer = Observer()
        self._observer.daemon = True
        self._forwarder = _Forwarder(lambda path: is_relevant(self.root, path), loop, on_path)
        self._watch = self._observer.schedule(self._forwarder, self.root, recursive=True)
        if os.path.islink(self._given):
            link = self._given
            self._observer.schedule(_Forwarder(lambda path: path == link, loop, on_path),
                                    os.path.dirname(link), recursive=False)
        self._started = False
        self._closed = False

    def start(self) -> None:
        self._observer.start()
        self._started = True

    def follow(self) -> None:
        """Watch the folder the models path leads to now, if a link on the way was swapped."""
        real = os.path.realpath(self._given)
        if real == self.root or self._closed or not os.path.isdir(real):
            return
        try:
            watch = self._observer.schedule(self._forwarder, real, recursive=True)
        except OSError as e:  # (gone again, or no watch left): the safety rescan still runs
            log.warning("models folder: cannot watch %s, where %s now leads (%s)", real, self._given, e)
            return
        old, self._watch, self.root = self._watch, watch, real
        try:
            self._observer.unschedule(old)
        except KeyError:  # its folder was removed: watchdog dropped the watch already
            pass
        log.info("models folder: %s now leads to %s; watching it", self._given, real)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._observer.stop()
            self._observer.join(timeout=5)


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
