"""Per-model lifecycle: carry out a ModelPlan (load beside, swap in, retire), one model at a time.

For one model, a plan's versions are loaded and warmed up beside the serving ones, put in
service with one assignment of the name -> versions map (a request sees the old map or the new
one, never a mix), and the replaced ones drain and are then closed; versions that a change of
the version_policy alone keeps (plan.keep) take the new config in that swap, not reloaded. A
failed load leaves the serving version in place, and so does (poll mode) a version whose file
went or was replaced, or that its policy dropped, while it loaded (or compiled): it never serves
(unload_choice.py: what a swap takes out), nor warms up when that is known by then (loader.py).
Each version's state (status.py names them and the moves allowed) changes only here.

Who owns which state. Everything below lives on the event loop thread; nothing is locked.
- Lifecycle.serving, .acted: replaced whole by `_swap`, run by the model's apply task (at most
  one per model, `aclserve-apply-<model>`: apply_tasks.py), and by `close`. Read by
  ModelRepository.get and the Planner's diff.
- Lifecycle.states: moved by the apply tasks, by `close`, and by `forget_stale` during the
  repository's reconcile. Lifecycle.held: ModelRepository.load/unload, ControlCalls (made-up names).
- Lifecycle.retiring, the versions out of service not closed yet (retiring.py): `_swap` and
  `close` add them, `_retire` drops them once closed. Read by ModelRepository.draining().
- Lifecycle.tasks (ApplyTasks: which model is busy, which to look at again): `start`, the apply tasks
  and their done callbacks. Lifecycle._loads: the apply tasks (their loads in progress, which `close`
  abandons); ._compiles: the apply tasks track their loads' compiles, which an unload, the close and a
  poll-mode scan (`stop_stale_compiles`) end, or the load itself once its file went (`_went_meanwhile`).
  A plan for a busy model is dropped and the model marked to be looked at again: its task's end asks
  for a rescan.
- Planner.scan, .pending, the SettleGate, the logged problems: the reconcile, one at a time under
  the repository's scan lock (run by start(), the Debouncer's task in poll mode, load() and, in
  explicit and none modes, a retry's task and the index's reads: index.py).
- LoadFailures (refused files, retry timers): the apply tasks record, the reconcile and load()
  forget; a retry timer fires as a loop callback.
- The Debouncer's timer and task, the listeners: ModelRepository.
- Threads hold no repository state: the watcher's thread only forwards paths to the loop
  (call_soon_threadsafe); the default executor runs the scan; the load executor's threads
  (LoadThreads, `aclserve-load_*`: daemons) compile, validate, open and warm up a pool, and
  close it; each gets its arguments and returns a result (a pool opened for a load abandoned
  meanwhile is closed by its own thread: handoff.py).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Callable

from ..config import ServerConfig
from ..om.compile_process import CompileStopped
from ..runtime.device import NoRoom
from ..runtime.limits import BeyondTheDevice, ResourceLimitError
from .apply_tasks import ApplyTasks
from .compile_cache import CompileCache
from .failures import LoadFailures
from .layout import VersionFile
from .load_threads import LoadThreads
from .load_turn import Turns
from .loader import first_step, load_version
from .plan import DesiredState, ModelPlan, Wanted
from .planner import FILE_GONE, FILE_REPLACED, Planner
from .retiring import Retiring, to_the_end
from .running_compiles import RunningCompiles, stopped_step
from .served import ServedVersion, StoppedBeforeWarmUp
from .status import SHUTTING_DOWN, UNLOADED, State, VersionStates
from .unload_choice import UNLOAD_ASKED, unload_cause, unloads_left, why_not_wanted

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self, config: ServerConfig, runtime, planner: Planner, failures: LoadFailures,
                 emit: Callable[..., None], rescan_soon: Callable[[], None], task_ended: Callable[[], None]):
        self.serving: dict[str, dict[str, ServedVersion]] = {}  # name -> version -> served; replaced whole
        self.acted: DesiredState = {}  # what is serving, as files + configs (the diff's baseline)
        self.states = VersionStates()
        self.held: set[str] = set()  # models unloaded through the API: no plan touches them
        self._config, self._runtime = config, runtime
        self._planner, self._failures = planner, failures
        self._emit = emit
        self._cache = CompileCache(config.compile_cache_dir, config.models_dir, config.compile_timeout_s)
        self._executor = LoadThreads(config.load_concurrency + 2, "aclserve-load")
        self._turns: Turns | None = None  # (made at the first load: load_turn.Turns)
        self.tasks = ApplyTasks(rescan_soon, task_ended)  # (one per model: busy, wait_for, wait_idle)
        failures.models_busy(self.tasks.busy)
        self._closed = False
        self._close_deadline: float | None = None  # close()'s (time.monotonic()), once closing
        self.retiring = Retiring()  # out of service, closing now (unload, reload): close() hurries them
        self._loads: set[asyncio.Task] = set()  # a version loading now (apply tasks): close() abandons them
        self._compiles = RunningCompiles(self._went_meanwhile)  # its loads' compiles, by model: stops end them

    def _load_turns(self) -> Turns:
        """load_concurrency's turns (fewer where the descriptor limit fits fewer loads at once), made at the
        first load: the server shares its descriptors out once the repository is built (server/descriptors.py)."""
        if self._turns is None:
            self._turns = Turns(self._config.load_concurrency)
        return self._turns

    async def sweep_cache(self) -> None:
        """What interrupted compiles left in the compile cache, and the entries no model file uses
        (CompileCache.sweep, in a thread): before the first loads, and after a scan found a file gone."""
        await asyncio.get_running_loop().run_in_executor(None, self._cache.sweep)

    # ---- tasks ----------------------------------------------------------------------------------
    def start(self, plan: ModelPlan) -> asyncio.Task | None:
        """Start carrying out `plan`; None when closing, or when its model is busy (it is
        rescanned after: apply_tasks.py). The task's result: version -> reason for each version that failed."""
        return None if self._closed else self.tasks.start(plan.name, lambda: self._apply(plan))

    def stop_compiles(self, name: str) -> None:
        """An unload of `name` through the API: the compiles its loads run now end (their child processes
        killed, nothing left in the cache), and so do their waits for another's compile of the same file
        (the cache entry's lock) and for their load_concurrency turn; those loads end as unloaded, not
        failed. (The close ends all: stop_all.)"""
        self._compiles.stop(name, UNLOAD_ASKED)

    def stop_stale_compiles(self) -> None:
        """Poll mode, after a scan: the compiles (or waits for another's) of versions whose file is
        gone or was replaced end as an unload's do, their versions leaving the index (the new file
        of a replaced one loads once its task ends; what they were to replace serves on meanwhile):
        the load's end would drop what they made."""
        if self._config.model_control_mode == "poll":
            self._compiles.stop_stale(self._planner.file_changed)

    def knows(self, name: str) -> bool:
        """Whether a serving version, the folder's last listing (one that can be listed) or a record knows `name`."""
        listing = self._planner.listed or self._planner.scan
        return name in self.serving or self.states.describe(name, None, listing) is not None

    # ---- load, swap, retire ---------------------------------------------------------------------
    async def _apply(self, plan: ModelPlan) -> dict[str, str]:
        name = plan.name
        loaded: dict[str, ServedVersion] = {}
        failed: dict[str, str] = {}
        stale: set[str] = set()  # (poll mode) versions whose load was stopped as their file went or was replaced

        async def one(version: str, wanted: Wanted) -> None:
            def progress(step: str) -> None:  # shown as the reason while the version is LOADING
                if self.states.get(name, version) is State.LOADING:
                    self.states.move(name, version, State.LOADING, step)

            if version not in self.serving.get(name, {}):  # (what it waits for from the start)
                self.states.move(name, version, State.LOADING, first_step(wanted))
            with self._compiles.track(name, version, wanted.file) as compile_:
                try:
                    loaded[version] = await load_version(self._runtime, self._executor, self._load_turns(), self._cache,
                                                         name, version, wanted, progress, compile_.stop, compile_.ended)
                    progress("loaded: serves once the versions loading with it are done")
                except StoppedBeforeWarmUp as e:  # (its compile goes with its file, as a dropped version's)
                    compiled = e.om_path != wanted.file.path  # (an .om's says as its check's did: nothing compiled)
                    self._stopped(name, version, ("load", " before its warm-up" if compiled else ""), compile_.why,
                                  stale)
                    self._release_unserved(name, version, e.om_path, wanted.file.path)
                except CompileStopped as e:  # an unload, the close, its file gone or replaced: no failure of the file's
                    self._stopped(name, version, stopped_step(compile_.stop, e), compile_.why, stale)
                except Exception as e:  # any failure leaves the serving version in place
                    if went := self._went_meanwhile(name, version, wanted.file):  # a step met it before a scan's stop
                        self._stopped(name, version, stopped_step(compile_.stop, e), went, stale)
                    else:
                        failed[version] = self._refuse(name, version, wanted, e, replaces=bool(plan.unload))
                else:
                    self._failures.succeeded(name, version)
                finally:  # (a load tried again for room ends its try: a stopped one records nothing)
                    self._failures.load_ended(name, version, wanted.file.identity)

        loads = [asyncio.ensure_future(one(v, w)) for v, w in plan.load.items()]
        self._loads.update(loads)
        try:
            await asyncio.gather(*loads, return_exceptions=True)  # close() cancels the loads: abandoned
        except asyncio.CancelledError:  # the repository's start, cancelled at shutdown: its loads too
            await self._close_unserved(loaded)
            raise
        finally:
            self._loads.difference_update(loads)
        if self._closed:
            await self._close_unserved(loaded)
            return failed
        dropped = self._changed_meanwhile(name, loaded)
        if stale:
            self.tasks.again(name)  # (a replaced file's new one loads next)
        unload = unloads_left(plan, self._planner, self.acted, self.held, bool(failed), bool(dropped or stale))
        causes = {v: unload_cause(plan, v, loaded, self._planner, self.held, self.serving.get(name, {}))
                  for v in unload}
        replaced = self._swap(name, loaded, causes, plan.keep)
        for version, sv in loaded.items():
            self.states.move(name, version, State.READY)
            if version in replaced:  # `replaced`: the version it took over from, draining now
                log.info("%s: version %s reloaded (%s), the one before drains", name, version,
                         sv.wanted.reload_said(replaced[version].wanted))
                self._emit("reloaded", name, version, seconds=sv.load_seconds, replaced=replaced[version], served=sv)
            else:
                self._emit("loaded", name, version, seconds=sv.load_seconds, served=sv)
        retiring = [self._retire(old, replaced=v in loaded, cause=causes.get(v, "")) for v, old in replaced.items()]
        await to_the_end(asyncio.gather(self._close_unserved(dropped), *retiring))  # (a caller gone: retiring.py)
        if failed:
            self.tasks.again(name)  # the selection may change now that a file is refused
        return failed

    def _stopped(self, name: str, version: str, step: tuple[str, str], why: str, stale: set[str]) -> None:
        """The load of `version` was stopped in `step` (stopped_step's; `why`: an unload, the close, its file gone or
        replaced), no failure of its file's; one whose file went or was replaced leaves the index and joins `stale`."""
        log.info("%s: the %s of version %s was stopped%s (%s)", name, step[0], version, step[1], why)
        gone = why in (FILE_GONE, FILE_REPLACED)
        if gone:
            stale.add(version)
        if self.states.get(name, version) is State.LOADING:
            self.states.move(name, version, None if gone else State.UNAVAILABLE, "" if gone else UNLOADED)

    def _went_meanwhile(self, name: str, version: str, file: VersionFile) -> str:
        """Poll mode, a load failed: FILE_GONE (or FILE_REPLACED) when its file went (or was replaced) as it
        loaded, which the step that failed met before a scan saw it and stopped the load (the hash after a wait
        for its turn, the compile's child opening it, the look after the compile that its source did not change,
        an .om's check or open): the documented stop, not a bad file; else "". Asked too by a load whose
        compile has ended (RunningCompile.ended): a file gone or replaced stops it before its warm-up."""
        if self._config.model_control_mode != "poll" or name in self.held:
            return ""
        return self._planner.file_changed(name, version, file)

    def _changed_meanwhile(self, name: str, loaded: dict[str, ServedVersion]) -> dict[str, ServedVersion]:
        """Poll mode, just before the swap: the versions the folder no longer wants (deleted, replaced or
        dropped by their policy as they loaded: no plan said so, as the diff compares with what
        serves) leave `loaded`, returned. Explicit and none modes take the folder as their load
        calls read it; a model unloaded through the API is left to its unload."""
        if self._config.model_control_mode != "poll" or name in self.held:
            return {}
        dropped = {}
        for version, sv in list(loaded.items()):
            why = why_not_wanted(self._planner, name, version, sv.wanted.file)
            if why:
                dropped[version] = loaded.pop(version)
                log.info("%s: version %s not put in service: %s (changed while it loaded)", name, version, why)
                if self.states.get(name, version) is State.LOADING:  # (a reload's stays READY: its old file serves)
                    self.states.move(name, version, None)
                self.tasks.again(name)
        return dropped

    async def _close_unserved(self, loaded: dict[str, ServedVersion]) -> None:
        """Close versions never swapped in: loaded as the repository closed, or dropped (compiles released)."""
        for sv in loaded.values():
            await sv.close(0.0, self._executor, self._close_deadline)
            self._release_unserved(sv.name, sv.version, sv.om_path, sv.source)

    def _release_unserved(self, name: str, version: str, om_path: str, source: str) -> None:
        """The compile of a version never served goes when its source is gone (at shutdown the cache stays)."""
        if not self._closed:
            self._cache.release(name, version, om_path, source, False)

    def _swap(self, name: str, loaded: dict[str, ServedVersion], unload: dict[str, str],
              keep: dict[str, Wanted]) -> dict[str, ServedVersion]:
        """Put `loaded` in service, take `unload` (version -> why) out, in one assignment; `keep`
        serves on as it is, under its new version_policy. Returns the retired."""
        updated = dict(self.serving.get(name, {}))
        kept = [v for v in keep if v in updated and v not in loaded]
        for version in kept:
            updated[version].reselected(keep[version])
        if kept:
            log.info("%s: its new version_policy keeps version %s serving as it is (not reloaded)",
                     name, ", ".join(kept))
        retired = {}
        for version, sv in loaded.items():
            if version in updated:
                retired[version] = updated[version]
            updated[version] = sv
        for version in unload:
            if version in updated:
                retired[version] = updated.pop(version)
        serving, acted = dict(self.serving), dict(self.acted)
        if updated:
            serving[name] = updated
            acted[name] = {v: sv.wanted for v, sv in updated.items()}
        else:
            serving.pop(name, None)
            acted.pop(name, None)
        self.serving, self.acted = serving, acted  # requests see the old map or the new one, never a mix
        self._cache.in_use = frozenset(sv.om_path for versions in serving.values() for sv in versions.values())
        for version, old in retired.items():
            old.retire(functools.partial(self._successor, name, version))
            self.retiring.add(old, replaced=version in loaded)
            if version in loaded:
                self.states.move(name, version, State.READY)
            else:
                self.states.move(name, version, State.UNLOADING, unload[version])
                self._emit("unloading", name, version, served=old)  # (draining: its queue still counts)
        return retired

    def _successor(self, name: str, version: str) -> ServedVersion | None:
        versions = self.serving.get(name)
        if not versions:
            return None
        return versions.get(version) or versions[max(versions, key=int)]

    async def _retire(self, sv: ServedVersion, replaced: bool, deadline: float | None = None,
                      cause: str = "") -> None:
        """`sv` is out of the serving map: close it (drained until `deadline`, time.monotonic(),
        default shutdown_timeout_s from now), drop its compile, settle its state; `cause`: why
        it was unloaded (not `replaced`), for the log."""
        drain_s = self._config.shutdown_timeout_s if deadline is None else max(0.0, deadline - time.monotonic())
        if self._close_deadline is not None:  # started as the repository closes: its deadline
            sv.hurry(self._close_deadline)
        try:
            await sv.close(drain_s, self._executor, deadline)
        finally:
            self.retiring.closed(sv)  # (the same loop step as its event below: listeners count it once)
        if not self._closed:  # at shutdown the cache stays for the next start
            successor = self.serving.get(sv.name, {}).get(sv.version) if replaced else None
            in_place = successor is not None and successor.source == sv.source  # (not a release switch's folder)
            self._cache.release(sv.name, sv.version, sv.om_path, sv.source, in_place)
        if sv.version not in self.serving.get(sv.name, {}):
            self.states.unloaded(sv.name, sv.version, held=sv.name in self.held
                                 and self._planner.on_disk(sv.name, sv.version))
        if replaced:  # its (name, version) serves on: what it counted is kept by listeners
            self._emit("retired", sv.name, sv.version, served=sv)
        else:
            log.info("%s: version %s unloaded (%s)", sv.name, sv.version, cause)
            self._emit("unloaded", sv.name, sv.version)

    def _refuse(self, name: str, version: str, wanted: Wanted, error: Exception, replaces: bool) -> str:
        """Record a failed load; `replaces`: its plan unloads versions once it is in (a new version
        taking over; one loaded beside those that serve on replaces none: unloading first is no help).
        One refused for the device's streams, events or memory says that it needs room beside the
        version it replaces, which holds its own until the swap (not one that no unload makes room for)."""
        serving = self.serving.get(name, {}).get(version)
        if (serving or (replaces and self.serving.get(name))) and _an_unload_may_help(error):
            said = (f"{error}; {'a reload' if serving else 'a new version'} loads beside the serving version it "
                    "replaces, whose instances hold theirs until the swap: if the new configuration fits alone, "
                    "unload the model first")
            # (a refusal keeps the device it waits for room on: failures.py)
            error = error.reworded(said) if isinstance(error, ResourceLimitError) else error.said_as(said)
        what = wanted.changed_from(serving.wanted) if serving is not None else ""
        reason = self._failures.record(name, version, wanted.file, error, what)
        if serving is not None:
            self.states.move(name, version, State.READY, f"serving the previous {what}; the new one failed: {reason}")
        else:
            self.states.move(name, version, State.UNAVAILABLE, reason)
        self._emit("load_failed", name, version, reason=reason)
        return reason

    def forget_stale(self) -> None:
        """After a rescan: forget the states of versions whose files (or failures) are gone. A
        model whose config does not read now, or selects none of its versions, was loaded with
        another one: its failures are forgotten with their reasons (the index kept one of an
        earlier config beside what is wrong now)."""
        scan = self._planner.scan
        superseded = {(n, v) for n, v in self._failures.versions()
                      if n in scan.config_problems or n in scan.selects_none}
        for name in {n for n, _ in superseded}:
            self._failures.forget_model(name)
        self.states.forget_stale(scan, set(self._failures.versions()), superseded, self.held)

    # ---- shutdown -------------------------------------------------------------------------------
    def hurry(self, deadline: float) -> None:
        """A close running now waits no later than `deadline` (time.monotonic(); a second signal)."""
        if self._close_deadline is not None:
            self._close_deadline = min(self._close_deadline, deadline)
            self.retiring.hurry(self._close_deadline)

    async def close(self, deadline: float | None = None) -> None:
        """Start nothing from now on; abandon the loads still running (served.open_version: not
        swapped in, closed by their threads when they return); wait for the running tasks (an
        unload or reload among them waits for the device no later than `deadline`), then drain
        and close every serving version (all at once, until `deadline`, time.monotonic();
        default shutdown_timeout_s from now: what is left then is answered 503, and a device
        still running is left to itself); then wait for what the load threads still run (an
        abandoned load closing what it opened) until `deadline`, no later, and stop them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if deadline is None:
            deadline = time.monotonic() + self._config.shutdown_timeout_s
        self._close_deadline = deadline
        self.retiring.hurry(deadline)  # an unload or reload waiting for a hung device: not past this
        self._compiles.stop_all(SHUTTING_DOWN)  # (a compile's thread would wait for its child to the end)
        for load in list(self._loads):  # a load that hangs on the device would hold the close for good
            load.cancel()
        await self.tasks.wait_idle()
        serving, self.serving = self.serving, {}
        closing = [sv for versions in serving.values() for sv in versions.values()]
        for sv in closing:
            sv.retire(lambda: None)
            self.retiring.add(sv, replaced=False)
            self.states.move(sv.name, sv.version, State.UNLOADING, SHUTTING_DOWN)
            self._emit("unloading", sv.name, sv.version, served=sv)
        await asyncio.gather(*(self._retire(sv, replaced=False, deadline=deadline, cause=SHUTTING_DOWN)
                               for sv in closing), return_exceptions=True)
        self.acted = {}
        await self._executor.calls_ended_by(lambda: self._close_deadline)  # an abandoned load closing what it opened
        self._executor.shutdown(wait=False)  # its threads are daemons: a hung one holds no exit


def _an_unload_may_help(error: Exception) -> bool:
    """A refusal for the device's streams, events or memory that room others hold may lift: not one the device
    cannot give at all (BeyondTheDevice; a NoRoom without its device: a piece larger than the device's memory, or
    than its memory less the reserve: runtime/device.py Device.room)."""
    if isinstance(error, NoRoom):
        return error.device is not None
    return isinstance(error, ResourceLimitError) and not isinstance(error, BeyondTheDevice)
