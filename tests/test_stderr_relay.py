"""`aclserve serve`'s fd 2 relay (cli/stderr_relay.py) in processes of their own, set up as serve
sets it (relay_for_logs): what native code writes to fd 2 comes out on the real stderr byte for
byte and in order with the log's lines, or is counted dropped when the log's queue is full; what is
written once it is closed goes to the real stderr directly, and so does faulthandler's dump of a
crash, which no relay thread outlives. Under `log_format: json` each native line is a JSON object
(native_lines.py). tests/server/test_log_writer.py has a whole server's."""
from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap

from aclserve.cli.stderr_relay import LINE_BYTES
from aclserve.logs import QUEUE_LINES, SERVER_LINES

SET_UP = """
import logging, os, subprocess, sys, threading
from aclserve import logs
from aclserve.cli.stderr_relay import relay_for_logs
relay = relay_for_logs("info", os.environ.get("TEST_LOG_FORMAT", "text"))
"""


def _run(script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SET_UP + textwrap.dedent(script)], capture_output=True,
                          timeout=120, env={**os.environ, **env})


def test_native_writes_come_out_as_written_in_order_with_the_log_s_lines():
    """Bytes that are not UTF-8, a line longer than LINE_BYTES (queued in pieces), a thread's uncaught
    exception (Python writes it to sys.stderr), a child's stderr, an unfinished last line: all on
    the real stderr as written, after the log line logged before them. After close() fd 2 is the
    real stderr again: Python's last traceback reaches it."""
    done = _run(f"""
        logging.getLogger("t").warning("first")
        os.write(2, b"not utf-8: \\xff\\n")
        os.write(2, b"x" * {2 * LINE_BYTES + 10} + b"\\n")
        thread = threading.Thread(target=lambda: 1 / 0, name="doomed")
        thread.start()
        thread.join()
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('from a child\\\\n')"], check=True)
        os.write(2, b"unfinished")
        relay.close()
        logs.stop_queue()
        raise RuntimeError("the last words")
    """)
    err = done.stderr
    assert done.returncode == 1, err[-2000:]
    assert err.index(b"WARNING t: first\n") < err.index(b"\nnot utf-8: \xff\n"), err[:500]
    assert b"\n" + b"x" * (2 * LINE_BYTES + 10) + b"\n" in err, err[:500]
    assert err.index(b'Exception in thread doomed') < err.index(b"ZeroDivisionError") < err.index(b"from a child\n")
    assert err.index(b"from a child\n") < err.index(b"unfinishedTraceback (most recent call last):")
    assert err.endswith(b"RuntimeError: the last words\n"), err[-500:]


def test_native_lines_past_the_queue_are_dropped_and_counted_not_waited_for():
    """stderr read by nobody: the native lines the log's queue has no room for are counted in
    lines_dropped() (aclserve_log_lines_dropped_total), none waited for; once the reader goes on,
    those kept come out, then the line saying how many were dropped."""
    written = 4 * QUEUE_LINES  # (13 bytes a line: the pipe holds some 5,000 of them, the queue 3,840)
    proc = subprocess.Popen([sys.executable, "-c", SET_UP + textwrap.dedent(f"""
        for i in range({written}):
            os.write(2, b"native %05d\\n" % i)
        relay.close()  # (everything the pipe held queued, or dropped)
        print(logs.lines_dropped(), flush=True)
        sys.stdin.read()  # the test reads stderr from here on
        logs.stop_queue()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        dropped = int(proc.stdout.readline())  # (said with stderr still unread)
        proc.stdin.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 0, err[-2000:]
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
    lines = err.splitlines()
    kept = [line for line in lines if line.startswith("native ")]
    assert dropped > 0
    assert len(kept) + dropped == written, (len(kept), dropped)
    assert kept == sorted(kept)
    assert lines[-1].endswith(f"WARNING aclserve.logs: {dropped} log line(s) dropped: stderr was not read as "
                              f"fast as they came (the queue holds {QUEUE_LINES} lines, the request log's "
                              f"{QUEUE_LINES - SERVER_LINES} of them at most)"), lines[-3:]


def test_faulthandler_s_dump_of_a_crash_reaches_the_real_stderr():
    """A crash (SIGSEGV) ends the relay thread with the process: faulthandler's dump, written to fd 2,
    stayed in the pipe and was lost. It is pointed at the real stderr."""
    done = _run("""
        import faulthandler
        logging.getLogger("t").warning("before the crash")
        faulthandler._sigsegv()
    """, PYTHONFAULTHANDLER="1")
    assert done.returncode == -signal.SIGSEGV, done.stderr[-2000:]
    assert b"Fatal Python error: Segmentation fault" in done.stderr, done.stderr[-2000:]
    assert b"Current thread" in done.stderr or b"Thread 0x" in done.stderr, done.stderr[-2000:]


def test_under_json_each_native_line_is_one_object_its_bytes_escaped_none_dropped():
    """Under `log_format: json` the native lines were written byte for byte: lines a pipeline that
    parses each stderr line as JSON failed on. Each is an object now, logger "native", `message` its
    text without the newline: bytes that are not UTF-8 escaped, a "%" as it is, a line past LINE_BYTES
    in pieces cut between characters (the € split by LINE_BYTES escaped in neither), a thread's
    traceback, the unfinished last line; level absl's letter (grpc core's lines), else warning."""
    long_text = "é" + "x" * (LINE_BYTES - 3) + "€" + "y" * 10  # (the € starts at the first piece's last byte)
    done = _run(f"""
        logging.getLogger("t").warning("first")
        os.write(2, b"not utf-8: \\xff, a lone surrogate: \\xed\\xa0\\x80, 100% %s\\n")
        os.write(2, {long_text.encode()!r} + b"\\n")
        os.write(2, b"E1207 13:16:44.606371    6241 chttp2_server.cc:1191] the port\\n")
        os.write(2, b"I1207 13:16:44.606371    6241 init.cc:124] grpc_init(void)\\n")
        thread = threading.Thread(target=lambda: 1 / 0, name="doomed")
        thread.start()
        thread.join()
        os.write(2, b"unfinished")
        relay.close()
        logs.stop_queue()
        logs.queue_native(b"after the stop\\n")  # (written at once, in this thread)
    """, TEST_LOG_FORMAT="json")
    assert done.returncode == 0, done.stderr[-2000:]
    docs = [json.loads(line) for line in done.stderr.splitlines()]  # every line an object
    assert docs[0]["logger"] == "t" and docs[0]["message"] == "first", docs[:2]
    native = docs[1:]
    assert {doc["logger"] for doc in native} == {"native"}, native
    for doc in native:
        assert datetime.datetime.fromisoformat(doc["ts"].replace("Z", "+00:00")).tzinfo, doc
    messages = [doc["message"] for doc in native]
    assert messages[0] == "not utf-8: \\xff, a lone surrogate: \\xed\\xa0\\x80, 100% %s", messages[0]
    assert messages[1] + messages[2] == long_text and messages[1].endswith("x"), [m[-5:] for m in messages[1:3]]
    assert messages[3:5] == ["E1207 13:16:44.606371    6241 chttp2_server.cc:1191] the port",
                             "I1207 13:16:44.606371    6241 init.cc:124] grpc_init(void)"]
    assert messages[5].startswith("Exception in thread doomed") and "ZeroDivisionError: division by zero" in messages
    assert messages[-2:] == ["unfinished", "after the stop"], messages[-3:]
    levels = [doc["level"] for doc in native]
    assert levels[3:5] == ["error", "info"], levels
    assert set(levels[:3] + levels[5:]) == {"warning"}, levels


def test_under_json_a_line_s_pieces_say_it_goes_on_and_carry_its_level():
    """A line past LINE_BYTES came out as objects with nothing joining them, the first with the level of its
    absl prefix and the others `warning`. Each piece but the last says `"continued": true` now, each has the
    line's level; a line left unfinished at close ends with its last piece (not continued), and one of
    LINE_BYTES left unfinished is one object, not a piece said to go on with nothing after it."""
    prefix = b"E1207 13:16:44.606371    6241 chttp2_server.cc:1191] "
    long_line = prefix + b"x" * (2 * LINE_BYTES + 100)
    done = _run(f"""
        os.write(2, {long_line!r} + b"\\n")
        os.write(2, b"short\\n")
        os.write(2, b"u" * {LINE_BYTES + 10})  # (left unfinished at close)
        relay.close()
        logs.stop_queue()
    """, TEST_LOG_FORMAT="json")
    assert done.returncode == 0, done.stderr[-2000:]
    docs = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(doc["level"], doc.get("continued")) for doc in docs] == [("error", True), ("error", True), ("error", None),
                                                                   ("warning", None), ("warning", True),
                                                                   ("warning", None)], docs
    assert "".join(doc["message"] for doc in docs[:3]) == long_line.decode(), [len(doc["message"]) for doc in docs]
    assert docs[3]["message"] == "short"
    assert docs[4]["message"] + docs[5]["message"] == "u" * (LINE_BYTES + 10)
    done = _run(f"""
        os.write(2, b"v" * {LINE_BYTES} + b"\\n")  # (whole: LINE_BYTES besides its newline)
        os.write(2, b"w" * {LINE_BYTES})
        relay.close()
        logs.stop_queue()
    """, TEST_LOG_FORMAT="json")
    assert [(doc["message"], doc.get("continued")) for doc in map(json.loads, done.stderr.splitlines())] == [
        ("v" * LINE_BYTES, None), ("w" * LINE_BYTES, None)], done.stderr[-500:]
