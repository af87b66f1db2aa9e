"""The `reason` label of aclserve_request_failure_total: a closed set, the one the README lists.

It was each error's class name (type(e).__name__), listed nowhere, so a dashboard could not know
what to expect and a renamed or new class changed what it saw (an SRE's audit)."""
from __future__ import annotations

import ast
import importlib
import re

from aclserve.errors import Overloaded, QueueFull, ServeError, Unavailable
from aclserve.server.failure_reasons import CANCELLED, FAILURE_REASONS, INTERNAL_ERROR, REASONS, failure_reason

from tests import REPO

# Errors no version's request is failed by, so none has a reason of its own: the bases are not
# raised themselves, a 404 (counted_infer's repository lookup) and a 401 / 403 (the API token's
# middleware, gRPC's check before the message) are answered before a version is counted, and a
# failed load is the repository API's answer, and so is a load call refused while the device still
# holds what the model's last load left (StillHeld); Closed is the Python API's (runtime/engine.py);
# an idle gRPC stream's end (StreamIdle) comes while none of its requests runs, and a stream past
# the streams' cap (StreamsFull) is refused before any of its requests reaches a version, as is a
# call that waited too long for a read slot (NoRoomToReceive: its message not read); a
# MalformedRequest counts as its base's, InvalidInput.
NOT_COUNTED = {"ServeError", "Unavailable", "NotFound", "Unauthorized", "Forbidden", "ModelLoadFailed", "StillHeld",
               "Closed", "StreamIdle", "StreamsFull", "NoRoomToReceive", "MalformedRequest"}


def _serve_error_classes() -> dict[str, type]:
    """Every ServeError subclass aclserve/ defines (found in its source, then imported)."""
    bases_of, module_of = {}, {}
    for path in (REPO / "aclserve").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases_of[node.name] = {getattr(b, "id", getattr(b, "attr", None)) for b in node.bases}
                module_of[node.name] = ".".join(path.relative_to(REPO).with_suffix("").parts)
    found, grew = {"ServeError"}, True
    while grew:
        more = {name for name, bases in bases_of.items() if bases & found} - found
        found |= more
        grew = bool(more)
    return {name: getattr(importlib.import_module(module_of[name]), name) for name in found}


def test_every_error_class_has_a_listed_reason_or_is_known_not_to_fail_a_version():
    classes = _serve_error_classes()
    assert len(classes) > 15 and all(issubclass(cls, ServeError) for cls in classes.values())
    assert {name for name, cls in classes.items() if cls not in REASONS} == NOT_COUNTED
    produced = {failure_reason(cls("x")) for cls in classes.values()} | {CANCELLED, INTERNAL_ERROR}
    assert produced == set(FAILURE_REASONS)


def test_the_readme_lists_every_reason():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Every `/metrics` family", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([A-Za-z]+)` \| (?:\d{3}|-)", section, re.MULTILINE)
    assert sorted(listed) == sorted(FAILURE_REASONS)


def test_a_reason_is_its_class_s_or_its_nearest_listed_base_s():
    class StreamsFull(Overloaded):  # a new kind of overload counts as one
        pass

    class Unforeseen(Unavailable):  # no listed base: an internal error, as HTTP's 500 for a bare ServeError
        pass
    assert failure_reason(QueueFull("x")) == "QueueFull"
    assert failure_reason(StreamsFull("x")) == "Overloaded"
    assert failure_reason(Unforeseen("x")) == INTERNAL_ERROR

