"""How the server follows a models folder whose config, links or own path change under it
(from a fuzz of the models folder): what a broken config keeps, and a models path that is a
link swapped for another."""
from __future__ import annotations

import asyncio
import os

import pytest

from aclserve.errors import ModelUnavailable, NotFound

from .repo_helpers import place, serving, until, write_in, x_rows

pytestmark = pytest.mark.asyncio


def missing_said(repo) -> bool:
    """The index says the models folder is missing (a scan saw it: nothing served changes for it)."""
    return any(row.get("reason") == "the models folder does not exist" for row in repo.index())


async def test_a_broken_config_keeps_the_versions_on_disk_serving_not_the_deleted_ones(
        make_repo, models_dir, model_files):
    """A config that breaks (here a version policy selecting none) keeps a serving model as it
    is; but a version whose file is then deleted is unloaded (unload_on_delete), and a model
    whose files are all gone (a flat file through a link left dangling) is unloaded whole. Both
    kept serving while the config or the link was broken (from a fuzz of the models folder)."""
    place(model_files[1]["om"], models_dir / "vm" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "vm" / "2" / "model.om")
    (models_dir / "vm" / "config.yaml").write_text("version_policy: all\n")
    place(model_files[1]["om"], models_dir / "target.om")
    os.symlink("target.om", models_dir / "link.om")
    repo, events = await make_repo()

    def ready_versions(name):
        return [r["version"] for r in repo.index(ready_only=True) if r["name"] == name]

    assert ready_versions("vm") == ["1", "2"] and ready_versions("link") == ["1"]
    (models_dir / "vm" / "config.yaml").write_text("version_policy: {specific: [7]}\n")
    place(model_files[2]["om"], models_dir / "gate1.om")  # an event after the edit, as a gate
    await events.wait("loaded", "gate1")
    assert ready_versions("vm") == ["1", "2"]  # broken config: kept as it was
    (models_dir / "vm" / "2" / "model.om").unlink()
    (models_dir / "vm" / "2").rmdir()
    await events.wait("unloaded", "vm", limit_s=20)
    assert ready_versions("vm") == ["1"]
    assert float((await repo.get("vm").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0
    (models_dir / "target.om").unlink()
    await events.wait("unloaded", "link", limit_s=20)
    assert "link" not in serving(repo)
    assert any(r["name"] == "link" and "link to nothing" in r["reason"] for r in repo.index())


async def test_a_models_path_that_is_a_swapped_link_is_followed(make_repo, models_dir, model_files, monkeypatch):
    """`models -> gen1` swapped for `models -> gen2` (git-sync, a release switch): the swap is
    seen at once (the folder holding the link is watched for it) and the watch moves to gen2, so
    a file dropped there later is seen by its event. The old target stayed watched, and only
    the safety rescan (every 10 s, turned off here) saw any change."""
    import aclserve.repository.repository as repository_module
    monkeypatch.setattr(repository_module, "RESCAN_S", 3600.0)
    gen1, gen2, link = models_dir / "gen1", models_dir / "gen2", models_dir / "current"
    place(model_files[1]["om"], gen1 / "a.om")
    place(model_files[2]["om"], gen2 / "a.om")
    os.symlink("gen1", link)
    repo, events = await make_repo(models_dir=str(link))
    assert float((await repo.get("a").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0
    os.symlink("gen2", models_dir / "current.new")
    os.replace(models_dir / "current.new", link)  # the swap, as git-sync makes it
    await events.wait("reloaded", "a", limit_s=20)
    assert float((await repo.get("a").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    place(model_files[3]["om"], gen2 / "b.om")
    await events.wait("loaded", "b", limit_s=20)
    assert float((await repo.get("b").infer(x_rows(), 1)).outputs["y"][0, 0]) == 3.0


async def test_a_link_swapped_further_up_the_models_path_is_followed(make_repo, models_dir, model_files, monkeypatch):
    """`current -> rel1` with the server on `current/models` (git-sync's worktree link, a
    release switch), and a chain of links (`models -> current -> rel1`): the swap of a link on
    the way is seen at once as well."""
    import aclserve.repository.repository as repository_module
    monkeypatch.setattr(repository_module, "RESCAN_S", 3600.0)
    place(model_files[1]["om"], models_dir / "rel1" / "models" / "a.om")
    place(model_files[2]["om"], models_dir / "rel2" / "models" / "a.om")
    os.symlink("rel1", models_dir / "current")
    os.symlink("current/models", models_dir / "served")
    repo, events = await make_repo(models_dir=str(models_dir / "served"))
    assert float((await repo.get("a").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0
    os.symlink("rel2", models_dir / "current.new")
    os.replace(models_dir / "current.new", models_dir / "current")
    await events.wait("reloaded", "a", limit_s=20)
    assert float((await repo.get("a").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    place(model_files[3]["om"], models_dir / "rel2" / "models" / "b.om")
    await events.wait("loaded", "b", limit_s=20)


@pytest.mark.parametrize("how", ["moved away", "deleted"])
async def test_a_models_folder_replaced_at_its_path_is_watched_again(make_repo, models_dir, model_files, monkeypatch,
                                                                     how):
    """`mv models models.old && mkdir models` (or `rm -r models && mkdir models`): the watch
    stayed on the old folder (or on none), and every change after it waited for the safety
    rescan (an operator's check; turned off here), the log silent."""
    import aclserve.repository.repository as repository_module
    monkeypatch.setattr(repository_module, "RESCAN_S", 3600.0)
    folder = models_dir / "models"
    place(model_files[1]["om"], folder / "a.om")
    repo, events = await make_repo(models_dir=str(folder))
    assert float((await repo.get("a").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0
    if how == "moved away":
        folder.rename(models_dir / "models.old")
    else:
        (folder / "a.om").unlink()
        folder.rmdir()
    folder.mkdir()  # the folder made at its place is an event where the models folder's parent is watched
    await events.wait("unloaded", "a", limit_s=20)
    place(model_files[2]["om"], folder / "b.om")  # seen by the new folder's own watch
    await events.wait("loaded", "b", limit_s=20)
    assert float((await repo.get("b").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


async def test_the_folder_above_replaced_then_the_models_folder_is_still_followed(make_repo, models_dir, model_files,
                                                                                 monkeypatch):
    """`mv current old && mkdir -p current/models`: the watch for the models folder's own
    replacement stayed on the old `current`, so a later `mv models models.old && mkdir models`
    in the new one went unseen (a second review). The first replacement is seen by a scan (the
    safety rescan's, called here), which moves that watch too."""
    import aclserve.repository.repository as repository_module
    monkeypatch.setattr(repository_module, "RESCAN_S", 3600.0)
    folder = models_dir / "current" / "models"
    place(model_files[1]["om"], folder / "a.om")
    repo, events = await make_repo(models_dir=str(folder))
    (models_dir / "current").rename(models_dir / "old")
    folder.mkdir(parents=True)
    place(model_files[2]["om"], folder / "b.om")
    await repo._reconcile(trust="settle")  # (what the safety rescan does)
    await events.wait("loaded", "b", limit_s=20)
    folder.rename(models_dir / "current" / "models.old")
    folder.mkdir()
    place(model_files[3]["om"], folder / "c.om")  # seen by events alone now
    await events.wait("loaded", "c", limit_s=20)
    assert float((await repo.get("c").infer(x_rows(), 1)).outputs["y"][0, 0]) == 3.0


async def test_a_models_folder_made_again_later_under_an_unlistable_folder_is_followed(
        make_repo, models_dir, model_files, monkeypatch, caplog):
    """The folder above cannot be listed (a service user passing through it): watchdog dropped
    that watch in silence, the models folder made again with its old inode number looked like
    the old one, and every change waited for the 10 s rescan for good (a fourth review). Now
    the folder's own watch marks its deletion, rescans come soon while it is missing, and the
    unwatchable folder is said once."""
    import aclserve.repository.repository as repository_module
    import aclserve.repository.watcher as watcher_module
    monkeypatch.setattr(repository_module, "RESCAN_S", 3600.0)
    monkeypatch.setattr(repository_module, "UNREADABLE_RESCAN_S", 0.05)
    folder = models_dir / "models"
    listable = os.access

    def access(path, mode, *args, **kwargs):
        return False if os.fspath(path) == str(models_dir) else listable(path, mode, *args, **kwargs)

    monkeypatch.setattr(watcher_module.os, "access", access)
    place(model_files[1]["om"], folder / "a.om")
    repo, events = await make_repo(models_dir=str(folder))
    assert any(f"cannot watch {models_dir} for the models folder" in r.getMessage() for r in caplog.records)
    (folder / "a.om").unlink()
    await events.wait("unloaded", "a", limit_s=20)
    folder.rmdir()
    await until(lambda: missing_said(repo), "the folder's own watch seeing it go")  # (a missing folder changes
    folder.mkdir()  # nothing served) (no event reaches the server: the folder above is not watched)
    place(model_files[2]["om"], folder / "b.om")
    await events.wait("loaded", "b", limit_s=20)
    place(model_files[3]["om"], folder / "c.om")  # and the new folder is watched
    await events.wait("loaded", "c", limit_s=20)


async def test_the_folder_above_made_again_after_a_scan_is_followed(make_repo, models_dir, model_files, monkeypatch):
    """`rm -r b`, a scan, then `mkdir -p b/models`: nothing watched `b`'s parent, and the models
    folder made again waited for the 10 s rescan (a fourth review); while the models folder is
    missing the rescans come as often as while it cannot be listed."""
    import aclserve.repository.repository as repository_module
    monkeypatch.setattr(repository_module, "RESCAN_S", 3600.0)
    monkeypatch.setattr(repository_module, "UNREADABLE_RESCAN_S", 0.05)
    above = models_dir / "b"
    folder = above / "models"
    place(model_files[1]["om"], folder / "a.om")
    repo, events = await make_repo(models_dir=str(folder))
    (folder / "a.om").unlink()
    await events.wait("unloaded", "a", limit_s=20)
    folder.rmdir()
    above.rmdir()
    await until(lambda: missing_said(repo), "a scan of the folder gone")
    await asyncio.sleep(0.5)  # the scans its deletion poked are over: the folder comes back later
    folder.mkdir(parents=True)
    place(model_files[2]["om"], folder / "b.om")
    await events.wait("loaded", "b", limit_s=20)


async def test_a_version_that_does_not_exist_of_a_serving_model_with_a_broken_config_is_404(
        make_repo, models_dir, model_files):
    """A model known only as a problem (its config broken from the start) answers 404 with why;
    the review of that change found that it also made a version that does not exist of a model
    still serving (its config broken later) a 503 to retry, where it is a 404 "no version"."""
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    repo, events = await make_repo()
    assert serving(repo) == ["m"]
    write_in(models_dir / "m" / "config.yaml", "instances: [\n")  # complete at once
    place(model_files[2]["om"], models_dir / "gate.om")  # an event after the edit, as a gate
    await events.wait("loaded", "gate")
    assert any(r["name"] == "m" and "invalid YAML" in r["reason"] for r in repo.index())
    assert "m" in serving(repo)  # kept as it was
    with pytest.raises(NotFound, match="model m has no version 999"):
        repo.get("m", "999")


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_a_config_being_written_waits_and_a_problem_that_comes_back_is_logged_again(
        make_repo, models_dir, model_files, caplog):
    """A config that does not read while it has not rested is being written: its model waits for
    it (the index says so, nothing is logged) and serves on; once it rests it is the problem it
    is, logged. A problem fixed and then made again is logged again (each was logged once for the
    server's life). Found by an independent check. The settle gate's clock is a fake one here,
    moved on by the test; file renames are the gates."""
    clock = FakeClock()
    place(model_files[1]["om"], models_dir / "m.om")
    os.utime(models_dir / "m.om", (100, 100))  # old: taken by the first scan
    repo, events = await make_repo(clock=clock)
    gates = iter(range(100))

    async def rescan():
        name = f"gate{next(gates)}"
        place(model_files[1]["om"], models_dir / f"{name}.om")
        await events.wait("loaded", name)

    def reason():
        return next(r["reason"] for r in repo.index() if r["name"] == "m" and r["version"] == "")

    def logged():
        return [r.getMessage() for r in caplog.records if "invalid YAML" in r.getMessage()]

    caplog.set_level("INFO", logger="aclserve.repository.planner")
    (models_dir / "m.yaml").write_text("instances: [\n")  # still being written
    await rescan()
    assert reason() == "waiting for its config file to be complete" and logged() == []
    assert serving(repo) == ["gate0", "m"]
    (models_dir / "n.yaml").write_text("instances: [\n")  # a new model whose config is being written
    place(model_files[1]["om"], models_dir / "n.om")
    await rescan()
    with pytest.raises(ModelUnavailable, match="waiting for its config file to be complete"):
        repo.get("n")  # 503, to retry: it was a 404 "no available versions" (found by an independent review)
    assert repo.all_ready()  # lenient readiness, once said, stays while a model added later waits
    os.unlink(models_dir / "n.yaml")
    os.unlink(models_dir / "n.om")
    clock.now += 1.0  # it has rested
    await rescan()
    assert "invalid YAML" in reason() and len(logged()) == 1
    write_in(models_dir / "m.yaml", "instances: 1\n")
    await events.wait("reloaded", "m")
    write_in(models_dir / "m.yaml", "instances: [\n")  # renamed in: complete at once
    await rescan()
    assert "invalid YAML" in reason() and len(logged()) == 2


async def test_a_load_failure_of_an_earlier_config_is_not_shown_once_the_config_breaks(
        make_repo, models_dir, model_files):
    """A version refused for its config's labels file, then a config that does not read: the
    index says what is wrong now, once, not the earlier failure beside it (found by an
    independent check); the next config that reads is loaded and judged afresh."""
    def rows():
        return [(r["version"], r["reason"]) for r in repo.index() if r["name"] == "m"]

    repo, events = await make_repo()
    (models_dir / "three.txt").write_text("a\nb\nc\n")
    write_in(models_dir / "m.yaml", "outputs: {y: {labels: three.txt}}\n")
    place(model_files[1]["om"], models_dir / "m.om")
    await events.wait("load_failed", "m")
    assert rows() == [("1", f"{models_dir / 'm.yaml'}: outputs.y.labels: labels file three.txt has 3 labels; "
                            "output 'y' has 4 classes")]
    write_in(models_dir / "m.yaml", "instances: 0\n")
    place(model_files[1]["om"], models_dir / "gate.om")
    await events.wait("loaded", "gate")
    ((version, reason),) = rows()
    assert version == "" and reason.endswith("m.yaml: instances: must be >= 1, got 0")
    write_in(models_dir / "m.yaml", "instances: 1\n")
    await events.wait("loaded", "m")
    assert rows() == [("1", "")]


async def test_a_load_failure_is_not_shown_once_the_version_policy_selects_none(
        make_repo, models_dir, model_files):
    """As above for a config that reads but selects none of the versions: the failure of the
    earlier config stayed in the index and in load_failures (the aclserve_model_load_failure
    metric) beside the problem (found by an independent check)."""
    repo, events = await make_repo()
    (models_dir / "three.txt").write_text("a\nb\nc\n")
    write_in(models_dir / "m.yaml", "outputs: {y: {labels: three.txt}}\n")
    place(model_files[1]["om"], models_dir / "m.om")
    await events.wait("load_failed", "m")
    assert list(repo.load_failures()) == [("m", "1")]
    write_in(models_dir / "m.yaml", "version_policy: {specific: [5]}\n")
    place(model_files[1]["om"], models_dir / "gate.om")
    await events.wait("loaded", "gate")
    assert [(r["version"], r["reason"]) for r in repo.index() if r["name"] == "m"] == [
        ("", "its version_policy {specific: [5]} selects none of the versions found (1)")]
    assert repo.load_failures() == {}


async def test_a_refused_config_edit_is_said_to_be_one(make_repo, models_dir, model_files):
    """A serving version whose config alone changed and failed says it serves the previous
    config, not "the previous file" (found by an independent check)."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo()
    (models_dir / "three.txt").write_text("a\nb\nc\n")
    write_in(models_dir / "m.yaml", "outputs: {y: {labels: three.txt}}\n")
    await events.wait("load_failed", "m")
    assert [(r["state"], r["reason"]) for r in repo.index() if r["name"] == "m"] == [
        ("READY", f"serving the previous config; the new one failed: {models_dir / 'm.yaml'}: outputs.y.labels: "
                  "labels file three.txt has 3 labels; output 'y' has 4 classes")]


async def test_a_policy_selecting_only_a_version_that_fails_keeps_the_serving_one(
        make_repo, models_dir, model_files):
    """`{specific: [2]}` over a serving version 1, with a version 2 that does not load: version 1
    serves on, as any failed file leaves the serving version in place. The replan after the
    failure selected nothing and unloaded it: every request 404 until the config changed back
    (found by an independent check)."""
    place(model_files[1]["om"], models_dir / "vm" / "1" / "model.om")
    repo, events = await make_repo()
    (models_dir / "vm" / "2").mkdir()
    write_in(models_dir / "vm" / "2" / "model.om", b"garbage" * 100)
    await events.wait("load_failed", "vm")
    write_in(models_dir / "vm" / "config.yaml", "version_policy: {specific: [2]}\n")
    await events.wait("load_failed", "vm", count=2)
    place(model_files[1]["om"], models_dir / "gate.om")  # scans after the failure's replan
    await events.wait("loaded", "gate")
    place(model_files[1]["om"], models_dir / "gate2.om")
    await events.wait("loaded", "gate2")
    assert events.count("unloaded", "vm") == 0
    assert float((await repo.get("vm").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0
    place(model_files[2]["om"], models_dir / "vm" / "2" / "model.om", how="copy")  # fixed in place: it settles
    await events.wait("unloaded", "vm", "1")
    assert [e[:3] for e in events.seen if e[1] == "vm" and e[0] in ("loaded", "unloaded")] == [
        ("loaded", "vm", "1"), ("loaded", "vm", "2"), ("unloaded", "vm", "1")]  # 1 served until 2 was in
    assert float((await repo.get("vm").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


async def test_a_version_on_disk_that_the_policy_does_not_select_is_said_to_be_one(
        make_repo, models_dir, model_files):
    """Also while the policy selects none of the versions (the serving one kept): it said "has
    no version 2", as of a version that does not exist (found by an independent check)."""
    place(model_files[1]["om"], models_dir / "vm" / "1" / "model.om")
    place(model_files[2]["om"], models_dir / "vm" / "2" / "model.om")
    (models_dir / "vm" / "config.yaml").write_text("version_policy: {specific: [1]}\n")
    repo, events = await make_repo()
    for gate, policy in (("gate1", "{specific: [1]}"), ("gate2", "{specific: [5]}")):
        write_in(models_dir / "vm" / "config.yaml", f"version_policy: {policy}\n")
        place(model_files[1]["om"], models_dir / f"{gate}.om")
        await events.wait("loaded", gate)
        assert serving(repo)[-1] == "vm" and repo.get("vm").version == "1"
        with pytest.raises(NotFound, match="^model vm version 2 is not selected by its version_policy$"):
            repo.get("vm", "2")
        with pytest.raises(NotFound, match="^model vm has no version 3$"):
            repo.get("vm", "3")


async def test_a_refused_labels_edit_is_said_to_be_one(make_repo, models_dir, model_files):
    """A labels file edited alone to the wrong count names the labels file, not the config
    (found by an independent check)."""
    (models_dir / "four.txt").write_text("a\nb\nc\nd\n")
    (models_dir / "m.yaml").write_text("outputs: {y: {labels: four.txt}}\n")
    place(model_files[1]["om"], models_dir / "m.om")
    os.utime(models_dir / "four.txt", (100, 100))
    os.utime(models_dir / "m.yaml", (100, 100))
    repo, events = await make_repo()
    write_in(models_dir / "four.txt", "a\nb\nc\n")
    await events.wait("load_failed", "m")
    assert [(r["state"], r["reason"]) for r in repo.index() if r["name"] == "m"] == [
        ("READY", f"serving the previous labels file; the new one failed: {models_dir / 'm.yaml'}: "
                  "outputs.y.labels: labels file four.txt has 3 labels; output 'y' has 4 classes")]


async def test_a_refused_file_replaced_in_place_no_longer_shows_its_failure(make_repo, models_dir, model_files):
    """The failure of the file it was stayed in the index (and a request's 404) while the new
    file settled (found by an independent review). The settle gate's clock is a fake one here:
    the new file is complete only when the test says."""
    clock = FakeClock()
    repo, events = await make_repo(clock=clock)
    write_in(models_dir / "m.om", b"garbage" * 100)
    await events.wait("load_failed", "m")
    place(model_files[1]["om"], models_dir / "m.om", how="copy")  # in place: it settles
    place(model_files[1]["om"], models_dir / "gate.om")
    await events.wait("loaded", "gate")
    assert [(r["state"], r["reason"]) for r in repo.index() if r["name"] == "m"] == [
        ("UNAVAILABLE", "waiting for the file to be complete")]
    with pytest.raises(ModelUnavailable):  # a 503 to retry, not the old file's 404
        repo.get("m")
    clock.now += 1.0
    place(model_files[1]["om"], models_dir / "gate2.om")
    await events.wait("loaded", "m")
