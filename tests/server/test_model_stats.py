"""The statistics extension's JSON shape, rendered from a batcher's counters (pure, no server)."""
from aclserve.runtime.types import DeviceTimings
from aclserve.scheduling.stats import BatcherStats
from aclserve.server.model_stats import model_stats


def test_counters_render_as_tritons_model_stats_entry():
    stats = BatcherStats(levels=(1, 2))
    h2d, infer, d2h = stats.batch_executed(gear=4, rows=3, compute_ns=900_000,
                                           timings=DeviceTimings(h2d_ms=0.1, compute_ms=0.5, d2h_ms=0.2))
    stats.request_answered(2, 300_000, 1_000_000, h2d, infer, d2h)  # the run's two requests, 2 and 1 rows
    stats.request_answered(1, 300_000, 1_000_000, h2d, infer, d2h)
    entry = model_stats(stats)
    assert entry["inference_count"] == 3 and entry["execution_count"] == 1
    assert entry["last_inference"] == stats.last_inference_ms > 0
    inference = entry["inference_stats"]
    assert set(inference) == {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                              "cache_hit", "cache_miss"}
    assert inference["success"] == {"count": 2, "ns": 2_000_000}
    # per request, as Triton counts: both requests of the run spent its 0.5 ms of compute
    assert inference["compute_infer"] == {"count": 2, "ns": 1_000_000}
    assert inference["compute_input"] == {"count": 2, "ns": 200_000}
    assert entry["batch_stats"] == [{"batch_size": 3, "compute_input": {"count": 1, "ns": 100_000},
                                     "compute_infer": {"count": 1, "ns": 500_000},
                                     "compute_output": {"count": 1, "ns": 200_000}}]


def test_an_idle_version_renders_zeros():
    entry = model_stats(BatcherStats(levels=(1,)))
    assert entry["batch_stats"] == [] and entry["inference_stats"]["queue"] == {"count": 0, "ns": 0}
