"""A served version's entry of Triton's statistics extension, rendered from its batcher's
counters (scheduling/stats.py keeps the numbers; this module owns the JSON shape). Pure; both
transports answer with it (views.statistics; gRPC parses the same document into its message)."""
from __future__ import annotations

from ..scheduling.stats import BatcherStats, Duration


def duration(d: Duration) -> dict:
    return {"count": d.count, "ns": d.ns}


def model_stats(stats: BatcherStats) -> dict:
    """The model_stats entry of the statistics extension, minus name and version."""
    zero = {"count": 0, "ns": 0}
    return {
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": duration(stats.success), "fail": duration(stats.fail),
            "queue": duration(stats.queue), "compute_input": duration(stats.compute_input),
            "compute_infer": duration(stats.compute_infer),
            "compute_output": duration(stats.compute_output),
            "cache_hit": dict(zero), "cache_miss": dict(zero)},
        "batch_stats": [
            {"batch_size": size, "compute_input": duration(s.compute_input),
             "compute_infer": duration(s.compute_infer), "compute_output": duration(s.compute_output)}
            for size, s in sorted(stats.batch_sizes.items())],
    }
