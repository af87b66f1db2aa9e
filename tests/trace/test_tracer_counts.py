"""The Tracer's trace_count, as Triton counts it: a model with settings of its own counts down
its own copy of the global count (refreshed when the global settings change), a model with none
the global count itself."""
from aclserve.trace.tracer import Tracer


def traced(tracer: Tracer, model: str, n: int) -> int:
    return sum(tracer.start(model, "1", "http", 0) is not None for _ in range(n))


def test_each_model_with_settings_of_its_own_counts_its_own_copy():
    tracer = Tracer()
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"})
    tracer.update({"trace_rate": "1"}, "own")  # a setting of its own: a copy of the count
    assert traced(tracer, "own", 5) == 2
    assert tracer.settings("own").count == 0 and tracer.settings().count == 2
    assert traced(tracer, "plain", 5) == 2  # follows the global settings: spends the global count
    assert tracer.settings().count == 0
    tracer.update({"trace_count": "3"})  # a global update refreshes the copies
    assert tracer.settings("own").count == 3 and traced(tracer, "own", 5) == 3
    tracer.update({"trace_count": "1"}, "counted")  # its own count, kept across global updates
    tracer.update({"trace_rate": "1"})
    assert traced(tracer, "counted", 3) == 1 and tracer.settings("counted").count == 0
    tracer.update({"trace_rate": "1"})
    assert tracer.settings("counted").count == 0
