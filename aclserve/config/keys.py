"""The YAML keys each section of a config file takes, in one place: the section parsers (server.py,
model.py) refuse any other as unknown, and yaml_numbers.py reads from them which keys take a boolean
(read from the schema's bool fields alone, it counted fields no key sets: batch_from_pbtxt)."""
from __future__ import annotations

import dataclasses

from ..scheduling.policy import BatchingConfig, QueuePolicy
from .schema import CompileOptions, ImageInput, ImageSettings, ModelConfig, ServerConfig, TensorOptions

SERVER_KEYS = frozenset(f.name for f in dataclasses.fields(ServerConfig))
IMAGE_SETTINGS_KEYS = frozenset(f.name for f in dataclasses.fields(ImageSettings))
QUEUE_KEYS = frozenset(f.name for f in dataclasses.fields(QueuePolicy)) - {"counts_rows"}  # (auto's, resolved)
# YAML keys of `batching`: the dataclass fields, with the cap under Triton's name (not those that
# say where a setting came from, which are not compared, nor a config.pbtxt's priorities_off)
BATCHING_KEYS = (frozenset(f.name for f in dataclasses.fields(BatchingConfig) if f.compare)
                 - {"batch_cap", "priorities_off"} | {"max_batch_size"})
# ModelConfig fields a config.pbtxt sets once its settings are layered (triton_config.py), not YAML keys:
# its tensors, whether its max_batch_size set compile.batch, its preferred sizes, its instance groups' gpus
PBTXT_FIELDS = ("declared", "batch_from_pbtxt", "preferred_batch_sizes", "pbtxt_gpus")
MODEL_KEYS = frozenset(f.name for f in dataclasses.fields(ModelConfig) if f.compare) - set(PBTXT_FIELDS)
COMPILE_KEYS = frozenset(f.name for f in dataclasses.fields(CompileOptions))
IMAGE_KEYS = frozenset(f.name for f in dataclasses.fields(ImageInput))
INPUT_KEYS = frozenset({"image", "value_range"})  # an input's, under its name in `inputs`
OUTPUT_KEYS = frozenset({"labels"})  # an output's (labels_as_triton is a config.pbtxt's, no key)

# the keys of each section's dataclass, where its keys are its fields' names (the trace section's are
# not: server.py names them; it has no boolean)
KEYS_OF = {ServerConfig: SERVER_KEYS, ImageSettings: IMAGE_SETTINGS_KEYS, ModelConfig: MODEL_KEYS,
           BatchingConfig: BATCHING_KEYS - {"max_batch_size"}, QueuePolicy: QUEUE_KEYS,
           CompileOptions: COMPILE_KEYS, ImageInput: IMAGE_KEYS, TensorOptions: INPUT_KEYS | OUTPUT_KEYS}
