"""DynamicBatcher failures, ordering, drain/close, statistics and the real loop clock."""
import asyncio

import numpy as np
import pytest

from aclserve.errors import ExecutionFailed, ModelUnavailable, RequestTimeout, ShuttingDown
from aclserve.scheduling import BatchingConfig, DynamicBatcher, QueuePolicy

pytestmark = pytest.mark.asyncio


def check(env, task, tag, rows=1):
    np.testing.assert_array_equal(task.result().outputs["y"], env.expected(tag, rows))


async def complete_all(env, executor):
    while executor.pending:
        for run in executor.pending:
            run.complete()
        await env.settle()


async def test_failed_run_fails_only_its_requests_and_batching_goes_on(env):
    batcher, executor = env.make(env.FakeExecutor(gears=(1, 2)))
    first = env.submit(batcher, 1)
    await env.settle()
    second = env.submit(batcher, 2)
    await env.settle()
    executor.runs[0].fail(ExecutionFailed("device fault on fake_0"))
    await env.settle()
    with pytest.raises(ExecutionFailed, match="device fault"):
        first.result()
    assert executor.runs[1].tags == [2]
    executor.runs[1].fail(ValueError("unexpected"))  # not a ServeError: wrapped, logged
    third = env.submit(batcher, 3)
    await env.settle()
    with pytest.raises(ExecutionFailed, match="ValueError"):
        second.result()
    await complete_all(env, executor)
    check(env, third, 3)
    # as Triton's: queue and compute count the answered requests only; `fail` is the server's count
    assert batcher.stats.success.count == batcher.stats.queue.count == batcher.stats.compute_infer.count == 1


async def test_submit_raising_fails_that_run_only(env):
    executor = env.FakeExecutor()
    batcher, _ = env.make(executor)
    real_submit = executor.submit
    calls = []

    def flaky(batch):
        calls.append(batch.gear)
        if len(calls) == 1:
            raise RuntimeError("launcher thread gone")
        return real_submit(batch)

    executor.submit = flaky
    first = env.submit(batcher, 1)
    await env.settle()
    with pytest.raises(ExecutionFailed, match="RuntimeError"):
        first.result()
    second = env.submit(batcher, 2)
    await env.settle()
    await complete_all(env, executor)
    check(env, second, 2)


async def test_scheduling_error_fails_the_head_request_and_the_loop_survives(env):
    executor = env.FakeExecutor()
    batcher, _ = env.make(executor)
    real_lanes = executor.lanes
    broken = [True]

    def lanes():
        if broken.pop() if broken else False:
            raise RuntimeError("pool state corrupted")
        return real_lanes()

    executor.lanes = lanes
    first = env.submit(batcher, 1)
    second = env.submit(batcher, 2)
    await env.settle()
    with pytest.raises(ExecutionFailed, match="internal batching error"):
        first.result()
    await complete_all(env, executor)
    check(env, second, 2)


async def test_a_dead_loop_task_is_logged_and_restarted(env, caplog):
    batcher, executor = env.make()
    batcher.start()
    original = batcher._schedule
    crashes = []

    def crash_once():
        if not crashes:
            crashes.append(1)
            raise RuntimeError("bug")
        original()

    batcher._schedule = crash_once
    task = env.submit(batcher, 1)
    await env.settle()
    assert crashes and "loop task died" in caplog.text
    batcher._wakeup.set()  # the restarted task picks up the queued request
    await env.settle()
    await complete_all(env, executor)
    check(env, task, 1)


async def test_preserve_ordering_releases_results_in_arrival_order(env):
    executor = env.FakeExecutor(gears=(1,), slots=2)
    batcher, _ = env.make(executor, preserve_ordering=True)
    first, second = env.submit(batcher, 1), env.submit(batcher, 2)
    await env.settle()
    assert [run.tags for run in executor.runs] == [[1], [2]]
    executor.runs[1].complete()
    await env.settle()
    assert not second.done()  # held until the earlier request is answered
    executor.runs[0].complete()
    await env.settle()
    check(env, first, 1)
    check(env, second, 2)


async def test_without_preserve_ordering_results_leave_as_runs_finish(env):
    executor = env.FakeExecutor(gears=(1,), slots=2)
    batcher, _ = env.make(executor)
    first, second = env.submit(batcher, 1), env.submit(batcher, 2)
    await env.settle()
    executor.runs[1].complete()
    await env.settle()
    assert second.done() and not first.done()


async def test_preserve_ordering_does_not_hold_results_behind_a_timed_out_request(env):
    executor = env.FakeExecutor(gears=(1,), slots=1)
    batcher, _ = env.make(executor, preserve_ordering=True)
    first = env.submit(batcher, 1)
    late = env.submit(batcher, 2, timeout_us=1000)
    after = env.submit(batcher, 3)
    await env.settle()
    env.clock.advance(0.002)
    await env.settle()
    with pytest.raises(RequestTimeout):
        late.result()
    await complete_all(env, executor)
    check(env, first, 1)
    check(env, after, 3)


async def test_a_timeout_while_no_instance_can_run_names_why(env):
    """Every instance out of rotation, each rebuild failing: queued requests were told only that
    they timed out in the queue, while the index knew the device fault behind it."""
    executor = env.FakeExecutor(gears=(1,), slots=1)
    batcher, _ = env.make(executor)
    executor.slots = 0
    executor.out_of_service_reason = "no instance can run a batch: rebuilding failed (507011); trying again"
    late = env.submit(batcher, 1, timeout_us=1000)
    await env.settle()
    env.clock.advance(0.002)
    await env.settle()
    with pytest.raises(RequestTimeout, match=r"in the queue \(no instance can run a batch: rebuilding failed "
                                             r"\(507011\); trying again\)$"):
        late.result()


async def test_preserve_ordering_releases_held_results_when_the_head_times_out(env):
    executor = env.FakeExecutor(gears=(1,))
    batcher, _ = env.make(executor, preserve_ordering=True)
    first = env.submit(batcher, 1)
    await env.settle()
    head = env.submit(batcher, 2, timeout_us=1000)
    urgent = env.submit(batcher, 3, priority=1)  # arrives later, runs earlier
    await env.settle()
    executor.runs[0].complete()
    await env.settle()
    check(env, first, 1)  # ahead of the head: answered at once
    assert executor.runs[1].tags == [3]
    executor.slots = 0  # the freed slot is not usable: the head stays queued
    executor.runs[1].complete()
    await env.settle()
    assert not urgent.done()  # held behind the queued head
    env.clock.advance(0.002)
    await env.settle()
    with pytest.raises(RequestTimeout):
        head.result()
    check(env, urgent, 3)
    assert len(executor.runs) == 2


async def test_preserve_ordering_releases_held_results_when_the_head_is_cancelled(env):
    executor = env.FakeExecutor(gears=(1,), slots=2)
    batcher, _ = env.make(executor, preserve_ordering=True)
    head, second = env.submit(batcher, 1), env.submit(batcher, 2)
    await env.settle()
    executor.runs[1].complete()
    await env.settle()
    assert not second.done()
    head.cancel()
    await env.settle()
    check(env, second, 2)
    executor.runs[0].complete()
    await env.settle()


async def test_drain_refuses_new_requests_and_waits_for_queued_and_running(env):
    batcher, executor = env.make(env.FakeExecutor(gears=(1,)))
    running, queued = env.submit(batcher, 1), env.submit(batcher, 2)
    await env.settle()
    drain = asyncio.ensure_future(batcher.drain(timeout=None))
    await env.settle()
    with pytest.raises(ModelUnavailable, match="draining"):
        await batcher.infer(env.make_rows(3, 1), 1)
    assert not drain.done()
    executor.runs[0].complete()
    await env.settle()
    assert not drain.done()  # the queued request still runs
    executor.runs[1].complete()
    await env.settle()
    assert drain.result() is True
    check(env, running, 1)
    check(env, queued, 2)


async def test_drain_timeout_returns_false_and_leaves_work_alone(env):
    batcher, executor = env.make()
    task = env.submit(batcher, 1)
    await env.settle()
    assert await batcher.drain(timeout=0.001) is False
    await complete_all(env, executor)
    check(env, task, 1)


async def test_close_fails_queued_and_running_with_shutting_down(env):
    batcher, executor = env.make(env.FakeExecutor(gears=(1,)),
                                 default_queue_policy=QueuePolicy(default_timeout_ms=100))
    running, queued = env.submit(batcher, 1), env.submit(batcher, 2)
    await env.settle()
    loop_task = batcher._task
    await batcher.close()
    await batcher.close()  # idempotent
    await env.settle()
    assert loop_task.done()
    for task in (running, queued):
        with pytest.raises(ShuttingDown):
            task.result()
    with pytest.raises(ShuttingDown):
        await batcher.infer(env.make_rows(3, 1), 1)
    executor.runs[0].complete()  # a late result is dropped quietly
    await env.settle()
    assert len(executor.runs) == 1 and env.clock.pending_timers == 0
    assert batcher.pending == 0


async def test_statistics_follow_the_runs(env):
    batcher, executor = env.make()
    seen_requests, seen_batches = [], []
    batcher.stats.observe(lambda *a: seen_requests.append(a), lambda *a: seen_batches.append(a))
    first = env.submit(batcher, 1)
    await env.settle()
    rest = [env.submit(batcher, tag, rows=rows, priority=p)
            for tag, rows, p in [(2, 2, 1), (3, 1, 2)]]
    await env.settle()
    env.clock.advance(0.002)  # 3 rows fill no gear: they leave when the window ends
    await complete_all(env, executor)
    check(env, first, 1)
    check(env, rest[0], 2, rows=2)
    check(env, rest[1], 3)
    stats = batcher.stats
    assert stats.gear_batches == {1: 1, 4: 1}
    assert (stats.rows, stats.padding_rows) == (4, 1)
    assert stats.padding_ratio() == pytest.approx(1 / 5)
    # the first left at once, the others waited the 2 ms window (queue time: to the launch; the fake
    # executor stamps none, so to the dispatch); each as its request's observers saw it, with its level
    assert sorted((level, round(queue_s * 1e3, 6)) for level, queue_s, *_ in seen_requests) == [
        (1, 2.0), (2, 0.0), (2, 2.0)]
    assert stats.inference_count == 4 and stats.execution_count == 2
    assert stats.success.count == 3 and stats.queue.count == 3 and stats.fail.count == 0
    assert abs(stats.queue.ns - 4_000_000) <= 2
    assert (stats.compute_infer.count, stats.compute_infer.ns) == (3, 500_000 * 3)  # 0.5 ms per request
    assert sorted(stats.batch_sizes) == [1, 3]
    assert sorted(level for level, *_ in seen_requests) == [1, 2, 2]
    assert [(gear, rows) for gear, rows, _ in seen_batches] == [(1, 1), (4, 3)]
    assert stats.queue_depth().get(2, 0) == 0


async def test_a_launch_stamped_before_its_dispatch_ends_the_queue_time_at_the_dispatch(env):
    """The runtime stamps a launch with time.perf_counter_ns, and the Clock's now_ns must read the
    same timeline; a manual clock does not: a launch stamp before the batch's dispatch made a
    negative queue time (and a compute time longer than the run), counted with no word."""
    batcher, executor = env.make(max_queue_delay_ms=2.0)
    seen = []
    batcher.stats.observe(lambda level, queue_s, ok, reason: seen.append(queue_s))
    task = env.submit(batcher, 1, rows=3)  # fills no gear: it leaves when the 2 ms window ends
    await env.settle()
    env.clock.advance(0.002)
    await env.settle()
    run = executor.runs[0]
    run.batch.launched_ns = run.batch.dispatched_ns - 50_000_000  # as from another timeline
    env.clock.advance(0.001)
    run.complete()
    await env.settle()
    check(env, task, 1, rows=3)
    assert (task.result().queue_ns, task.result().compute_ns) == (2_000_000, 1_000_000)
    assert seen == [0.002] and (batcher.stats.queue.count, batcher.stats.queue.ns) == (1, 2_000_000)


async def test_real_loop_clock_timeout_fires_while_the_executor_is_blocked(fakes):
    """No manual clock: the deadline is a loop timer, answered with the run still blocked."""
    executor = fakes.FakeExecutor(gears=(1,))
    batcher = DynamicBatcher(executor, BatchingConfig(
        default_queue_policy=QueuePolicy(default_timeout_ms=20)), name="m:1")
    try:
        blocker = asyncio.ensure_future(batcher.infer(fakes.make_rows(1, 1), 1))
        await fakes.settle()
        with pytest.raises(RequestTimeout):
            await asyncio.wait_for(batcher.infer(fakes.make_rows(2, 1), 1), timeout=30)
        assert not executor.runs[0].done and len(executor.runs) == 1
        executor.runs[0].complete()
        await blocker
    finally:
        await batcher.close()


async def test_real_loop_clock_window_dispatches_a_partial_batch(fakes):
    executor = fakes.FakeExecutor(gears=(4,), auto=True)
    batcher = DynamicBatcher(executor, BatchingConfig(max_queue_delay_ms=1), name="m:1")
    try:
        result = await asyncio.wait_for(batcher.infer(fakes.make_rows(5, 1), 1), timeout=30)
        np.testing.assert_array_equal(result.outputs["y"], fakes.expected(5, 1))
        assert result.gear == 4
    finally:
        await batcher.close()
        executor.join()


async def test_a_result_held_for_ordering_whose_client_leaves_is_no_success(env):
    """Outputs held behind an earlier arrival (preserve_ordering) whose client goes before they
    are released: counted as a success at the run's end, while the server counted the request
    as failed (found by an independent review). A success is counted when it is delivered."""
    executor = env.FakeExecutor(gears=(1,), slots=2)
    batcher, _ = env.make(executor, preserve_ordering=True)
    first, second = env.submit(batcher, 1), env.submit(batcher, 2)
    await env.settle()
    executor.runs[1].complete()  # second's outputs arrive, held behind first
    await env.settle()
    assert not second.done()
    second.cancel()  # its client goes
    await env.settle()
    executor.runs[0].complete()
    await env.settle()
    check(env, first, 1)
    stats = batcher.stats
    assert stats.success.count == stats.queue.count == stats.compute_infer.count == 1
    assert stats.execution_count == 2 and stats.inference_count == 1


async def test_a_request_cancelled_after_its_outputs_came_is_marked_answered(env):
    """The client went after the request's outputs reached it but before its task resumed: the
    statistics counted a success, and the cancellation says so (answered_before_cancel), so the
    server's counters count it a success too, not also a cancelled request (a scheduling
    review saw /stats and /metrics disagree by one)."""
    from aclserve.scheduling import answered_before_cancel
    batcher, executor = env.make(env.FakeExecutor(gears=(1,)))
    loop = asyncio.get_running_loop()
    seen = {}

    async def call(tag):
        try:
            return await batcher.infer(env.make_rows(tag, 1), 1)
        except asyncio.CancelledError as e:
            seen[tag] = answered_before_cancel(e)
            raise

    first = loop.create_task(call(1))
    # inside the answer, before its future is resolved: the cancellation comes next, ahead of
    # the task's own wake-up
    batcher.stats.observe(on_request_done=lambda *_: loop.call_soon(first.cancel))
    await env.settle()
    executor.runs[0].complete()
    await env.settle()
    assert first.cancelled() and seen == {1: True}
    assert batcher.stats.success.count == 1 and batcher.stats.levels[2].cancelled == 0

    second = loop.create_task(call(2))  # cancelled while it runs: not answered
    await env.settle()
    second.cancel()
    await env.settle()
    assert seen[2] is False
    executor.runs[1].complete()
    await env.settle()
    assert batcher.stats.success.count == 1
