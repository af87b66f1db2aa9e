"""open_pool(): a model version's instances loaded on their devices, and the InstanceBuilder
that makes them (again, for a rebuild)."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Sequence

from . import device_health
from .device import NoRoom
from .instance import ModelInstance
from .kept_file import KeptFile, identity_of
from .left_on_device import LeftOnDevice
from .limits import ResourceLimitError
from .execution_timeout import UNMEASURED_TIMEOUT_MS
from .pool import InstancePool

log = logging.getLogger(__name__)

# Placing a model's instances and claiming their share of the devices is one step: parallel loads
# (load_threads) each count the others' instances, or both went on the device that held the fewest.
_PLACING = threading.Lock()


class InstanceBuilder:
    """Builds the instance of a pool's lane on that lane's device: for open_pool, and again for
    a rebuild, which claims its streams and events on the device's ledger. An instance's share
    goes back when the instance is freed (ModelInstance.when_freed): at its close, or for one
    abandoned on a hung device (teardown.py) once the device lets go, since its streams and
    events exist until then.

    A rebuild reads the model by its path again when the file there is the one the pool opened
    (the identity the repository watches: inode, size, mtime, ctime, taken before the first
    load); a file replaced since belongs to the version that will replace this one, and loading
    it here would serve another model under this version's name. The file the pool opened is
    then read through the KeptFile (kept_file.py; `keep_open`), as long as it is unchanged: a
    version still serving after its replacement failed to load (garbage renamed over the file)
    could not rebuild an instance, and one device fault per instance took it down for good.
    `close()` lets the kept file go (the pool's close). `left` counts every instance it makes
    (open_pool's and the rebuilds') until it is freed (left_on_device.py)."""

    def __init__(self, runtime, path: str, name: str, placed: list, slots: int, claimed_slots: int,
                 reset_timeout_ms: int = 10_000, keep_open: bool = True, owner: str | None = None):
        self._acl = runtime.acl
        self.path, self.name, self.placed, self.slots = path, name, placed, slots
        self.owner = owner or name  # the model its instances' shares of the ledgers are counted to (open_pool)
        self.reset_timeout_ms = reset_timeout_ms  # each instance's bound on waiting for the device
        self.claimed_slots = claimed_slots  # what each instance claims on its device's ledger
        try:
            self._identity: tuple | None = _file_identity(path)
        except OSError:
            self._identity = None  # create() says why it cannot be loaded
        self._kept = KeptFile.open(path, self._identity) if keep_open and self._identity else None
        self.left = LeftOnDevice()

    def confirm(self) -> None:
        """After the first loads: if the file changed meanwhile, the kept file may not hold what
        the instances loaded, so it is let go."""
        try:
            unchanged = _file_identity(self.path) == self._identity
        except OSError:
            unchanged = False
        if not unchanged:
            self.close()

    def close(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    def create(self, lane: int, execution_timeout_ms: int, path: str | None = None) -> ModelInstance:
        """An instance whose resources are claimed already, loaded from `path` (default: the
        model's own)."""
        return ModelInstance(self._acl, self.placed[lane], path or self.path, f"{self.name}#{lane}",
                             slots=self.slots, execution_timeout_ms=execution_timeout_ms,
                             reset_timeout_ms=self.reset_timeout_ms)

    def build(self, lane: int, execution_timeout_ms: int) -> ModelInstance:
        """A replacement for `lane`, with a claim of its own (blocking: loads the model).
        DeviceFailed, before anything is loaded, on a device that failed as a whole (probed:
        device_health.py): no instance can run there again in this process."""
        failed = device_health.failure(self.placed[lane])
        if failed is not None:  # (the pool's rebuild thread gives up: said here, once per lane)
            log.warning("%s#%d: instance is not rebuilt: %s", self.name, lane, failed)
            raise failed
        with self._source() as path:  # the model's own path, or a temp copy of the file the pool opened
            device = self.placed[lane]
            need = device.ledger.need(1, self.claimed_slots)
            device.ledger.claim(need, f"a rebuilt instance of model {self.name} ({self.claimed_slots} slots)",
                                self.owner)
            try:
                instance = self.create(lane, execution_timeout_ms, path)
            except BaseException as error:
                device.ledger.release(need)
                if isinstance(error, NoRoom):  # (the old instance too while it is not closed: each try's own)
                    raise _held_by_its_own(error, self.name, self.left.on(device)) from error.__cause__
                raise
        instance.when_freed(device.ledger.hold(need, instance.leaving, self.owner))
        self.left.track(instance)  # (after its claim's release: a load retried on its word finds the room)
        return instance

    @contextlib.contextmanager
    def _source(self):
        """The path to load: the model's own when the file there is the one the pool opened;
        else a temp copy of the kept file, when that is unchanged; else why not (RuntimeError)."""
        try:  # (decided before any yield: an error of the with-block must not land in this try)
            same, error = self._identity is not None and _file_identity(self.path) == self._identity, None
        except OSError as e:
            same, error = False, e
        if same:
            yield self.path
            return
        kept = self._kept
        if kept is not None and kept.unchanged():
            with kept.copy_out(_safe(self.name)) as copy:
                yield copy
            return
        if error is not None:
            raise RuntimeError(f"model file {self.path} cannot be read again: {error.strerror}") from None
        raise RuntimeError(f"model file {self.path} changed since this version was loaded; it is not "
                           f"loaded into this version (the repository serves it as a new one)")

    def dispose(self, instance: ModelInstance) -> None:
        """Close a replaced (or unneeded) instance; its claim goes back once it is freed (for an
        abandoned one, when the device lets go of it: teardown.py)."""
        try:
            instance.close()
        except Exception:
            log.exception("%s: closing instance %s failed", self.name, instance.name)


def _file_identity(path: str) -> tuple[int, int, int, int, int]:
    return identity_of(os.stat(path))


def _safe(name: str) -> str:
    """A model name as part of a temp file's name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]


def open_pool(runtime, path: str, name: str, instances: int = 1, devices: Sequence[int] = (0,),
              slots: int = 2, retry: bool = True, execution_timeout_ms: int = UNMEASURED_TIMEOUT_MS,
              rebuild: bool = True, claimed_slots: int | None = None,
              reset_timeout_ms: int = 10_000, owner: str | None = None) -> InstancePool:
    """Load `instances` copies of the OM over `devices`, each on the one holding the fewest instances
    (_placed: ties by the list's order), one without the memory for it passed over (blocking; run off the loop).

    The streams and events the instances need are claimed on each device first, so a
    configuration the device cannot hold is refused (ResourceLimitError) before anything loads.
    `claimed_slots` (default `slots`): the slots each instance claims there, more than it
    builds when the CPU runtime stands in for an NPU that would build more (`slots: auto`).
    `rebuild`: an instance out of rotation is replaced in the background. `reset_timeout_ms`: how
    long each instance waits for the device after a fault, or when it closes (teardown.py). DeviceFailed,
    before anything loads, when a device it would load on was found failed as a whole (device_health.py).
    `owner` (default `name`): the model the instances' shares are counted to on the ledgers, its versions'
    alike (a refusal only its own serving ones cause is a BesideItsOwn: runtime/limits.py)."""
    claimed = _claimed(slots, claimed_slots)
    built: list[ModelInstance] = []
    with contextlib.ExitStack() as undo:
        unbuilt: dict = {}  # Device -> instances claimed for there, not built yet
        undo.callback(_release_unbuilt, unbuilt, claimed)
        with _PLACING:  # placed and claimed in one step: a load beside it counts these
            placed = _placed(runtime, instances, devices)
            builder = InstanceBuilder(runtime, path, name, placed, slots, claimed, reset_timeout_ms,
                                      keep_open=rebuild, owner=owner)
            undo.callback(builder.close)  # (the last thing a failed open does, as a pool's close)
            for device, count, need, what in _claims(placed, name, claimed):
                device.ledger.claim(need, what, builder.owner)
                unbuilt[device] = count
        for k in range(instances):
            instance = _create_where_room(runtime, builder, k, devices, unbuilt, execution_timeout_ms)
            # from here on the instance's share goes back when it is freed (maybe after its close)
            unbuilt[instance.device] -= 1
            ledger = instance.device.ledger
            instance.when_freed(ledger.hold(ledger.need(1, claimed), instance.leaving, builder.owner))
            builder.left.track(instance)
            undo.callback(instance.close)
            built.append(instance)
        _check_same_model(built)
        builder.confirm()
        pool = InstancePool(name, built, retry=retry, builder=builder if rebuild else None, left_on_device=builder.left)
        # the pool owns the instances from here (it closes those serving, a rebuild the one it replaced): the
        # undo stack lets them go, or each replaced one stayed in memory until the pool's close
        undo.pop_all()
    pool.on_close(builder.close)
    return pool


def check_room(runtime, name: str, instances: int = 1, devices: Sequence[int] = (0,), slots: int = 2,
               claimed_slots: int | None = None, owner: str | None = None) -> bool:
    """Before a load's long steps (an .onnx's compile): what open_pool with these arguments
    refuses from them alone, in its words: NoSuchDevice, DeviceFailed (a device known failed as a
    whole), or ResourceLimitError when a device cannot
    hold the streams and events of the instances placed there, even once the shares on their way
    back there are back (DeviceLedger.check: a version retired, an instance closing). Claims
    nothing (open_pool's claim decides); returns whether they fit now. Blocking: opens the devices.
    `owner`: open_pool's."""
    placed = _placed(runtime, instances, devices)
    fits = [device.ledger.check(need, what, owner or name) for device, _, need, what in
            _claims(placed, name, _claimed(slots, claimed_slots))]
    return all(fits)


def _placed(runtime, instances: int, devices: Sequence[int]) -> list:
    """Each instance's Device, every listed one of which must exist: one by one, the device of `devices`
    holding the fewest model instances now (every model's: its ledger's count, with those placed before it
    here), ties by the list's order; so one model alone on empty devices takes them in the list's order, again
    and again (3 over [1, 2]: 1, 2, 1), and models that share devices spread over them (each began at the
    list's first device: four models of one instance over [0, 1, 2, 3] all went on device 0). A device placed
    on must not be known failed as a whole (DeviceFailed: no probe; a load there would fail at its first run)."""
    if instances < 1:
        raise ValueError("instances must be >= 1")
    if not devices:
        raise ValueError("devices must name at least one device")
    _check_devices_exist(runtime, devices)
    held = _instances_by_device(runtime, devices)
    placed = []
    for _ in range(instances):
        device_id = _fewest_first(devices, held)[0]
        held[device_id] += 1
        placed.append(runtime.device(device_id))
    for device in placed:
        if (failed := device_health.known_failure(device)) is not None:
            raise failed
    return placed


def _instances_by_device(runtime, devices: Sequence[int]) -> dict[int, int]:
    """Device id -> the model instances claimed or held on it now (none on one not opened)."""
    counts = {}
    for device_id in devices:
        device = runtime.opened(device_id)
        counts[device_id] = device.ledger.instances if device is not None else 0
    return counts


def _fewest_first(devices: Sequence[int], held: dict[int, int]) -> list[int]:
    """`devices` by the instances they hold (`held`), ties by the list's order (a stable sort)."""
    return sorted(devices, key=lambda device_id: held[device_id])


def _create_where_room(runtime, builder: InstanceBuilder, lane: int, devices: Sequence[int], unbuilt: dict,
                       execution_timeout_ms: int) -> ModelInstance:
    """The lane's instance, on its placed device, or refused there for memory (NoRoom), on the next of
    the model's `devices` (fewest instances first, as placed) that can take its streams and events, its
    claim moved there with it: a device's memory is known only by the load. Refused on every one: the
    first refusal, naming the others tried (none of the list had room)."""
    tried: list = []
    first: NoRoom | None = None
    while True:
        device = builder.placed[lane]
        tried.append(device)
        try:
            return builder.create(lane, execution_timeout_ms)
        except NoRoom as error:
            first = first or error
        if not _moved(runtime, builder, lane, devices, tried, unbuilt):
            refusal = _none_had_room(first, [device.id for device in tried[1:]])
            # (builder.left counts those built so far, by device)
            raise _held_by_its_own(refusal, builder.name, builder.left.on(tried[0])) from first.__cause__


def _moved(runtime, builder: InstanceBuilder, lane: int, devices: Sequence[int], tried: list,
           unbuilt: dict) -> bool:
    """Whether the lane's claim moved to a device of `devices` not tried yet whose ledger takes it."""
    with _PLACING:
        for device_id in _fewest_first(devices, _instances_by_device(runtime, devices)):
            device = runtime.device(device_id)
            if device in tried or device_health.known_failure(device) is not None:
                continue
            need = device.ledger.need(1, builder.claimed_slots)
            try:
                device.ledger.claim(need, _claim_named(builder.name, 1, builder.claimed_slots), builder.owner)
            except ResourceLimitError:  # (its streams or events: no room there either)
                continue
            old = builder.placed[lane]
            unbuilt[old] -= 1
            old.ledger.release(old.ledger.need(1, builder.claimed_slots))
            unbuilt[device] = unbuilt.get(device, 0) + 1
            builder.placed[lane] = device
            return True
    return False


def _none_had_room(error: NoRoom, others: list[int]) -> NoRoom:
    """The refusal on the lane's first device, saying the other devices of its list tried had no room either."""
    if not others:
        return error
    said = f"device {others[0]}" if len(others) == 1 else "devices " + ", ".join(map(str, others))
    return error.said_as(f"{error.facts}; nor had {said} of its devices room for it", error.remedy)


def _release_unbuilt(unbuilt: dict, claimed: int) -> None:
    """A failed open's claims for the instances it did not build go back."""
    for device, count in unbuilt.items():
        if count:
            device.ledger.release(device.ledger.need(count, claimed))


def _claimed(slots: int, claimed_slots: int | None) -> int:
    """The slots an instance claims on its device's ledger: `claimed_slots` when more than it builds."""
    return max(slots, claimed_slots or slots)


def _claims(placed: list, name: str, claimed: int) -> list[tuple]:
    """Per device: (device, instances placed there, their Need, how a refusal names them)."""
    out = []
    for device in {d.id: d for d in placed}.values():
        count = sum(1 for d in placed if d is device)
        out.append((device, count, device.ledger.need(count, claimed), _claim_named(name, count, claimed)))
    return out


def _claim_named(name: str, instances: int, claimed: int) -> str:
    """How a ledger's refusal names a claim for `instances` instances of model `name` (its `what`,
    which a promise of room is matched by: runtime/limits.py)."""
    return f"model {name} ({instances} instance(s) x {claimed} slots)"


def _held_by_its_own(error: NoRoom, name: str, own: int) -> NoRoom:
    """A refusal for memory while `own` instances of the model hold some of the device's (not
    freed: a first load's built so far, or for a rebuild the others serving there, the one it
    replaces until that is closed, any abandoned): fewer of them is a remedy too (as the ledger's
    refusal for streams and events says), whatever else holds the rest."""
    if not own or not error.remedy:  # (none there, or one instance alone is larger than the device)
        return error
    held = f"{own} instance{'s' if own > 1 else ''} of model {name} already hold{'' if own > 1 else 's'} memory there"
    return error.said_as(error.facts, f"{held}: give the model fewer instances or spread them over more devices, or "
                                      f"{error.remedy}")


class NoSuchDevice(ValueError):
    """The devices a model is to load on name one this host has not; the message names them, and
    `missing` and `said_of` let a config.pbtxt name them in its own field (repository/served.py)."""

    def __init__(self, devices: Sequence[int], missing: Sequence[int], count: int):
        self.devices, self.missing, self.count = tuple(devices), tuple(missing), count
        super().__init__(f"devices {self.said_of(devices)}")

    def __reduce__(self):  # (pickled, made again of its parts: its __init__ takes no message)
        return NoSuchDevice, (self.devices, self.missing, self.count)

    def said_of(self, listed: Sequence[int]) -> str:
        """"[0, 5]: this host has no device 5 (it has ...)", of the ids `listed` (the missing among them)."""
        missing = [d for d in self.missing if d in listed]
        has = {0: "none", 1: "device 0"}.get(self.count, f"devices 0..{self.count - 1}")
        return (f"{list(listed)}: this host has no device{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(str, missing))} (it has {has}: the ids this process sees, from 0)")


def _check_devices_exist(runtime, devices: Sequence[int]) -> None:
    """Every device listed, not only those the instances land on: `devices: [0, 5]` with one
    instance loaded on a host of one device and failed only once a second instance was placed."""
    count = runtime.device_count()
    missing = [d for d in dict.fromkeys(devices) if not 0 <= d < count]
    if missing:
        raise NoSuchDevice(devices, missing, count)


def _check_same_model(instances: list[ModelInstance]) -> None:
    first = instances[0].model
    for other in instances[1:]:
        if other.model.inputs != first.inputs or other.model.gears != first.gears:
            raise RuntimeError("instances of one pool loaded different models")
