"""The batch sizes a CPU compile's test runs take (cpu_compile.probe_outputs): small ones, whatever
sizes are compiled. A run takes memory for the rows it is fed: at the largest size asked for
(`compile: {batch: [1, 1073741824]}`, x [N, 4] FP32) it took 16 GiB and half a minute, and a
larger size would take the machine's memory down, for a model whose load then refuses that size's
buffers for memory anyway; ATC never runs the model to compile it.

A dynamic-batch model runs at every size compiled that is small (PROBE_ROWS at most): a model may
run at some of its sizes only (a Slice capping the batch at 2 rows compiled for 1,2,4 ran at 1 and 2,
and every warm-up at 4 failed, retried for good as a device fault; a Reshape to pairs of rows fails at
an odd size), and each run says the outputs' shapes at a size it will serve. With fewer than two small
sizes it runs at its smallest small size (or 1) and twice that: two sizes still, for the batch-major
check. A model that does not run at those runs at its two smallest sizes, as before
(cpu_compile.probe_outputs): the rows asked for. Sizes past PROBE_ROWS are not run (the server's
warm-up runs every size). The default
sizes (1 to 32) cost the medium CNN of tools/make_example_models.py about 0.3 s more than its two
smallest did (63 rows a test run instead of 3). A static model runs at its own size (one --batch
size fixes it): its outputs' shapes are those at that size, and only a run there says them for sure
(a model that runs at its export size only, a Slice capping the batch).
"""
from __future__ import annotations

from .spec import ModelSpec

PROBE_ROWS = 32  # the most rows a test run is fed for a size asked for (the default sizes end there)


def probe_batches(spec: ModelSpec) -> list[int | None]:
    """The batch sizes the model is run at: every small size compiled (two at least) for a dynamic
    batch, None (the inputs' own dims) for a static model."""
    if not spec.gears:
        return [None]
    small = [g for g in spec.gears if g <= PROBE_ROWS]
    if len(small) >= 2:
        return small
    first = small[0] if small else 1
    return [first, 2 * first]  # (a multiple: a model reshaping rows into pairs runs at it, as at its sizes)
