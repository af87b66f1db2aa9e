"""The README names every key of configs/default.yaml by its YAML name, not only through a flag."""
from __future__ import annotations

import re

import yaml

from tests import REPO


def key_paths(mapping: dict, prefix: tuple = ()):
    for key, value in mapping.items():
        yield prefix + (str(key),)
        if isinstance(value, dict):
            yield from key_paths(value, prefix + (str(key),))


def test_every_default_yaml_key_is_named_in_the_readme():
    """models_dir, compile_cache_dir and model_defaults.compile's soc_version and precision_mode
    were named nowhere in the README, only as --models, --compile-cache-dir and compile's
    --soc-version / --precision-mode (a tester): a reader of default.yaml could not find them."""
    defaults = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    readme = (REPO / "README.md").read_text()
    unnamed = [".".join(path) for path in key_paths(defaults)
               if not re.search(rf"(?<![\w-]){re.escape(path[-1])}(?![\w-])", readme)]
    assert unnamed == []
