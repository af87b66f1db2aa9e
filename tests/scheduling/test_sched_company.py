"""A lone request waits for company only while arrivals overlap others pending (company.py),
on the gated fake executor (gears 1, 2, 4, 8; one slot) and a manual clock."""
import pytest

from aclserve.scheduling.company import Company
from aclserve.scheduling.formation import EARLY_S

MS = 0.001


def test_the_overlap_share_rises_with_overlapping_arrivals_and_decays_without():
    company = Company()
    assert not company.expected
    company.arrived(True)
    company.arrived(True)
    assert not company.expected  # 0.23: two of the recent arrivals are not enough
    company.arrived(True)
    assert company.expected
    for _ in range(3):
        company.arrived(False)
    assert not company.expected


@pytest.mark.asyncio
async def test_a_client_that_waits_for_each_answer_is_never_held(env):
    batcher, executor = env.make(max_queue_delay_ms=100)
    for tag in range(20):
        task = env.submit(batcher, tag)
        await env.settle()  # no clock advance: it ran at once
        assert [run.tags for run in executor.runs[tag:]] == [[tag]]
        executor.runs[-1].complete()
        await env.settle()
        assert task.done()


async def overlap(env, batcher, executor):
    """Four requests arriving together (three of them find others queued): one batch of gear 4."""
    tasks = [env.submit(batcher, tag) for tag in range(4)]
    await env.settle()
    assert [run.tags for run in executor.runs] == [[0, 1, 2, 3]]
    executor.runs[0].complete()
    await env.settle()
    assert all(task.done() for task in tasks)


@pytest.mark.asyncio
async def test_while_arrivals_overlap_a_lone_request_waits_for_company_within_its_window(env):
    batcher, executor = env.make(max_queue_delay_ms=1)
    await overlap(env, batcher, executor)
    first = env.submit(batcher, 10)
    await env.settle()
    env.clock.advance(0.5 * MS)
    await env.settle()
    assert len(executor.runs) == 1  # alone on an idle instance, yet waiting
    second = env.submit(batcher, 11)
    await env.settle()
    assert [run.tags for run in executor.runs[1:]] == [[10, 11]]  # company came: gear 2, at once
    executor.runs[1].complete()
    await env.settle()
    assert first.done() and second.done()

    lone = env.submit(batcher, 20)  # still overlapping enough: waits, but no longer than its window
    await env.settle()
    env.clock.advance(1 * MS - EARLY_S - 0.1 * MS)
    await env.settle()
    assert len(executor.runs) == 2
    env.clock.advance(EARLY_S + 0.2 * MS)
    await env.settle()
    assert [run.tags for run in executor.runs[2:]] == [[20]]
    executor.runs[2].complete()
    await env.settle()
    assert lone.done()


@pytest.mark.asyncio
async def test_without_a_batch_window_a_lone_request_never_waits(env):
    batcher, executor = env.make(max_queue_delay_ms=0)
    await overlap(env, batcher, executor)
    task = env.submit(batcher, 10)
    await env.settle()
    assert [run.tags for run in executor.runs[1:]] == [[10]]
    executor.runs[1].complete()
    await env.settle()
    assert task.done()
