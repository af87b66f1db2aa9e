"""The auto queue size counts rows: a burst of requests of a full batch each is refused 503 at once
past the level's rows, where counted in requests it was queued whole and waited out its deadline
(a tester's 64 requests of 8 rows on a 200 ms run: 17 served, 47 timed out after 3.2 s). A size
configured counts requests, as in Triton.

The model's one slot is held by the CPU runtime's fault injection until the test lets it go, so
the burst queues behind it without any test double and without a timing."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
import threading
import urllib.error
import urllib.request

import pytest

from aclserve.acl.cpu import faults
from aclserve.repository.overload import auto_queue_size

from tests.serving import ServerThread

from .hostile import metric, wait_for

FULL_BATCH = 8  # the affine model's largest gear (compile_cpu_om's 1, 2, 4, 8)
AUTO_ROWS = auto_queue_size(FULL_BATCH, 1)  # 64 rows: 8 full batches
BURST = 16  # requests of a full batch: twice what AUTO_ROWS holds, a quarter of it in requests
EXPLICIT = 12  # level 1's configured size: requests, 96 rows of full batches


@pytest.fixture
def held_affine(models_dir, tmp_path, make_config, clean_faults):
    """The affine model with one slot (the held run keeps it: the rest queue), no queue deadline
    (nothing times out while the test holds the run), level 1 bounded to EXPLICIT requests and the
    others `auto`."""
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "affine.yaml").write_text(
        "slots: 1\nexecution_timeout_ms: 60000\n"
        f"batching: {{default_queue_policy: {{default_timeout_ms: 0}}, "
        f"priority_queue_policy: {{1: {{max_queue_size: {EXPLICIT}}}}}}}\n")
    with ServerThread(make_config(tmp_path, model_control_mode="none")) as srv:
        yield srv


def infer(url: str, rows: int, priority: int | None = None) -> tuple[int, str, str | None]:
    """(status, body, Retry-After) of an affine request of `rows` rows."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 8], "data": [1.0] * 8 * rows},
                       {"name": "idx", "datatype": "INT64", "shape": [rows, 3], "data": [1] * 3 * rows}]}
    if priority is not None:
        body["parameters"] = {"priority": priority}
    req = urllib.request.Request(f"http://{url}/v2/models/affine/infer", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode(), None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("Retry-After")


def depth(url: str, level: int) -> float:
    return metric(url, "aclserve_queue_depth", f'model="affine",priority="{level}",version="1"')


class HeldRun:
    """The model's one slot taken by a one-row request whose run waits for `release()`."""

    def __init__(self, url: str, pool: concurrent.futures.Executor):
        self.gate = threading.Event()
        held = faults.inject("execute", nth=1, hold=self.gate, code=0)
        self.first = pool.submit(infer, url, 1)
        assert held.entered.wait(30)

    def release(self) -> None:
        self.gate.set()
        assert self.first.result()[0] == 200


def settle(url: str, level: int, answers: list) -> list:
    """Wait until each request of `answers` sent to `level` is queued or answered (a hang guard,
    not a timing); the answers given so far, which the held run leaves to refusals alone."""
    asyncio.run(wait_for(lambda: depth(url, level) + sum(a.done() for a in answers) == len(answers)))
    return [a.result() for a in answers if a.done()]


def test_a_burst_of_full_batches_is_refused_past_the_auto_queues_rows(held_affine):
    url = held_affine.url
    with concurrent.futures.ThreadPoolExecutor(2 * BURST + 1) as pool:
        held = HeldRun(url, pool)
        try:
            one_rows = [pool.submit(infer, url, 1) for _ in range(BURST)]
            assert settle(url, 2, one_rows) == [] and depth(url, 2) == BURST  # all taken: 16 of its 64 rows
        finally:
            held.release()
        assert [a.result()[0] for a in one_rows] == [200] * BURST

        held = HeldRun(url, pool)
        try:
            full = [pool.submit(infer, url, FULL_BATCH) for _ in range(BURST)]
            refused = settle(url, 2, full)
            # 8 of them fill the level's 64 rows; the other 8 are answered at once, not queued
            assert depth(url, 2) == AUTO_ROWS // FULL_BATCH and len(refused) == BURST - AUTO_ROWS // FULL_BATCH
            for status, body, retry_after in refused:
                assert status == 503 and retry_after == "1", body
                # (the request's rows are named unless the connection guard refused it unread: shedding.py)
                # (they named no priority: the level, one they never chose, is not named)
                assert "the queue is full (64 of its 64 rows queued" in body and "level" not in body
                # (and how to raise it: t99's perf_analyzer stopped at this refusal, which named no way out)
                assert ("max_queue_size auto counts rows); raise it in the model's config: "
                        "batching.default_queue_policy.max_queue_size (config.pbtxt: dynamic_batching { "
                        "default_queue_policy { max_queue_size: N } }; 0: unbounded") in body
            # a configured size counts requests: level 1 takes EXPLICIT full batches, 96 rows
            urgent = [pool.submit(infer, url, FULL_BATCH, priority=1) for _ in range(BURST)]
            refused = settle(url, 1, urgent)
            assert depth(url, 1) == EXPLICIT and len(refused) == BURST - EXPLICIT
            for status, body, _ in refused:
                assert status == 503 and f"priority level 1 queue is full (max_queue_size {EXPLICIT}); " \
                    "raise it in the model's config: batching.priority_queue_policy.1.max_queue_size (config.pbtxt: " \
                    "dynamic_batching { priority_queue_policy { key: 1 value { max_queue_size: N } } }" in body, body
        finally:
            held.release()
        statuses = sorted(a.result()[0] for a in full + urgent)
        assert statuses == [200] * (AUTO_ROWS // FULL_BATCH + EXPLICIT) + [503] * (2 * BURST - 8 - EXPLICIT)


SLOW_RUN_MS = 50  # every run of the slow device's, the warm-up's too: each gear costs at least this
REQUESTS = 64  # level 1's configured size


def test_the_auto_deadline_beside_a_size_in_requests_lets_a_full_queue_of_full_batches_run(
        models_dir, tmp_path, make_config, clean_faults):
    """Level 1 bounded to 64 requests, its deadline auto: the deadline was derived as if the 64 were
    rows (8 runs of 8), about 2 s, while 64 requests of 8 rows take 64 runs, 3.2 s or more: most of a
    burst of them waited its deadline out for a 503 (the heavy CNN's 64 of 32 rows: 48 of 64). Now it
    allows for a run a request; the auto level (rows) keeps its own."""
    faults.inject("execute", delay_ms=SLOW_RUN_MS)  # before the start: the warm-up measures it
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "affine.yaml").write_text(
        f"batching: {{priority_queue_policy: {{1: {{max_queue_size: {REQUESTS}}}}}}}\n")
    with ServerThread(make_config(tmp_path, model_control_mode="none")) as srv:
        with urllib.request.urlopen(f"http://{srv.url}/v2/models/affine/config", timeout=60) as resp:
            batching = json.loads(resp.read())["dynamic_batching"]
    in_requests = batching["priority_queue_policy"]["1"]
    assert in_requests["max_queue_size"] == REQUESTS
    assert in_requests["default_timeout_microseconds"] >= 2 * REQUESTS * SLOW_RUN_MS * 1000  # twice 64 runs
    in_rows = batching["default_queue_policy"]  # auto: 64 rows, 8 runs of 8
    assert in_rows["max_queue_size"] == AUTO_ROWS
    assert in_rows["default_timeout_microseconds"] < in_requests["default_timeout_microseconds"]


def test_config_shows_the_auto_deadline_of_a_huge_size_in_requests(models_dir, tmp_path, make_config):
    """A size of 10**17 requests made the auto deadline 3.3e16 ms: GET /config answered 500 ("Integer
    exceeds 64-bit range" in its microseconds). It is capped at the longest a written one may be. (A
    size is at most 2**32 - 1 now, Triton's uint32; with the longest window the deadline passes the cap.)"""
    from aclserve.config.checks import MAX_MS
    shutil.copy(models_dir / "affine.om", tmp_path / "affine.om")
    (tmp_path / "affine.yaml").write_text(f"batching: {{max_queue_delay_ms: {MAX_MS}, "
                                          f"default_queue_policy: {{max_queue_size: {2**32 - 1}}}}}\n")
    with ServerThread(make_config(tmp_path, model_control_mode="none")) as srv:
        with urllib.request.urlopen(f"http://{srv.url}/v2/models/affine/config", timeout=60) as resp:
            policy = json.loads(resp.read())["dynamic_batching"]["default_queue_policy"]
    assert policy["max_queue_size"] == 2**32 - 1 and policy["default_timeout_microseconds"] == MAX_MS * 1000
