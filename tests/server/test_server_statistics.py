"""Statistics that perf_analyzer reads, on the real server (on uvloop, as in production) with the
digits model (about 0.1 ms of compute per run): durations have sub-millisecond resolution, and each request's queue +
compute input/infer/output adds up to no more than its time in the server.

Requests go one at a time with a statistics read between them, so every delta belongs to one
request. Nothing here bounds a duration: only the clocks' resolution and the breakdown's
consistency are checked."""
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import REPO
from tests.serving import ServerThread

KEYS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture(scope="module")
def digits_server(tmp_path_factory, make_config):
    """On uvloop, as `aclserve serve` runs: its loop.time() advances in whole milliseconds."""
    uvloop = pytest.importorskip("uvloop")
    models = tmp_path_factory.mktemp("digits_models")
    shutil.copy(REPO / "models" / "digits.om", models / "digits.om")
    with ServerThread(make_config(models), run=uvloop.run) as srv:
        yield srv


def totals(client) -> dict[str, tuple[int, int]]:
    stats = client.get_inference_statistics("digits")["model_stats"][0]["inference_stats"]
    return {key: (stats[key]["count"], stats[key]["ns"]) for key in KEYS}


def off_whole_ms(ns: int) -> bool:
    """More than 100 ns away from a whole millisecond (a millisecond clock's reading, turned
    into nanoseconds through a float, lands within a few ns of one)."""
    rest = ns % 1_000_000
    return min(rest, 1_000_000 - rest) > 100


def test_per_request_timings_are_sub_millisecond_and_add_up(digits_server):
    client = httpclient.InferenceServerClient(digits_server.url)
    x = np.load(REPO / "tests" / "data" / "digits_test.npz")["x"][:1]
    inp = httpclient.InferInput("x", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    client.infer("digits", [inp])  # first contact outside the measured requests
    deltas = []
    before = totals(client)
    for _ in range(10):
        client.infer("digits", [inp])
        after = totals(client)
        deltas.append({key: (after[key][0] - before[key][0], after[key][1] - before[key][1]) for key in KEYS})
        before = after
    client.close()
    for d in deltas:
        assert all(count == 1 for count, _ in d.values()), d  # one request per delta
        parts = sum(d[key][1] for key in ("queue", "compute_input", "compute_infer", "compute_output"))
        assert 0 < parts <= d["success"][1], d  # the breakdown fits inside the request's time
    for key in ("success", "queue", "compute_infer"):
        assert any(off_whole_ms(d[key][1]) for d in deltas), [d[key][1] for d in deltas]
    for key in ("compute_input", "compute_output"):  # a lone batch's copies are timed too (they read 0)
        assert all(d[key][1] > 0 for d in deltas), [d[key][1] for d in deltas]
