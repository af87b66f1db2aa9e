"""The version state machine: the moves it allows, the ones it refuses, the index it renders."""
from __future__ import annotations

import pytest

from aclserve.repository.layout import ScanResult
from aclserve.repository.status import LONG_STEP_S, TRANSITIONS, IllegalTransition, State, VersionStates


def test_a_version_goes_through_load_serve_unload():
    states = VersionStates()
    for state in (State.LOADING, State.READY, State.READY, State.UNLOADING):
        states.move("m", "1", state)
    states.unloaded("m", "1", held=True)
    assert states.get("m", "1") is State.UNAVAILABLE
    states.move("m", "1", State.LOADING)
    states.move("m", "1", State.UNAVAILABLE, "bad file")
    states.move("m", "1", None)
    assert states.get("m", "1") is None


@pytest.mark.parametrize("path", [
    (State.READY,),  # never loaded
    (State.LOADING, State.UNLOADING),  # a load not in service cannot drain
    (State.LOADING, State.READY, State.LOADING),  # a serving version reloads beside, READY
    (State.LOADING, State.READY, State.UNLOADING, State.READY),  # closing goes on
    (None,),  # nothing to forget
])
def test_moves_outside_the_table_are_refused(path):
    states = VersionStates()
    *before, last = path
    for state in before:
        states.move("m", "1", state)
    with pytest.raises(IllegalTransition):
        states.move("m", "1", last)
    assert last not in TRANSITIONS[before[-1] if before else None]


def test_a_replaced_version_stays_ready_when_its_old_copy_closes():
    states = VersionStates()
    states.move("m", "1", State.LOADING)
    states.move("m", "1", State.READY)
    states.unloaded("m", "1", held=False)
    assert states.get("m", "1") is State.READY


def test_the_index_shows_plain_strings_and_explains_files_without_a_record():
    states = VersionStates()
    states.move("m", "1", State.LOADING)
    scan = ScanResult(problems={"bad": "config broken"})
    rows = states.index(scan, {})
    assert rows == [{"name": "bad", "version": "", "state": "UNAVAILABLE", "reason": "config broken"},
                    {"name": "m", "version": "1", "state": "LOADING", "reason": ""}]
    assert all(type(row["state"]) is str for row in rows)  # rendered as-is into JSON and metric labels
    assert states.describe("m", None, scan) == ("LOADING", "")
    assert states.describe("bad", None, scan) == ("UNAVAILABLE", "config broken")
    assert states.describe("other", None, scan) is None


def test_a_loading_step_says_how_long_so_far_once_it_is_long_and_the_next_counts_afresh():
    """Counted when the index is read, from when its reason changed: a short step keeps its words."""
    now = [100.0]
    states = VersionStates(clock=lambda: now[0])
    scan = ScanResult()

    def shown() -> tuple[str, str]:
        (row,) = states.index(scan, {})
        assert states.describe("m", "1", scan) == states.describe("m", None, scan) == (row["state"], row["reason"])
        return row["state"], row["reason"]
    states.move("m", "1", State.LOADING, "compiling m.onnx for cpu")
    now[0] += LONG_STEP_S - 0.1
    assert shown() == ("LOADING", "compiling m.onnx for cpu")
    now[0] += 0.1
    assert shown() == ("LOADING", f"compiling m.onnx for cpu, {LONG_STEP_S:.0f} s so far")
    states.move("m", "1", State.LOADING, "compiling m.onnx for cpu")  # said again: the same step
    now[0] += 36.5
    assert shown() == ("LOADING", "compiling m.onnx for cpu, 41 s so far")
    states.move("m", "1", State.LOADING, "opening on the device")  # another step: counted from now
    assert shown() == ("LOADING", "opening on the device")
    now[0] += 60
    states.move("m", "1", State.READY)
    assert shown() == ("READY", "")
    states.move("m", "1", State.UNLOADING, "unloaded through the repository API")  # (LOADING's steps only)
    now[0] += 60
    assert shown() == ("UNLOADING", "unloaded through the repository API")
