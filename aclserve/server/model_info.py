"""Model metadata and Triton `ModelConfig` JSON for a served version (pure rendering).

Shapes as Triton gives them: metadata shapes keep the -1 batch dim of a batching model
(perf_analyzer drops the first dim when max_batch_size > 0); config `dims` exclude it. An input's
metadata shape is its config dims after that -1, as Triton derives it, so a tensor of no dimension
but the batch shows [-1, 1] (a static scalar [1]): with [-1] perf_analyzer kept no dims and sent
nothing. An output's metadata shape is the one its answers carry.
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

from ..images.plan import picture_layout
from ..runtime.types import TensorSpec
from ..scheduling.policy import QueuePolicy

PLATFORM = "ascend_om"


def triton_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def config_dims(spec: TensorSpec, batching: bool) -> tuple[list[int], list[int] | None]:
    """(dims, reshape) of `spec` in Triton's ModelConfig; reshape None when there is none."""
    dims = list(spec.shape[1:] if batching and spec.batched else spec.shape)
    if spec.reshape is not None:  # a config.pbtxt's: dims are what clients use, reshape what the model does
        return dims, list(spec.reshape)
    if not dims:  # Triton refuses empty dims: one element, reshaped to none (as it spells a scalar)
        return [1], []
    return dims, None


def input_metadata_shape(spec: TensorSpec, batching: bool) -> list[int]:
    """An input's metadata shape: its config dims after the batch's -1, as Triton's. Requests may
    still send the model's own shape, [N] for [N, 1] and [] for [1] (codec.check_input)."""
    return ([-1] if batching and spec.batched else []) + config_dims(spec, batching)[0]


def output_metadata_shape(spec: TensorSpec) -> list[int]:
    """An output's metadata shape: its answers' ([N] for a tensor of no dimension but the batch,
    where Triton, from the config's dims [1], would answer [N, 1]): answers keep the shape clients
    have read all along, and tritonclient and perf_analyzer take an output's shape from the answer."""
    return list(spec.shape)


def tensor_metadata(specs: Sequence[TensorSpec], shape_of: Callable[[TensorSpec], list[int]],
                    parameters: dict[str, dict] | None = None) -> list[dict]:
    out = []
    for s in specs:
        entry = {"name": s.name, "datatype": s.datatype, "shape": shape_of(s)}
        if parameters and s.name in parameters:
            entry["parameters"] = parameters[s.name]
        out.append(entry)
    return out


def label_files(served) -> dict[str, str]:
    """{output: labels file name} (Triton's label_filename) for outputs with labels (not those
    model_defaults names and the model passed over: labels.py)."""
    options = served.config.outputs
    return {name: os.path.basename(o.labels) for name, o in options.items() if o.labels and name in served.labels}


def model_metadata(served, versions: Sequence[str]) -> dict:
    images = served.images
    batching = served.max_batch_size > 0
    labels = {name: {"label_filename": f} for name, f in label_files(served).items()}
    inputs = dict(images.describe()) if images else {}  # (an image input has no value range)
    inputs.update({name: {"value_range": [r.low, r.high]} for name, r in served.value_ranges.items()})
    return {"name": served.name, "versions": list(versions), "platform": PLATFORM,
            "inputs": tensor_metadata(served.inputs, lambda s: input_metadata_shape(s, batching), inputs),
            "outputs": tensor_metadata(served.outputs, output_metadata_shape, labels)}


def _config_tensors(specs: Sequence[TensorSpec], batching: bool, is_input: bool,
                    labels: dict[str, str] | None = None) -> list[dict]:
    out = []
    for s in specs:
        dims, reshape = config_dims(s, batching)
        entry = {"name": s.name, "data_type": triton_type(s.datatype), "dims": dims}
        if reshape is not None:
            entry["reshape"] = {"shape": reshape}
        if is_input:  # ModelInput has a format, ModelOutput has none (model_config.proto)
            entry["format"] = _input_format(s, dims)
        if labels and s.name in labels:
            entry["label_filename"] = labels[s.name]
        out.append(entry)
    return out


def _input_format(spec: TensorSpec, dims: list[int]) -> str:
    """FORMAT_NCHW / FORMAT_NHWC for an input laid out as a picture of a fixed size with 1 or 3
    channels (Triton's image_client needs one of the two), FORMAT_NONE for any other: image_client
    would resize to a size of -1, or feed a 4-channel tensor as RGB."""
    # (an ATC OM may have dynamic H and W; a raw AIPP buffer, YUV420SP's [1.5H, W, 1] say, is no picture)
    if len(dims) != 3 or min(dims) < 1 or spec.datatype == "BYTES" or spec.raw_aipp_format:
        return "FORMAT_NONE"
    layout = picture_layout(spec.format, dims)
    channels = dims[0] if layout == "NCHW" else dims[-1] if layout == "NHWC" else None
    return f"FORMAT_{layout}" if channels in (1, 3) else "FORMAT_NONE"


def _queue_policy(policy: QueuePolicy) -> dict:
    return {"timeout_action": policy.timeout_action.upper(),
            "default_timeout_microseconds": int(policy.default_timeout_ms * 1000),
            "allow_timeout_override": policy.allow_timeout_override,
            "max_queue_size": policy.max_queue_size}


def _levels(batching) -> tuple[int, int]:
    """(priority_levels, default_priority_level) as Triton's ModelConfig has them: 0 and 0 for a
    config.pbtxt without levels (priorities off; run as one level)."""
    return (0, 0) if batching.priorities_off else (batching.priority_levels, batching.default_level)


def _queue_parameters(batching) -> dict[str, dict]:
    """The levels and queue policies in force on a model shown without dynamic_batching (one request
    per run): Triton has no field for them outside it, so they are string parameters named after
    dynamic_batching's fields, where clients that read /config find them (a queue's 503 named a
    limit /config did not show: an independent check)."""
    levels, default_level = _levels(batching)
    values = {"priority_levels": levels, "default_priority_level": default_level,
              "preserve_ordering": batching.preserve_ordering}
    for prefix, policy in _policies(batching).items():
        values.update({f"{prefix}.{field}": value for field, value in _queue_policy(policy).items()})
    return {name: {"string_value": str(value).lower() if isinstance(value, bool) else str(value)}
            for name, value in values.items()}


def _row_bounds(batching) -> dict[str, dict]:
    """`<policy>.max_queue_size_unit: rows` for each policy whose max_queue_size counts rows (the
    auto size's): Triton's field counts requests, and its ModelQueuePolicy has none for a unit."""
    return {f"{prefix}.max_queue_size_unit": {"string_value": "rows"}
            for prefix, policy in _policies(batching).items() if policy.counts_rows and policy.max_queue_size}


def _policies(batching) -> dict[str, QueuePolicy]:
    """The queue policies by their names in parameters: default_queue_policy, priority_queue_policy.<level>."""
    return {"default_queue_policy": batching.default_queue_policy,
            **{f"priority_queue_policy.{level}": p for level, p in sorted(batching.priority_queue_policy.items())}}


def _version_policy(policy: tuple) -> dict:
    kind = policy[0]
    if kind == "all":
        return {"all": {}}
    if kind == "specific":
        return {"specific": {"versions": [int(v) for v in policy[1]]}}
    return {"latest": {"num_versions": int(policy[1])}}


def model_config(served) -> dict:
    """Triton ModelConfig as JSON (field names of model_config.proto)."""
    config = served.config
    max_batch = served.max_batch_size
    batching = config.batching
    body = {
        "name": served.name,
        "platform": PLATFORM,
        "backend": "",
        "version_policy": _version_policy(config.version_policy),
        "max_batch_size": max_batch,
        "input": _config_tensors(served.inputs, max_batch > 0, True),
        "output": _config_tensors(served.outputs, max_batch > 0, False, label_files(served)),
        # KIND_MODEL: the model places its instances; Triton refuses gpus beside it, so the NPUs
        # they run on are a parameter
        "instance_group": [{"name": f"{served.name}_0", "kind": "KIND_MODEL", "count": config.instances}],
        "parameters": {"devices": {"string_value": ",".join(str(d) for d in config.devices)}},
    }
    if max_batch > 0 and batching.enabled:
        gears = [g for g in served.gears if g <= max_batch] or list(served.gears)
        levels, default_level = _levels(batching)
        body["dynamic_batching"] = {
            "preferred_batch_size": gears,
            "max_queue_delay_microseconds": int(batching.max_queue_delay_ms * 1000),
            "preserve_ordering": batching.preserve_ordering,
            "priority_levels": levels,
            "default_priority_level": default_level,
            "default_queue_policy": _queue_policy(batching.default_queue_policy),
            "priority_queue_policy": {str(level): _queue_policy(p)
                                      for level, p in sorted(batching.priority_queue_policy.items())},
        }
    else:
        body["parameters"].update(_queue_parameters(batching))
    body["parameters"].update(_row_bounds(batching))
    return body
