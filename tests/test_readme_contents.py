"""The README's Contents lists every section and, nested under it, its subsections (`###`), and each of
the README's links to a place in itself leads to a heading, by GitHub's anchors. A new user (tester t69)
found the ~5,300-line README had no table of contents; one kept by hand goes stale when a section is added
or renamed. Another found the subsections (the Python API, `aclserve infer`'s reference) unlisted."""
from __future__ import annotations

import re

from tests import REPO

FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)  # a `# comment` in a snippet is no heading
HEADING = re.compile(r"^(#{1,6}) (.+)$", re.M)
LOCAL_LINK = re.compile(r"\]\(#([^)]*)\)")
CONTENTS_ENTRY = re.compile(r"^((?:  )?)- \[(.+)\]\(#([^)]*)\)$", re.M)  # a subsection's indented


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation (backticks, colons, brackets) dropped,
    spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def readme_prose() -> str:
    return FENCE.sub("", (REPO / "README.md").read_text(encoding="utf-8"))


def contents_section(prose: str) -> str:
    start = prose.index("\n## Contents\n")
    return prose[start:prose.index("\n## ", start + 1)]


def test_contents_lists_every_section_and_subsection_in_order():
    prose = readme_prose()
    indents = {"##": "", "###": "  "}
    sections = [(indents[level], title) for level, title in HEADING.findall(prose)
                if level in indents and title != "Contents"]
    listed = CONTENTS_ENTRY.findall(contents_section(prose))
    assert listed == [(indent, title, github_anchor(title)) for indent, title in sections]


def test_every_link_within_the_readme_leads_to_a_heading():
    prose = readme_prose()
    anchors = {github_anchor(title) for _, title in HEADING.findall(prose)}
    assert [target for target in LOCAL_LINK.findall(prose) if target not in anchors] == []
