"""`aclserve serve`'s trace file checked at its start: trace settings without --trace said, an empty
name, a file it cannot write or a folder refused (a folder taken where --trace-log-frequency
writes beside it)."""
from __future__ import annotations

import pytest

from tests.aclserve_command import run_aclserve


def test_serve_says_trace_settings_without_trace_trace_nothing(tmp_path):
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", "--trace-rate", "1",
                        "--trace-format", "triton", cwd=tmp_path)  # stops at the missing models folder
    assert "--trace-rate, --trace-format given, but tracing is off (no --trace)" in proc.stderr, proc.stderr
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--device", "cpu", "--trace-rate", "1",
                        "--trace", "t.json", cwd=tmp_path)
    assert proc.returncode == 2 and "tracing is off" not in proc.stderr, proc.stderr


def test_serve_refuses_an_empty_trace_file_name(tmp_path):
    """`--trace ''` was taken and traced nothing without a word (a configuration tester's finding)."""
    for args in (("--trace", ""), ("--trace=",)):
        proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", *args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            "aclserve serve: error: argument --trace: needs a file name, got '' (`aclserve serve --help` lists its "
            "arguments)"], proc.stderr


def test_serve_with_a_trace_file_it_cannot_write_says_so_at_start(tmp_path):
    """The traces were written at shutdown only, so they were lost with one ERROR then (found by
    an independent check)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "file").write_text("")
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", "--trace", "file/t.json",
                        cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write the trace file file/t.json" in proc.stderr, proc.stderr


def test_serve_with_a_folder_as_trace_file_says_so_at_start(tmp_path):
    """A folder passed the folder check: the server ran and lost its traces at shutdown with one
    ERROR ("Is a directory") and exit status 0; and a file above the folder said "File exists"."""
    (tmp_path / "models").mkdir()
    (tmp_path / "traces").mkdir()
    (tmp_path / "file").write_text("")
    for trace, said in (("traces", "traces: it is a folder"), ("file/a/t.json", "file is a file, not a folder")):
        proc = run_aclserve("serve", "--port", "0", "--grpc-port", "0", "--models", "models", "--trace", trace,
                            cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr


def test_serve_takes_a_folder_as_trace_file_when_log_frequency_writes_beside_it(tmp_path):
    """With --trace-log-frequency the files are FILE.0, FILE.1, ... beside FILE, so FILE may be a
    folder (the tracer takes such a name through the API: fce3055); the start-up check refused
    it as "it is a folder", a set-up that worked before."""
    from aclserve.cli.serve import _check_trace_folder
    from aclserve.cli.usage import UsageError
    (tmp_path / "run").mkdir()
    _check_trace_folder(str(tmp_path / "run"), log_frequency=100)
    with pytest.raises(UsageError, match="it is a folder"):
        _check_trace_folder(str(tmp_path / "run"), log_frequency=0)
