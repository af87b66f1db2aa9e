"""The curl examples at the start of README's "HTTP API (KServe v2)" run as written against a real
server of the example models and print what their comments say. A new user found that section without
a single runnable request; examples nobody runs drift from what the server answers."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests import REPO
from tests.serving import ServerThread, server_config

BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
COMMAND_START = re.compile(r"^(?:curl|python) ")
INLINE_COMMENT = re.compile(r"\s{2,}# (.*)$")
# a score as the README quotes it (six decimals): another CPU's kernels may sum in another order and round
# its last digit the other way, so a quoted score matches any within SCORE_SLACK
SCORE = re.compile(r"\d+\.\d{4,}")
SCORE_SLACK = 2e-6


def http_examples() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## HTTP API (KServe v2)\n")
    block = BASH_BLOCK.search(text, start, text.index("\n## ", start + 1))
    assert block, "no bash block in the HTTP API section"
    return block.group(1)


def commands_and_expectations(block: str) -> list[tuple[str, str]]:
    """Each command (its continuation lines joined by newlines) with what its comments say it prints:
    the comment on its first line and the comment lines after it, joined."""
    pairs: list[list[str]] = []
    for line in block.splitlines():
        if COMMAND_START.match(line):
            comment = INLINE_COMMENT.search(line)
            pairs.append([line[:comment.start()] if comment else line, comment.group(1) if comment else ""])
        elif line.startswith("#"):
            pairs[-1][1] += line.lstrip("# ")
        else:
            pairs[-1][0] += "\n" + line
    return [(command, said) for command, said in pairs]


def printed_fragments(said: str) -> list[str]:
    """The JSON a comment quotes, from its first `{` or `[` to its last `}` or `]`, as the pieces
    between its `...` elisions."""
    begin = min((i for i in (said.find("{"), said.find("[")) if i >= 0), default=-1)
    if begin < 0:
        return []
    end = max(said.rfind("}"), said.rfind("]")) + 1
    return [piece for piece in said[begin:end].split("...") if piece]


def test_the_http_examples_print_what_their_comments_say(tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("needs curl")
    pairs = commands_and_expectations(http_examples())
    assert [c for c, said in pairs if c.startswith("curl") and not printed_fragments(said)] == []
    models = tmp_path / "models"
    shutil.copytree(REPO / "models", models)
    (tmp_path / "tests").symlink_to(REPO / "tests")  # the examples' tests/data/, as from the clone
    with ServerThread(server_config(models, model_control_mode="poll")) as server:
        port = server.url.rsplit(":", 1)[1]
        for command, said in pairs:
            run = subprocess.run(["bash", "-c", 'python() { "$PYTHON" "$@"; }\n' +
                                  command.replace("localhost:8000", f"localhost:{port}")],
                                 cwd=tmp_path, env={**os.environ, "PYTHON": sys.executable},
                                 capture_output=True, text=True, timeout=60)
            assert (run.returncode, run.stderr) == (0, ""), command
            at = 0
            for fragment in printed_fragments(said):
                found = _printed(fragment).search(run.stdout, at)
                assert found and _scores_close(fragment, found), f"{command!r} printed {run.stdout!r}, not {fragment!r}"
                at = found.end()


def _printed(fragment: str) -> re.Pattern:
    """`fragment` as a pattern, each score in it (SCORE) matching any score."""
    pieces = SCORE.split(fragment)
    return re.compile(r"(\d+\.\d+)".join(re.escape(piece) for piece in pieces))


def _scores_close(fragment: str, found: re.Match) -> bool:
    return all(abs(float(said) - float(printed)) <= SCORE_SLACK
               for said, printed in zip(SCORE.findall(fragment), found.groups()))
