"""`aclserve compile` on the CPU path says a long compile still runs, as ATC's lines say their elapsed
time: a 1.2 GB model's compile printed nothing between its first line and its last for 55-70 s, so a
slow compile looked hung. The compile is held in its child (compile_child's ACLSERVE_COMPILE_HOLD) until
the line has come, and the interval is made short (compile_process.STILL_COMPILING_EVERY_S) by the
command's own process before it runs the CLI."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

from tests import REPO
from tests.tiny_models import scale_onnx

HANG_GUARD_S = 90  # (not a timing: the held compile goes on once the line has come)
FIRST_LINE_GUARD_S = 30  # (not a timing either: said every 0.05 s from the start; before the change never)
RUN_CLI = ("import sys; from aclserve.om import compile_process; compile_process.STILL_COMPILING_EVERY_S = 0.05; "
           "from aclserve.cli import main; sys.exit(main(sys.argv[1:]))")


def _held_compile(tmp_path) -> tuple[subprocess.Popen, str]:
    """`aclserve compile` of a small model, its compile held (compile_holds): (the process, the OM's path)."""
    model, om = scale_onnx(tmp_path / "m.onnx", 2.0), str(tmp_path / "m.om")
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, "compile", model, "-o", om, "--target", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc, om


def _first_line(proc: subprocess.Popen) -> str:
    """The command's first line on stdout ("" if none within the hang guard: the compile is held, and
    before the change nothing was said until it ended)."""
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(FIRST_LINE_GUARD_S)
    return said[0] if said else ""


def _release(compile_holds) -> None:
    """Let the held compile go on, once its child holds (it may say it still compiles before)."""
    for _ in range(HANG_GUARD_S * 100):
        marks = list(compile_holds.iterdir())
        if marks:
            break
        time.sleep(0.01)
    for mark in marks:
        mark.unlink()


def test_a_long_cpu_compile_says_it_still_runs_on_stdout(tmp_path, compile_holds):
    proc, om = _held_compile(tmp_path)
    try:
        first = _first_line(proc)  # (held: nothing else is said until the compile goes on)
        _release(compile_holds)
        assert first.startswith("still compiling m.onnx: "), first
        rest, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        proc.kill()
    lines = [first.rstrip("\n")] + rest.splitlines()
    assert proc.returncode == 0 and err == "", err
    assert re.fullmatch(r"still compiling m\.onnx: \d+ s", lines[0]), lines
    compiling = next(i for i, line in enumerate(lines) if line.startswith("compiling "))
    assert all(re.fullmatch(r"still compiling m\.onnx: \d+ s", line) for line in lines[:compiling]), lines
    assert lines[compiling] == f"compiling {tmp_path / 'm.onnx'} for the CPU runtime (ATC not used)", lines
    assert os.path.isfile(om)


def test_a_reader_gone_after_a_still_compiling_line_leaves_the_compile_to_its_end(tmp_path, compile_holds):
    """As README says of `aclserve compile m.onnx | head -1`: what cannot be written is dropped, the OM
    is written, and the command exits 141."""
    proc, om = _held_compile(tmp_path)
    try:
        first = _first_line(proc)
        _release(compile_holds)
        assert first.startswith("still compiling m.onnx: "), first
        proc.stdout.close()  # (the reader leaves, as `head -1` does)
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (141, "") and os.path.isfile(om), err


def test_the_child_s_lines_come_whole_however_its_pipe_splits_them():
    """The waiting loop reads the child's pipe in chunks (compile_process._lines): a line cut across
    chunks, a long one, an empty one and a last one without its newline come as written."""
    from aclserve.om.compile_process import _lines
    data = b"a\nbb" + b"x" * 300_000 + b"\n\nccc"
    read_end, write_end = os.pipe()

    def write() -> None:
        for start in range(0, len(data), 7_000):
            os.write(write_end, data[start:start + 7_000])
        os.close(write_end)

    writer = threading.Thread(target=write)
    writer.start()
    with os.fdopen(read_end, "rb") as pipe:
        lines = list(_lines(pipe, lambda: None))
    writer.join()
    assert lines == data.split(b"\n")
