"""The README documents every key of configs/default.yaml by its YAML name where it says what the
key does: a key of a section (`model_defaults.batching.enabled`) by a dotted path that ends with it
(`batching.enabled`), or as code in a passage that names its section as code too (`enabled: false`
beside `batching`); a top-level key as code (`unload_on_delete: false`). A key named only as a flag,
or a word that happens to be a key's name (`inputs`, `enabled`, `batch` are common words of the
README), does not count: its last name anywhere in the README passed for a key's documentation."""
from __future__ import annotations

import re

import yaml

from tests import REPO

FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)  # (a list item's block is indented)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def key_paths(mapping: dict, prefix: tuple = ()):
    for key, value in mapping.items():
        yield prefix + (str(key),)
        if isinstance(value, dict):
            yield from key_paths(value, prefix + (str(key),))


def fenced_blocks(text: str) -> list[str]:
    return [m.group() for m in FENCE.finditer(text)]


def paragraphs(text: str) -> list[str]:
    """The README's prose passages, outside fenced blocks: each paragraph (blank lines apart), each
    item of a list (a "- " line begins one: the Limits section's run on without blank lines) and
    each table row."""
    found = []
    for paragraph in re.split(r"\n\s*\n", FENCE.sub("\n\n", text)):
        rows = [line for line in paragraph.splitlines() if line.startswith("|")]
        found += rows or re.split(r"\n(?=[ \t]*[-*] )", paragraph)
    return found


def code_spans(passage: str) -> str:
    """A passage's code spans, one a line (a span may run over a line break)."""
    return "\n".join(m.group(2) for m in CODE_SPAN.finditer(passage))


def as_key(name: str) -> re.Pattern:
    """`name` as a YAML key is written: not part of a longer name, a flag (--batch) or a dotted path's tail."""
    return re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")


def as_path(path: tuple) -> re.Pattern:
    """`path` as a dotted name, alone or the tail of a longer one (`model_defaults.batching.enabled`)."""
    return re.compile(rf"(?<![\w-]){re.escape('.'.join(path))}(?![\w-])")


def key_in(spans: str, name: str) -> bool:
    """`name` as a key among a paragraph's code spans: a span of it alone, or it with a value (`enabled:
    false`, `{latest: 2}`). A word of a longer span (a URL's /trace/, a command's) is no key."""
    alone = re.compile(rf"^\s*{re.escape(name)}\s*$", re.M)
    return bool(alone.search(spans) or re.search(rf"(?<![\w.-]){re.escape(name)}:", spans))


def section_in(spans: str, section: str) -> bool:
    """`section` named among a paragraph's code spans as a key is, or as a dotted path's last name
    (`model_defaults.batching`); not as a file's (`trace.json`)."""
    return key_in(spans, section) or bool(re.search(rf"\w\.{re.escape(section)}(?![\w.-])", spans))


def documented(path: tuple, readme: str, codes: list[str], blocks: list[str]) -> bool:
    """A top-level key: as a key in code (a span of it alone or with a value, a fenced block's YAML
    line). A key of a section: by a dotted path ending with it, or as a key in code in a paragraph (or
    table row) naming the section as code too. A word of a fenced block's text (the module tree, the
    folder layout, shell lines) documents no key."""
    if len(path) == 1:
        yaml_line = re.compile(rf"^[ \t]*{re.escape(path[0])}:", re.M)
        return any(key_in(code, path[0]) for code in codes) or any(yaml_line.search(block) for block in blocks)
    if any(as_path(path[i:]).search(readme) for i in range(len(path) - 1)):
        return True
    return any(key_in(code, path[-1]) and section_in(code, path[-2]) for code in codes)


def undocumented(readme: str) -> list[str]:
    defaults = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    codes = [code_spans(passage) for passage in paragraphs(readme)]
    blocks = fenced_blocks(readme)
    return [".".join(path) for path in key_paths(defaults) if not documented(path, readme, codes, blocks)]


def test_every_default_yaml_key_is_documented_in_the_readme():
    """models_dir, compile_cache_dir and model_defaults.compile's soc_version and precision_mode
    were named nowhere in the README, only as --models, --compile-cache-dir and compile's
    --soc-version / --precision-mode (a tester): a reader of default.yaml could not find them."""
    assert undocumented((REPO / "README.md").read_text()) == []


def test_a_generic_key_counts_only_where_its_section_is_named():
    """`inputs` said as a word, or as code away from `model_defaults`, documents no key; beside it, it does."""
    apart = "Each model has `inputs`.\n\nThe `model_defaults` section holds a model's settings.\n"
    beside = "The `model_defaults` section holds a model's settings; its `inputs` name image inputs.\n"
    assert "model_defaults.inputs" in undocumented(apart)
    assert "model_defaults.inputs" not in undocumented(beside)
    assert "model_defaults.batching.enabled" not in undocumented("`batching.enabled: false` turns batching off.")
