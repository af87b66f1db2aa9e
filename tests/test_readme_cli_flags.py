"""The README documents every option of every command (`aclserve X --help`'s) in a paragraph that
names the command: `infer --priority` and `profile --png-window-ms` were in --help alone (tester
t51). An option counts by any of its spellings (`-o` for compile's --output)."""
from __future__ import annotations

import argparse
import re

from aclserve.cli import build_parser
from tests import REPO


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_option_of_every_command_is_in_the_readme_beside_the_command():
    paragraphs = re.split(r"\n\s*\n", (REPO / "README.md").read_text(encoding="utf-8"))
    missing = []
    for name, parser in commands().items():
        beside = [p for p in paragraphs if re.search(rf"\b{name}\b", p)]
        for action in parser._actions:
            spellings = [o for o in action.option_strings if o not in ("-h", "--help")]
            said = [re.compile(re.escape(o) + r"(?![\w-])") for o in spellings]
            if spellings and not any(s.search(p) for s in said for p in beside):
                missing.append(f"{name} {spellings[0]}")
    assert not missing, missing
