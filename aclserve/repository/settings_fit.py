"""What a version's config makes of its model once the model is open: the image stage, a
config.pbtxt's tensor views, the labels and the value ranges, each checked against the model.

A setting that does not fit the model fails the load, named by its dotted key and where it came
from, as a config's parse errors are (`<models>/m.yaml: inputs.x.image.mean: has 3 values for 1
channel(s)`): the model's own config, or the server config's model_defaults (a mean the model's
own image settings take from there; model_defaults' image settings, labels and value ranges on
their own are fitted to the model or passed over, failing none: images/stage.py). ModelConfig.origin_of says
which; a config built in code names none. A config.pbtxt's tensors name their file themselves
(declared.py)."""
from __future__ import annotations

from typing import Mapping

from ..config import ConfigError, ModelConfig
from ..images import ImageStage
from .declared import tensor_views
from .labels import load_labels
from .value_ranges import input_ranges


def fitted_settings(config: ModelConfig, pool, index_bounds: Mapping[str, int], label: str,
                    compiled: bool) -> tuple:
    """(image stage, tensor views, labels, value ranges) of the model `pool` opened, for the
    version `label` names ("m:1"; `compiled`: from an .onnx, here). Blocking (reads labels files).
    ConfigError, blamed on where the setting came from, when one does not fit the model."""
    try:
        images = ImageStage.for_model(config.inputs, pool.inputs, label)
        pictures = frozenset(images.plans) if images else frozenset()  # (not model_defaults' passed over)
        views = tensor_views(config.declared, pool.inputs, pool.outputs, bool(pool.gears), pictures, compiled)
        labels = load_labels(config.outputs, pool.outputs, label)
        ranges = input_ranges(config.inputs, pool.inputs, index_bounds, label, pictures)
    except ConfigError as e:
        raise e if e.source is not None else ConfigError(e.path, e.problem, origin(config, e.path)) from None
    return images, views, labels, ranges


def origin(config: ModelConfig, key: str) -> str | None:
    """Where the model's setting at the dotted `key` came from: its config file's path, `the server
    config's model_defaults (<its path>)`, a flag, `the default`; None when unknown."""
    return config.origin_of(key) if config.origin_of is not None else None
