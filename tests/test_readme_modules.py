"""README's Architecture section names every module of aclserve/, by its package: in its module
map, in the block of the module's package (a top-level module as an entry of its own, `app.py`;
a package's module in the lines of its entry, `runtime/` or `    cpu/` under `acl/`, by the name
without .py as the map lists most, or with it), or anywhere in the section as a file with its
package path (`runtime/warmup.py`). An architecture review (t62) found modules the section
described nowhere (repository/successor.py, om/cpu_compile.py, server/app_keys.py, ...), and
cli/remote.py and cli/usage.py under a map line that said "one module per command". A module's
bare name matched anywhere in the map let a new module pass on another package's module of the
same name (names.py, plan.py, infer.py, ... are in two packages each)."""
from __future__ import annotations

import re

from tests import REPO

# a map entry: two spaces (a package or top-level module of aclserve/) or four (a package's
# subpackage), its names (`cli/, __main__.py`), then its description after two spaces or more
ENTRY = re.compile(r"^( {2}| {4})(\S+(?:, \S+)*)(?: {2,}|$)")
MAP_TOP = "aclserve/"


def architecture() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Architecture\n")
    return text[start:text.index("\n## ", start + 1)]


def module_map(section: str) -> str:
    start = section.index("\n```\naclserve/\n")
    return section[start:section.index("\n```", start + 1)]


def map_blocks(listed: str) -> dict[str, str]:
    """The map's entries, by what each names: a package's path below aclserve/ ("runtime",
    "acl/cpu") -> the lines of its entry; a top-level module ("app.py") -> its entry's line."""
    blocks: dict[str, list[str]] = {}
    keys: list[str] = []
    package = ""  # the top-level package whose entry was last (for a subpackage's entry)
    inside = False  # within aclserve/'s tree (a line at the margin, `deploy/`, ends it)
    for line in listed.splitlines():
        if line == MAP_TOP:
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):
            break
        entry = ENTRY.match(line)
        if entry:
            names = entry.group(2).split(", ")
            if len(entry.group(1)) == 4:  # a subpackage of the package above
                keys = [f"{package}/{name.rstrip('/')}" for name in names]
            else:
                keys = [name.rstrip("/") if name.endswith("/") else name for name in names]
                package = next((name.rstrip("/") for name in names if name.endswith("/")), "")
        for key in keys:
            blocks.setdefault(key, []).append(line)
    return {key: "\n".join(lines) for key, lines in blocks.items()}


def named(module: str, blocks: dict[str, str], section: str) -> bool:
    """Whether `module` (its path below aclserve/: "runtime/warmup.py", "app.py") is named as
    the module docstring says."""
    package, _, file = module.rpartition("/")
    if not package:
        return module in blocks
    name = file.removesuffix(".py")
    in_block = re.search(rf"(?<![\w./]){re.escape(name)}(?![\w/])", blocks.get(package, ""))
    as_file = re.search(rf"(?<![\w./])(?:aclserve/)?{re.escape(module)}\b", section)
    return bool(in_block or as_file)


def test_every_module_is_named_in_the_architecture_section():
    section = architecture()
    blocks = map_blocks(module_map(section))
    missing = []
    for path in sorted((REPO / "aclserve").rglob("*.py")):
        if path.stem == "__init__":
            continue
        module = path.relative_to(REPO / "aclserve").as_posix()
        if not named(module, blocks, section):
            missing.append(f"aclserve/{module}")
    assert not missing, f"not named in README's Architecture section: {missing}"


def test_a_module_is_not_named_by_a_same_named_module_of_another_package():
    """names.py is listed under om/ and repository/, plan.py under images/ and repository/ (as
    plan), infer.py under cli/ and server/: a new module of that name in another package, or one
    the map would not list in its own, is not named by them. Their own packages' are."""
    section = architecture()
    blocks = map_blocks(module_map(section))
    for own in ("om/names.py", "repository/names.py", "images/plan.py", "repository/plan.py", "cli/infer.py",
                "server/infer.py", "acl/cpu/faults.py", "runtime/warmup.py", "app.py"):
        assert named(own, blocks, section), own
    for other in ("images/names.py", "server/plan.py", "scheduling/infer.py", "acl/faults.py",
                  "names.py", "server/warmup.py"):
        assert not named(other, blocks, section), other
    without_images = dict(blocks, images="")
    assert not named("images/plan.py", without_images, section)  # repository's plan does not stand in for it
