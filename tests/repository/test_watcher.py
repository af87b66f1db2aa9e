"""The repository watcher's own thread stays quiet when the server stops right after starting;
the links it watches on the way to the models folder."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil

from aclserve.repository.watcher import RepositoryWatcher, links_on_the_way


def test_a_watcher_stopped_at_once_logs_no_error(tmp_path, caplog):
    async def start_and_stop():
        for _ in range(20):  # a server that fails to bind stops its watcher right after starting it
            watcher = RepositoryWatcher(tmp_path, asyncio.get_running_loop(), lambda path, moved: None)
            watcher.start()
            watcher.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(start_and_stop())
        # what watchdog's emitter says when it is stopped while it reads (a race, so said here too)
        logging.getLogger("watchdog.observers.inotify").error(
            "InotifyEmitter.queue_events() called when the thread is inactive")
        logging.getLogger("watchdog.observers.inotify").error("another watchdog error")
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert said == ["another watchdog error"]


def test_links_on_the_way_follow_components_and_chains(tmp_path):
    (tmp_path / "rel" / "models").mkdir(parents=True)
    os.symlink("rel", tmp_path / "current")
    os.symlink(str(tmp_path / "current"), tmp_path / "abs")
    os.symlink("abs/models", tmp_path / "served")
    os.symlink("loop", tmp_path / "loop")
    assert links_on_the_way(str(tmp_path / "rel" / "models")) == []
    assert links_on_the_way(str(tmp_path / "current" / "models")) == [str(tmp_path / "current")]
    assert links_on_the_way(str(tmp_path / "served")) == [str(tmp_path / p) for p in ("served", "abs", "current")]
    assert len(links_on_the_way(str(tmp_path / "loop"))) == 40


async def until_seen(seen: list, path) -> None:
    """Until the watcher has reported `path` (its events come from watchdog's thread)."""
    for _ in range(500):  # a hang guard, not a timing check
        if str(path) in seen:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no event for {path}: {seen}")


async def replace_and_follow(watcher, seen: list, doomed, folder) -> None:
    """`rm -r doomed`, the models folder made again, its poke of a scan from the folder above
    awaited, then follow() as that scan calls it."""
    seen.clear()
    shutil.rmtree(doomed)
    folder.mkdir(parents=True)
    await until_seen(seen, folder)
    await asyncio.get_running_loop().run_in_executor(None, watcher.follow)


def watched(folder, rounds):
    """Run `rounds(watcher, seen)` against a started watcher of `folder`, then close it."""
    async def scenario():
        seen = []
        watcher = RepositoryWatcher(folder, asyncio.get_running_loop(), lambda path, moved: seen.append(path))
        watcher.start()
        try:
            await rounds(watcher, seen)
        finally:
            watcher.close()
    asyncio.run(scenario())


def test_a_models_folder_made_again_at_its_path_is_watched_even_with_its_old_inode(tmp_path):
    """`rm -r models && mkdir models`: ext4 gives the new folder the freed inode number, so its
    identity alone did not tell it from the old one (a second review); the folder above saw it
    deleted and made, and follow() watches it again."""
    folder = tmp_path / "models"
    folder.mkdir()

    async def rounds(watcher, seen):
        for round_ in range(3):
            await replace_and_follow(watcher, seen, folder, folder)
            (folder / f"b{round_}.om").write_bytes(b"")
            await until_seen(seen, folder / f"b{round_}.om")

    watched(folder, rounds)


def test_the_folder_above_made_again_with_its_old_inode_is_watched_again(tmp_path):
    """`rm -r current && mkdir -p current/models`, ext4 giving both folders their old inode
    numbers: the watch on the old `current` ended with it and was not made again (its identity
    looked the same), so every later change waited for the safety rescan (a third review)."""
    above = tmp_path / "current"
    folder = above / "models"
    folder.mkdir(parents=True)

    async def rounds(watcher, seen):
        for round_ in range(3):
            await replace_and_follow(watcher, seen, above, folder)  # seen from the old `current`
            await replace_and_follow(watcher, seen, folder, folder)  # seen from the new one
            (folder / f"b{round_}.om").write_bytes(b"")
            await until_seen(seen, folder / f"b{round_}.om")

    watched(folder, rounds)
