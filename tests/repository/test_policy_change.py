"""A config edit that changes only `version_policy` loads the versions it newly selects and
unloads those it drops; the versions it keeps selecting serve on untouched (poll mode, real
watcher, real CPU runtime); one that changes another setting with it still reloads them."""
from __future__ import annotations

import logging

import pytest

from aclserve.repository import State

from .repo_helpers import place, write_in, x_rows
from .test_hot_reload import Clients

pytestmark = pytest.mark.asyncio


def loads_of(events, name: str, version: str) -> list[str]:
    """The load-side events of one version, in order ("loaded", "reloaded", "unloaded")."""
    return [e[0] for e in events.seen if e[1] == name and e[2] == version and e[0] in ("loaded", "reloaded",
                                                                                        "unloaded")]


async def test_a_version_policy_change_loads_and_unloads_only_the_difference(make_repo, models_dir, model_files,
                                                                              caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "m" / "2" / "model.om")
    write_in(models_dir / "m" / "config.yaml", "version_policy: {latest: 1}\n")
    repo, events = await make_repo()
    two = repo.get("m", "2")
    clients = Clients(repo, "m")  # the newest, 2, throughout
    try:
        await clients.wait_for_answers(4, phase=0)
        clients.phase = 1
        write_in(models_dir / "m" / "config.yaml", "version_policy: {latest: 2}\n")
        await events.wait("loaded", "m", "1")
        assert (await repo.get("m", "1").infer(x_rows(), 1)).outputs["y"][0, 0] == 1.0
        await clients.wait_for_answers(4, phase=1)
        clients.phase = 2
        write_in(models_dir / "m" / "config.yaml", "version_policy: {specific: [2]}\n")
        await events.wait("unloaded", "m", "1")
        await clients.wait_for_answers(4, phase=2)
        clients.phase = 3
        write_in(models_dir / "m" / "config.yaml", "version_policy: all\n")
        await events.wait("loaded", "m", "1", count=2)
        await clients.wait_for_answers(4, phase=3)
    finally:
        await clients.stop()
    assert clients.failures == []
    assert clients.scales() == {2.0}
    # version 2 was loaded once, at start: the same object served every request
    assert loads_of(events, "m", "2") == ["loaded"]
    assert loads_of(events, "m", "1") == ["loaded", "unloaded", "loaded"]
    assert repo.get("m", "2") is two
    # it reads as configured now: its /config shows the policy that keeps it
    assert two.config.version_policy == ("all",) == repo.get("m", "1").config.version_policy
    assert "m: its new version_policy keeps version 2 serving as it is (not reloaded)" in caplog.text
    assert "m: version 2 reloaded" not in caplog.text
    index = {r["version"]: (r["state"], r["reason"]) for r in repo.index() if r["name"] == "m"}
    assert index == {"1": (State.READY, ""), "2": (State.READY, "")}

    # another setting changed with the policy: every version reloads, as for any config edit
    write_in(models_dir / "m" / "config.yaml", "version_policy: {latest: 1}\nbatching: {max_queue_delay_ms: 2}\n")
    await events.wait("reloaded", "m", "2")
    await events.wait("unloaded", "m", "1", count=2)
    assert repo.get("m", "2").config.batching.max_queue_delay_ms == 2


async def test_the_versions_a_specific_policy_names_that_are_not_there_are_said_once_per_config_read(
        make_repo, models_dir, model_files, caplog):
    """`{specific: [1, 5]}` with no version 5 served 1 and said nothing (Triton logs it as an error):
    a WARNING names the missing versions when the config is read, not again at every rescan, and
    again once the config is read anew (an edit)."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    write_in(models_dir / "m" / "config.yaml", "version_policy: {specific: [1, 5]}\n")
    repo, events = await make_repo()

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "names version" in r.getMessage()]
    assert said() == ["models folder: m: its version_policy {specific: [1, 5]} names version 5, which has no model "
                      "file (m/5/): not served"]
    for other in ("a", "b"):  # each a rescan of the folder, and a load
        place(model_files[2]["om"], models_dir / f"{other}.om")
        await events.wait("loaded", other)
    assert len(said()) == 1
    write_in(models_dir / "m" / "config.yaml",
             "version_policy: {specific: [1, 5, 7]}\nbatching: {max_queue_delay_ms: 2}\n")
    await events.wait("reloaded", "m", "1")
    assert said()[1:] == ["models folder: m: its version_policy {specific: [1, 5, 7]} names versions 5, 7, which have "
                          "no model file (m/5/, m/7/): not served"]
    assert [r["version"] for r in repo.index() if r["name"] == "m"] == ["1"]
