"""Server and model configuration: YAML -> frozen dataclasses, every bad key reported by path.

The one source of defaults is the embedded `aclserve/configs/default.yaml` (documented key by
key; `configs/default.yaml` at the repository root is a byte-identical copy for readers). A
user file is deep-merged over it, then command-line overrides over that; the merged mapping
is validated in one pass. Unknown keys and bad values raise ConfigError whose message starts
with the dotted path of the key, e.g.
`model_defaults.batching.max_queue_delay_ms: must be >= 0, got -1`.

Merging: mappings merge key by key, except `version_policy`, which a later layer replaces
whole (it is a one-key choice). A per-model file (`models/<name>.yaml` or
`models/<name>/config.yaml`) has the keys of `model_defaults` and merges over the server's
`model_defaults` the same way; so does a Triton folder's `config.pbtxt`, once translated.
Entries of `batching.priority_queue_policy` (keyed by level number) inherit unset fields from
`batching.default_queue_policy` of the layers merged (each level keeps the fields it set:
BatchingConfig.priority_queue_fields); levels of model_defaults past a model's own
priority_levels are left out for it, in a note; so are model_defaults' levels past the one a
model's own preserve_ordering takes (Triton's rule; more given beside it are refused).
Relative paths (models_dir, compile_cache_dir, model_defaults' labels files) are relative to the
working directory; labels files a model's own file names, to its folder. An error in a key given
as an override is blamed on the `command line`, not the file; one about settings that do not go
together (ConfigConflict: port and grpc_port the same) names where each value came from (a flag,
the file, an environment variable, the default). Origins, which load_server_settings returns,
does the same for an error found as the server starts (a TLS file, the API token). A value of the
file an override replaces is checked as the file alone would have it (files._check_replaced).

Modules: schema (the dataclasses, their choices, ConfigError), checks (value checks), model and
server (a section's mapping -> its dataclass), files (default, YAML files, overrides, merging;
MAX_CONFIG_BYTES, the most a config file may hold),
origins (where each setting came from, for the errors), image_values (an image input's mean and
std as far as they can be judged without a model),
yaml_numbers (the numbers and booleans YAML 1.1 reads otherwise than they look, refused in a file:
07000, 1:30, yes, off),
triton_config (a Triton model folder's config.pbtxt -> the mapping a model's YAML gives),
triton_tensors (its input and output lists -> DeclaredTensors, compared with the model at load).
"""
from .files import DEFAULT_CONFIG_PATH, MAX_CONFIG_BYTES, load_model_config, load_server_config, load_server_settings
from .model import model_config_mapping, parse_model_config
from .origins import Origins
from .schema import (MAX_VERSION_DIGITS, CompileOptions, ConfigConflict, ConfigError, ConfigFileUnread, DeclaredTensor,
                     DeclaredTensors, ImageInput, ImageSettings, ModelConfig, ServerConfig, TensorOptions)
from .triton_config import PBTXT, load_triton_config, model_file_named, read_pbtxt

__all__ = ["DEFAULT_CONFIG_PATH", "MAX_CONFIG_BYTES", "MAX_VERSION_DIGITS", "PBTXT", "CompileOptions", "ConfigConflict",
           "ConfigError", "ConfigFileUnread",
           "DeclaredTensor", "DeclaredTensors", "ImageInput",
           "ImageSettings", "ModelConfig", "Origins", "ServerConfig", "TensorOptions", "load_model_config",
           "load_server_config", "load_server_settings", "load_triton_config", "model_config_mapping",
           "model_file_named", "parse_model_config", "read_pbtxt"]
