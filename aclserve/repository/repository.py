"""ModelRepository: the models folder turned into served versions, kept in step with the disk.

Owns every ServedVersion (pool + batcher), the watcher, the load executor. Lives on one
asyncio loop; blocking work (scan, compile, validate, open_pool, warm-up, pool close) runs in
threads. Three parts (STYLE.md #11): the watcher forwards paths; a pure scan + diff decides
what changed; per model, new versions are loaded and warmed up beside the serving ones,
swapped in with one assignment of the name -> versions map, and the replaced ones drain and
are then closed.

Control modes: poll watches the folder (and rescans every RESCAN_S seconds as a safety net);
explicit loads everything at start, then changes only through load()/unload(); none loads everything at start and refuses load()/unload().
In poll mode, unload(name) keeps the model unloaded (the watcher leaves it alone) until
load(name). load(name) rescans and loads what changed for that model (an unchanged, loaded
model is not reloaded), taking files as they are (no settle wait: the caller vouches).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from pathlib import Path
from typing import Callable

from .. import heap
from ..config import ServerConfig
from ..errors import InvalidInput, ModelUnavailable, NotFound, ServeError, ShuttingDown
from . import cache_entry, layout
from .loader import load_version
from .plan import DesiredState, ModelPlan, Wanted, diff
from .retry import RetrySchedule, is_transient
from .served import LOADING, READY, UNAVAILABLE, UNLOADING, ServedVersion
from .settle import SettleGate
from .status import StatusBoard
from .watcher import Debouncer, RepositoryWatcher

log = logging.getLogger(__name__)

RESCAN_S = 10.0  # poll mode: rescan at least this often even without file events
MAX_VERSION_DIGITS = 18  # versions are folder names of positive integers; longer is not one


class ModelLoadFailed(ServeError):
    """A load asked through the API failed; the message gives each version's reason."""

    status = 400


class RepositoryError(RuntimeError):
    """The repository cannot start (e.g. the models folder is missing)."""


class ModelRepository:
    def __init__(self, config: ServerConfig, runtime, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self.config = config
        self.runtime = runtime
        self.root = Path(config.models_dir)
        self.mode = config.model_control_mode
        self._serving: dict[str, dict[str, ServedVersion]] = {}  # replaced whole on every swap
        self._acted: DesiredState = {}  # what is serving, as files + configs (diff baseline)
        self._status = StatusBoard()
        self._rejected: dict[tuple[str, str, tuple], str] = {}  # failed file versions -> reason
        self._scan = layout.ScanResult()
        self._pending: dict[str, list[str]] = {}
        self._excluded: set[str] = set()  # unloaded through the API; the watcher leaves them
        self._busy: dict[str, asyncio.Task] = {}
        self._dirty: set[str] = set()
        self._logged: set = set()
        self._listeners: list[Callable] = []
        self._gate = SettleGate(config.settle_s, clock, wall_clock)
        self._retry = RetrySchedule(config.load_retry_initial_s, config.load_retry_max_s, self._retry_due)
        self._retry_tasks: set[asyncio.Task] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(config.load_concurrency + 2, "aclserve-load")
        self._scan_lock = asyncio.Lock()
        self._load_sem: asyncio.Semaphore | None = None
        self._watcher: RepositoryWatcher | None = None
        self._debouncer: Debouncer | None = None
        self._started = self._closed = False

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Scan and load per the control mode; in poll mode start watching first (no event missed)."""
        if self._started:
            return
        self._started = True
        if not self.root.is_dir():
            raise RepositoryError(f"models folder {self.root} does not exist (run from the folder that holds "
                                  "models/, or pass --models DIR)")
        self._load_sem = asyncio.Semaphore(self.config.load_concurrency)
        if self.mode == "poll":
            loop = asyncio.get_running_loop()
            self._debouncer = Debouncer(self.config.debounce_s, self._reconcile_all,
                                        max_wait=max(10 * self.config.debounce_s, self.config.settle_s))
            self._watcher = RepositoryWatcher(self.root, loop, self._on_path)
            self._watcher.start()
        tasks = await self._reconcile(trust="age" if self.mode == "poll" else "all")
        await asyncio.gather(*tasks)
        if not self._serving and not tasks:
            log.warning("the models folder %s holds no model (<name>.om, <name>.onnx or <name>/<version>/"
                        "model.om); the server is up but has nothing to serve", self.root)

    async def close(self) -> None:
        """Stop watching, drain every version (shutdown_timeout_s), close every pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.close()
        if self._debouncer is not None:
            await self._debouncer.close()
        self._retry.close()
        for task in self._retry_tasks:
            task.cancel()
        await asyncio.gather(*self._retry_tasks, *list(self._busy.values()), return_exceptions=True)
        serving, self._serving = self._serving, {}
        retiring = [sv for versions in serving.values() for sv in versions.values()]
        for sv in retiring:
            sv.retire(lambda: None)
            self._status.set(sv.name, sv.version, UNLOADING, "")
        await asyncio.gather(*(self._retire(sv, "unloaded") for sv in retiring), return_exceptions=True)
        self._acted = {}
        self._executor.shutdown(wait=True)

    async def wait_idle(self) -> None:
        """Wait until no model is being loaded, swapped or drained (a later file event may
        start more work)."""
        while self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)

    # ---- lookups (server) -----------------------------------------------------------------------
    def get(self, name: str, version: str | None = None) -> ServedVersion:
        """The serving version (newest when `version` is None). Raises NotFound or
        ModelUnavailable (known but not ready; ShuttingDown after close())."""
        if self._closed:
            raise ShuttingDown("the model repository is shut down")
        versions = self._serving.get(name)
        if version not in (None, ""):
            version = str(version)
            if len(version) > MAX_VERSION_DIGITS:
                raise InvalidInput(f"version must be a positive integer of at most {MAX_VERSION_DIGITS} digits")
            version = str(int(version)) if version.isascii() and version.isdigit() else version
        if versions:
            if version in (None, ""):
                return versions[max(versions, key=int)]
            served = versions.get(version)
            if served is not None:
                return served
        known = self._status.get(name, version) if version else self._status.model_status(name, self._scan)
        if known is not None:
            state, reason = known
            raise ModelUnavailable(f"model {name}{' version ' + version if version else ''} is not ready"
                                   f" ({state}{': ' + reason if reason else ''})")
        if versions or name in self._scan.models:
            raise NotFound(f"model {name} has no version {version}")
        raise NotFound(f"unknown model {name!r}")

    def model_names(self) -> list[str]:
        return sorted(self._serving)

    def all_ready(self) -> bool:
        """Every model found on disk (and not unloaded on purpose) is serving. With readiness
        `lenient`, a model whose file was refused (shown in the index) does not hold readiness
        back either; in both modes a model still settling, loading or retrying does."""
        if not self._started or self._closed:
            return False
        wanted = {n for n, e in self._scan.models.items() if e.selected} - self._excluded
        if self.config.readiness == "strict":
            return all(n in self._serving for n in wanted)
        failed = {n for n, _, _ in self._rejected}
        return all(n in self._serving or (n in failed and n not in self._busy) for n in wanted)

    def load_failures(self) -> dict[tuple[str, str], str]:
        """(name, version) -> why its current file failed to load (retry plan included)."""
        return {(n, v): reason for (n, v, _), reason in self._rejected.items()}

    @property
    def load_retries(self) -> dict[str, int]:
        """model -> automatic load retries started (transient device errors)."""
        return self._retry.retries

    def index(self, ready_only: bool = False) -> list[dict]:
        """[{"name", "version", "state", "reason"}] for every version loaded or on disk."""
        return self._status.index(self._scan, self._pending, ready_only)

    def add_listener(self, callback: Callable) -> None:
        """callback(event, name, version, **info), event in loaded | reloaded | unloaded | load_failed."""
        self._listeners.append(callback)

    # ---- control API ----------------------------------------------------------------------------
    async def load(self, name: str) -> None:
        self._check_control("load")
        if layout.check_model_name(name):
            raise InvalidInput(f"invalid model name {name!r}: {layout.check_model_name(name)}")
        self._excluded.discard(name)
        for key in [k for k in self._rejected if k[0] == name]:
            del self._rejected[key]  # the caller asks for another try
        while name in self._busy:
            await asyncio.shield(self._busy[name])
        tasks = await self._reconcile(trust="all", only=name)
        results = await asyncio.gather(*tasks)
        if name not in self._scan.models:
            raise NotFound(self._scan.problems.get(name) or f"no model {name!r} in {self.root}")
        failed = [f"version {v}: {r}" for result in results for v, r in result.items()]
        if name not in self._serving or failed:
            raise ModelLoadFailed(f"failed to load {name}: " + ("; ".join(failed) or "no version loaded"))

    async def unload(self, name: str) -> None:
        self._check_control("unload")
        if name not in self._serving and name not in self._scan.models:
            raise NotFound(f"unknown model {name!r}")
        self._excluded.add(name)
        while name in self._busy:
            await asyncio.shield(self._busy[name])
        if name in self._acted:
            await self._spawn(ModelPlan(name, unload=list(self._acted[name])))

    def _check_control(self, what: str) -> None:
        if self.mode == "none":
            raise InvalidInput(f"model {what} is disabled (model_control_mode is none)")
        if self._closed or not self._started:
            raise ModelUnavailable("the model repository is not running")

    # ---- reconcile ------------------------------------------------------------------------------
    def _on_path(self, path: str, moved: bool) -> None:  # from the watcher, on the loop
        self._gate.note_event(path, moved)
        if self._debouncer is not None:
            self._debouncer.poke()

    async def _reconcile_all(self) -> None:
        await asyncio.gather(*await self._reconcile(trust="settle"))

    async def _reconcile(self, trust: str, only: str | None = None) -> list[asyncio.Task]:
        """Scan, diff against what is serving, start one task per changed model. Returns them."""
        if self._closed:
            return []
        async with self._scan_lock:
            scan = await asyncio.get_running_loop().run_in_executor(
                None, layout.scan, self.root, self.config.model_defaults)
            self._scan = scan
            self._log_problems(scan)
            live = {(n, v, f.identity) for n, e in scan.models.items() for v, f in e.available.items()}
            self._rejected = {k: r for k, r in self._rejected.items() if k in live}
            self._status.forget_stale(scan, {(n, v) for n, v, _ in self._rejected})
            desired, self._pending = self._gate.desired(scan, self._acted, trust, frozenset(self._rejected))
            for name in scan.problems:  # a broken config must not unload a serving model
                if name in self._acted and name not in desired:
                    desired[name] = self._acted[name]
            for name in self._excluded:
                desired.pop(name, None)
            plans = diff(self._acted, desired, unload_missing=self.config.unload_on_delete)
            tasks = []
            for plan in plans:
                if only is not None and plan.name != only:
                    continue
                if plan.name in self._busy:
                    self._dirty.add(plan.name)
                    continue
                tasks.append(self._spawn(plan))
            if self._debouncer is not None:
                wait = self._gate.next_check()
                # a missed file event (inotify races with new folders) is caught by the next rescan
                self._debouncer.wake_after(RESCAN_S if wait is None else min(wait + 0.01, RESCAN_S))
            return tasks

    def _spawn(self, plan: ModelPlan) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._apply(plan), name=f"aclserve-apply-{plan.name}")
        self._busy[plan.name] = task

        def done(t: asyncio.Task) -> None:
            if self._busy.get(plan.name) is t:
                del self._busy[plan.name]
            if not t.cancelled() and t.exception() is not None:
                log.error("%s: applying changes failed", plan.name, exc_info=t.exception())
            if plan.name in self._dirty:
                self._dirty.discard(plan.name)
                if self._debouncer is not None and not self._closed:
                    self._debouncer.wake_after(0)

        task.add_done_callback(done)
        return task

    # ---- load, swap, retire ---------------------------------------------------------------------
    async def _apply(self, plan: ModelPlan) -> dict[str, str]:
        """Load, swap, retire for one model; returns version -> reason for failed loads."""
        name = plan.name
        loaded: dict[str, ServedVersion] = {}
        failed: dict[str, str] = {}

        async def one(version: str, wanted: Wanted) -> None:
            try:
                loaded[version] = await self._load_version(name, version, wanted)
            except Exception as e:  # any failure leaves the serving version in place
                failed[version] = self._reject(name, version, wanted, _reason(e), is_transient(e))
            else:
                self._retry.succeeded(name, version)

        await asyncio.gather(*(one(v, w) for v, w in plan.load.items()))
        if self._closed:
            for sv in loaded.values():
                await self._retire(sv, None)
            return failed
        unload = list(plan.unload)
        if failed:  # keep versions a failed one was meant to push out, while their files exist
            on_disk = self._scan.models.get(name)
            unload = [v for v in unload if on_disk is None or v not in on_disk.available
                      or name in self._excluded]
        replaced = self._swap(name, loaded, unload)
        for version, sv in loaded.items():
            self._status.set(name, version, READY, "")
            self._emit("reloaded" if version in replaced else "loaded", name, version, seconds=sv.load_seconds)
        await asyncio.gather(*(self._retire(old, None if v in loaded else "unloaded")
                               for v, old in replaced.items()))
        if failed:
            self._dirty.add(name)  # the selection may change now that a file is rejected
        return failed

    def _swap(self, name: str, loaded: dict[str, ServedVersion], unload: list[str]) -> dict[str, ServedVersion]:
        """Put `loaded` in service and take `unload` out, in one assignment. Returns the retired."""
        updated = dict(self._serving.get(name, {}))
        retired = {}
        for version, sv in loaded.items():
            if version in updated:
                retired[version] = updated[version]
            updated[version] = sv
        for version in unload:
            if version in updated:
                retired[version] = updated.pop(version)
        serving = dict(self._serving)
        acted = dict(self._acted)
        if updated:
            serving[name] = updated
            acted[name] = {v: sv.wanted for v, sv in updated.items()}
        else:
            serving.pop(name, None)
            acted.pop(name, None)
        self._serving = serving  # requests see the old map or the new one, never a mix
        self._acted = acted
        for version, old in retired.items():
            old.retire(functools.partial(self._successor, name, version))
            self._status.set(name, version, READY if version in loaded else UNLOADING)
        return retired

    def _successor(self, name: str, version: str) -> ServedVersion | None:
        versions = self._serving.get(name)
        if not versions:
            return None
        return versions.get(version) or versions[max(versions, key=int)]

    async def _load_version(self, name: str, version: str, wanted: Wanted) -> ServedVersion:
        if version not in self._serving.get(name, {}):
            self._status.set(name, version, LOADING)
        return await load_version(self.runtime, self._executor, self._load_sem, name, version, wanted,
                                  self.config.compile_cache_dir, self.config.models_dir)

    async def _retire(self, sv: ServedVersion, event: str | None) -> None:
        """Drain `sv` (already out of the serving map), then close its batcher and pool."""
        key = (sv.name, sv.version)
        try:
            await sv.drain(self.config.shutdown_timeout_s)
        except Exception:
            log.exception("%s:%s: drain failed", sv.name, sv.version)
        try:
            await sv.close_batcher()
            await asyncio.get_running_loop().run_in_executor(self._executor, _close_and_trim, sv)
        except Exception:
            log.exception("%s:%s: close failed", sv.name, sv.version)
        if not self._closed and (event is None or not Path(sv.source).exists()):
            self._prune_compiled(sv)  # replaced, or its file is gone; a restart keeps the cache
        if (self._status.get(*key) or (None,))[0] == UNLOADING and sv.version not in self._serving.get(sv.name, {}):
            entry = self._scan.models.get(sv.name)
            if sv.name in self._excluded and entry is not None and sv.version in entry.available:
                self._status.set(*key, UNAVAILABLE, "unloaded")
            else:  # gone from disk or out of the version policy: the scan rows tell the rest
                self._status.drop(*key)
        if event:
            log.info("%s: version %s unloaded", sv.name, sv.version)
            self._emit(event, sv.name, sv.version)

    def _prune_compiled(self, sv: ServedVersion) -> None:
        """Delete the cached compile of a replaced or deleted .onnx version unless a serving
        version uses it, so replacing a dropped .onnx does not grow the cache without bound."""
        if sv.om_path == sv.source:
            return  # an .om from the repository itself, not a cache entry
        in_use = {v.om_path for versions in self._serving.values() for v in versions.values()}
        if sv.om_path in in_use:
            return
        try:
            cache_entry.remove(sv.om_path)
            log.info("%s: removed the compile of the retired version %s (%s)", sv.name, sv.version,
                     Path(sv.om_path).name)
        except OSError as e:
            log.warning("%s: could not remove %s: %s", sv.name, sv.om_path, e)

    def _reject(self, name: str, version: str, wanted: Wanted, reason: str, transient: bool = False) -> str:
        if transient and self._retry.enabled and not self._closed:
            attempt, delay = self._retry.schedule(name, version, wanted.file.identity)
            reason = f"{reason} (transient device error: retry {attempt} in {delay:.1f} s)"
        self._rejected[(name, version, wanted.file.identity)] = reason
        serving = version in self._serving.get(name, {})
        if serving:
            self._status.set(name, version, READY, f"serving the previous file; the new one failed: {reason}")
        else:
            self._status.set(name, version, UNAVAILABLE, reason)
        if ("load", name, version, wanted.file.identity) not in self._logged:
            self._logged.add(("load", name, version, wanted.file.identity))
            log.error("%s: version %s from %s not loaded: %s", name, version, wanted.file.path, reason)
        elif transient:
            log.warning("%s: version %s not loaded: %s", name, version, reason)
        self._emit("load_failed", name, version, reason=reason)
        return reason

    def _retry_due(self, name: str, version: str, identity: tuple) -> None:
        """A transient failure's delay has passed: let the file be loaded again."""
        if self._closed or self._rejected.pop((name, version, identity), None) is None:
            return  # shut down, or the file changed or went away meanwhile
        log.info("%s: retrying the load of version %s", name, version)
        if self._debouncer is not None:
            self._debouncer.wake_after(0)
            return
        task = asyncio.get_running_loop().create_task(self._reconcile_one(name))
        self._retry_tasks.add(task)
        task.add_done_callback(self._retry_tasks.discard)

    async def _reconcile_one(self, name: str) -> None:
        await asyncio.gather(*await self._reconcile(trust="all", only=name))

    def _log_problems(self, scan: layout.ScanResult) -> None:
        for name, reason in scan.problems.items():
            if ("scan", name, reason) not in self._logged:
                self._logged.add(("scan", name, reason))
                log.warning("models folder: %s: %s", name, reason)
        for note in scan.notes:  # once each: a scan runs on every change in poll mode
            if ("note", note) not in self._logged:
                self._logged.add(("note", note))
                log.info("models folder: %s", note)

    def _emit(self, event: str, name: str, version: str, **info) -> None:
        for callback in self._listeners:
            try:
                callback(event, name, version, **info)
            except Exception:
                log.exception("repository listener failed on %s", event)


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0] if text else type(error).__name__


def _close_and_trim(sv: ServedVersion) -> None:
    """Close the pool, then give the freed heap back (see aclserve/heap.py: without it RSS grows
    with every reload)."""
    sv.close_pool()
    heap.trim()
