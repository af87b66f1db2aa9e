"""The device's event resources as CANN counts them (acl/cpu/_event_pool.py): not at creation
(but for create_event_with_flag with ACL_EVENT_SYNC), at each record_event, and a record past
the limit waits for a release instead of failing: its stream's work stops behind it, so a timed
synchronize ends with the timeout code a device's gives. Each case in a process of its own with
ACLSERVE_CPU_MAX_EVENTS=2 (the CPU runtime reads it when ACL starts); the timeouts end waits no
release can end, they time nothing."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from aclserve.acl import constants as C

from tests import REPO

_UP = """
    import json, os, threading
    os.environ["ACLSERVE_CPU_MAX_EVENTS"] = "2"
    from aclserve.acl import cpu as acl
    from aclserve.acl import constants as C
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    s, _ = acl.rt.create_stream()
    t, _ = acl.rt.create_stream()
    out = {}
"""


def _run(*scripts: str) -> dict:
    """The output of _UP then `scripts` (each dedented) in a process of its own; the timeout is
    the guard against a hang."""
    script = "".join(textwrap.dedent(part) for part in (_UP, *scripts))
    proc = subprocess.run([sys.executable, "-c", script + "\nprint(json.dumps(out))\n"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_events_are_made_past_the_limit_but_those_that_take_one_as_they_are_made(cpu_only):
    """CANN: aclrtCreateEvent takes the resources at record_event; aclrtCreateEventExWithFlag's
    are "不受硬件限制"; aclrtCreateEventWithFlag(ACL_EVENT_TIME_LINE) "数量不受限制", with
    ACL_EVENT_SYNC "创建出来的Event数量受限" (207007 past them)."""
    out = _run("""
        sync_time_line = C.ACL_EVENT_SYNC | C.ACL_EVENT_TIME_LINE
        makes = {"create_event": lambda: acl.rt.create_event(),
                 "time_line": lambda: acl.rt.create_event_with_flag(C.ACL_EVENT_TIME_LINE),
                 "ex_sync_time_line": lambda: acl.rt.create_event_ex_with_flag(sync_time_line),
                 "sync": lambda: acl.rt.create_event_with_flag(C.ACL_EVENT_SYNC)}
        for name, make in makes.items():
            out[name] = [make()[1] for _ in range(4)]
    """)
    refused = C.ACL_ERROR_RT_NO_EVENT_RESOURCE
    assert out == {"create_event": [0] * 4, "time_line": [0] * 4, "ex_sync_time_line": [0] * 4,
                   "sync": [0, 0, refused, refused]}


def test_a_record_past_the_limit_holds_its_stream_until_an_event_is_released(cpu_only):
    """The third plain event's record is taken (the device does not refuse it) and waits: what
    its stream holds behind it does not run (an event recorded after it stays not ready), its
    synchronize and the event's end at their timeouts, another stream runs on. Destroying an
    event gives its resource to the waiting record. A plain event recorded again takes a new one
    before it lets go of its last (hicann/runtime Event::Record), so with both held it waits too;
    an abort ends that wait (107023 at the next synchronize)."""
    out = _run("""
        plain = [acl.rt.create_event()[0] for _ in range(3)]
        mark, _ = acl.rt.create_event_with_flag(C.ACL_EVENT_TIME_LINE)  # takes none
        out["records"] = [acl.rt.record_event(e, s) for e in plain + [mark]]
        out["waiting"] = [acl.rt.synchronize_stream_with_timeout(s, 50),
                          acl.rt.synchronize_event_with_timeout(plain[2], 50), acl.rt.query_event_status(mark)[0]]
        other, _ = acl.rt.create_event_with_flag(C.ACL_EVENT_TIME_LINE)
        out["other stream"] = [acl.rt.record_event(other, t), acl.rt.synchronize_stream_with_timeout(t, 10_000)]
        out["released"] = [acl.rt.destroy_event(plain[0]), acl.rt.synchronize_stream_with_timeout(s, 10_000),
                           acl.rt.query_event_status(mark)[0]]
        out["again"] = [acl.rt.record_event(plain[1], s), acl.rt.synchronize_stream_with_timeout(s, 50)]
        out["aborted"] = [acl.rt.stream_abort(s), acl.rt.synchronize_stream_with_timeout(s, 10_000),
                          acl.rt.query_event_status(plain[1])[0]]
    """)
    not_ready, complete = C.ACL_EVENT_RECORDED_STATUS_NOT_READY, C.ACL_EVENT_RECORDED_STATUS_COMPLETE
    assert out == {"records": [0] * 4,
                   "waiting": [C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, not_ready],
                   "other stream": [0, 0], "released": [0, 0, complete],
                   "again": [0, C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT],
                   "aborted": [0, C.ACL_ERROR_RT_STREAM_ABORT, complete]}


def test_a_sync_event_of_create_event_ex_with_flag_holds_one_while_its_record_is_waited_for(cpu_only):
    """Its resource goes back once its record ran and the stream waits queued for that record
    ended (hicann/runtime: such an event's id is freed at completion): five records in a row
    need no more than two, but while stream t, held by a host callback, has yet to reach its
    wait for the first record, the record after it waits for that one."""
    out = _run("""
        ex = [acl.rt.create_event_ex_with_flag(C.ACL_EVENT_SYNC)[0] for _ in range(5)]
        out["in a row"] = [acl.rt.record_event(e, s) for e in ex] + [acl.rt.synchronize_stream_with_timeout(s, 10_000)]
        stop, gate = threading.Event(), threading.Event()

        def loop(args):
            acl.rt.set_context(ctx)
            while not stop.is_set():
                acl.rt.process_report(50)
        tid, _ = acl.util.start_thread(loop, [])
        assert acl.rt.subscribe_report(tid, t) == 0
        assert acl.rt.launch_callback(lambda data: gate.wait(), None, C.ACL_CALLBACK_BLOCK, t) == 0
        held, _ = acl.rt.create_event_with_flag(C.ACL_EVENT_SYNC)  # the other of the two, for good
        out["waited for"] = [acl.rt.record_event(ex[0], s), acl.rt.stream_wait_event(t, ex[0]),
                             acl.rt.record_event(ex[1], s), acl.rt.synchronize_stream_with_timeout(s, 50)]
        gate.set()
        out["once waited"] = [acl.rt.synchronize_stream_with_timeout(t, 10_000),
                              acl.rt.synchronize_stream_with_timeout(s, 10_000)]
        assert acl.rt.unsubscribe_report(tid, t) == 0
        stop.set()
        assert acl.util.stop_thread(tid) == 0
    """)
    assert out == {"in a row": [0] * 6, "waited for": [0, 0, 0, C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT],
                   "once waited": [0, 0]}


# Both resources held for good by two plain events recorded on t; the third plain event's record
# on s then waits (and a TIME_LINE event recorded behind it, which takes none, with it).
_HELD_AND_WAITING = """
    held = [acl.rt.create_event()[0] for _ in range(2)]
    out["held"] = [acl.rt.record_event(e, t) for e in held] + [acl.rt.synchronize_stream(t)]
    late, _ = acl.rt.create_event()
    mark, _ = acl.rt.create_event_with_flag(C.ACL_EVENT_TIME_LINE)
    out["waiting"] = [acl.rt.record_event(late, s), acl.rt.record_event(mark, s),
                      acl.rt.synchronize_stream_with_timeout(s, 50)]
"""
# Every event gone, the device's events are whole again: as many as it has are taken at creation
_WHOLE = """
    out["whole"] = [acl.rt.create_event_with_flag(C.ACL_EVENT_SYNC)[1] for _ in range(3)]
"""
_WAITED = {"held": [0, 0, 0], "waiting": [0, 0, C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT],
           "whole": [0, 0, C.ACL_ERROR_RT_NO_EVENT_RESOURCE]}
_COMPLETE = C.ACL_EVENT_RECORDED_STATUS_COMPLETE


def test_destroying_a_stream_whose_record_waits_for_an_event_ends_the_wait(cpu_only):
    """destroy_stream runs what the stream holds and joins its thread; a record that waits for a
    resource (which a device's stream never holds: its recording thread waits in record_event)
    gives up its wait and completes without one, as at an abort, where the join hung for a
    release that nothing here makes. The work behind it runs; nothing is lost from the pool."""
    out = _run(_HELD_AND_WAITING, """
        out["destroyed"] = [acl.rt.destroy_stream(s), acl.rt.query_event_status(late)[0],
                            acl.rt.query_event_status(mark)[0]]
        out["released"] = [acl.rt.destroy_event(e) for e in held + [late, mark]]
    """, _WHOLE)
    assert out == {**_WAITED, "destroyed": [0, _COMPLETE, _COMPLETE], "released": [0] * 4}


def test_destroying_a_context_whose_records_wait_for_events_ends_the_waits(cpu_only):
    """destroy_context closes its streams (its default one too) and destroys its events: records
    of its events waiting for a resource on either stream give up their waits, where it hung."""
    out = _run("""
        held = [acl.rt.create_event()[0] for _ in range(2)]
        out["held"] = [acl.rt.record_event(e, t) for e in held] + [acl.rt.synchronize_stream(t)]
        other, _ = acl.rt.create_context(0)
        stream, _ = acl.rt.create_stream()
        late = [acl.rt.create_event()[0] for _ in range(2)]
        out["waiting"] = [acl.rt.record_event(late[0], stream), acl.rt.record_event(late[1], 0),
                          acl.rt.synchronize_stream_with_timeout(stream, 50)]
        out["destroyed"] = [acl.rt.destroy_context(other), acl.rt.set_context(ctx)]
        out["released"] = [acl.rt.destroy_event(e) for e in held]
    """, _WHOLE)
    assert out == {**_WAITED, "destroyed": [0, 0], "released": [0, 0]}


def test_destroying_the_event_of_a_record_that_waits_lets_its_stream_run_on(cpu_only):
    """The resource a destroyed event's record waits for would go back as soon as the record
    ran: the wait gives up instead, so the stream runs on (it waited until a release)."""
    out = _run(_HELD_AND_WAITING, """
        out["destroyed"] = [acl.rt.destroy_event(late), acl.rt.synchronize_stream_with_timeout(s, 10_000),
                            acl.rt.query_event_status(mark)[0]]
        out["released"] = [acl.rt.destroy_event(e) for e in held + [mark]]
    """, _WHOLE)
    assert out == {**_WAITED, "destroyed": [0, 0, _COMPLETE], "released": [0] * 3}
