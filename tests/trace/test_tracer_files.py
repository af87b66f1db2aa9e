"""The Tracer's bounds, whatever the trace_file names a client uses: at most MAX_FILES files in
all, MAX_NAMES names set through the API, MAX_PENDING traces held in memory (waiting for their
file or for the writer thread), and while the writer thread is behind, traces under
log_frequency wait in memory rather than queueing more files (a client that may change trace
settings could otherwise fill the disk or the memory). The limits are lowered here to keep the
tests small."""
import json
import logging
import os
import threading

import pytest

from aclserve.trace import names as names_module
from aclserve.trace import tracer as tracer_module
from aclserve.trace.settings import TraceSettings, TraceSettingsError
from aclserve.trace.tracer import Tracer

EVERY_REQUEST = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1", "trace_file": "t.json"}


def trace_requests(tracer: Tracer, n: int) -> None:
    for k in range(n):
        trace = tracer.start("m", "1", "http", k)
        assert trace is not None
        tracer.finish(trace)


def test_at_most_max_files_are_written_whatever_their_names(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tracer_module, "MAX_FILES", 3)
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST))
    trace_requests(tracer, 2)
    tracer.update({"trace_file": "u.json"})  # another name goes on from the same count
    trace_requests(tracer, 5)
    tracer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0", "t.json.1", "u.json.0"]
    assert [r.levelno for r in caplog.records if "further traces are dropped" in r.getMessage()] \
        == [logging.WARNING]


def test_at_most_max_names_are_set_through_the_api(tmp_path, monkeypatch):
    monkeypatch.setattr(names_module, "MAX_NAMES", 2)
    tracer = Tracer(trace_dir=str(tmp_path))
    for name in ("a.json", "b.json", "a.json"):
        tracer.update({"trace_file": name})
    tracer.update({"trace_file": "b.json"}, model="m")
    with pytest.raises(TraceSettingsError, match="trace_file: this server has taken 2 trace_file names"):
        tracer.update({"trace_file": "c.json"}, model="m")
    assert tracer.settings("m").file == "b.json"  # nothing changed
    tracer.close()


def test_a_trace_file_whose_folder_cannot_be_made_is_refused_when_set(tmp_path):
    """trace_dir under /proc (or any folder that cannot be made): the API answered 200, every
    trace was lost and only the log said so (found by a helper's fuzz of the config). Refused
    when set now, its folder made then."""
    tracer = Tracer(trace_dir="/proc/aclserve-no-such-folder")
    with pytest.raises(TraceSettingsError, match="trace_file: 't.json' cannot be written: its folder cannot be made"):
        tracer.update({"trace_file": "t.json"})
    tracer.close()
    tracer = Tracer(trace_dir=str(tmp_path / "new"))
    tracer.update({"trace_file": "sub/t.json"})
    assert (tmp_path / "new" / "sub").is_dir()
    tracer.close()


def test_traces_held_in_memory_are_bounded_across_files_and_setting_changes(tmp_path, monkeypatch):
    """Each change of trace_file queues the old file's write: traces queued for a writer that is
    behind count against MAX_PENDING as the waiting ones do (a client changing names faster than
    the writer wrote kept every trace of every name in memory)."""
    monkeypatch.setattr(tracer_module, "MAX_PENDING", 4)
    gate = threading.Event()
    write = tracer_module._write
    monkeypatch.setattr(tracer_module, "_write", lambda *args: (gate.wait(30), write(*args)))
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "a.json"})
    trace_requests(tracer, 3)
    tracer.update({"trace_file": "b.json"})  # a.json's 3 traces wait for the writer
    trace_requests(tracer, 3)  # room for one
    tracer.update({"trace_file": "c.json"})
    gate.set()
    tracer.close()
    files = {p.name: json.loads(p.read_text())["otherData"] for p in tmp_path.iterdir()}
    assert {name: (data["requests"], data["dropped"]) for name, data in files.items()} \
        == {"a.json": (3, 0), "b.json": (1, 2)}


def test_while_the_writer_is_behind_traces_wait_instead_of_making_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tracer_module, "MAX_QUEUED_WRITES", 0)  # the writer always behind
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, trace_format="triton"))  # Triton's format: entries named by trace id
    trace_requests(tracer, 5)
    assert list(tmp_path.iterdir()) == []  # none written, none queued
    tracer.close()  # what waits is written at close, in one file
    (written,) = tmp_path.iterdir()
    assert written.name == "t.json.0" and sorted({t["id"] for t in json.loads(written.read_text())}) == [1, 2, 3, 4, 5]


def test_traces_kept_in_memory_only_never_starve_the_files(tmp_path, monkeypatch):
    """Tracing turned on before a trace_file was set keeps its traces for take() (nothing on a
    server takes them): they must not use up the files' MAX_PENDING (every later trace to a file
    was dropped until a restart; found by an independent review)."""
    monkeypatch.setattr(tracer_module, "MAX_PENDING", 4)
    # no trace_file: memory only (the start-up settings only: the API refuses it)
    tracer = Tracer(TraceSettings(level="TIMESTAMPS", rate=1), trace_dir=str(tmp_path))
    trace_requests(tracer, 5)
    tracer.update({"trace_file": "t.json"})
    trace_requests(tracer, 3)
    tracer.update({"trace_level": ["OFF"]})
    tracer.close()
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["requests"] == 3
    assert len(tracer.take()) == 4  # the memory-only ones: their own bound


def test_changes_of_trace_file_queue_no_more_writes_than_the_bound(tmp_path, monkeypatch):
    """A client changing trace_file faster than the writer thread writes: each name left is
    written as the writer has room (its traces wait in memory meanwhile), not queued at once
    (200 changes queued 207 writes; found by an independent review)."""
    monkeypatch.setattr(tracer_module, "MAX_QUEUED_WRITES", 2)
    gate = threading.Event()
    write = tracer_module._write
    monkeypatch.setattr(tracer_module, "_write", lambda *args: (gate.wait(30), write(*args)))
    tracer = Tracer(trace_dir=str(tmp_path))
    names = [f"{letter}.json" for letter in "abcdef"]
    for name in names:
        tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": name})
        trace_requests(tracer, 1)
    assert tracer._queued_writes() <= 2  # the writer's queue, while it is held
    gate.set()
    tracer.close()
    assert {p.name: json.loads(p.read_text())["otherData"]["requests"] for p in tmp_path.iterdir()} \
        == {name: 1 for name in names}


def test_a_file_written_again_is_not_one_more_file(tmp_path, monkeypatch):
    """Without log_frequency a name's file is rewritten each time tracing to it stops: the same
    file, not one more toward MAX_FILES."""
    monkeypatch.setattr(tracer_module, "MAX_FILES", 2)
    tracer = Tracer(trace_dir=str(tmp_path))
    for _ in range(3):
        tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "t.json"})
        trace_requests(tracer, 1)
        tracer.update({"trace_level": ["OFF"]})
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_file": "u.json"})
    trace_requests(tracer, 2)
    tracer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "u.json"]
    assert json.loads((tmp_path / "u.json").read_text())["otherData"]["requests"] == 2


def test_a_file_grows_by_appends_no_further_than_its_bound(tmp_path, monkeypatch, caplog):
    """Each append copies the file, so a client turning tracing on and off to one name made it
    grow, and the copies with the square of the appends (a reviewer: 300 cycles, 100 MB copied):
    past MAX_FILE_BYTES what would be added is dropped, said once."""
    from aclserve.trace import files as files_module
    monkeypatch.setattr(files_module, "MAX_FILE_BYTES", 400)
    tracer = Tracer(trace_dir=str(tmp_path))
    for _ in range(12):
        tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "t.json",
                       "trace_format": "triton"})  # (about 100 bytes a trace)
        trace_requests(tracer, 1)
        tracer.update({"trace_level": ["OFF"]})
    tracer.close()
    held = len(json.loads((tmp_path / "t.json").read_text()))
    assert 1 < held < 12 and (tmp_path / "t.json").stat().st_size <= 400, held
    assert len([r for r in caplog.records if "as many as a trace file may" in r.getMessage()]) == 1


def test_a_name_left_while_the_writer_was_behind_is_written_when_it_catches_up(tmp_path, monkeypatch):
    """With no traffic and no setting change after it, a name left while the writer's queue
    was full is written once the writer finishes (it waited for close(); found by a review)."""
    import asyncio

    monkeypatch.setattr(tracer_module, "MAX_QUEUED_WRITES", 1)
    gate = threading.Event()
    write = tracer_module._write
    monkeypatch.setattr(tracer_module, "_write", lambda *args: (gate.wait(30), write(*args)))

    async def main():
        tracer = Tracer(trace_dir=str(tmp_path))
        tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "a.json"})
        trace_requests(tracer, 1)
        tracer.update({"trace_file": "b.json"})  # a.json queued: the queue is full
        trace_requests(tracer, 1)
        tracer.update({"trace_level": ["OFF"]})  # b.json left, waiting for room
        gate.set()
        for _ in range(3000):  # a hang guard, not a timing check
            if (tmp_path / "b.json").exists():
                break
            await asyncio.sleep(0.01)
        written = sorted(p.name for p in tmp_path.iterdir())
        tracer.close()
        return written
    assert asyncio.run(main()) == ["a.json", "b.json"]


@pytest.mark.parametrize("name,frequency,match", [("afile/t.json", "1", "'afile' is a file, not a folder"),
                                                  ("folder", "0", "it is a folder"),
                                                  ("folder/afile/t.json", "1", "'afile' is a file")])
def test_a_trace_file_that_cannot_be_written_is_refused_when_set(tmp_path, name, frequency, match, caplog):
    """A trace_file whose folder is a file (or which is a folder) failed every write, each an
    ERROR with a traceback, and the traces were lost; refused when set, nothing changes."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "afile").write_text("x")
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, log_frequency=frequency))
    with pytest.raises(TraceSettingsError, match=match):
        tracer.update({"trace_file": name})
    assert tracer.settings().file == "t.json"
    tracer.update({"trace_file": "sub/t.json"})  # a folder that is not there yet is made
    trace_requests(tracer, 1)
    tracer.close()
    assert (tmp_path / "sub" / ("t.json" if frequency == "0" else "t.json.0")).is_file()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("name", ["c" * 256 + "/x.json", "c" * 256, "b" * 254, "\u00e9" * 128, "d/" * 600 + "t.json"])
@pytest.mark.parametrize("frequency", ["0", "1"])
def test_a_trace_file_name_too_long_for_the_filesystem_is_refused_when_set(tmp_path, name, frequency, caplog):
    """A name past the filesystem's 255 bytes a component raised ENAMETOOLONG out of the check
    (500 / INTERNAL), or was taken and failed every write (a 254-byte name: the writer adds
    ".tmp"); refused when set, in bytes, whatever the log frequency (a fuzzer's finding)."""
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, log_frequency=frequency))
    with pytest.raises(TraceSettingsError, match="trace_file: longer than 1024 bytes, or a folder or file name"):
        tracer.update({"trace_file": name})
    assert tracer.settings().file == "t.json"
    tracer.update({"trace_file": "a" * 200})  # the longest name taken, written with what the writer adds
    trace_requests(tracer, 1)
    tracer.close()
    assert [p.name for p in tmp_path.iterdir()] == ["a" * 200 + (".0" if frequency == "1" else "")]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_operators_trace_file_is_not_held_to_the_apis_name_limits(tmp_path):
    """--trace and the config file may name any path the disk takes: a 220-byte folder name."""
    from aclserve.config import load_server_config
    folder = tmp_path / ("f" * 220)
    settings = load_server_config(None, {"trace": {"level": "TIMESTAMPS", "rate": 1, "file": str(folder / "t.json")}}).trace
    tracer = Tracer(settings, trace_dir=str(tmp_path))
    trace_requests(tracer, 1)
    tracer.close()
    assert (folder / "t.json").is_file()


def test_a_write_that_fails_on_the_disk_is_one_error_line_without_a_traceback_and_counted(tmp_path, caplog):
    """Counted for /metrics too (aclserve_trace_files_failed_total): it was an ERROR line alone."""
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, trace_file="sub/t.json"))
    (tmp_path / "sub").rmdir()  # made by the setting, which checks the folder can be
    (tmp_path / "sub").write_text("made a file after the setting")  # (the check above is at setting time)
    trace_requests(tracer, 1)
    tracer.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "could not write" in errors[0].getMessage() and errors[0].exc_info is None
    assert tracer.files_failed == 1


def test_the_name_of_a_folder_is_taken_when_log_frequency_writes_beside_it(tmp_path, caplog):
    """With log_frequency the files written are name.0, name.1, ...: a folder called `name`
    does not stop them (it wrote them before the writability check, which refused it)."""
    (tmp_path / "run").mkdir()
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, trace_file="run"))
    trace_requests(tracer, 2)
    tracer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run.0", "run.1"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_folder_name_in_force_is_refused_when_log_frequency_stops_writing_beside_it(tmp_path):
    """The name itself becomes the file written when log_frequency goes to 0: a folder of that
    name then failed every write (the check ran on a new name only; found by a review)."""
    (tmp_path / "run").mkdir()
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, trace_file="run"))
    with pytest.raises(TraceSettingsError, match="it is a folder"):
        tracer.update({"log_frequency": "0"})
    assert tracer.settings().log_frequency == 1
    tracer.close()


def test_a_write_that_fails_leaves_no_part_behind(tmp_path, caplog):
    """A full disk left a t.json.tmp of what it could write for each failed file (found by
    running the server with its trace folder on a full file system): here the rename fails."""
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, trace_file="t.json"))
    (tmp_path / "t.json.0").mkdir()  # (after the setting, which checks the name can be written)
    (tmp_path / "t.json.0" / "kept").write_text("a folder with something in it: the rename fails")
    trace_requests(tracer, 1)
    tracer.close()
    assert [r for r in caplog.records if "could not write" in r.getMessage()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0"]


def test_a_file_not_as_this_server_wrote_it_is_written_anew(tmp_path):
    """A later write appends to what this server wrote; a file of a previous life, or one removed
    or changed since the server wrote it (aclserve profile --url removes its file once read), is
    replaced: its bytes are not this server's to append to."""
    (tmp_path / "t.json").write_text("a previous life's file")
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "t.json", "trace_format": "triton"})

    def traced_then_off(n):
        trace_requests(tracer, n)
        tracer.update({"trace_level": ["OFF"]})
        for write in tracer.flush():
            write.result()
        tracer.update({"trace_level": ["TIMESTAMPS"]})
        return sorted({e["id"] for e in json.loads((tmp_path / "t.json").read_text())})
    assert traced_then_off(2) == [1, 2]
    assert traced_then_off(1) == [1, 2, 3]  # appended
    (tmp_path / "t.json").unlink()
    assert traced_then_off(1) == [4]
    (tmp_path / "t.json").write_text("[]")
    assert traced_then_off(1) == [5]
    tracer.close()


def test_the_writers_temporary_file_is_hidden(tmp_path, monkeypatch):
    """It was NAME.tmp beside the file, which a `trace.json.*` pattern (the log_frequency
    files') matched while it was written."""
    renamed, replace = [], os.replace

    def spy(source, target):
        renamed.append(os.path.basename(source))
        return replace(source, target)
    monkeypatch.setattr(os, "replace", spy)
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(EVERY_REQUEST, trace_file="trace.json"))
    trace_requests(tracer, 1)
    tracer.close()
    assert renamed == [".trace.json.0.tmp"]


def test_a_file_tracing_left_is_written_once_its_last_trace_sampled_is_in(tmp_path):
    """The trace_count spent (or the level OFF) while sampled requests are still in flight: the
    file is written when the last of them is answered, not at shutdown."""
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2", "trace_file": "t.json"})
    first, second = tracer.start("m", "1", "http", 1), tracer.start("m", "1", "http", 2)
    assert tracer.start("m", "1", "http", 3) is None  # the count spent
    tracer.finish(first)
    assert tracer._writes == []  # the second is still in flight
    tracer.finish(second)
    (write, _), = tracer._writes
    write.result()
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["requests"] == 2
    tracer.close()
