"""One served model version: its InstancePool and its DynamicBatcher, opened and closed here.

This module is the repository's only caller of the runtime's pool (`open_pool`, `warm_up`,
`set_execution_timeout`, `close`, its tensor specs and gears) and of the scheduling package's
DynamicBatcher.

`open_version` opens the pool, warms it up and starts the batcher; on failure it closes what it
opened before the error propagates; cancelled (the repository closing), it abandons the load to
its thread, which closes what it opened once it returns (handoff.py). `infer` delegates to the
batcher. When the version is retired (replaced or unloaded) it leaves the serving map first;
`close` then drains its batcher (no new requests; the queued and in-flight ones finish), closes
the batcher (what the drain left is answered 503) and, in a worker thread, the pool (an
instance the device has not let go of by the pool's deadline is abandoned, not waited for:
runtime/teardown.py). A request that raced the swap and is refused by the draining batcher is
re-sent once to the successor when that takes the same tensors (inputs, outputs, batch limit)
and, unless it runs the same model file, has the same labels and image plans (the request was
decoded, and will be answered, by this version's: with the same model that is what this version
would have answered, so a config-only edit of image settings fails nothing), and is the same
version reloaded, or another version while the request named none (a request to /versions/1 is
never answered by version 2; the result names the version that ran it), so a reload never fails
such a request (also when the caller held this object past the close of its batcher, e.g. while
reading a request body). Otherwise it is refused 503 with a message saying why and to send it
again: run by a model it was not checked against, it was answered wrongly or failed its whole
batch. A request this version refused as invalid once it had retired (its body still arriving
during the reload) is refused so too when its successor checks requests otherwise
(`invalid_since_retired`; the decisions: successor.py). Owned by the repository's Lifecycle;
used on the loop, blocking steps in the executor it is given.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from typing import Callable, Mapping

from .. import heap
from ..config import PBTXT, ConfigError, ModelConfig
from ..errors import InvalidInput, ModelUnavailable, ServeError, ShuttingDown
from ..om.compile_process import CompileStopped
from ..om.gears import MAX_BATCH_SIZE, MAX_BATCH_SIZE_WHY
from ..scheduling import BatchingConfig, DynamicBatcher
from . import overload
from .declared import TensorViews
from .handoff import Handoff
from .settings_fit import fitted_settings, origin
from .successor import check_refusal, handover_refusal, replaced
from .plan import Wanted

log = logging.getLogger(__name__)

# `slots: auto`. A second slot lets the next batch be packed and copied in while one computes.
# An NPU copies with its own engines beside the compute: two. The CPU runtime's "device" is the
# host's cores: with two or more, packing and copying run beside ONNX Runtime and two slots
# pay (measured unpinned on two cores, medium CNN binary at 64 clients: 2,182-2,304 req/s with
# two slots against 1,741-1,816 with one); confined to one core there is nothing to overlap
# with (pinned: 1,948-1,965 with one against 1,912-1,918 with two), and a second slot only
# commits a batch ahead of higher-priority requests (tools/bench_priority.py): one. The
# device's stream/event ledger is charged for an NPU's two either way, so a configuration an
# NPU could not hold is refused on the CPU runtime too.
NPU_SLOTS = 2
_WINDOW_MS = BatchingConfig.max_queue_delay_ms  # the embedded default's: no one set it for the model


class StoppedBeforeWarmUp(CompileStopped):
    """A load stopped once its compile had ended (or its turn come, for an .om), before it warmed
    up: an unload, the close, (poll mode) its file gone or replaced. Nothing serves, nothing failed;
    `om_path`: what it was to open (a compile cache entry, for an .onnx)."""

    def __init__(self, om_path: str):
        super().__init__("stopped before its warm-up")
        self.om_path = om_path


def auto_slots(runtime_kind: str) -> int:
    """Slots per instance under `slots: auto` for this process's runtime and CPU affinity."""
    if runtime_kind == "cpu" and len(os.sched_getaffinity(0)) < 2:
        return 1
    return NPU_SLOTS


def pool_shape(config: ModelConfig, runtime_kind: str) -> dict:
    """open_pool's placement of a version's instances, from its config alone: what its open
    claims, and what the check before an .onnx's compile asks (loader.py). With `slots: auto` an
    NPU's two slots are claimed, so the CPU runtime refuses what an NPU would."""
    return {"instances": config.instances, "devices": config.devices,
            "slots": config.slots or auto_slots(runtime_kind), "claimed_slots": config.slots or NPU_SLOTS}


def devices_refusal(error: ValueError, config: ModelConfig) -> ConfigError:
    """A NoSuchDevice (runtime/builder.py) as a setting that does not fit is named (settings_fit.py): a
    config.pbtxt's by the instance_group gpus listing the device (said as `devices`, a key it has not)."""
    for i, gpus in enumerate(config.pbtxt_gpus):
        if set(gpus) & set(getattr(error, "missing", ())):
            return ConfigError("", f"instance_group[{i}].gpus {error.said_of(gpus)}", origin(config, "devices"))
    return ConfigError("", str(error), origin(config, "devices"))


class ServedVersion:
    def __init__(self, name: str, version: str, pool, batcher, config: ModelConfig, source: str,
                 om_path: str, load_seconds: float, wanted: Wanted, images=None, labels=None, value_ranges=None,
                 views: TensorViews | None = None):
        self.name = name
        self.version = version
        self.pool = pool
        self.batcher = batcher
        self.config = config  # with every `auto` queue limit resolved
        self.source = source  # the file in the models folder (.om or .onnx)
        self.om_path = om_path  # what was loaded (the compile cache entry for an .onnx)
        self.load_seconds = load_seconds
        self.wanted = wanted  # the file identity + config this version came from
        self.images = images  # images.ImageStage for its image inputs, or None
        self.labels = labels or {}  # output name -> class labels
        self.value_ranges = value_ranges or {}  # integer input name -> value_ranges.ValueRange
        self.views = views  # a config.pbtxt's tensors: their shapes as clients see them (declared.py), or None
        self.reshapes = views.reshapes if views else None  # None: requests and answers go as they are
        self._successor: Callable[[], "ServedVersion | None"] | None = None

    def reselected(self, wanted: Wanted) -> None:
        """Kept in service by a config whose version_policy alone changed (plan.Wanted.reselects):
        it now comes from that config (the diff's baseline, and its /config shows the new
        policy); nothing it runs with changes, so nothing reloads."""
        self.wanted = wanted
        self.config = dataclasses.replace(self.config, version_policy=wanted.config.version_policy)

    # what the server reads
    @property
    def inputs(self):
        """As clients see them: image inputs are BYTES, a config.pbtxt's with its dims (self.pool.inputs
        has the model's own)."""
        inputs = self.views.inputs if self.views else self.pool.inputs
        return self.images.client_inputs(inputs) if self.images else inputs

    @property
    def outputs(self):
        """As clients see them: a config.pbtxt's with its dims (self.pool.outputs has the model's own)."""
        return self.views.outputs if self.views else self.pool.outputs

    @property
    def max_batch_size(self) -> int:
        """The protocol's max_batch_size: the batcher's batch_limit (the largest compiled gear,
        or the configured cap when lower); 0 for a static model."""
        return self.batcher.batch_limit

    @property
    def gears(self) -> tuple[int, ...]:
        return tuple(self.pool.gears)

    async def infer(self, inputs, rows: int, priority: int | None = None, timeout_us: int | None = None,
                    trace=None, pinned: bool = False, waited_ns: int = 0):
        """The batcher's result; `pinned`: the request named this version (never handed to another);
        `waited_ns`: its wait for a decode thread, which its queue deadline counts.
        A config.pbtxt's reshapes turn the request's tensors into the model's shapes (views) and the
        model's outputs into the config's dims."""
        if self.reshapes is not None:
            inputs = self.reshapes.to_model(inputs)
        try:
            result = await self.batcher.infer(inputs, rows, priority, timeout_us, trace, waited_ns)
        except (ModelUnavailable, ShuttingDown):
            # refused because this version was retired after the caller looked it up (draining,
            # or already closed): hand the request to the version that took over, when it has
            # the same signature and is this one reloaded, or the request named no version
            successor = self._successor() if self._successor is not None else None
            if successor is None or successor is self:
                raise
            refusal = replaced(self, successor, pinned, handover_refusal(self, successor))
            if refusal is not None:
                raise refusal from None
            result = await successor.batcher.infer(inputs, rows, priority, timeout_us, trace, waited_ns)
            if successor.version != self.version:
                result = dataclasses.replace(result, version=successor.version)
        if self.reshapes is not None:  # (a successor's are the same: the same tensors, tensor_key)
            result = dataclasses.replace(result, outputs=self.reshapes.to_client(result.outputs))
        return result

    def invalid_since_retired(self, error: InvalidInput, pinned: bool) -> ServeError:
        """What answers a request this version refused as invalid (its tensors or pictures checked
        against this version's): `error`, unless the version was retired meanwhile (its body was
        still arriving, say) and the one that took over checks requests otherwise, or is another
        version while the request named this one (`pinned`): then the 503 a refused hand-over
        gets (successor.py)."""
        successor = self._successor() if self._successor is not None else None
        if successor is None or successor is self:
            return error
        return replaced(self, successor, pinned, check_refusal(self, successor)) or error

    def tensor_key(self) -> tuple:
        """The tensors a request decoded for this version holds (its values checked against the
        ranges) and its answer is made of."""
        return (tuple(self.inputs), tuple(self.pool.inputs), tuple(self.outputs), tuple(self.pool.outputs),
                self.max_batch_size, tuple(sorted(self.value_ranges.items())))

    def model_key(self) -> tuple:
        """The model that runs: the file in the models folder and what was loaded from it."""
        return (self.wanted.file.model_identity, self.om_path)

    def settings_key(self) -> tuple:
        """How a request's images became tensors and its classes are named."""
        plans = sorted((name, plan.key()) for name, plan in self.images.plans.items()) if self.images else None
        return (self.labels, plans)

    def retire(self, successor: Callable[[], "ServedVersion | None"]) -> None:
        """Out of the serving map: `successor()` names where raced requests go from now on. Its
        instances' streams and events are on their way back (a load's check before its compile counts them so)."""
        self._successor = successor
        self.pool.retire()

    async def close(self, drain_timeout_s: float, executor, deadline: float | None = None) -> None:
        """Drain (at most `drain_timeout_s`), close the batcher, then the pool in `executor`,
        waiting for the device until `deadline` (time.monotonic(); default: the pool's own
        bound). Failures are logged and closing goes on; safe twice."""
        try:
            await self.batcher.drain(drain_timeout_s)
        except Exception:
            log.exception("%s:%s: drain failed", self.name, self.version)
        try:
            await self.batcher.close()
            await asyncio.get_running_loop().run_in_executor(executor, self._close_pool, deadline)
        except Exception:
            log.exception("%s:%s: close failed", self.name, self.version)

    def hurry(self, deadline: float) -> None:
        """A close running now (or to come) waits for the device no later than `deadline`
        (time.monotonic()): the repository is closing while this version unloads."""
        self.pool.hurry(deadline)

    def _close_pool(self, deadline: float | None) -> None:
        """Blocking: frees every device resource of this version, then gives the freed heap
        back (heap.trim: without it RSS grows with every reload)."""
        self.pool.close(deadline)
        heap.trim()

    def __repr__(self) -> str:
        return f"<ServedVersion {self.name}:{self.version}>"


async def open_version(executor, runtime, name: str, version: str, om_path: str, wanted: Wanted,
                       started: float, progress: Callable[[str], None] = lambda step: None,
                       index_bounds: Mapping[str, int] | None = None,
                       stopped: Callable[[], bool] = lambda: False) -> ServedVersion:
    """Open `om_path` as `name:version`, warm it up and start its batcher; the blocking part runs
    in one thread of `executor` (_open_and_warm_up). On failure what it opened is closed before
    the error propagates; `stopped()` (called in that thread) true once it is open ends it there,
    before its warm-up: StoppedBeforeWarmUp. Cancelled (the repository closes while the version
    loads), it returns at once: the load is abandoned, said in one line; the thread, which cannot
    be stopped, closes what it opened once it returns (a load or warm-up hung on the device never
    does, and its device is not reset meanwhile: the process's exit ends it). `progress(step)`,
    called from that thread, hears the opening and each warm-up run begin, until the load is abandoned."""
    loop = asyncio.get_running_loop()
    config = wanted.config
    handoff: Handoff[tuple] = Handoff()
    try:
        pool, images, labels, ranges, views = await loop.run_in_executor(executor, functools.partial(
            _open_and_warm_up, runtime, om_path, f"{name}:{version}", wanted, handoff, progress, index_bounds or {},
            stopped, name))
    except asyncio.CancelledError:
        late = handoff.give_up()
        if late is not None:  # it came back as the loop was cancelled: closed in a load thread too
            with contextlib.suppress(RuntimeError):  # the threads are stopped: the process is ending
                executor.submit(late[0].close)
        log.warning("%s: version %s was still loading when the repository closed; the load is abandoned: "
                    "what it opened is closed when it returns, the shutdown does not wait for it past its "
                    "deadline, and its device is not reset meanwhile", name, version)
        raise
    try:
        pool.set_execution_timeout(config.execution_timeout_ms)  # 0: derived from the warm-up's costs
        config = overload.resolve(config, pool.gears, pool.gear_cost, len(pool.instances), f"{name}:{version}")
        batcher = DynamicBatcher(pool, config.batching, name=f"{name}:{version}")
        if not pool.gears:
            _batching_on_a_static_model(f"{name}:{version}", config.batching, wanted.config_path())
        elif config.batching.batch_cap > batcher.batch_limit:  # (it was taken in silence)
            _cap_above_the_gears(f"{name}:{version}", config.batching, batcher.batch_limit, wanted)
        batcher.start()
    except BaseException:
        await loop.run_in_executor(executor, pool.close)
        raise
    return ServedVersion(name, version, pool, batcher, config, wanted.file.path, om_path,
                         time.monotonic() - started, wanted, images=images, labels=labels, value_ranges=ranges,
                         views=views)


def _cap_above_the_gears(label: str, batching: BatchingConfig, largest: int, wanted) -> None:
    """A max_batch_size above the largest compiled batch size (it was taken in silence): requests
    of more rows are refused. The model's own config's in a WARNING (its owner asked for more);
    model_defaults' (or --max-batch), which fits no model in particular, in an INFO line."""
    own = "max_batch_size" in batching.own_keys
    pbtxt = os.path.basename(wanted.config_path() or "") == PBTXT
    # (an .om's sizes were fixed by ATC: its compile settings are passed over, layout.py; a config.pbtxt's
    # max_batch_size sets an .onnx's unless model_defaults' compile.batch does: triton_config.py)
    sizes = ("an .om's batch sizes were fixed when it was compiled: ATC's --dynamic_batch_size"
             if wanted.file.kind != "onnx" else
             f"an .onnx is compiled with batch sizes up to {MAX_BATCH_SIZE}, {MAX_BATCH_SIZE_WHY}"
             if wanted.config.batch_from_pbtxt else "model_defaults' compile.batch sets the sizes" if pbtxt
             else "compile.batch sets the sizes")
    log.log(logging.WARNING if own else logging.INFO, "%s: %s %d%s is above the largest compiled batch size %d: a "
            "batch holds %d rows at most, and a request of more is refused (%s)", label,
            "max_batch_size" if pbtxt else "batching.max_batch_size", batching.batch_cap,
            "" if own else " (model_defaults', or --max-batch)", largest, largest, sizes)


def _batching_on_a_static_model(label: str, batching: BatchingConfig, config_path: str | None) -> None:
    """A static model (no batch sizes compiled: no batch dimension) runs one request at a time. A
    max_batch_size over 0 its own config gives fails its load, as Triton refuses one for a model
    without a batch dimension; one from model_defaults (or --max-batch) and a batching window set
    for it are named in an INFO line: model_defaults' settings never fail a model (they were taken
    in silence)."""
    own = batching.own_keys
    if batching.batch_cap and "max_batch_size" in own:
        key = "max_batch_size" if os.path.basename(config_path or "") == PBTXT else "batching.max_batch_size"
        raise ValueError(f"{os.path.basename(config_path or '')}: {key} {batching.batch_cap} cannot apply: the model "
                         "has no batch dimension (compiled without batch sizes, it runs one request at a time); "
                         "set 0 or remove it (Triton refuses a max_batch_size over 0 for such a model too)")
    passed = [f"max_batch_size {batching.batch_cap} (model_defaults', or --max-batch)"] if batching.batch_cap else []
    if batching.max_queue_delay_ms and ("max_queue_delay_ms" in own or batching.max_queue_delay_ms != _WINDOW_MS):
        passed.append(f"max_queue_delay_ms {batching.max_queue_delay_ms:g}")
    if passed:
        log.info("%s: batching %s passed over: the model has no batch dimension (compiled without batch sizes, it "
                 "runs one request at a time)", label, " and ".join(passed))


def _zeros_remedy(wanted: Wanted) -> str:
    """What ends the reason of a warm-up that failed on zeros: how the model's config warms it up
    on ones, in that file's words (a config.pbtxt has no warmup_data: triton_config.py)."""
    if os.path.basename(wanted.config_path() or "") == PBTXT:
        return (f" (if the model cannot run on zeros, a model_warmup in its {PBTXT} whose inputs give random_data "
                "warms it up on ones)")
    return " (if the model cannot run on zeros, warmup_data: ones in its config warms it up on ones)"


def _open_and_warm_up(runtime, path: str, name: str, wanted: Wanted, handoff: Handoff,
                      progress: Callable[[str], None], index_bounds: Mapping[str, int],
                      stopped: Callable[[], bool], model: str) -> tuple | None:
    """A load thread: open the pool (its ledger shares counted to `model`, of which `name` is a version),
    plan its image inputs, match a config.pbtxt's tensors with its own (declared.py), read its labels,
    settle its inputs' value ranges, unless `stopped()` by then (StoppedBeforeWarmUp) warm it up (three
    runs per gear; times the gear costs the batcher plans with; it stops at the next run once the loop has
    given up, so a shutdown does not wait for a long warm-up), then hand (pool, images, labels,
    ranges, views) to the loop, or close the pool when the loop has given up meanwhile. While it
    runs, the runtime resets none of the model's devices (it is inside ACL calls, or its
    instances' work runs there: teardown.py). On failure the pool is closed and the error says
    what it left on the device (an instance a hung warm-up run kept, abandoned:
    runtime/left_on_device.py), which holds back the load's retry."""
    from ..runtime import open_pool, teardown, warm_up  # the runtime imports ACL; keep this module light to import
    from ..runtime.builder import NoSuchDevice
    from ..runtime.device import NoRoom
    from ..runtime.execution_timeout import UNMEASURED_TIMEOUT_MS
    from ..runtime.left_on_device import note_left

    config = wanted.config

    def warming(gear: int | None, run: int, runs: int) -> None:  # (after stop(): not given up)
        progress(f"warming up: gear {gear}, run {run + 1} of {runs}" if gear is not None
                 else f"warming up: run {run + 1} of {runs}")

    progress("opening on the device")
    with contextlib.ExitStack() as on_devices:
        for device in dict.fromkeys(config.devices):
            on_devices.enter_context(teardown.working_on(device, runtime))
        try:
            pool = open_pool(runtime, path, name=name, **pool_shape(config, runtime.kind), retry=config.retry,
                             # the warm-up waits for the device as long as a served batch would (with 0 that is
                             # derived from the warm-up's own costs, not known yet: the runtime's default)
                             execution_timeout_ms=config.execution_timeout_ms or UNMEASURED_TIMEOUT_MS,
                             reset_timeout_ms=config.reset_timeout_ms, owner=model)  # (its versions' shares alike)
        except NoSuchDevice as error:
            raise devices_refusal(error, config) from None
        except NoRoom as error:
            if not config.batch_from_pbtxt:
                raise
            # Triton allocates per request, so its configs often say 256 or 1024; here the largest
            # compiled batch size's buffers are taken at load: the setting to lower is named
            raise error.said_as(f"{error}, or lower {PBTXT}'s max_batch_size {config.batching.batch_cap} (it sets "
                                "the largest batch size compiled)") from None
        try:
            images, views, labels, ranges = fitted_settings(config, pool, index_bounds, name,
                                                            wanted.file.kind == "onnx")
            if stopped():  # (while it opened: its runs would be for nothing)
                raise StoppedBeforeWarmUp(path)
            warm_up(pool, stop=lambda: handoff.given_up, progress=warming, data=config.warmup_data,
                    remedy=_zeros_remedy(wanted),
                    timeout_remedy=_timeout_remedy(config.execution_timeout_ms, UNMEASURED_TIMEOUT_MS))
        except BaseException as error:
            pool.close()
            note_left(error, pool.left_on_device)  # a hung instance abandoned: no retry while it is (failures.py)
            raise
        return handoff.deliver((pool, images, labels, ranges, views), lambda opened: opened[0].close())


def _timeout_remedy(configured_ms: int, unmeasured_ms: int) -> str:
    """What ends the reason of a warm-up run past the execution timeout: the setting that bounds
    it. Retried all the same (a transient device error): the same timeout also ends a run the
    device hung on, which the server cannot tell from a slow one, and a run slowed by a busy
    host (other versions warming up beside it) may finish in time later (retry.warm_up_failure)."""
    if configured_ms:
        return f"; if a run takes longer, raise execution_timeout_ms ({configured_ms} ms) in the model's config"
    return (f"; if a run takes longer, set execution_timeout_ms in the model's config above it (0, the default, "
            f"gives a warm-up run {unmeasured_ms} ms)")
