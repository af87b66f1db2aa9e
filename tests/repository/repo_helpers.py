"""Helpers for the repository tests: placing files, folders that cannot be listed, event gates, request rows."""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading

import aiohttp
import numpy as np

from aclserve.acl.cpu import faults
from aclserve.config import load_server_config
from tests.serving import started_app


def place(source: str, target, how: str = "rename") -> None:
    """Put `source` at `target`: by rename (copy to a hidden .part, then os.replace) or copy."""
    target = os.fspath(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if how == "rename":
        tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.part")
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    else:
        shutil.copyfile(source, target)


def write_in(target, content: str | bytes) -> None:
    """Write `content` to `target` as a careful writer does: into a hidden .part beside it, then
    renamed into place (complete at once for the settle gate)."""
    target = os.fspath(target)
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.part")
    with open(tmp, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    os.replace(tmp, target)


def touch(path, data=b"om"):
    """Write `data` at `path`, its folders made: a model file as the scan sees it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def unlistable(monkeypatch, folder) -> None:
    """Listing `folder` fails as it does for a user without read permission on it (the tests
    run as root, who reads everything)."""
    folder, listdir = folder.resolve(), type(folder).iterdir

    def iterdir(self):
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return listdir(self)
    monkeypatch.setattr(type(folder), "iterdir", iterdir)


class Events:
    """Collects repository listener events; wait() gates on one arriving (no timing asserted)."""

    def __init__(self):
        self.seen: list[tuple] = []
        self._changed = asyncio.Event()

    def __call__(self, event, name, version, **info):
        self.seen.append((event, name, version, info))
        self._changed.set()

    async def wait(self, event: str, name: str, version: str | None = None, count: int = 1,
                   limit_s: float = 120.0) -> tuple:
        async def until():
            while True:
                hits = [e for e in self.seen if e[0] == event and e[1] == name
                        and (version is None or e[2] == version)]
                if len(hits) >= count:
                    return hits[count - 1]
                self._changed.clear()
                await self._changed.wait()
        return await asyncio.wait_for(until(), limit_s)  # a hang guard, not a timing check

    async def until(self, predicate, limit_s: float = 120.0) -> None:
        """Wait until predicate() holds, re-checking after every event."""
        async def loop():
            while not predicate():
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(loop(), limit_s)  # a hang guard, not a timing check

    async def next(self) -> None:
        """Until the next event."""
        self._changed.clear()
        await self._changed.wait()

    def count(self, event: str, name: str) -> int:
        return sum(1 for e in self.seen if e[0] == event and e[1] == name)


def settling_judge(repo):
    """Lenient readiness (readiness.py) over `repo`'s parts, whatever readiness `repo` was given:
    after note(), its `reached` says whether every model the repository should serve has settled:
    READY, or its load failed (its file refused, or failed again at its first retry) and no task
    works on it, none waits for its files or its config. (Under strict readiness a failed model is
    never ready; and lenient readiness is not reached while one is still to settle.)"""
    from aclserve.repository.readiness import Readiness
    judge = Readiness(False, repo._lifecycle, repo._planner, repo._failures, repo._calls)
    judge._said_none_serves = True  # (that no model serves is the repository's own readiness's to log)
    return judge


async def until_settled(repo, events: Events, limit_s: float = 120.0) -> None:
    """Until every model the start found has settled (settling_judge) with no model's task at
    work. Looked at once the tasks at work have ended (a task's last event comes before its end,
    where a failed model's settling shows: the wait heard no more events and ran to its guard)
    and after every event while none works (a file done settling starts its load in a task)."""
    judge = settling_judge(repo)

    async def loop():
        while True:
            await asyncio.shield(repo.wait_idle())  # (shielded: the guard would cancel the tasks)
            judge.note()
            if judge.reached:
                return
            await events.next()
    await asyncio.wait_for(loop(), limit_s)  # a hang guard, not a timing check


async def started_on_old_files(models_dir, mode: str = "none"):
    """The real app over `models_dir` on a free port and the CPU runtime, its files made old first
    (taken at once at start, without the settle wait): started_app's (runner, state, url, runtime,
    repository)."""
    for path in models_dir.rglob("*"):
        os.utime(path, (1, 1))
    config = load_server_config(None, {"models_dir": str(models_dir), "port": 0, "device": "cpu",
                                       "model_control_mode": mode, "log_level": "warning"})
    return await started_app(config)


async def http_index(base: str) -> dict:
    """The repository index as a client reads it over HTTP: (name, version) -> (state, reason)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/v2/repository/index", json={}) as resp:
            return {(r["name"], r.get("version", "")): (r["state"], r.get("reason", "")) for r in await resp.json()}


def x_rows(rows: int = 1, value: float = 1.0) -> dict:
    return {"x": np.full((rows, 4), value, np.float32)}


async def answer(repo, name: str, version: str | None = None, rows: int = 1) -> float:
    """The first output value of model `name`'s answer to `rows` rows of ones: its scale."""
    result = await repo.get(name, version).infer(x_rows(rows), rows)
    return float(result.outputs["y"][0, 0])


def serving(repo) -> list[str]:
    """Names of the models with a version READY, as the repository index shows them."""
    return sorted({row["name"] for row in repo.index(ready_only=True)})


async def until(check, what: str) -> None:
    """Wait until `check()` holds (a hang guard, not a timing)."""
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never {what}")


@contextlib.contextmanager
def held_run(kind: str = "execute", nth: int = 1, **also):
    """A fault holding the `nth` `kind` device call from now on (a warm-up's run, a request's)
    until the block ends, or a 30 s watchdog lets it go (a hang guard); `also`: what else it
    does then (code=...: the call fails with it). Yields the fault (its `entered` is set once
    the call waits)."""
    gate = threading.Event()
    fault = faults.inject(kind, nth=nth, hold=gate, **also)
    watchdog = threading.Timer(30, gate.set)
    watchdog.start()
    try:
        yield fault
    finally:
        gate.set()
        watchdog.cancel()


def hold_folder_reads(repo) -> tuple[asyncio.Event, asyncio.Event]:
    """Make `repo`'s reads of the models folder (a load call's first step) wait: (reading, set
    once one waits; go_on, which lets them go when set)."""
    reading, go_on = asyncio.Event(), asyncio.Event()
    rescan = repo._planner.rescan

    async def held_rescan():
        reading.set()
        await go_on.wait()
        return await rescan()
    repo._planner.rescan = held_rescan
    return reading, go_on


@contextlib.contextmanager
def folder_reads_held(repo):
    """hold_folder_reads for a block: yields `reading`; the reads are let go as the block ends,
    however it ends (a failed check leaves no call waiting on them)."""
    reading, go_on = hold_folder_reads(repo)
    try:
        yield reading
    finally:
        go_on.set()


def count_folder_reads(repo) -> list[int]:
    """Count `repo`'s reads of the models folder: [reads so far], kept up to date."""
    scans = [0]
    rescan = repo._planner.rescan

    async def counted():
        scans[0] += 1
        return await rescan()
    repo._planner.rescan = counted
    return scans
