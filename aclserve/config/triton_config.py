"""A Triton model folder's `config.pbtxt` as a model's settings: protobuf's text format parsed into
Triton's ModelConfig message (tritonclient's model_config_pb2, the module the gRPC ModelConfig RPC
answers with), then translated into the mapping a model's config.yaml gives, which layers over
`model_defaults` and is validated as that file is (files.layer_model_config).

Triton's meaning is kept. A message the file gives (dynamic_batching, a queue policy, a
version_policy, instance_group) is read whole, the fields it leaves out taking Triton's defaults:
proto3 cannot tell a field left out from one set to its default, and Triton reads them as its
defaults (a `dynamic_batching { }` has no queue delay, one priority level, unbounded queues without
deadlines, no timeout override). A message it leaves out leaves model_defaults' settings, and so
do the settings Triton has no field for (slots, retry, timeouts, batch_formation, compile, images;
max_batch_size sets an .onnx's batch sizes, compile.batch, unless model_defaults gives them);
but without dynamic_batching Triton batches no requests together, unless its ONNX Runtime backend
completes the config (no input or no output listed), which adds `dynamic_batching { }`.
What aclserve cannot honour is refused, naming the field, where ignoring it would change answers or
scheduling; what changes neither is named in a note."""
from __future__ import annotations

import dataclasses
import os

from google.protobuf import text_format

from ..om.gears import DEFAULT_GEARS, MAX_BATCH_SIZE, MAX_GEARS
from ..regular_files import open_regular
from ..runtime.limits import MAX_INSTANCES
from .checks import MAX_MS
from .files import bounded_text, layer_model_config
from .model import MAX_PRIORITY_LEVELS
from .schema import ConfigError, ConfigFileUnread, ModelConfig
from .triton_backend import ONNXRUNTIME, triton_backend
from .triton_tensors import declared_tensors

PBTXT = "config.pbtxt"
_MAX_US = MAX_MS * 1000  # durations in microseconds, where aclserve's are in milliseconds
_PLATFORMS = ("", "onnxruntime_onnx", "ascend_om")  # (ascend_om: aclserve's own, as /config shows it)
_BACKENDS = ("", "onnxruntime")
_MODEL_FILES = ("", "model.onnx", "model.om")
# fields that change neither answers nor scheduling here, named in the note when given
_PASSED_OVER = ("runtime", "optimization", "parameters", "response_cache", "metric_tags",
                "model_metrics", "cc_model_filenames", "model_operations", "model_transaction_policy")
_REFUSED = {
    "sequence_batching": "aclserve has no sequence batcher: a stateful model's requests would run without "
                         "their sequence's state (a model that keeps no state between requests: remove it)",
    "ensemble_scheduling": "aclserve serves single models, not ensembles",
    "batch_input": "aclserve adds no batch inputs to a model's inputs",
    "batch_output": "aclserve scatters no batch outputs",
    "model_repository_agents": "repository agents change the model files Triton loads (checksums, decryption); "
                               "aclserve loads them as they are",
}


def _messages():
    """tritonclient's model_config_pb2, imported when a config.pbtxt is read: importing it imports
    grpc (tritonclient.grpc's package does), which only server/ needs otherwise."""
    from tritonclient.grpc import model_config_pb2
    return model_config_pb2


def read_pbtxt(path: str | os.PathLike):
    """Triton's ModelConfig message in the file at `path`. Raises ConfigError blamed on it; a FIFO,
    socket or device node is refused unopened."""
    try:
        with open_regular(path, "r", "utf-8") as f:
            text = bounded_text(f, path).removeprefix("\ufeff")  # a byte order mark, invisible in an editor
    except OSError as e:
        raise ConfigFileUnread("", f"cannot read config file: {e.strerror}", str(path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError("", f"not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x})", str(path)) from None
    message = _messages().ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:  # "3:5 : Message type ... has no field named ..."
        said = str(e).partition(" : ")[2]
        problem = f"line {e.GetLine()}, column {e.GetColumn()}: {said}" if e.GetLine() > 0 and said else str(e)
        raise ConfigError("", f"invalid text format: {' '.join(problem.split())[:300]}", str(path)) from None
    except RecursionError:
        raise ConfigError("", "invalid text format: nested too deeply", str(path)) from None
    return message


def model_file_named(message) -> str:
    """The version folder's file a config.pbtxt's ModelConfig `message` names in default_model_filename
    (model.onnx or model.om), which Triton loads alone; "" when it names none (or none of them, which
    load_triton_config refuses), or `message` is None."""
    named = message.default_model_filename if message is not None else ""
    return named if named in _MODEL_FILES else ""


def load_triton_config(path: str | os.PathLike, name: str, defaults: ModelConfig,
                       notes: list[str] | None = None, message=None) -> ModelConfig:
    """Model `name`'s config.pbtxt at `path` over `defaults`, as load_model_config does a YAML file
    (errors blamed on `path`, with the pbtxt's field path). `notes` gets what was passed over.
    `message`: the file's ModelConfig as read_pbtxt read it already (None: it is read here)."""
    message = read_pbtxt(path) if message is None else message
    said: list[str] = []
    try:
        data = translate(message, name, defaults.devices, said, triton_backend(message, os.path.dirname(path)))
        from_pbtxt = _compile_gears(message, data, defaults.compile.batch, said)
        declared = declared_tensors(message)
    except ConfigError as e:
        raise ConfigError(e.path, e.problem, str(path)) from None
    if "default_queue_policy" in data["batching"]:
        # its dynamic_batching (given, or implied as Triton's backend does) is read whole: not model_defaults' levels
        batching = dataclasses.replace(defaults.batching, priority_queue_policy={}, priority_queue_fields={})
        defaults = dataclasses.replace(defaults, batching=batching)
    config = layer_model_config(data, defaults, path, notes)
    if "default_queue_policy" in data["batching"] and not message.dynamic_batching.priority_levels:
        # Triton's 0: priorities off, run as one level (translated so above); /config shows 0 as Triton's
        config = dataclasses.replace(config, batching=dataclasses.replace(config.batching, priorities_off=True))
    if notes is not None:
        notes.extend(said)
    if from_pbtxt:  # (what is said of them: a load refused for memory, an .om's scan: repository/)
        preferred = tuple(sorted(set(message.dynamic_batching.preferred_batch_size)))
        config = dataclasses.replace(config, batch_from_pbtxt=True, preferred_batch_sizes=preferred)
    labelled = {out.name for out in message.output if out.label_filename}  # (read as Triton reads them: labels.py)
    outputs = {n: dataclasses.replace(o, labels_as_triton=n in labelled) for n, o in config.outputs.items()}
    gpus = tuple(tuple(group.gpus) for group in message.instance_group)  # (its tensors: compared at load, declared.py)
    return dataclasses.replace(config, declared=declared, outputs=outputs, pbtxt_gpus=gpus)


def translate(message, name: str, devices: tuple[int, ...], notes: list[str], backend: str = "") -> dict:
    """The config.yaml mapping of Triton's ModelConfig `message` for the model `name` whose
    default devices are `devices` and Triton backend `backend` (triton_backend.py). Raises
    ConfigError naming the pbtxt's field; `notes` gets a line for what it passes over."""
    if message.name and message.name != name:
        raise ConfigError("name", f"is {message.name!r}, not the model's folder name {name!r} (Triton refuses it too)")
    _refuse_the_unservable(message)
    data: dict = {"batching": _batching(message, notes)}
    if message.HasField("version_policy"):
        data["version_policy"] = _version_policy(message.version_policy)
    if message.instance_group:
        data.update(_instances(message, devices, notes, backend == ONNXRUNTIME))
    if message.model_warmup:
        warmup = _warmup_data(message.model_warmup, notes)
        if warmup is not None:
            data["warmup_data"] = warmup
    labels = {out.name: {"labels": out.label_filename} for out in message.output if out.label_filename}
    if labels:
        data["outputs"] = labels
    passed = [f.name for f in _given(message) if f.name in _PASSED_OVER]
    passed += _passed_in(message)
    if passed:
        notes.append(f"passed over (aclserve's answers and scheduling do not depend on them): {', '.join(passed)}")
    return data


def _given(message) -> list:
    """The fields `message` sets (a scalar to other than its default, a message, a non-empty list)."""
    return [field for field, _ in message.ListFields()]


def _refuse_the_unservable(message) -> None:
    for field in _given(message):
        if field.name in _REFUSED:
            raise ConfigError(field.name, _REFUSED[field.name])
    if message.platform not in _PLATFORMS:
        raise ConfigError("platform", f"{message.platform!r}: aclserve serves ONNX and OM models (platform "
                                      "onnxruntime_onnx, or none)")
    if message.backend not in _BACKENDS:
        raise ConfigError("backend", f"{message.backend!r}: aclserve serves ONNX and OM models (backend "
                                     "onnxruntime, or none)")
    if message.default_model_filename not in _MODEL_FILES:
        raise ConfigError("default_model_filename", f"{message.default_model_filename!r}: aclserve serves "
                                                    "<version>/model.om or <version>/model.onnx (rename the files)")
    if message.model_transaction_policy.decoupled:
        raise ConfigError("model_transaction_policy.decoupled", "aclserve answers each request once (a model that "
                                                                "answers each once: remove decoupled)")
    _check_preferred_sizes(message)


def _check_preferred_sizes(message) -> None:
    """Triton's refusal of a preferred_batch_size (sizes an .onnx is compiled with: _compile_gears)
    that is not positive or over max_batch_size (model_config_utils.cc), but where its ONNX Runtime
    backend completes a max_batch_size of 0 (no input or output listed): the model gives that one."""
    cap = message.max_batch_size
    if cap < 0 or (cap == 0 and not (message.input and message.output)):  # (a negative one: _batching's refusal)
        return
    for size in message.dynamic_batching.preferred_batch_size:
        if not 0 < size <= cap:
            raise ConfigError("dynamic_batching.preferred_batch_size", f"{size}: must be positive and at most "
                                                                       f"max_batch_size ({cap}; Triton refuses it too)")


def _passed_in(message) -> list[str]:
    """Fields inside the messages translated that change nothing here, as the note names them."""
    passed = []
    if message.platform or message.backend:
        passed.append("platform and backend (the model runs as an OM; an .onnx is compiled to one)")
    tensor_fields = sorted({f.name for t in [*message.input, *message.output] for f in _given(t)}
                           - {"name", "label_filename", "data_type", "dims", "reshape"})  # (those: checked at load)
    if tensor_fields:
        passed.append(f"input and output {', '.join(tensor_fields)} (the model's own are served)")
    group_fields = sorted({f.name for g in message.instance_group for f in _given(g)}
                          - {"name", "kind", "count", "gpus"})
    if group_fields:
        passed.append(f"instance_group {', '.join(group_fields)}")
    if message.dynamic_batching.priority_queue_policy and not message.dynamic_batching.priority_levels:
        passed.append("dynamic_batching.priority_queue_policy (priority_levels is 0: one level, its "
                      "default_queue_policy)")
    return passed


def _compile_gears(message, data: dict, given: tuple[int, ...] | None, notes: list[str]) -> bool:
    """An .onnx's batch sizes (compile.batch) from max_batch_size N > 0 unless model_defaults gives
    them (`given`): the default sizes below N, N and the preferred sizes (batches form at them
    unpadded). N of 1 compiles 1 and 2 (one size alone has no batch dimension). An N past
    MAX_BATCH_SIZE compiles up to that, served as an .om of fewer sizes is (served.py warns; layout.py
    notes an .om's preferred sizes passed over). True when the sizes were set."""
    cap, preferred = message.max_batch_size, message.dynamic_batching.preferred_batch_size
    if given is not None or cap < 1:
        if preferred:
            notes.append("dynamic_batching.preferred_batch_size passed over: batches form at the model's compiled "
                         "batch sizes, which /config lists as preferred_batch_size")
        return False
    largest = min(cap, MAX_BATCH_SIZE)
    gears = sorted({g for g in DEFAULT_GEARS if g < largest} | {largest, max(largest, 2)}  # (1: 1 and 2)
                   | {size for size in preferred if size <= largest})
    if len(gears) > MAX_GEARS:
        raise ConfigError("dynamic_batching.preferred_batch_size",
                          f"with max_batch_size {cap} makes {len(gears)} batch sizes to compile an .onnx with: at "
                          f"most {MAX_GEARS} are allowed")
    data["compile"] = {"batch": gears}  # (/config lists them as preferred_batch_size)
    return True


def _batching(message, notes: list[str]) -> dict:
    cap = message.max_batch_size
    if cap < 0:
        raise ConfigError("max_batch_size", f"must be >= 0, got {cap} (Triton refuses it too)")
    batching: dict = {"max_batch_size": cap}
    given = message.HasField("dynamic_batching")
    # Triton's ONNX Runtime backend completes a config that lists no inputs or no outputs (as it
    # does by default): a max_batch_size of 0 from the model (its default-max-batch-size, 4, for a
    # model with a batch dimension; here its largest compiled batch size), and dynamic_batching { }
    # when that is over 1 and the config has no scheduler
    completes = not (message.input and message.output)
    filled = completes and cap == 0
    dynamic = given or (completes and (cap > 1 or filled))
    # requests are batched together only by a dynamic batcher, and only along a batch dimension
    batching["enabled"] = dynamic and (cap > 0 or filled)
    implied = "" if given else ", batched as dynamic_batching { }"
    # what the config leaves out, named: "no input or output listed" read as neither when one was
    unlisted = ("no input or output" if not (message.input or message.output)
                else "no input" if not message.input else "no output")
    if filled:
        notes.append(f"max_batch_size 0 with {unlisted} listed: the model's{implied}, as Triton's ONNX "
                     "Runtime backend completes such a config (its largest compiled batch size here; Triton's "
                     "default-max-batch-size: 4)")
    elif cap == 0:
        notes.append("max_batch_size 0: requests run one at a time, each whole, as Triton runs a model without "
                     "a batch dimension (a model compiled with batch sizes shows its largest as max_batch_size)")
    elif not given and dynamic:
        notes.append(f"no dynamic_batching and {unlisted} listed{implied}, as Triton's ONNX Runtime "
                     "backend completes such a config")
    elif not given:
        notes.append("no dynamic_batching: requests run one at a time, as Triton runs them (dynamic_batching { } "
                     "batches them), under model_defaults' priority levels and queue limits (Triton's has none)")
    if not dynamic:
        return batching
    dynamic = message.dynamic_batching
    batching["max_queue_delay_ms"] = _ms(dynamic.max_queue_delay_microseconds,
                                         "dynamic_batching.max_queue_delay_microseconds")
    levels = dynamic.priority_levels
    if levels > MAX_PRIORITY_LEVELS:
        raise ConfigError("dynamic_batching.priority_levels", f"is {levels}, at most {MAX_PRIORITY_LEVELS} here")
    default = dynamic.default_priority_level
    if levels and not 1 <= default <= levels:
        raise ConfigError("dynamic_batching.default_priority_level",
                          f"must be within 1..{levels} (priority_levels), got {default} (Triton refuses it too)")
    batching["priority_levels"], batching["default_priority"] = (levels, default) if levels else (1, 1)
    if dynamic.preserve_ordering:
        _check_ordering(dynamic)
    batching["preserve_ordering"] = dynamic.preserve_ordering
    batching["default_queue_policy"] = _queue_policy(dynamic.default_queue_policy,
                                                     "dynamic_batching.default_queue_policy")
    per_level = {}
    for level in sorted(dynamic.priority_queue_policy) if levels else ():
        path = f"dynamic_batching.priority_queue_policy[{level}]"
        if not 1 <= level <= levels:
            raise ConfigError(path, f"level {level} is outside 1..{levels} (priority_levels; Triton refuses it too)")
        per_level[level] = _queue_policy(dynamic.priority_queue_policy[level], path)
    batching["priority_queue_policy"] = per_level
    return batching


def _check_ordering(dynamic) -> None:
    """Triton's own refusals of preserve_ordering (model_config_utils.cc): one level, no delayed deadlines."""
    if dynamic.priority_levels > 1:
        raise ConfigError("dynamic_batching.preserve_ordering", "takes one priority level, not "
                                                                f"{dynamic.priority_levels} (Triton refuses it too)")
    policies = [("default_queue_policy", dynamic.default_queue_policy)]
    policies += [(f"priority_queue_policy[{k}]", p) for k, p in sorted(dynamic.priority_queue_policy.items())]
    for where, policy in policies:
        if policy.default_timeout_microseconds and policy.timeout_action == _messages().ModelQueuePolicy.DELAY:
            raise ConfigError(f"dynamic_batching.{where}.timeout_action", "DELAY does not go with preserve_ordering "
                                                                          "(Triton refuses it too)")


def _queue_policy(policy, path: str) -> dict:
    """Every field: Triton's default for one the file leaves out (no size limit, no deadline,
    REJECT, no override), not default_queue_policy's nor model_defaults'."""
    actions = _messages().ModelQueuePolicy.TimeoutAction
    if policy.timeout_action not in actions.values():
        raise ConfigError(f"{path}.timeout_action", f"{policy.timeout_action} is not REJECT or DELAY")
    return {"max_queue_size": policy.max_queue_size,
            "default_timeout_ms": _ms(policy.default_timeout_microseconds, f"{path}.default_timeout_microseconds"),
            "timeout_action": actions.Name(policy.timeout_action).lower(),
            "allow_timeout_override": policy.allow_timeout_override}


def _ms(microseconds: int, path: str) -> float:
    if microseconds > _MAX_US:
        raise ConfigError(path, f"is {microseconds}, at most {_MAX_US} (24.8 days)")
    return microseconds / 1000


def _version_policy(policy) -> dict:
    """Triton's VersionsToLoad (model_lifecycle.cc): `specific`, `latest`, and all versions for
    `all` or a policy choosing no kind (`version_policy { }`); `latest` of 0 versions (`latest { }`)
    selects none, and Triton refuses the model (a policy left out is latest 1: model_defaults')."""
    kind = policy.WhichOneof("policy_choice")
    if kind in ("all", None):
        return {"all": True}
    if kind == "specific":
        versions = sorted(set(policy.specific.versions))
        if not versions or versions[0] < 1:
            raise ConfigError("version_policy.specific.versions", "must list versions, positive integers, got "
                                                                  f"{list(policy.specific.versions)}")
        return {"specific": versions}
    if not policy.latest.num_versions:
        raise ConfigError("version_policy.latest.num_versions", "is 0: it selects no version (Triton refuses the "
                                                                "model too: at least one version must be available "
                                                                "under the version policy)")
    return {"latest": policy.latest.num_versions}


def _warmup_data(samples, notes: list[str]) -> str | None:
    """model_warmup as warmup_data, what aclserve warms up on (zeros or ones, every input alike,
    every compiled batch size three times): zero_data is zeros; random_data (Triton's random bytes)
    is ones, the data aclserve has that is not zeros; input_data_file is passed over (no file is
    read). None when nothing translates. An input without data Triton refuses too."""
    kinds = set()
    for i, sample in enumerate(samples):
        for name in sorted(sample.inputs):
            kind = sample.inputs[name].WhichOneof("input_data_type")
            if kind is None:
                raise ConfigError(f"model_warmup[{i}].inputs[{name}]", "gives no zero_data, random_data or "
                                                                      "input_data_file (Triton refuses it too)")
            kinds.add(kind)
    data = "ones" if "random_data" in kinds else "zeros" if "zero_data" in kinds else None
    said = [f"model_warmup read as warmup_data {data}" + (" (random_data: aclserve has no random data; ones are "
                                                          "its data other than zeros)" if data == "ones" else "")
            if data else "model_warmup passed over"]
    if "input_data_file" in kinds:
        said.append("its input_data_file passed over (aclserve warms up on zeros or ones, not a file's data)")
    if data == "ones" and "zero_data" in kinds:
        said.append("its zero_data inputs warmed up on ones too (one kind of data for every input)")
    notes.append("; ".join(said) + ": aclserve warms every compiled batch size up, three runs each, whatever the "
                                   "samples' batch_size, count and dims")
    return data


def _instances(message, devices: tuple[int, ...], notes: list[str], onnxruntime: bool) -> dict:
    """instances (and devices) of the instance groups. Triton's count is per GPU listed (every GPU
    when none is: here, the model's default devices) and in all for KIND_CPU and KIND_MODEL;
    aclserve puts each instance on the device holding the fewest (runtime/builder._placed), not where
    the groups say, so the groups must give every device they name as many."""
    kinds = _messages().ModelInstanceGroup.Kind
    on_device: dict[int, int] = {}
    in_all = 0  # KIND_CPU and KIND_MODEL instances: placed with the others
    for i, group in enumerate(message.instance_group):
        path = f"instance_group[{i}]"
        if group.passive:
            raise ConfigError(f"{path}.passive", "passive instances take no requests; aclserve's all do")
        kind = kinds.Name(group.kind) if group.kind in kinds.values() else str(group.kind)
        # Triton's default count: 1, and 2 for ONNX Runtime's KIND_CPU (model_config_utils.cc)
        count = group.count if group.count >= 1 else 2 if kind == "KIND_CPU" and onnxruntime else 1
        if kind in ("KIND_CPU", "KIND_MODEL"):
            if group.gpus:
                raise ConfigError(f"{path}.gpus", f"{kind} takes no gpus (Triton refuses it too)")
            in_all += count
            if kind == "KIND_CPU":
                notes.append(f"{path} KIND_CPU: its instances run on the model's devices, as all do here")
            continue
        for gpu in group.gpus or devices:
            if gpu < 0:
                raise ConfigError(f"{path}.gpus", f"{gpu} is not a device id")
            on_device[gpu] = on_device.get(gpu, 0) + count
    total = sum(on_device.values()) + in_all
    if total > MAX_INSTANCES:
        raise ConfigError("instance_group", f"makes {total} instances, at most {MAX_INSTANCES}")
    if len(set(on_device.values())) > 1:
        counts = ", ".join(f"{n} on device {d}" for d, n in sorted(on_device.items()))
        raise ConfigError("instance_group", f"places {counts}: aclserve spreads a model's instances evenly over "
                                            "its devices (instances and devices in a config.yaml)")
    placed = {"instances": total}
    if any(group.gpus for group in message.instance_group):
        placed["devices"] = sorted(on_device)
    return placed
