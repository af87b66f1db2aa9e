"""The repository watcher's own thread stays quiet when the server stops right after starting;
the links it watches on the way to the models folder."""
from __future__ import annotations

import asyncio
import logging
import os

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


def test_a_models_folder_made_again_at_its_path_is_watched_even_with_its_old_inode(tmp_path):
    """`rm -r models && mkdir models`: ext4 gives the new folder the freed inode number, so its
    identity alone did not tell it from the old one (a second review); the folder above saw it
    deleted and made, and follow() watches it again."""
    import shutil

    async def scenario():
        folder, seen = tmp_path / "models", []
        folder.mkdir()
        loop = asyncio.get_running_loop()
        watcher = RepositoryWatcher(folder, loop, lambda path, moved: seen.append(path))
        watcher.start()
        try:
            async def until_seen(path) -> None:
                for _ in range(500):  # a hang guard, not a timing check
                    if str(path) in seen:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"no event for {path}: {seen}")

            for _ in range(3):
                seen.clear()
                shutil.rmtree(folder)
                folder.mkdir()
                await until_seen(folder)  # the poke of a scan, from the folder above
                await loop.run_in_executor(None, watcher.follow)  # (the scan calls it first)
                (folder / "b.om").write_bytes(b"")
                await until_seen(folder / "b.om")
        finally:
            watcher.close()

    asyncio.run(scenario())


def test_the_folder_above_made_again_with_its_old_inode_is_watched_again(tmp_path):
    """`rm -r current && mkdir -p current/models`, ext4 giving both folders their old inode
    numbers: the watch on the old `current` ended with it and was not made again (its identity
    looked the same), so every later change waited for the safety rescan (a third review)."""
    import shutil

    async def scenario():
        above = tmp_path / "current"
        folder, seen = above / "models", []
        folder.mkdir(parents=True)
        loop = asyncio.get_running_loop()
        watcher = RepositoryWatcher(folder, loop, lambda path, moved: seen.append(path))
        watcher.start()

        async def until_seen(path) -> None:
            for _ in range(500):  # a hang guard, not a timing check
                if str(path) in seen:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"no event for {path}: {seen}")

        try:
            for round_ in range(3):
                seen.clear()
                shutil.rmtree(above)
                folder.mkdir(parents=True)
                await until_seen(folder)  # its deletion, seen from the old `current`: a scan is poked
                await loop.run_in_executor(None, watcher.follow)
                seen.clear()
                shutil.rmtree(folder)  # the models folder replaced again: seen from the new `current`
                folder.mkdir()
                await until_seen(folder)
                await loop.run_in_executor(None, watcher.follow)
                (folder / f"b{round_}.om").write_bytes(b"")
                await until_seen(folder / f"b{round_}.om")
        finally:
            watcher.close()

    asyncio.run(scenario())
