"""ModelRepository: the models folder turned into served versions, kept in step with the disk.

Hot reload in three parts: the watcher only forwards paths (watcher.py); a scan and a pure
diff decide what changed (planner.py); per model, the Lifecycle loads the new versions beside
the serving ones, swaps them in and retires the replaced ones (lifecycle.py, which also says
which task owns which state). This class wires them together and holds the control API. It
lives on one asyncio loop; blocking work runs in threads.

Control modes: poll watches the folder (and rescans every RESCAN_S seconds as a safety net);
explicit loads everything at start, then changes only through load()/unload(); none loads
everything at start and refuses load()/unload(). In poll mode, unload(name) keeps the model
unloaded (the watcher leaves it alone) until load(name). load(name) rescans and loads what
changed for that model (an unchanged, loaded model is not reloaded), taking files as they are
(no settle wait: the caller vouches); it first waits for a task already working on the model
and tries again a file that task refused, so its answer names that file's error. Calls on one
model take effect in the order they come; what that means for their answers: control_calls.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Callable

from ..config import ServerConfig
from ..errors import InvalidInput, ModelUnavailable, NotFound, ServeError, ShuttingDown
from ..quoting import listed_names
from . import names
from .asked_version import asked_version
from .control_calls import ControlCalls, check_control_mode, shut_down_before
from .events import Listeners
from .failures import LoadFailures
from .index import IndexReads, index_rows
from .lifecycle import UNLOAD_ASKED, Lifecycle
from .models_folder import check_models_folder
from .not_served import WhyNotServed
from .plan import ModelPlan
from .problem_loads import ProblemLoads
from .planner import Planner
from .readiness import Readiness
from .retiring import Draining
from .served import ServedVersion
from .settle import SettleGate
from .watcher import Debouncer, RepositoryWatcher

log = logging.getLogger(__name__)

RESCAN_S = 10.0  # poll mode: rescan at least this often even without file events
UNREADABLE_RESCAN_S = 1.0  # ... and this often while the folder cannot be listed (a chmod back sends no event)


class ModelLoadFailed(ServeError):
    """A load asked through the API failed; the message gives each version's reason."""

    status = 400


class StillHeld(ModelLoadFailed):
    """A load call refused: the model's last load left instances the device still holds."""


class ModelRepository:
    def __init__(self, config: ServerConfig, runtime, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self.config = config
        # absolute however it was given: the messages quoting it (a load of no model, the index's row of a folder
        # gone) then read `<models>` to a client (server/redact.py), where a relative `models` was shown as it is;
        # joined, not abspath's: `link/..` is the folder above the link's target, as the OS reads it
        self.root = Path(os.getcwd(), config.models_dir)
        self.mode = config.model_control_mode
        self._planner = Planner(self.root, config.model_defaults, SettleGate(config.settle_s, clock, wall_clock),
                                unload_missing=config.unload_on_delete, wall_clock=wall_clock)
        self._failures = LoadFailures(config.load_retry_initial_s, config.load_retry_max_s, self._retry_due)
        self._listeners = Listeners()
        self._problem_loads = ProblemLoads(self._listeners.emit)  # (a model's files that cannot serve: a failed load)
        self._lifecycle = Lifecycle(config, runtime, self._planner, self._failures, self._listeners.emit,
                                    self._rescan_soon, lambda: self._readiness.note())
        self._scan_lock = asyncio.Lock()  # one reconcile at a time: each sees what the last one started
        self._scans_started = 0  # ... numbered, so that a load may use a scan begun after it was asked
        self._last_scan = 0  # the number of the last scan done
        self._retry_tasks: set[asyncio.Task] = set()  # explicit and none modes: rescans for a retry
        self._index_reads = IndexReads(clock, lambda after: self._reconcile("all", only="", asked_after=after),
                                       lambda: self._last_scan)
        self._watcher: RepositoryWatcher | None = None
        self._debouncer: Debouncer | None = None
        self._started = self._closed = False
        self._calls = ControlCalls(self._lifecycle.knows, self._lifecycle.held)  # (its `asked`: readiness's)
        self._readiness = Readiness(config.readiness == "strict", self._lifecycle, self._planner, self._failures,
                                    self._calls)
        self._not_served = WhyNotServed(self.mode, self._lifecycle, self._planner, self._failures, self._calls)

    # ---- start and stop -------------------------------------------------------------------------
    async def start(self, only: str | None = None) -> None:
        """Scan and load per the control mode; in poll mode start watching first (no event missed).
        `only` (explicit mode): load that model alone, the folder's others unloaded until a load call
        names one (`aclserve profile` loaded and warmed up every model of its folder to profile one)."""
        if only is not None and self.mode != "explicit":
            raise ValueError("start(only=...) is for explicit mode")
        if self._started:
            return
        self._started = True
        check_models_folder(Path(self.config.models_dir))  # (the operator's words, as serve's check says them)
        await self._lifecycle.sweep_cache()
        if self.mode == "poll":
            self._debouncer = Debouncer(self.config.debounce_s, self._reconcile_all,
                                        max_wait=max(10 * self.config.debounce_s, self.config.settle_s))
            self._watcher = RepositoryWatcher(self.root, asyncio.get_running_loop(), self._on_path)
            self._watcher.start()
        tasks = await self._reconcile(trust="age" if self.mode == "poll" else "all", only=only)
        if self.mode != "poll":  # (a load call, a retry's or the index reads the folder: what it finds is not asked)
            self._calls.asked = {only} if only is not None else (self._planner.wanted_models()
                                                                 | set(self._planner.scan.problems))
        await asyncio.gather(*tasks)
        if only is None and not self._lifecycle.serving and not tasks:
            if self._planner.next_check() is not None:  # files too fresh to trust yet
                log.info("the models folder %s holds files still being written; each loads once it "
                         "has not changed for settle_s (%g s)", self.root, self.config.settle_s)
            elif self._planner.scan.problems and not self._planner.scan.unreadable:  # (it said "holds no model")
                refused = sorted(self._planner.scan.problems)
                log.warning("the models folder %s holds %d model(s) it cannot serve as they are (%s: each one's "
                            "reason is logged above and in the repository index); the server is up but has "
                            "nothing to serve", self.root, len(refused), listed_names(refused, 5))
            elif not self._planner.scan.unreadable:  # (one that cannot be listed is logged as a problem)
                log.warning("the models folder %s holds no model (<name>.om, <name>.onnx or <name>/<version>/"
                            "model.om); the server is up but has nothing to serve", self.root)

    async def close(self, deadline: float | None = None) -> None:
        """Stop watching and retrying, drain every version until `deadline` (time.monotonic();
        default shutdown_timeout_s from now), answer what is left 503, close every pool (a device
        still running then is left to itself: runtime/teardown.py). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._failures.close()
        if self._watcher is not None:
            self._watcher.close()
        await self._lifecycle.close(deadline)
        if self._debouncer is not None:
            await self._debouncer.close()
        for task in self._retry_tasks:
            task.cancel()
        await asyncio.gather(*self._retry_tasks, self._index_reads.close(), return_exceptions=True)

    def stop_load_calls(self) -> None:
        """The server is shutting down (its drain begins, the close comes after it): a load call
        ending from now on is answered 503, as the close unloads what it loaded (control_calls.py)."""
        self._calls.shutting_down = True

    def hurry(self, deadline: float) -> None:
        """The close running now waits for the device and abandoned loads no later than `deadline`."""
        self._lifecycle.hurry(deadline)

    async def wait_idle(self) -> None:
        """Until no model is being loaded, swapped or drained (a later file event may start more)."""
        await self._lifecycle.tasks.wait_idle()

    # ---- lookups (server) -----------------------------------------------------------------------
    def get(self, name: str, version: str | None = None) -> ServedVersion:
        """The serving version (newest when `version` is None). Raises NotFound, ModelUnavailable
        (known but not ready), ShuttingDown after close(), InvalidInput (a version that is none)."""
        if self._closed:
            raise ShuttingDown("the model repository is shut down")
        if by_length := names.too_long(name):  # no model's (names.check_model_name)
            raise NotFound(f"unknown model: {by_length}")
        versions = self._lifecycle.serving.get(name)
        version = asked_version(version)
        if versions:
            if version is None:
                return versions[max(versions, key=int)]
            served = versions.get(version)
            if served is not None:
                return served
        raise self._not_served.error(name, version, versions)

    def models_served(self) -> int:
        """How many models have a version in service (the request memory budget's shares: server/budget.py)."""
        return len(self._lifecycle.serving)

    def serving_versions(self, name: str) -> list[str]:
        """The versions of `name` in service, one no instance can run now included (per-model statistics)."""
        return list(self._lifecycle.serving.get(name, ()))

    def all_ready(self) -> bool:
        """Every model that should be served is (readiness.py says which, strict or lenient)."""
        return self._started and not self._closed and self._readiness.ready()

    def not_serving(self) -> tuple[str, bool]:
        """What holds readiness back, for the log, and whether it stays so until something happens (readiness.py)."""
        return self._readiness.not_serving()

    def load_failures(self) -> dict[tuple[str, str], str]:
        """(name, version) -> why its current file failed to load, the same text for the same failure."""
        return self._failures.versions()

    @property
    def load_retries(self) -> dict[str, int]:
        return self._failures.retries  # model -> automatic load retries started (transient device errors)

    def index(self, ready_only: bool = False) -> list[dict]:  # as the folder was last read (/metrics')
        return index_rows(self._lifecycle, self._planner, self._calls, self._failures, ready_only)

    async def index_now(self, ready_only: bool = False) -> list[dict]:
        """index() of the folder as it is now (the repository API's): in explicit and none modes
        read first as a load call reads it, loading nothing (index.IndexReads: paced, shared)."""
        if self.mode != "poll" and self._started and not ready_only:  # (READY rows are records alone)
            await self._index_reads.read(self._scans_started)
        return self.index(ready_only)

    def add_listener(self, callback: Callable) -> None:
        """callback(event, name, version, **info) on each event events.py names."""
        self._listeners.add(callback)

    def draining(self) -> Draining:
        """The versions out of service not closed yet, read-only (retiring.py: a reload's
        replaced ones by (name, version), the ones unloading): the Lifecycle's own record."""
        return self._lifecycle.retiring.view

    # ---- control API ----------------------------------------------------------------------------
    async def load(self, name: str) -> None:
        self._check_control("load")
        if by_length := names.too_long(name):
            raise InvalidInput(f"invalid model name: {by_length}")
        if names.check_model_name(name):
            raise InvalidInput(f"invalid model name {name!r}: {names.check_model_name(name)}")
        log.info("%s: load asked through the repository API", name)  # (the log says who did what)
        held = name in self._lifecycle.held
        self._lifecycle.held.discard(name)
        with self._calls.load(name) as overtaken:
            try:
                await self._load(name, overtaken)
            except StillHeld:
                if held:  # (poll mode: the watcher would load it, its failure forgotten by the unload)
                    self._lifecycle.held.add(name)
                raise

    async def _load(self, name: str, overtaken: Callable[[], bool]) -> None:
        while True:  # an unload may start its task while this load scans: wait for it, then plan again
            if await self._lifecycle.tasks.wait_for(name):  # (the start's load of it, which the shutdown stopped)
                raise shut_down_before(name, "loaded")
            tasks = await self._reconcile(trust="all", only=name, again=True)
            if tasks or not self._lifecycle.tasks.busy(name):
                break
        if tasks:  # the repository's: a caller gone (cancelled) must not abandon them, and one the shutdown
            await asyncio.wait(tasks)  # cancelled is no CancelledError of the caller's (gather raised it)
        if self._closed or any(task.cancelled() for task in tasks):
            raise shut_down_before(name, "loaded")  # not the model's failure, and no 4xx
        results = [task.result() for task in tasks]
        if self._planner.scan.unreadable:  # it tells nothing of the model: not a 404
            raise ModelUnavailable(f"cannot load {name}: {next(iter(self._planner.scan.problems.values()))}")
        if name not in self._planner.scan.models:
            problem = self._planner.scan.problems.get(name)
            if problem:  # its files are there but cannot be served as they are (a bad config, say)
                self._problem_loads.refused(name, problem)
                raise ModelLoadFailed(f"failed to load {name}: {problem}")
            self._calls.no_such_model(name)
            # (a failed load, 400 / INVALID_ARGUMENT as Triton answers it, and the protocol's load: a 404 read as a
            # model unknown to a loaded server, a Triton client's check of a failed load missed it, a tester)
            raise ModelLoadFailed(f"failed to load {name}: no model {name!r} in {self.root}")
        failed_versions = [v for result in results for v in result]
        failed = [f"version {v}: {r}" for result in results for v, r in result.items()]
        if overtaken() and not failed:  # (a load that came after the unload answers for itself)
            raise ModelLoadFailed(f"failed to load {name}: an unload request for it arrived during this load")
        if name not in self._lifecycle.serving or failed:
            message = f"failed to load {name}: " + ("; ".join(failed) or "no version loaded")
            if self._failures.first_failure(name, failed_versions):  # tried again by itself: 503, try later
                error = ModelUnavailable(message)
                error.retry_after_s = self._failures.retry_due_in(name, failed_versions)  # (None: 1 s)
                raise error
            raise ModelLoadFailed(message)

    async def unload(self, name: str) -> None:
        self._check_control("unload")
        if by_length := names.too_long(name):  # no model's, loaded or loading
            raise NotFound(f"unknown model: {by_length}")
        if not self._lifecycle.knows(name) and not self._calls.loading(name):  # (a load running may find
            raise NotFound(f"unknown model {name!r}")  # it: this unload overtakes it)
        log.info("%s: unload asked through the repository API", name)
        self._calls.unload(name)
        self._lifecycle.held.add(name)
        self._lifecycle.stop_compiles(name)  # (a compile of minutes is not waited for)
        if await self._lifecycle.tasks.wait_for(name) or self._closed:
            raise shut_down_before(name, "unloaded")
        # a version whose load failed is unloaded too: its failure (index, /metrics) and retries go
        self._failures.forget_model(name, cancel_retries=True)
        self._lifecycle.states.failures_unloaded(name)
        if name in self._lifecycle.acted:
            plan = ModelPlan(name, unload=list(self._lifecycle.acted[name]), unload_cause=UNLOAD_ASKED)
            task = self._lifecycle.start(plan)  # (not None: the repository is open, the model idle)
            await asyncio.shield(task)  # (the repository's, as a load's: not stopped by a caller gone)

    def _check_control(self, what: str) -> None:
        check_control_mode(self.mode, what)
        if self._closed or not self._started:
            raise ModelUnavailable("the model repository is not running")

    # ---- reconcile ------------------------------------------------------------------------------
    def _on_path(self, path: str, moved: bool) -> None:  # from the watcher, on the loop
        self._planner.note_event(path, moved)
        if self._debouncer is not None:
            self._debouncer.poke()

    async def _reconcile_all(self) -> None:
        # the model tasks run on their own (a task's end rescans when changes were left over):
        # waiting for them here held every other file change of the folder back while one model
        # loaded, compiled or drained, and loaded the models dropped one after another one at a
        # time whatever load_concurrency said
        await self._reconcile(trust="settle")

    async def _reconcile(self, trust: str, only: str | None = None, again: bool = False,
                         asked_after: int | None = None) -> list[asyncio.Task]:
        """Scan, diff against what is serving, start one task per changed model. Returns them. A call for one
        model (`only`: a load; "": an index read, none) uses a scan begun after it was made (after scan
        `asked_after` if given) if one is done by the time it has the lock (each load rescanned the folder:
        300 loads of a 300-model folder took 44 s, whatever load_concurrency said). `again`: the load API
        asks for another try of that model's refused files; they are forgotten under the lock, just before
        the plan (forgotten earlier, a task ending while this call waited for the lock, another load call's
        say, recorded its failure again, and this call planned nothing and could not say why)."""
        if self._closed:
            return []
        asked_after = self._scans_started if asked_after is None else asked_after
        async with self._scan_lock:
            try:
                if only is None or self._last_scan <= asked_after:
                    await self._scan()
                if again:
                    self._refuse_while_held(only)
                    self._failures.forget_model(only)
                plans = self._planner.plans(self._lifecycle.acted, trust, self._failures.files, self._lifecycle.held)
                self._problem_loads.scanned(self._planner.scan, loads=only is None)  # (the start's, poll mode's)
                plans = [plan for plan in plans if only is None or plan.name == only]
                started = [self._lifecycle.start(plan) for plan in plans]
                self._failures.planned(plans, started, only)  # (a load tried for room none begins: its room back)
                self._lifecycle.stop_stale_compiles()  # (poll mode: a compile of a file gone or replaced ends)
                self._readiness.note()  # (a scan alone may end a wait: a config no longer being written)
            finally:  # (a scan that raised stopped the safety rescan too: hot reload waited for a file event)
                if self._debouncer is not None:
                    wait = self._planner.next_check()
                    # a missed file event (inotify races with new folders) is caught by the next rescan,
                    # sooner while the folder cannot be listed or is missing (made again after `rm -r`)
                    soon = self._planner.scan.unreadable or not os.path.isdir(self.root)
                    every = UNREADABLE_RESCAN_S if soon else RESCAN_S
                    self._debouncer.wake_after(every if wait is None else min(wait + 0.01, every))
            return [task for task in started if task is not None]

    async def _scan(self) -> None:
        """The scan of a reconcile (under its lock)."""
        self._scans_started += 1
        number = self._scans_started
        if self._watcher is not None:  # watch first, then scan: nothing falls in between
            await asyncio.get_running_loop().run_in_executor(None, self._watcher.follow)
        scan = await self._index_reads.timed(self._planner.rescan())  # (its time paces the index's reads)
        if not scan.unreadable:  # (a folder that cannot be listed tells nothing: all is kept)
            self._failures.keep_files_of(scan)
            self._lifecycle.forget_stale()
            if self._planner.files_went:  # (their compiles, an unloaded model's too: the cache stays bounded)
                await self._lifecycle.sweep_cache()
        self._last_scan = number

    def _refuse_while_held(self, name: str) -> None:
        """A load call of a model whose file's failed load left instances abandoned on the device is
        refused (each such call left one more, until other models could not load); a changed file or
        config may be a fix, and loads."""
        entry = self._planner.scan.models.get(name)
        files = {version: file.identity for version, file in entry.available.items()} if entry else {}
        held = self._failures.held_by(name, files)
        if held:
            raise StillHeld(f"failed to load {name}: {held} instance(s) of its last load are still held by "
                                  "the device (abandoned: the device still runs their work); it can be loaded again "
                                  "once the device lets go of them (looked at every second; its retry is armed "
                                  "then), after a change of its file or config, or after a restart")

    def _rescan_soon(self) -> None:
        """A model's task ended with changes left over (a plan arrived while it was busy, or a
        file was refused): reconcile again at once (poll mode)."""
        if self._debouncer is not None and not self._closed:
            self._debouncer.wake_after(0)

    def _retry_due(self, name: str, version: str) -> None:
        """A transient failure's delay has passed (the file may be loaded again): rescan."""
        if self._closed:
            return
        if self._debouncer is not None:
            self._debouncer.wake_after(0)
            return
        task = asyncio.get_running_loop().create_task(self._reconcile_only(name, version))
        self._retry_tasks.add(task)
        task.add_done_callback(self._retry_tasks.discard)

    async def _reconcile_only(self, name: str, version: str) -> None:
        # after the task working on the model, if one is (it loads another version, say): planned
        # while it ran, the retry planned nothing, and in these modes nothing asked again after it
        with contextlib.suppress(Exception):
            await self._lifecycle.tasks.wait_for(name)
        await asyncio.gather(*await self._reconcile(trust="all", only=name))
        if self._planner.scan.unreadable and not self._closed:  # nothing planned: try again later
            # (explicit and none modes: nothing else reads the folder; the retry was lost for good)
            asyncio.get_running_loop().call_later(UNREADABLE_RESCAN_S, self._retry_due, name, version)
