"""The Tracer's trace_count, as Triton counts it: a model with settings of its own counts down
its own copy of the global count (refreshed when the global settings change), a model with none
the global count itself."""
from aclserve.trace.tracer import Tracer

TRACING = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "t.json"}


def traced(tracer: Tracer, model: str, n: int) -> int:
    return sum(tracer.start(model, "1", "http", 0) is not None for _ in range(n))


def test_each_model_with_settings_of_its_own_counts_its_own_copy(tmp_path):
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(TRACING, trace_count="2"))
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


def test_the_global_count_spent_refills_no_models_copy(tmp_path):
    """A countdown is no settings change: the global count spent by a model with no settings of
    its own recopied every model's settings from the global ones, so a model whose copy of the
    count was spent got the global count left again (a tester's find)."""
    tracer = Tracer(trace_dir=str(tmp_path))
    tracer.update(dict(TRACING, trace_count="5"))
    tracer.update({"trace_rate": "1"}, "own")
    assert traced(tracer, "own", 9) == 5 and tracer.settings("own").count == 0
    assert traced(tracer, "plain", 2) == 2  # the global count: 5 -> 3
    assert tracer.settings().count == 3 and tracer.settings("own").count == 0
    assert traced(tracer, "own", 3) == 0  # (its copy was refilled to 4, then 3: 3 more traced)
    tracer.close()


def test_a_global_null_restores_a_start_that_traced_without_a_file():
    """Tracing with no trace_file is refused over the API, but README says a global null restores
    the start's value: a start that traced in memory (aclserve profile's) could not be restored
    (400 "trace file name is not given"; a reviewer's find)."""
    from aclserve.trace.settings import TraceSettings
    from aclserve.trace.tracer import Tracer
    start = TraceSettings(level="TIMESTAMPS", rate=1)
    tracer = Tracer(start)
    try:
        tracer.update({"trace_level": ["OFF"]})
        assert tracer.update({"trace_level": None}) == start
    finally:
        tracer.close()
