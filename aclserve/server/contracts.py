"""What server/ reads from the objects it is handed: the model repository, each version it
serves, and the ACL runtime. Written down as typing protocols so the contract is in one place
and a type checker can hold the implementations to it; those are repository.ModelRepository,
repository.ServedVersion (its `batcher` a scheduling.DynamicBatcher, its `pool` a
runtime.InstancePool) and runtime.AclRuntime, all built by the composition root
(aclserve/app.py). Every member listed is always there: the server reads them directly.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Protocol, Sequence

from ..errors import InvalidInput, ServeError
from ..images import ImageStage
from ..runtime.types import TensorSpec


class BatchStatistics(Protocol):
    """A batcher's counters (scheduling.stats.BatcherStats); model_stats.py reads its duration
    counters (success, fail, queue, compute_input, compute_infer, compute_output: each a count
    and total ns), inference_count, execution_count, last_inference_ms and batch_sizes."""

    def observe(self, on_request_done: Callable | None = None, on_batch: Callable | None = None) -> None:
        """Call `on_request_done(level, queue_s, ok, reason)` and `on_batch(gear, rows, compute_s)`."""

    levels: dict  # priority level -> its counts (accepted, rejected, timed_out, delayed, cancelled)

    def queue_depth(self) -> dict[int, int]:
        """Requests waiting, per priority level."""


class Batcher(Protocol):
    stats: BatchStatistics  # server/model_stats.py renders them as Triton's statistics JSON

    def deadline_s(self, priority: int | None, timeout_us: int | None) -> float:
        """Seconds a request may wait, for a decode thread and then queued, before its deadline
        refuses it; 0 for none."""


class BatchFaultCounts(Protocol):
    """A version's batches whose run failed (runtime.batch_faults.BatchFaults)."""

    reruns: int  # runs that retrying cost: a whole batch on another instance, a request alone

    def outcomes(self) -> dict[str, int]:
        """Failed batches, each once, by what became of them (every outcome, 0 until one comes)."""


class InstanceGroup(Protocol):
    """The instances running one version's batches (runtime.InstancePool)."""

    batch_faults: BatchFaultCounts
    rebuilds: int  # instances replaced after leaving rotation
    rebuilds_failed: int  # rebuild attempts that failed (each tried again)

    def fault_counts(self) -> dict[int, int]:
        """The faults the device reported, by ACL error code (one per fault)."""

    def out_of_service(self) -> str | None:
        """Why no instance can run a batch now (all out of rotation, rebuilding failing), or None."""

    def out_of_rotation(self) -> Sequence[object]:
        """One item per instance taking no batch now (out of rotation, or on a failed device)."""

    def busy_ratio(self) -> float:
        """Fraction of the last 10 s the instances had a batch in flight (averaged over them)."""

    def utilisation(self) -> list[dict]:
        """One row per instance: {"instance", "device", "compute_busy", "out_of_rotation"}."""


class ServedModel(Protocol):
    """One model version in service (repository.ServedVersion)."""

    name: str
    version: str
    labels: Mapping[str, Sequence[str]]  # output name -> class labels (empty: none)
    # integer input name -> the values it takes (.low, .high, .why: repository/value_ranges.py)
    value_ranges: Mapping[str, object]
    images: ImageStage | None  # how its image inputs are decoded, or None
    batcher: Batcher
    pool: InstanceGroup
    config: object  # config.ModelConfig: its outputs' labels files, batching and queue policy

    @property
    def gears(self) -> tuple[int, ...]:
        """The compiled batch sizes; () for a static model."""

    @property
    def max_batch_size(self) -> int:
        """The protocol's max_batch_size: the batcher's batch_limit; 0 for a static model."""

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    async def infer(self, inputs, rows: int, priority: int | None = None, timeout_us: int | None = None,
                    trace=None, pinned: bool = False, waited_ns: int = 0):
        """Queue one request's rows and wait for its outputs (a batch result); `waited_ns`: its
        wait for a decode thread, which its deadline counts."""

    def invalid_since_retired(self, error: InvalidInput, pinned: bool) -> ServeError:
        """What answers a request this version refused as invalid: `error`, or a 503 to send it
        again when the version was replaced meanwhile by one that may take it."""


class Draining(Protocol):
    """The versions out of service not closed yet, read-only (repository.retiring.Draining): the
    repository's own record, read at each scrape (draining.py)."""

    def replaced(self, name: str, version: str) -> list[ServedModel]:
        """The versions a reload of (name, version) replaced, still draining."""

    def unloading(self) -> Iterable[tuple[str, str, ServedModel]]:
        """(model, version, served) of each version out of service with no successor, still draining."""


class ModelStore(Protocol):
    """The model repository, as the server drives and reads it."""

    async def start(self) -> None: ...

    async def close(self, deadline: float | None = None) -> None:
        """Drain until `deadline` (time.monotonic()), answer what is left, unload everything."""

    def stop_load_calls(self) -> None:
        """The shutdown began: a load call ending from now on is answered 503 (the close unloads it)."""

    def hurry(self, deadline: float) -> None:
        """A close running now waits no later than `deadline` (a second signal brought it forward)."""

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The serving version; raises NotFound / ModelUnavailable / ShuttingDown."""

    def all_ready(self) -> bool: ...

    def not_serving(self) -> tuple[str, bool]:
        """What holds readiness back (how many models, why, the first few names; "" for nothing), for the
        log, and whether it stays so until something happens (no model loading or still to load)."""

    def serving_versions(self, name: str) -> list[str]:
        """The versions of `name` in service (as `index` lists them, without building it)."""

    def models_served(self) -> int:
        """How many models have a version in service (cheap: called as requests are charged)."""

    def index(self, ready_only: bool = False) -> list[dict]:
        """The index as the models folder was last read (no I/O: /metrics, the statistics)."""

    async def index_now(self, ready_only: bool = False) -> list[dict]:
        """The index of the folder as it is now (the repository API's; it may read the folder)."""

    load_retries: Mapping[str, int]  # model -> automatic load retries so far

    def load_failures(self) -> dict[tuple[str, str], str]:
        """(model, version) -> why its last load failed, while it is failing."""

    def add_listener(self, callback: Callable) -> None:
        """callback(event, name, version, **info) on loaded / reloaded (info: seconds, the load's
        duration; reloaded also replaced, the ServedModel it took over from, draining now),
        unloading (info: served, the ServedModel out of service with no successor, draining now),
        unloaded, load_failed (info: reason; the version empty: the model's files cannot be served as
        they are, its config broken, say), retired (that replaced version has closed; info:
        served, the ServedModel it was)."""

    def draining(self) -> Draining: ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str) -> None: ...


class Runtime(Protocol):
    """The ACL runtime (runtime.AclRuntime)."""

    kind: str | None  # "cpu" or "npu" once started

    def start(self) -> object: ...

    def close(self) -> None: ...

    def open_devices(self, device_ids: Iterable[int]) -> None:
        """Open those of `device_ids` the host has, for their memory rows (blocking: ACL calls)."""

    def memory(self, refresh: bool = False) -> list[dict]:
        """Device memory rows {"device", "used", "total", "reserve"}; refresh=True calls ACL (blocking)."""

    def abandoned_instances(self) -> int:
        """Instances left allocated at close because the device still ran their work (no ACL call)."""

    def on_device_failure(self, callback, after: str) -> None:
        """`callback(device_id, code)`, from a runtime thread, when a device is found failed as a
        whole; `after` says in the runtime's ERROR line what follows."""

    def failed_devices(self) -> int:
        """How many devices were found failed as a whole (no ACL call)."""
