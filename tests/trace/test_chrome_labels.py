"""The Chrome trace's span names say which numbering their "#N" is. The event loop's track mixed
them: `decode #N` and `encode #N` counted requests (their trace id) while `form batch #N` beside
them, and `pack #N`, `H2D #N`, `compute #N` elsewhere, counted batches, two counters that give
the same numbers (found by an independent tester). Now "request #N" is a request's trace id and
"batch #N" a batch's id on every track; traces written with the old names still summarize."""
from __future__ import annotations

import re

import pytest

from aclserve.trace import analysis, chrome

from .test_analysis import _batch, _request


def _one_request_and_its_batch_numbered_alike(direct: bool = False) -> list[dict]:
    batch = _batch(0, (0, 100), (100, 300), (300, 350), slot=0)
    batch.direct = direct  # (its copies drawn on its compute stream's track, told apart by their names)
    batch.packed_ns, batch.enqueued_ns = batch.launched_ns + 10_000, batch.launched_ns + 15_000
    batch.woke_ns = batch.done_ns - 20_000  # (its unpack)
    request = _request(-30, 600, batch, 7)
    batch.id = request.id  # the two counters meet: the names alone must tell them apart
    return chrome.events([request])


def test_every_numbered_span_says_whether_it_numbers_a_request_or_a_batch():
    events = _one_request_and_its_batch_numbered_alike()
    named = [e for e in events if e["ph"] in ("X", "i") and "#" in e["name"]]
    assert named and all(re.search(r"\b(request|batch) #7\b", e["name"]) for e in named), \
        [e["name"] for e in named]
    loop = {e["name"]: e for e in events if e["ph"] in ("X", "i") and e["tid"] == chrome.global_tid(
        chrome.PID_HOST, chrome.TID_LOOP)}
    assert set(loop) == {"decode request #7", "encode request #7", "form batch #7"}
    (request,) = [e for e in events if e["ph"] == "X" and e["name"].startswith("request ")]
    assert loop["decode request #7"]["args"]["trace_id"] == request["args"]["trace_id"] == 7
    assert loop["form batch #7"]["args"]["batch"] == request["args"]["batch"] == 7
    batch_spans = {e["name"].split(" #")[0] for e in named if "batch #" in e["name"]}
    assert {"form batch", "pack batch", "enqueue batch", "unpack batch", "H2D batch", "compute batch",
            "D2H batch"} <= batch_spans


@pytest.mark.parametrize("direct", [False, True], ids=["piped", "direct"])
def test_a_trace_written_with_the_former_names_summarizes_alike(direct):
    events = _one_request_and_its_batch_numbered_alike(direct)
    former = [dict(e, name=re.sub(r"^(\w+) (?:batch|request) #", r"\1 #", e["name"])) if e["ph"] == "X" else e
              for e in events]
    assert any(e["name"] == "pack #7" for e in former) and any(e["name"] == "H2D #7" for e in former)
    assert analysis.summarize(former) == analysis.summarize(events)
