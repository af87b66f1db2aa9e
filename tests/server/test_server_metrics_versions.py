"""A version's series on /metrics over its loads, unloads and reloads, parsed with prometheus-client's
own parser: there from its load with every failure reason at 0, gone with its unload (and not
brought back by a late failure, nor its record kept alive), carried over a reload of the same
version, and a load failure shown for a model whose config cannot be used."""
import asyncio
import json
import urllib.request

import aiohttp

from .metrics_samples import samples, value


def test_unloaded_versions_leave_no_series_and_no_created_samples(models_dir, tmp_path):
    """A dedicated server: unloading a model removes its per-version series from /metrics."""
    _, srv = _own_server(models_dir, tmp_path)
    try:
        before, after = asyncio.run(_infer_then_unload_double(f"http://{srv.url}"))
    finally:
        srv.close()
    assert value(samples(before), "aclserve_request_success_total", model="double") == 1
    assert 'model="double",version="1"' not in after
    assert value(samples(after), "aclserve_model_unloads_total", model="double") == 1  # model-level counters stay
    assert "_created" not in before + after


def test_fault_counters_survive_a_reload_of_the_same_version(models_dir, tmp_path, clean_faults):
    """A reload replaces the version's pool, whose counts the fault counters read: they went back
    to 0 and a code's series vanished (found by an independent check; Prometheus reads that as
    a counter reset), then, once kept at the old pool's close, they still dipped while it drained
    (found by an independent review). Scraped while the old version drains a held batch, and
    after it has closed."""
    import shutil
    import threading
    import time
    import urllib.error
    import urllib.request

    from aclserve.acl.cpu import faults
    from tests.serving import ServerThread, post_status, server_config

    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "double.om", own / "double.om")
    (own / "double.yaml").write_text("retry: false\n")  # the fault fails its batch: no re-run
    config = server_config(own, model_control_mode="poll", settle_s=0.1, debounce_s=0.05)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()
    gate = threading.Event()

    def scrape():
        return samples(urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode())

    def infer() -> int:
        return post_status(srv.url, "/v2/models/double/infer", body)

    def until(predicate) -> None:
        for _ in range(3000):  # a hang guard
            if predicate():
                return
            time.sleep(0.01)

    def ready() -> bool:
        try:
            return urllib.request.urlopen(f"http://{srv.url}/v2/models/double/ready", timeout=30).status == 200
        except urllib.error.HTTPError as e:
            e.close()
            return False

    try:
        with ServerThread(config) as srv:
            until(ready)  # poll mode loads after the start
            faults.inject("execute", count=1)
            assert infer() == 500
            before = scrape()
            held = faults.inject("execute", nth=1, hold=gate)
            answers = []
            holder = threading.Thread(target=lambda: answers.append(infer()))
            holder.start()
            assert held.entered.wait(60)  # in flight on the old pool: its drain waits for it
            shutil.copy(models_dir / "double.om", own / ".double.tmp")
            (own / ".double.tmp").rename(own / "double.om")  # the same model, a new file: a reload
            until(lambda: value(scrape(), "aclserve_model_reloads_total", model="double") >= 1)
            draining = scrape()
            gate.set()
            holder.join(60)
            until(lambda: value(scrape(), "aclserve_request_success_total", model="double") >= 1)
            after = scrape()
    finally:
        gate.set()
    mv = {"model": "double", "version": "1"}
    for found in (before, draining, after):
        assert value(found, "aclserve_batch_faults_total", outcome="failed", **mv) == 1
        assert value(found, "aclserve_device_faults_total", code="507011", **mv) == 1
    assert value(draining, "aclserve_model_reloads_total", model="double") == 1 and answers == [200]


def test_a_request_failing_after_its_version_was_unloaded_brings_no_series_back():
    """A request still arriving when its version was unloaded fails afterwards: its failure made
    a new series for the gone version that nothing removed, and a later load of that version
    inherited its count (found by an independent check)."""
    from aclserve.server.metrics import ServerMetrics

    metrics = ServerMetrics(lambda index: [], lambda: [])
    late = metrics.version("m", "1")  # held by the request, as state.record hands it out
    late.request_failed("InvalidInput")
    metrics.on_repository_event("unloaded", "m", "1")
    late.request_failed("ModelUnavailable")
    late.request_failed("InvalidInput")
    assert 'version="1"' not in metrics.render().decode()
    metrics.version("m", "1").request_failed("InvalidInput")  # loaded again: a fresh count
    assert value(samples(metrics.render().decode()), "aclserve_request_failure_total", model="m") == 1


def test_a_model_whose_config_cannot_be_used_shows_a_load_failure(models_dir, tmp_path):
    """A broken config showed the model UNAVAILABLE in aclserve_model_state but no
    aclserve_model_load_failure series, so an alert on that metric missed it; the series has
    the version empty, as the repository index row does, and goes once the config is mended."""
    import shutil
    import time
    import urllib.request

    from tests.serving import ServerThread, server_config

    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "double.om", own / "double.om")
    (own / "double.yaml").write_text("instances: 0\n")
    config = server_config(own, model_control_mode="poll", settle_s=0.1, debounce_s=0.05, readiness="lenient")

    def failures():
        found = samples(urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode())
        return [(s.labels["model"], s.labels["version"], s.labels["reason"], s.value)
                for s in found.get("aclserve_model_load_failure", [])]

    with ServerThread(config) as srv:
        for _ in range(3000):  # a hang guard: a config just written is awaited first (and shown as no failure)
            if failures():
                break
            time.sleep(0.01)
        ((model, version, reason, one),) = failures()
        assert (model, version, one) == ("double", "", 1) and reason.endswith("instances: must be >= 1, got 0")
        (own / ".double.tmp").write_text("instances: 1\n")
        (own / ".double.tmp").rename(own / "double.yaml")
        for _ in range(3000):  # a hang guard: poll mode loads it once the config settles
            if not failures():
                break
            time.sleep(0.01)
        assert failures() == []


def test_a_version_s_series_exist_from_its_load_with_every_failure_reason_at_0(models_dir, tmp_path):
    """They appeared with a version's first request, and a reason's with its first failure, so
    rate() and increase() missed that first burst (an SRE's audit). Loaded at the start, and again
    through the repository API after an unload (which removes them)."""
    import shutil

    from aclserve.server.failure_reasons import FAILURE_REASONS
    from tests.serving import ServerThread, server_config

    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "double.om", own / "double.om")

    def series(found):
        mv = {"model": "double", "version": "1"}
        return ({name: [s.value for s in found.get(name, []) if s.labels.items() >= mv.items()]
                 for name in ("aclserve_request_success_total", "aclserve_request_duration_seconds_count",
                              "aclserve_queue_duration_seconds_count", "aclserve_padding_rows_total")},
                {s.labels["reason"]: s.value for s in found.get("aclserve_request_failure_total", [])
                 if s.labels["model"] == "double"})

    def scrape():
        return samples(urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode())

    def control(action):
        request = urllib.request.Request(f"http://{srv.url}/v2/repository/models/double/{action}", method="POST")
        assert urllib.request.urlopen(request, timeout=60).status == 200

    with ServerThread(server_config(own)) as srv:
        at_start = series(scrape())
        control("unload")
        unloaded = series(scrape())
        control("load")
        loaded_again = series(scrape())
    for counters, reasons in (at_start, loaded_again):
        assert all(values == [0.0] for values in counters.values()), counters
        assert reasons == dict.fromkeys(FAILURE_REASONS, 0.0)
    assert unloaded == ({name: [] for name in at_start[0]}, {})


def test_an_unloaded_version_is_not_kept_alive_by_the_servers_records(models_dir, tmp_path):
    """The server's per-version record (its metrics and limits, made at the first request) is
    dropped at the unload: it held the closed version, and all it refers to, until a request
    named the same version again."""
    import gc
    import os

    from aclserve.repository.served import ServedVersion

    own, srv = _own_server(models_dir, tmp_path)

    def alive():
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, ServedVersion) and o.name == "double"
                and o.wanted.file.path.startswith(os.path.realpath(own))]  # (not another test's server)

    try:
        assert alive() != []  # (what is looked for is found)
        asyncio.run(_infer_then_unload_double(f"http://{srv.url}"))
        assert alive() == []
    finally:
        srv.close()


def _own_server(models_dir, tmp_path):
    """A dedicated server on a copy of the test models (the module's `server` is shared): (its
    models folder, the started ServerThread)."""
    import shutil

    from tests.serving import ServerThread, server_config

    own = tmp_path / "models"
    shutil.copytree(models_dir, own)
    return own, ServerThread(server_config(own)).start()


async def _infer_then_unload_double(url) -> tuple[str, str]:
    """One request to `double`, then its unload through the API: /metrics before and after."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v2/models/double/infer", json={
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}) as r:
            assert r.status == 200
        async with session.get(f"{url}/metrics") as r:
            before = await r.text()
        async with session.post(f"{url}/v2/repository/models/double/unload") as r:
            assert r.status == 200
        async with session.get(f"{url}/metrics") as r:
            return before, await r.text()
