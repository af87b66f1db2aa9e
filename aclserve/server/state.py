"""Per-app server state: the repository/runtime handles, shutdown flag, in-flight count, the
per-version records (codec signature + metrics children) the infer hot path needs, and the
guards every request passes (access, memory budget, connection tracker)."""
from __future__ import annotations

import asyncio
import logging
import time

from ..errors import ShuttingDown
from ..repository.cache_dir import user_cache_folder
from .auth import Access
from .budget import MemoryBudget
from ..trace import Tracer
from .codec import Signature
from .connection_churn import ConnectionChurn
from .connections import ConnectionTracker
from .contracts import ModelStore, Runtime, ServedModel
from .deadline_wait import set_by
from .draining import DrainingVersions
from .grpc_arrivals import Arrivals
from .grpc_refusals import GrpcRefusals
from .guard_metrics import GuardCollector
from .health_metrics import HealthCollector
from .images import ImageDecoding
from .in_flight import InFlight
from .json_limits import JsonLimits
from .metrics import ServerMetrics, VersionMetrics
from .open_calls import SHUTDOWN_MESSAGE, OpenCalls
from .redact import PathRedactor
from .scrape_text import ScrapeText
from .shedding import EarlyRefusal
from .stalled_bodies import StalledBodies
from .tls import enabled as tls_enabled
from .tls_renewal import ServedCertificate
from .trim import HeapTrimmer
from .observe import Observer
from .readiness_log import ReadinessLog

log = logging.getLogger(__name__)

# The whole shutdown ends this long after the drain's deadline: the models close (a device still
# running then is abandoned: runtime/teardown.GRACE_S), the answers their close made are written
# and every connection of both transports is closed, all by then.
ANSWER_GRACE_S = 0.5
# However late the models close, the answers their close made get this long to be written.
LAST_ANSWERS_S = 0.1


class VersionRecord:
    """What the infer route caches for one served version object (rebuilt when it changes)."""

    __slots__ = ("served", "signature", "metrics", "batched", "name", "version", "images")

    def __init__(self, served: ServedModel, metrics: VersionMetrics, json_limits: JsonLimits):
        self.served = served
        self.name = served.name
        self.version = str(served.version)
        limit = served.max_batch_size
        self.signature = Signature(served.inputs, served.outputs, limit, json_limits, served.labels,
                                   served.value_ranges)
        self.images = served.images  # images.ImageStage, or None
        self.batched = limit > 0
        self.metrics = metrics

    def request_failed(self, reason: str, elapsed_ns: int) -> None:
        """One failed request, counted alike by /metrics and the statistics extension (as
        Triton's one aggregator feeds both: a client gone or a bad input fails in both)."""
        self.metrics.request_failed(reason)
        self.served.batcher.stats.request_failed(elapsed_ns)


class ServerState:
    """Owned by the app (under app_keys.STATE). Event-loop thread only.

    The repository and runtime are owned by whoever built them (aclserve/app.py or a test); the
    app's lifecycle starts and closes them in order."""

    def __init__(self, config, repo: ModelStore, runtime: Runtime):
        self.config = config
        self.repo = repo
        self.runtime = runtime
        self.draining = DrainingVersions(repo.draining())  # versions out of service, still draining: the repo's
        self.metrics = ServerMetrics(self.scraped_versions, self._memory, self.draining, repo.index,
                                     lambda: repo.load_retries)
        self.auth = Access(config)
        self.redact = PathRedactor(config.models_dir, *_known_folders(config))
        self.trimmer = HeapTrimmer()
        self.stalled_bodies = StalledBodies()  # HTTP bodies still arriving: the stalled ones end for others' memory
        self.budget = MemoryBudget(config.max_inflight_bytes, config.max_request_bytes, self.trimmer.released,
                                   self.stalled_bodies.make_room, config.max_inflight_bytes_per_model,
                                   repo.models_served)
        self.grpc_arrivals = Arrivals.for_config(config)  # gRPC messages received at once
        self.grpc_refusals = GrpcRefusals()  # calls grpc answers itself (call limit, unknown method)
        self.body_reads = OpenCalls()  # HTTP bodies still arriving: ended when the drain ends (open_calls.py)
        self.connections = ConnectionTracker(config.max_connections, config.header_timeout_s,
                                             config.keepalive_timeout_s, config.hold_refused_connections,
                                             send_timeout_s=config.body_timeout_s,
                                             send_min_bytes_per_s=config.send_min_bytes_per_s)
        self.connections.early = EarlyRefusal(self) if config.shed_before_parsing else None
        self.connections.stopping_message = lambda: self.stopping_message  # (its 503s once the drain has begun)
        self.connections.churn = ConnectionChurn(self.trimmer, lambda: self.budget.used)  # (the heap they leave)
        self.grpc_max_connections = config.max_connections  # what the descriptor limit leaves (app.py)
        # () -> the gRPC connections open: the endpoint's once it has one (grpc_server.py), else none
        self.grpc_connections = lambda: 0
        self.own_middlewares: tuple = ()  # the app's middlewares as create_app made them
        self.guard_metrics = GuardCollector(self)
        self.metrics.register(self.guard_metrics)
        self.metrics.register(HealthCollector(self))  # (after the guards' families, as /metrics has written them)
        # the TLS pair both endpoints serve, taken again as its files change (loaded and watched by serve())
        self.tls = ServedCertificate(config) if tls_enabled(config) else None
        if self.tls is not None:
            self.metrics.register(self.tls)
        self.scrapes = ScrapeText(self.metrics, self.refresh_memory)  # /metrics' text, shared by scrapes at once
        self.started = False  # every model the repository found at start has been tried
        self.loading: asyncio.Task | None = None  # the repository's start, begun by the app's lifecycle
        self.loads_after_listen = False  # serve(): the loading begins once both ports are bound
        self.shutting_down = False
        self.stopping_message = SHUTDOWN_MESSAGE  # what requests are refused with then (a failed device: why)
        # the start's line and each change after it, naming what holds readiness back
        self.readiness_log = ReadinessLog(self.ready, config.readiness, repo.not_serving)
        self.shutdown_deadline: float | None = None  # time.monotonic() the drain ends at, once shutting down
        self.answers_by: float | None = None  # time.monotonic() the connections close at, once the models closed
        self._drain_reported = False  # the drain ran out of time and said so
        self.start_failed = False  # serve() could not listen (a port taken): its error says so, not a drain's lines
        self.infer_requests = InFlight()  # enter() to leave(): what the drain waits for
        # repository loads and unloads running (HTTP): the drain does not wait for them (a load may
        # compile for minutes; the shutdown stops it), but their answers are written before the close
        self.control_calls = InFlight()
        self._records: dict[tuple[str, str], VersionRecord] = {}
        self.json_limits = JsonLimits(config.max_json_bytes, config.max_json_elements)
        self.images = ImageDecoding(config.images, runtime)  # the decode pool, shared by every model
        self.tracer = Tracer(config.trace, config.trace_dir)
        self._observer = Observer(self.tracer, config.request_log)
        self.observer: Observer | None = None  # set while tracing or the request log wants requests
        self.tracer.on_change = self._observe_changed
        self._observe_changed()

    def _observe_changed(self) -> None:
        self.observer = self._observer if self._observer.wanted else None

    # -- hot path ------------------------------------------------------------------------------
    def record(self, served: ServedModel) -> VersionRecord:
        rec = self._records.get((served.name, str(served.version)))
        if rec is None or rec.served is not served:
            rec = VersionRecord(served, self.metrics.version(served.name, str(served.version)), self.json_limits)
            served.batcher.stats.observe(on_request_done=rec.metrics.on_request_done, on_batch=rec.metrics.on_batch)
            self._records[(rec.name, rec.version)] = rec
        return rec

    def on_repository_event(self, event: str, name: str, version=None, **info) -> None:
        """Listener for ModelRepository.add_listener: an unloaded version's record goes (it
        held the closed version until a request named the same version again)."""
        if event == "unloaded":
            self._records.pop((name, str(version)), None)

    def enter(self) -> None:
        """Count one infer request in flight; refuse it when shutting down."""
        if self.shutting_down:
            raise ShuttingDown(self.stopping_message)
        self.infer_requests.enter()

    def leave(self) -> None:
        self.infer_requests.leave()

    # -- readiness and shutdown -----------------------------------------------------------------
    def ready(self) -> bool:
        ready = self.started and not self.shutting_down and self.repo.all_ready()
        self.readiness_log.seen(ready)  # (a line when it changed since the last)
        return ready

    def stop_accepting(self) -> None:
        """Readiness false and new infer requests refused (503), at once, and repository load calls
        as they end (the close unloads what they load); the drain's deadline is shutdown_timeout_s
        from the first call. Idempotent."""
        if not self.shutting_down:
            self.shutting_down = True
            self.repo.stop_load_calls()  # (a load ending in the drain was answered 200, then unloaded)
            self.readiness_log.close()
            self.shutdown_deadline = time.monotonic() + self.config.shutdown_timeout_s
            self.connections.stop_accepting(self.config.shutdown_timeout_s)
            if not self.start_failed:
                idle = self.connections.idle
                kept = (f", {len(idle)} idle connection(s) kept open {idle.seconds:.1f} s for a request on its way"
                        if len(idle) else "")
                log.info("shutting down: %d request(s) in flight, %d connection(s) still sending answers%s",
                         self.infer_requests.count, len(self.connections.sending), kept)

    async def begin_shutdown(self) -> None:
        """stop_accepting(), then wait until the shutdown deadline for queued and in-flight
        requests, for the idle connections' grace (idle_grace.py: at once when none is idle) and for
        the answers still going out to their clients (connections.py). Idempotent:
        a later call (`serve` drains, then the app's lifecycle asks again) waits no longer than the
        first, and a drain that ran out of time is reported once."""
        self.stop_accepting()
        connections = self.connections
        drained = await self.infer_requests.none_by(self.shutdown_deadline)
        # (before `sent`: an idle connection answered in its grace has its answer sent next; the grace
        # ends by the deadline)
        await set_by(connections.idle.over, self.shutdown_deadline)
        if not (drained and await set_by(connections.sending.sent, self.shutdown_deadline)):
            if not self._drain_reported:
                self._drain_reported = True
                log.warning("shutdown: %d request(s) still in flight and %d connection(s) still sending answers "
                            "after %.1f s; those waiting on a model are answered 503 as it closes, answers not "
                            "taken by their clients are dropped", self.infer_requests.count,
                            len(self.connections.sending),
                            self.config.shutdown_timeout_s)

    async def close_models(self) -> None:
        """After the drain: close_repository(), then answers_written(). Idempotent."""
        await self.close_repository()
        await self.answers_written()

    async def close_repository(self) -> None:
        """Stop loading (a load still running is abandoned, not waited for past the deadline:
        repository/served.py) and close the repository: what the drain left is answered 503,
        and a device still running by the deadline is left to itself (runtime/teardown.py), so
        this ends ANSWER_GRACE_S after the deadline at the latest. Sets `answers_by`.
        Idempotent."""
        self.stop_accepting()  # the deadline
        if self.loading is not None and not self.loading.done():
            self.loading.cancel()  # stopped (or failed to bind) while models were loading
        if self.loading is not None:
            await asyncio.wait([self.loading])
            if not self.loading.cancelled() and self.loading.exception() is not None:
                # serve() reports it, or a failure to bind that came first (one error line, not a
                # "Task exception was never retrieved" traceback at exit)
                log.debug("model loading ended with: %s", self.loading.exception())
        await self.repo.close(self.shutdown_deadline)
        self.auth.close()
        self.grpc_arrivals.close()  # the refused streams its log held back
        if self.answers_by is None:
            self.answers_by = max(self.shutdown_deadline + ANSWER_GRACE_S, time.monotonic() + LAST_ANSWERS_S)

    def closes_by(self) -> float:
        """When the closes after the models' (the decoders', the runtime's) stop being waited for:
        `answers_by`, or ANSWER_GRACE_S after the deadline where the models' close did not set it."""
        return self.answers_by if self.answers_by is not None else self.shutdown_deadline + ANSWER_GRACE_S

    def hurry(self) -> None:
        """A second signal: the shutdown's deadline is now, for the repository's close running
        too (what it still waits for, a load or a device, is abandoned as at the deadline)."""
        self.stop_accepting()
        self.shutdown_deadline = min(self.shutdown_deadline, time.monotonic())
        self.repo.hurry(self.shutdown_deadline)

    async def answers_written(self) -> None:
        """Wait until no request is in flight (the answers the repository's close made are
        written) and no repository load or unload runs (answered 503 once the repository has
        closed: their connections were closed before their answer, which the client saw as a
        dropped connection), or until `answers_by`: a request not waiting on a model (a stalled
        body) is ended by its connection's close, which comes next."""
        await self.infer_requests.none_by(self.answers_by)
        await self.control_calls.none_by(self.answers_by)

    # -- repository views ----------------------------------------------------------------------
    def ready_versions(self, name: str | None = None) -> list[tuple[str, str]]:
        """(model, version) of the versions in service (live_versions), of `name` only if given."""
        if name is not None:
            return [(name, v) for v in self.repo.serving_versions(name)]
        return [(n, v) for n, v, _ in self.live_versions()]

    def live_versions(self, index: list[dict] | None = None):
        """(model, version, served) for every version in service, one no instance can run now
        included (its statistics and fault counters are what an operator wants then); `index`:
        the repository index's rows, when already read."""
        for entry in self.repo.index() if index is None else index:
            name, version = entry["name"], str(entry["version"])
            if not version:  # a scan problem's row (get would name the newest version)
                continue
            try:
                served = self.repo.get(name, version)
            except Exception:  # not serving (loading, failed, only on disk)
                continue
            yield name, version, served

    def scraped_versions(self, index: list[dict] | None = None):
        """live_versions, and the versions unloading (out of service, draining: their queued
        requests and counts are there until they have closed, when their series go)."""
        live = set()
        for name, version, served in self.live_versions(index):
            live.add((name, version))
            yield name, version, served
        for name, version, served in self.draining.unloading():
            if (name, version) not in live:
                yield name, version, served

    def _memory(self) -> list[dict]:
        """Cached device memory figures (no ACL call: this runs on the event loop)."""
        return self.runtime.memory() if self.started else []

    def refresh_memory(self) -> None:
        """Re-read device memory through ACL. Blocking: call it from a worker thread."""
        if self.started:
            try:
                self.runtime.memory(refresh=True)
            except Exception:  # a closing runtime; the scrape shows the cached figures
                log.debug("device memory refresh failed", exc_info=True)


def _known_folders(config) -> list[str]:
    """Folders besides the models folder whose paths answers may quote (redact.py): trace_dir,
    the compile cache's (the configured one, else the user cache folder it falls back to when
    <models>/.cache cannot be written), and the operator's trace file itself (not its folder,
    which may be a home folder: every path under it was shown from there on)."""
    try:
        cache = config.compile_cache_dir or str(user_cache_folder(config.models_dir))
    except RuntimeError:  # no home folder to be found (pathlib, Python 3.12 on): nothing compiles there
        cache = ""
    return [config.trace_dir, config.trace.file, cache]
