"""The compiles of the loads running now, one CompileStop each, by model: what ends a compile
before it is done (its child process killed, its work folder and lock gone from the cache), a
load's wait for another's compile of the same file (the cache entry's lock) or for its turn
(load_concurrency, any file's load: load_turn.py), and why it was ended.

An unload through the API ends a model's compiles, the close ends all of them, and in poll mode
each scan ends those whose file is gone or was replaced (lifecycle.stop_stale_compiles): their
result would be thrown away when the load ends, after a compile of minutes (or a wait for another
process's, up to its compile_timeout_s). So does a load that finds its file gone or replaced before
a scan says so, once its compile has ended (`ended`: it would warm up for nothing). Owned by the
Lifecycle; loop thread only (a CompileStop itself may be stopped from any thread).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..om.compile_process import CompileStop
from .compiler import PlaceWaitStopped
from .entry_locks import EntryWaitStopped
from .layout import VersionFile
from .load_turn import TurnWaitStopped


@dataclass(eq=False)  # (compared by identity: track() takes its own out with list.remove)
class RunningCompile:
    """The compile of one version's load (or its wait for another's compile of the same file)."""

    version: str
    file: VersionFile  # what it compiles
    stop: CompileStop = field(default_factory=CompileStop)
    why: str = ""  # why it was ended, for the log: the first stop's cause
    went: Callable[[], str] = lambda: ""  # why its file is stale now, when it is (RunningCompiles' `went`)

    def end(self, why: str) -> None:
        if not self.stop.stopped:
            self.why = why
        self.stop.stop()

    def ended(self) -> bool:
        """Whether it was ended, or is now as its file went or was replaced (`went`)."""
        if not self.stop.stopped and (why := self.went()):
            self.end(why)
        return self.stop.stopped


def stopped_step(stop: CompileStop, error: BaseException | None = None) -> tuple[str, str]:
    """What the stop of a load (or, poll mode, a failure on its file gone) ended, as its log line says
    it: ("compile", "") while its compile ran, else ("load", the wait it was in or ""). Nothing was
    compiled for it before (its turn's wait, the hash, the wait for another compile of the same file or
    for a compile's place: compiler.PlaceWaitStopped) or after (the OM's check and open); that was said
    "the compile of version N was stopped" too."""
    if stop.compiling:
        return "compile", ""
    if isinstance(error, TurnWaitStopped):
        return "load", " while it waited for its turn"
    if isinstance(error, EntryWaitStopped):
        return "load", " while it waited for another compile of the same file"
    if isinstance(error, PlaceWaitStopped):
        return "load", " while it waited for another compile to end"
    return "load", ""


class RunningCompiles:
    def __init__(self, went: Callable[[str, str, VersionFile], str] = lambda name, version, file: ""):
        self._by_model: dict[str, list[RunningCompile]] = {}
        self._went = went  # why the file (name, version, file) loads from is stale now, else ""

    @contextlib.contextmanager
    def track(self, name: str, version: str, file: VersionFile) -> Iterator[RunningCompile]:
        """A load of `version` of `name` from `file` for the block: its compile, to stop."""
        running = RunningCompile(version, file, went=functools.partial(self._went, name, version, file))
        self._by_model.setdefault(name, []).append(running)
        try:
            yield running
        finally:
            self._by_model[name].remove(running)
            if not self._by_model[name]:
                del self._by_model[name]

    def stop(self, name: str, why: str) -> None:
        for running in self._by_model.get(name, ()):
            running.end(why)

    def stop_all(self, why: str) -> None:
        for name in list(self._by_model):
            self.stop(name, why)

    def stop_stale(self, stale: Callable[[str, str, VersionFile], str]) -> None:
        """End each compile for which `stale(name, version, file)` says why (not "")."""
        for name, compiles in self._by_model.items():
            for running in compiles:
                if not running.stop.stopped and (why := stale(name, running.version, running.file)):
                    running.end(why)
