"""The completeness rules (rename, settle time, first-scan age) and the debouncer, on fake clocks
and event gates: nothing here asserts a duration."""
from __future__ import annotations

import asyncio
import os

import pytest

from aclserve.config import ModelConfig
from aclserve.repository.layout import scan
from aclserve.repository.plan import Wanted, diff
from aclserve.repository.settle import SettleGate
from aclserve.repository.watcher import Debouncer, is_relevant


class FakeClock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def make_gate(settle=1.0, wall=None):
    clock = FakeClock()
    wall = wall or FakeClock(0.0)  # wall time 0: every mtime looks "in the future" (fresh)
    return SettleGate(settle, clock, wall), clock


def test_file_is_taken_only_after_size_and_mtime_hold_for_settle_time(tmp_path):
    gate, clock = make_gate()
    (tmp_path / "m.om").write_bytes(b"abc")
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert state == {} and "m" in pending
    assert gate.next_check() == 1.0
    clock.now += 0.5
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert state == {}
    (tmp_path / "m.om").write_bytes(b"abcdef")  # still being written: the settle restarts
    clock.now += 0.6
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert state == {}
    clock.now += 1.0
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert list(state) == ["m"] and pending == {} and gate.next_check() is None


def test_rename_makes_a_file_complete_at_once(tmp_path):
    gate, _ = make_gate()
    (tmp_path / ".m.om.part").write_bytes(b"abc")
    os.replace(tmp_path / ".m.om.part", tmp_path / "m.om")
    gate.note_event(str(tmp_path / "m.om"), moved=True)
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert list(state) == ["m"] and not pending


def test_write_after_rename_revokes_the_rename_trust(tmp_path):
    gate, _ = make_gate()
    (tmp_path / "m.om").write_bytes(b"abc")
    gate.note_event(str(tmp_path / "m.om"), moved=True)
    gate.note_event(str(tmp_path / "m.om"), moved=False)
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert state == {}


def test_changed_after_first_look_following_rename_needs_settling(tmp_path):
    gate, _ = make_gate()
    (tmp_path / "m.om").write_bytes(b"abc")
    gate.note_event(str(tmp_path / "m.om"), moved=True)
    assert gate.desired(scan(tmp_path, ModelConfig()), {})[0]
    (tmp_path / "m.om").write_bytes(b"abcdef")  # event lost, but identity differs
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert state == {} and "m" in pending


def test_a_config_renamed_into_place_is_taken_at_once_and_one_written_in_place_settles(tmp_path):
    """Each file a version is served with is judged on its own: a config renamed in is complete
    at once (judged with the model file's identity it waited settle_s, found by an independent
    check), one written in place settles, and the model file's rename trust is not lost to it."""
    gate, clock = make_gate()
    (tmp_path / "m.om").write_bytes(b"v1")
    gate.note_event(str(tmp_path / "m.om"), moved=True)
    acted, pending = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert list(acted) == ["m"] and not pending
    (tmp_path / ".m.yaml.part").write_text("instances: 2\n")
    os.replace(tmp_path / ".m.yaml.part", tmp_path / "m.yaml")
    gate.note_event(str(tmp_path / "m.yaml"), moved=True)
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), acted)
    (plan,) = diff(acted, state)
    assert plan.load["1"].config.instances == 2 and not pending
    acted = state
    (tmp_path / "m.yaml").write_text("instances: 3\n")
    gate.note_event(str(tmp_path / "m.yaml"), moved=False)
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), acted)
    assert diff(acted, state) == [] and "m" in pending and gate.next_check() == 1.0
    clock.now += 1.0
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    (plan,) = diff(acted, state)
    assert plan.load["1"].config.instances == 3


def test_first_scan_trusts_old_mtimes_only(tmp_path):
    (tmp_path / "old.om").write_bytes(b"a")
    (tmp_path / "new.om").write_bytes(b"b")
    os.utime(tmp_path / "old.om", (100.0, 100.0))
    os.utime(tmp_path / "new.om", (200.0, 200.0))
    gate, _ = make_gate(wall=FakeClock(200.5))
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), {}, trust="age")
    assert list(state) == ["old"] and list(pending) == ["new"]


def test_incomplete_replacement_holds_the_serving_file(tmp_path):
    gate, clock = make_gate()
    (tmp_path / "m.om").write_bytes(b"v1")
    acted, _ = gate.desired(scan(tmp_path, ModelConfig()), {}, trust="all")
    (tmp_path / "m.om").write_bytes(b"v2 being written")
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), acted)
    assert state == acted and "m" in pending
    assert diff(acted, state) == []  # nothing reloads, nothing unloads
    clock.now += 1.0
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    (plan,) = diff(acted, state)
    assert list(plan.load) == ["1"]


def test_newer_version_being_written_does_not_push_out_the_serving_one(tmp_path):
    gate, _ = make_gate()
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.om").write_bytes(b"v1")
    acted, _ = gate.desired(scan(tmp_path, ModelConfig()), {}, trust="all")
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "model.om").write_bytes(b"half")
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    assert diff(acted, state) == []


def test_rejected_file_is_skipped_and_the_serving_one_held(tmp_path):
    gate, _ = make_gate()
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.om").write_bytes(b"v1")
    acted, _ = gate.desired(scan(tmp_path, ModelConfig()), {}, trust="all")
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "model.om").write_bytes(b"corrupt")
    (tmp_path / "m" / "1" / "model.om").write_bytes(b"corrupt too")
    result = scan(tmp_path, ModelConfig())
    rejected = frozenset(("m", v, f.identity) for v, f in result.models["m"].available.items())
    state, pending = gate.desired(result, acted, trust="all", rejected=rejected)
    assert state == acted and not pending


def test_ignored_paths_are_not_forwarded(tmp_path):
    root = str(tmp_path)
    assert is_relevant(root, f"{root}/m.om")
    assert is_relevant(root, f"{root}/m/1/model.om")
    for path in (f"{root}/m.om.tmp", f"{root}/.m.om", f"{root}/m/1/.x.part", f"{root}/.cache/a.om",
                 f"{root}/m/1/model.om.part", f"{tmp_path.parent}/other.om", root):
        assert not is_relevant(root, path), path


@pytest.mark.asyncio
async def test_a_burst_of_events_gives_one_run():
    runs = []
    gate = asyncio.Event()

    async def action():
        runs.append(1)
        gate.set()

    debouncer = Debouncer(0.05, action, max_wait=60)
    for _ in range(20):
        debouncer.poke()
        await asyncio.sleep(0)
    await gate.wait()
    await debouncer.close()
    assert runs == [1]


@pytest.mark.asyncio
async def test_events_during_a_run_give_exactly_one_more_run():
    started, release, second = asyncio.Event(), asyncio.Event(), asyncio.Event()
    runs = []

    async def action():
        runs.append(1)
        if len(runs) == 1:
            started.set()
            await release.wait()
        else:
            second.set()

    debouncer = Debouncer(0.0, action)
    debouncer.poke()
    await started.wait()
    for _ in range(5):
        debouncer.poke()
        await asyncio.sleep(0.01)
    release.set()
    await second.wait()
    await debouncer.close()
    assert len(runs) == 2


@pytest.mark.asyncio
async def test_wake_after_does_not_postpone_an_earlier_run():
    done = asyncio.Event()

    async def action():
        done.set()

    debouncer = Debouncer(3600, action)
    debouncer.wake_after(0)
    debouncer.wake_after(3600)  # later: must not replace the earlier wake-up
    await asyncio.wait_for(done.wait(), 30)
    await debouncer.close()


def test_a_version_policy_being_written_changes_nothing_until_it_rests(tmp_path):
    """A switch of version_policy saved in place was acted on at once: the serving version was
    unloaded while the new one waited for the config to rest (found by an independent check)."""
    gate, clock = make_gate()
    for version in ("1", "3"):
        (tmp_path / "vm" / version).mkdir(parents=True)
        (tmp_path / "vm" / version / "model.om").write_bytes(b"v" + version.encode())
    (tmp_path / "vm" / "config.yaml").write_text("version_policy: {specific: [3]}\n")
    acted, _ = gate.desired(scan(tmp_path, ModelConfig()), {}, trust="all")
    assert list(acted["vm"]) == ["3"]
    (tmp_path / "vm" / "config.yaml").write_text("version_policy: {specific: [1]}\n")
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), acted)
    assert diff(acted, state) == [] and "vm" in pending
    clock.now += 1.0
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    (plan,) = diff(acted, state)
    assert list(plan.load) == ["1"] and plan.unload == ["3"]


def test_a_labels_file_two_configs_name_by_other_paths_settles_once(tmp_path):
    """m1 and m2 name ../labels.txt: keyed by its real path but identified by the path as each
    config spelled it, each model reset the other's first look on every scan and neither ever
    loaded (found by an independent review)."""
    gate, clock = make_gate()
    (tmp_path / "labels.txt").write_text("a\nb\n")
    for name in ("m1", "m2"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.om").write_bytes(b"v1")
        (tmp_path / name / "config.yaml").write_text("outputs: {y: {labels: ../labels.txt}}\n")
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert state == {} and set(pending) == {"m1", "m2"}
    clock.now += 1.0
    state, pending = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert set(state) == {"m1", "m2"} and not pending


def test_a_config_renamed_away_and_written_again_changes_nothing_until_its_absence_rests(tmp_path):
    """vim saves by renaming the file away and writing a new one: a scan between the two saw
    no config and reloaded the model with the defaults (its labels lost), then again with the
    config back (found by an independent check). A config that is gone is acted on once its
    absence has rested for settle_s, as a write is."""
    gate, clock = make_gate()
    (tmp_path / "m.om").write_bytes(b"v1")
    (tmp_path / "m.yaml").write_text("instances: 2\n")
    gate.desired(scan(tmp_path, ModelConfig()), {})
    clock.now += 1.0
    acted, _ = gate.desired(scan(tmp_path, ModelConfig()), {})
    assert acted["m"]["1"].config.instances == 2
    os.replace(tmp_path / "m.yaml", tmp_path / "m.yaml~")
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    assert diff(acted, state) == [] and gate.next_check() == 1.0
    (tmp_path / "m.yaml").write_text("instances: 2\n")  # written again: it settles as any write
    clock.now += 0.5
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    assert diff(acted, state) == []
    (tmp_path / "m.yaml").unlink()  # deleted for good: the defaults once the absence rests
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    assert diff(acted, state) == []
    clock.now += 1.0
    state, _ = gate.desired(scan(tmp_path, ModelConfig()), acted)
    (plan,) = diff(acted, state)
    assert plan.load["1"].config.instances == 1


def test_a_policy_with_a_refused_version_keeps_only_what_it_selects_of_the_rest(tmp_path):
    """`latest: 2` over serving 2 and 3, with 4 refused and 5 good: 3 and 5 serve, not 2 as well
    (a version the policy selects refused kept every serving one; found by an independent
    review). Only when it selects nothing else does what serves stay."""
    gate, _ = make_gate()
    for version in ("2", "3", "4", "5"):
        (tmp_path / "vm" / version).mkdir(parents=True)
        (tmp_path / "vm" / version / "model.om").write_bytes(b"v" + version.encode())
    (tmp_path / "vm" / "config.yaml").write_text("version_policy: {latest: 2}\n")
    found = scan(tmp_path, ModelConfig())
    acted = {"vm": {v: w for v, w in gate.desired(found, {}, trust="all")[0]["vm"].items()}}
    assert list(acted["vm"]) == ["4", "5"]
    acted = {"vm": {v: Wanted(found.models["vm"].available[v], found.models["vm"].config) for v in ("2", "3")}}
    refused = frozenset({("vm", "4", found.models["vm"].available["4"].identity)})
    state, _ = gate.desired(found, acted, trust="all", rejected=refused)
    assert sorted(state["vm"]) == ["3", "5"]
    refused |= {("vm", "5", found.models["vm"].available["5"].identity)}
    (tmp_path / "vm" / "config.yaml").write_text("version_policy: {specific: [4, 5]}\n")
    found = scan(tmp_path, ModelConfig())
    refused = frozenset((n, v, found.models["vm"].available[v].identity) for n, v, _ in refused)
    state, _ = gate.desired(found, acted, trust="all", rejected=refused)
    assert sorted(state["vm"]) == ["2", "3"]  # selects nothing that loads: what serves stays


def test_a_config_that_is_a_link_to_nothing_settles_before_it_is_a_problem(tmp_path):
    """vim saving a linked config's target renames the target away first: the link to nothing
    was logged and indexed as a problem for that moment (found by an independent review)."""
    gate, clock = make_gate()
    os.symlink("target.yaml", tmp_path / "m.yaml")
    assert not gate.file_complete(str(tmp_path / "m.yaml"))
    clock.now += 0.5
    assert not gate.file_complete(str(tmp_path / "m.yaml"))
    clock.now += 0.5
    assert gate.file_complete(str(tmp_path / "m.yaml"))
    (tmp_path / "plain.yaml").write_text("x: 1\n")
    (tmp_path / "plain.yaml").unlink()
    assert gate.file_complete(str(tmp_path / "plain.yaml"))  # gone, not a link: nothing is being written
