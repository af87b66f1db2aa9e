"""The repository watcher's own thread stays quiet when the server stops right after starting."""
from __future__ import annotations

import asyncio
import logging

from aclserve.repository.watcher import RepositoryWatcher


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
