"""Property: under concurrent submitters with random sizes, priorities, timeouts and
cancellations, every request is answered exactly once, with its own rows."""
import asyncio
import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aclserve.errors import RequestTimeout
from aclserve.scheduling import BatchingConfig, DynamicBatcher, QueuePolicy

GEAR_SETS = [(1, 2, 4, 8), (2, 4), (1,), (4, 8), ()]

request_specs = st.lists(
    st.tuples(
        st.integers(1, 8),  # rows (clipped to the model's limit)
        st.integers(0, 4),  # priority (0 and 4 fall back to the default level)
        st.one_of(st.none(), st.integers(0, 6)),  # cancel after this many loop turns
        st.one_of(st.none(), st.integers(100, 3000)),  # own timeout, microseconds
        st.integers(0, 3),  # loop turns before the next submission
    ),
    min_size=1, max_size=40)

scenarios = st.fixed_dictionaries({
    "gears": st.sampled_from(GEAR_SETS),
    "slots": st.integers(1, 3),
    "instances": st.integers(1, 2),
    "formation": st.sampled_from(["just_in_time", "when_slot_free"]),
    "timed": st.booleans(),  # warm-up gear times known: just_in_time predicts moments
    "delay_ms": st.sampled_from([0.0, 0.3, 1.0]),
    "ordered": st.booleans(),
    "enabled": st.booleans(),
    "action": st.sampled_from(["reject", "delay"]),
    "submitters": st.lists(request_specs, min_size=1, max_size=4),
})


async def _turns(n):
    for _ in range(n):
        await asyncio.sleep(0)


async def run_scenario(fakes, scenario):
    times = {g: g * 1e-4 for g in scenario["gears"]} if scenario["timed"] else {}
    executor = fakes.FakeExecutor(gears=scenario["gears"], slots=scenario["slots"], auto=True,
                                  instances=scenario["instances"], compute_cost=times,
                                  gear_cost={g: t + 5e-5 for g, t in times.items()})
    config = BatchingConfig(enabled=scenario["enabled"], max_queue_delay_ms=scenario["delay_ms"],
                            preserve_ordering=scenario["ordered"], batch_formation=scenario["formation"],
                            default_queue_policy=QueuePolicy(timeout_action=scenario["action"]))
    batcher = DynamicBatcher(executor, config, name="prop:1")
    limit = scenario["gears"][-1] if scenario["gears"] else 8
    submitted = []  # (tag, rows, cancelled, timeout, task)
    cancellers = []

    async def submitter(index, specs):
        for n, (rows, priority, cancel_after, timeout_us, pause) in enumerate(specs):
            tag = index * 1000 + n
            rows = min(rows, limit)
            task = asyncio.ensure_future(batcher.infer(
                fakes.make_rows(tag, rows), rows, priority=priority, timeout_us=timeout_us))
            submitted.append((tag, rows, cancel_after is not None, timeout_us, task))
            if cancel_after is not None:
                cancellers.append(asyncio.ensure_future(_cancel_later(task, cancel_after)))
            await _turns(pause)

    async def _cancel_later(task, turns):
        await _turns(turns)
        task.cancel()

    try:
        await asyncio.gather(*(submitter(i, specs) for i, specs in enumerate(scenario["submitters"])))
        await asyncio.gather(*cancellers)
        tasks = [entry[-1] for entry in submitted]
        done, pending = await asyncio.wait(tasks, timeout=20)
        assert not pending, f"{len(pending)} requests never answered"
    finally:
        await batcher.close()
        executor.join()

    dispatched = collections.Counter(tag for run in executor.runs for tag in run.tags)
    assert all(count == 1 for count in dispatched.values()), "a request ran twice"
    for tag, rows, cancelled, timeout_us, task in submitted:
        if task.cancelled():
            assert cancelled
            continue
        error = task.exception()
        if error is not None:
            assert isinstance(error, RequestTimeout) and timeout_us is not None, repr(error)
            assert tag not in dispatched, "a timed-out request ran"
            continue
        np.testing.assert_array_equal(task.result().outputs["y"], fakes.expected(tag, rows))
        assert dispatched[tag] == 1
    for run in executor.runs:
        if not scenario["gears"]:
            assert run.gear is None and len(run.requests) == 1
        elif not scenario["enabled"]:
            assert len(run.requests) == 1
    assert batcher.pending == 0 and not any(executor.busy)


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios)
def test_every_request_is_answered_exactly_once_with_its_own_rows(fakes, scenario):
    asyncio.run(run_scenario(fakes, scenario))
