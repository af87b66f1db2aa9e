"""The diff of what the scan wants served against what was: files new, changed and deleted, a new
version pushing out the old, a config change, a version policy change."""
from __future__ import annotations

from aclserve.config import ModelConfig
from aclserve.repository.layout import scan
from aclserve.repository.plan import diff
from aclserve.repository.settle import SettleGate

from .repo_helpers import touch


DEFAULTS = ModelConfig()


def desired(tmp_path):
    """What the repository wants served from the folder, every file taken as complete."""
    return SettleGate(0.0).desired(scan(tmp_path, DEFAULTS), {}, trust="all")[0]


def test_diff_new_changed_deleted(tmp_path):
    touch(tmp_path / "a.om")
    touch(tmp_path / "b.om")
    first = desired(tmp_path)
    plans = diff({}, first)
    assert [(p.name, list(p.load), p.unload) for p in plans] == [("a", ["1"], []), ("b", ["1"], [])]
    assert diff(first, desired(tmp_path)) == []  # nothing changed

    touch(tmp_path / "a.om", b"new content")  # size changes -> identity changes
    (tmp_path / "b.om").unlink()
    touch(tmp_path / "c.om")
    plans = {p.name: p for p in diff(first, desired(tmp_path))}
    assert list(plans["a"].load) == ["1"] and plans["a"].unload == []
    assert plans["b"].unload == ["1"] and not plans["b"].load
    assert list(plans["c"].load) == ["1"]

    kept = {p.name for p in diff(first, desired(tmp_path), unload_missing=False)}
    assert kept == {"a", "c"}


def test_diff_new_version_pushes_out_old_under_latest_1(tmp_path):
    touch(tmp_path / "m" / "1" / "model.om")
    first = desired(tmp_path)
    touch(tmp_path / "m" / "2" / "model.om")
    (plan,) = diff(first, desired(tmp_path))
    assert list(plan.load) == ["2"] and plan.unload == ["1"]
    carried_out = {v: w for v, w in first["m"].items() if v not in plan.unload} | plan.load
    assert carried_out == desired(tmp_path)["m"]


def test_diff_config_change_reloads(tmp_path):
    touch(tmp_path / "m.om")
    first = desired(tmp_path)
    (tmp_path / "m.yaml").write_text("slots: 4\n")
    (plan,) = diff(first, desired(tmp_path))
    assert list(plan.load) == ["1"] and plan.load["1"].config.slots == 4


def test_diff_a_version_policy_change_loads_and_unloads_only_the_difference(tmp_path):
    for v in (1, 2, 3):
        touch(tmp_path / "m" / str(v) / "model.om")
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {latest: 2}\n")
    first = desired(tmp_path)
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {specific: [1, 3]}\n")
    (plan,) = diff(first, desired(tmp_path))
    assert list(plan.load) == ["1"] and plan.unload == ["2"] and list(plan.keep) == ["3"]
    assert plan.keep["3"].config.version_policy == ("specific", (1, 3))
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {specific: [1, 3]}\nslots: 4\n")
    (plan,) = diff(first, desired(tmp_path))  # another setting changed with it: a reload, as ever
    assert list(plan.load) == ["1", "3"] and plan.unload == ["2"] and not plan.keep
