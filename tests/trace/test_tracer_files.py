"""The Tracer's files under log_frequency 1 at every request: one trace_file name gets at most
MAX_FILES files, and while the writer thread is behind the traces wait in memory rather than
queueing more files (a client that may change trace settings could otherwise fill the disk or
the writer's queue). The limits are lowered here to keep the test small."""
import json
import logging

from aclserve.trace import tracer as tracer_module
from aclserve.trace.tracer import Tracer

EVERY_REQUEST = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1", "trace_file": "t.json"}


def trace_requests(tracer: Tracer, n: int) -> None:
    for k in range(n):
        trace = tracer.start("m", "1", "http", k)
        assert trace is not None
        tracer.finish(trace)


def test_a_trace_file_name_gets_at_most_max_files(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tracer_module, "MAX_FILES", 3)
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST))
    trace_requests(tracer, 7)
    tracer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0", "t.json.1", "t.json.2"]
    assert [r.levelno for r in caplog.records if "further traces for it are dropped" in r.getMessage()] \
        == [logging.WARNING]


def test_while_the_writer_is_behind_traces_wait_instead_of_making_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tracer_module, "MAX_QUEUED_WRITES", 0)  # the writer always behind
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, trace_format="triton"))  # Triton's format: entries named by trace id
    trace_requests(tracer, 5)
    assert list(tmp_path.iterdir()) == []  # none written, none queued
    tracer.close()  # what waits is written at close, in one file
    (written,) = tmp_path.iterdir()
    assert written.name == "t.json.0" and sorted({t["id"] for t in json.loads(written.read_text())}) == [1, 2, 3, 4, 5]
