"""A bug of the scan (an unexpected exception scanning one model's files) is that model's problem:
logged with its traceback once while it lasts, in either log format, and kept as text, so that the
scan's result is freed with its last reference."""
from __future__ import annotations

import gc
import json
import logging
import weakref

from aclserve.config import ModelConfig
from aclserve.logs import JsonFormatter, TextFormatter
from aclserve.repository import layout
from aclserve.repository.layout import scan
from aclserve.repository.planner import Planner
from aclserve.repository.settle import SettleGate

from .repo_helpers import touch


DEFAULTS = ModelConfig()


def test_a_bug_of_the_scan_is_logged_with_its_traceback_once_while_it_lasts(tmp_path, monkeypatch, caplog):
    """An unexpected exception scanning one model's files was logged with its traceback at every
    rescan (every few seconds in poll mode), forever. Now once at ERROR, again only when the
    failure changes or after the model scanned fine; the repeats at DEBUG. The scan puts it on its
    result and the Planner says it, once per repository: two on one folder each say it (a record
    kept by the scan for the whole process said it in one repository's log only)."""
    touch(tmp_path / "ok.om")
    touch(tmp_path / "bad.om")
    failure = {"error": RuntimeError("boom")}
    real_pick = layout._pick

    def pick(root, folder, stem, result, name):
        if name == "bad" and failure["error"] is not None:
            raise failure["error"]
        return real_pick(root, folder, stem, result, name)

    monkeypatch.setattr(layout, "_pick", pick)
    caplog.set_level(logging.DEBUG, logger="aclserve.repository")
    planner = Planner(tmp_path, DEFAULTS, SettleGate(0.0), unload_missing=True)

    def errors_after_scans(times, planners=(planner,)):
        caplog.clear()
        for _ in range(times):
            for each in planners:
                each.scan = scan(tmp_path, DEFAULTS)
                assert "ok" in each.scan.models
                each.plans({}, "all", frozenset(), set())
        said = [r for r in caplog.records if "scanning its files failed" in r.getMessage()]
        assert all((r.exc_text or "").startswith("Traceback") for r in said), caplog.text  # the traceback even at DEBUG
        return sum(r.levelno >= logging.ERROR for r in said), len(said)

    assert errors_after_scans(3) == (1, 3)  # the repeats at DEBUG
    assert scan(tmp_path, DEFAULTS).problems["bad"].startswith("its files could not be scanned")
    failure["error"] = RuntimeError("another boom")  # another failure: said again
    assert errors_after_scans(2) == (1, 2)
    failure["error"] = None  # scanned fine, then the same failure again: said again
    assert errors_after_scans(1) == (0, 0)
    failure["error"] = RuntimeError("another boom")
    assert errors_after_scans(2) == (1, 2)
    other = Planner(tmp_path, DEFAULTS, SettleGate(0.0), unload_missing=True)  # another repository, same folder
    assert errors_after_scans(2, (planner, other)) == (1, 4)  # said in its log too, once


def test_a_bug_of_the_scan_is_kept_as_text_and_its_result_freed_with_its_last_reference(tmp_path, monkeypatch):
    """The scan's result kept the exception a bug raised, whose traceback held the scan's frames,
    the result among them: a cycle that kept every frame of the scan alive until the cycle
    collector ran, for as long as the planner kept the scan. It keeps the failure as text."""
    touch(tmp_path / "bad.om")

    def pick(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(layout, "_pick", pick)
    gc.disable()  # (freed by its last reference going, not by a collection)
    try:
        result = scan(tmp_path, DEFAULTS)
        failure = result.errors["bad"]
        assert failure.what == "RuntimeError: boom"
        assert failure.traceback.startswith("Traceback") and failure.traceback.endswith("RuntimeError: boom")
        freed = weakref.ref(result)
        del result
        assert freed() is None
    finally:
        gc.enable()


def test_a_scan_failure_kept_as_text_is_logged_with_its_traceback_in_either_log_format(tmp_path, monkeypatch):
    """The line the planner logs from the text, as it was from the exception: the message, then
    the traceback (text format), or the traceback as the JSON line's "exc"."""
    touch(tmp_path / "bad.om")

    def pick(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(layout, "_pick", pick)
    failure = scan(tmp_path, DEFAULTS).errors["bad"]
    records = []
    logger = logging.getLogger("tests.scan_failure")
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        failure.log(logger, logging.ERROR, "model %s: scanning its files failed", "bad")
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert TextFormatter("%(message)s").format(record) == "model bad: scanning its files failed\n" + failure.traceback
    assert json.loads(JsonFormatter().format(record))["exc"] == failure.traceback
