"""README's Architecture section names every module of aclserve/: in its module map (by the name
without .py, as the map lists most) or as a file anywhere in the section (`runtime/warmup.py`). An
architecture review (t62) found modules the section described nowhere (repository/successor.py,
om/cpu_compile.py, server/app_keys.py, ...), and cli/remote.py and cli/usage.py under a map line
that said "one module per command"."""
from __future__ import annotations

import re

from tests import REPO


def architecture() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Architecture\n")
    return text[start:text.index("\n## ", start + 1)]


def module_map(section: str) -> str:
    start = section.index("\n```\naclserve/\n")
    return section[start:section.index("\n```", start + 1)]


def test_every_module_is_named_in_the_architecture_section():
    section = architecture()
    listed = module_map(section)
    missing = []
    for path in sorted((REPO / "aclserve").rglob("*.py")):
        name = path.stem
        if name == "__init__":
            continue
        in_map = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", listed)
        as_file = re.search(rf"(?<![\w.]){re.escape(name)}\.py\b", section)
        if not (in_map or as_file):
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"not named in README's Architecture section: {missing}"
