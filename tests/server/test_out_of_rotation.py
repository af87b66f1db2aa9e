"""A version serving with an instance out of rotation, as an operator sees it (runtime/rotation.py).

Found by a tester: while one of a model's two instances was out of rotation (its context stopped
on a device fault, its rebuild failing), the repository index showed the version READY with no
reason, the statistics that instance at 0.0 compute busy with nothing saying it was out, and
/metrics only the rebuild counters: a model running at half its instances was said in the log
alone. Now /metrics counts them (aclserve_instances_out_of_rotation), the index's reason says so
(the version still READY) and the statistics mark the instance, until the rebuild serves; the
series goes with its version at an unload. The CPU runtime's fault injection makes the fault and
fails or holds the rebuild's model loads; nothing here is timed."""
from __future__ import annotations

import json
import re
import threading
import urllib.request

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, index_of, post_status, wait_until

from .hostile import metric

GOOD = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()
LABELS = 'model="double",version="1"'
GAUGE = "aclserve_instances_out_of_rotation"
LOAD_REFUSED = 207001  # the device's memory: what a rebuild's load may fail with


def infer(url: str) -> int:
    return post_status(url, "/v2/models/double/infer", GOOD)


def seen(srv) -> tuple[float, tuple[str, str], list[bool]]:
    """The gauge, the index's (state, reason) and each instance's statistics mark."""
    with urllib.request.urlopen(f"http://{srv.url}/v2/models/double/stats", timeout=60) as resp:
        (entry,) = json.loads(resp.read())["model_stats"]
    marks = [row["out_of_rotation"] for row in entry["utilisation"]]
    return metric(srv.url, GAUGE, LABELS), index_of(srv)["double", "1"], marks


def test_an_instance_out_of_rotation_is_counted_said_and_marked_until_it_is_rebuilt(
        double_dir, make_config, clean_faults):
    """Two instances: a batch faults (re-run on the other, answered), its instance leaves
    rotation, the rebuild's first load fails and its second is held. Meanwhile: 1 out, READY
    with a reason naming the rebuild and its failure, that instance marked. Once the held load
    goes on and the rebuilt instance serves: 0, no reason, none marked."""
    (double_dir / "double.yaml").write_text("instances: 2\n")
    srv = ServerThread(make_config(double_dir)).start()
    gate = threading.Event()
    try:
        assert seen(srv) == (0, ("READY", ""), [False, False])
        faults.inject("load", nth=1, code=LOAD_REFUSED)  # the rebuild's first attempt
        held = faults.inject("load", nth=2, hold=gate)  # its second, until the test lets it go
        faults.inject("execute", nth=1, code=507011)  # the batch's run: its instance's context stops
        assert infer(srv.url) == 200
        assert held.entered.wait(60)  # (the first attempt's failure is recorded before the second)
        during = seen(srv)
        assert metric(srv.url, "aclserve_instance_rebuild_failures_total", LABELS) == 1
        gate.set()
        wait_until(lambda: metric(srv.url, "aclserve_instance_rebuilds_total", LABELS) == 1, "rebuilt")
        after = seen(srv)
        assert infer(srv.url) == 200
    finally:
        gate.set()
        srv.close()
    gauge, (state, reason), marks = during
    assert gauge == 1 and state == "READY" and sorted(marks) == [False, True], during
    assert re.fullmatch(r"1 of 2 instances out of rotation \(rebuilding; last failure: .*\)", reason), reason
    assert str(LOAD_REFUSED) in reason and "trying again" not in reason, reason  # the attempt's own error
    assert not re.search(r"(^|\s)/", reason), reason  # no absolute path
    assert after == (0, ("READY", ""), [False, False])


def test_the_series_goes_with_its_version_at_an_unload(double_dir, make_config, clean_faults):
    """An instance out of rotation with every rebuild failing (backing off): the gauge is 1 until
    the version is unloaded, then there is no series of it (not one left at 1 for good)."""
    (double_dir / "double.yaml").write_text("instances: 2\n")
    srv = ServerThread(make_config(double_dir)).start()
    try:
        faults.inject("load", code=LOAD_REFUSED)  # every rebuild attempt from now on
        faults.inject("execute", nth=1, code=507011)
        assert infer(srv.url) == 200
        wait_until(lambda: metric(srv.url, "aclserve_instance_rebuild_failures_total", LABELS) >= 2, "backing off")
        assert metric(srv.url, GAUGE, LABELS) == 1
        assert post_status(srv.url, "/v2/repository/models/double/unload", b"{}") == 200
        wait_until(lambda: index_of(srv)["double", "1"][0] == "UNAVAILABLE", "unloaded")
        with urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=60) as resp:
            text = resp.read().decode()
    finally:
        srv.close()
    assert f"# TYPE {GAUGE} gauge" in text  # the family is there, no series of the unloaded version
    assert not [line for line in text.splitlines() if line.startswith(GAUGE + "{")], text
