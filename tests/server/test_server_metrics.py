"""/metrics on the real server, parsed with prometheus-client's own parser. A version's series over
its loads, unloads and reloads: test_server_metrics_versions.py."""
import asyncio
import json
import logging
import threading
import urllib.request

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .metrics_samples import samples, value

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 8], "data": [0.5] * 24},
                   {"name": "idx", "datatype": "INT64", "shape": [3, 3], "data": [1] * 9}]}


async def _exchange(url):
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.post(f"{url}/v2/models/affine/infer", json=BODY) as resp:
                assert resp.status == 200
        bad = dict(BODY, inputs=BODY["inputs"][:1])
        async with session.post(f"{url}/v2/models/affine/infer", data=json.dumps(bad)) as resp:
            assert resp.status == 400
        async with session.get(f"{url}/metrics") as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
            return await resp.text()


def test_metrics_after_requests(server):
    found = samples(asyncio.run(_exchange(f"http://{server.url}")))
    mv = {"model": "affine", "version": "1"}
    assert value(found, "aclserve_request_success_total", **mv) >= 3
    assert value(found, "aclserve_request_failure_total", reason="InvalidInput", **mv) >= 1
    # successes only: refusals answered at once passed for latency falling under overload
    assert value(found, "aclserve_request_duration_seconds_count", **mv) == value(
        found, "aclserve_request_success_total", **mv)
    assert value(found, "aclserve_queue_duration_seconds_count", **mv) >= 3
    assert value(found, "aclserve_compute_duration_seconds_count", **mv) >= 1
    # 3 rows run in gear 4: one padding row per run
    assert value(found, "aclserve_batch_size_count", **mv) >= 1
    assert value(found, "aclserve_padding_rows_total", **mv) >= 1
    levels = {s.labels["priority"] for s in found["aclserve_queue_depth"] if s.labels["model"] == "affine"}
    assert levels == {"1", "2", "3"}
    assert any(s.labels["model"] == "affine" for s in found["aclserve_instance_busy_ratio"])
    assert value(found, "aclserve_device_memory_total_bytes", device="0") > 0
    assert "aclserve_device_memory_used_bytes" in found
    assert value(found, "aclserve_model_load_duration_seconds_count", model="affine") >= 1


def test_requests_in_flight_while_a_batch_is_held_on_the_device_and_after(server, clean_faults):
    from aclserve.acl.cpu import faults
    from tests.serving import request
    from tests.server.hostile import metric

    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate)
    answer = {}
    client = threading.Thread(
        target=lambda: answer.update(r=request(server, "POST", "/v2/models/affine/infer", json=BODY)))
    client.start()
    try:
        while not held.fired:
            gate.wait(0.01)
        assert metric(server.url, "aclserve_requests_in_flight") == 1
    finally:
        gate.set()
        client.join(30)
    assert answer["r"][0] == 200
    assert metric(server.url, "aclserve_requests_in_flight") == 0


def test_compute_busy_ratio_in_metrics_and_statistics(server):
    """Per instance and per device, from events; the help text names the source."""
    async def go():
        url = f"http://{server.url}"
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v2/models/affine/infer", json=BODY) as resp:
                assert resp.status == 200
            async with session.get(f"{url}/metrics") as resp:
                text = await resp.text()
            async with session.get(f"{url}/v2/models/affine/stats") as resp:
                stats = await resp.json()
        return text, stats
    text, stats = asyncio.run(go())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    per_instance = families["aclserve_compute_busy_ratio"]
    assert "event_elapsed_time" in per_instance.documentation and "not the chip's own" in per_instance.documentation
    rows = [s for s in per_instance.samples if s.labels["model"] == "affine"]
    assert [s.labels["instance"] for s in rows] == ["affine:1#0"] and rows[0].labels["device"] == "0"
    # a fraction (the exact figure, from each batch's events, is checked in test_utilisation.py;
    # here the window's wall time grows with the module's server, so the value is not fixed)
    assert 0.0 <= rows[0].value <= 1.0
    assert 0.0 <= families["aclserve_device_compute_busy_ratio"].samples[0].value <= 1.0
    assert families["aclserve_device_memory_reserve_bytes"].samples[0].value > 0
    (entry,) = stats["model_stats"]
    (utilisation,) = entry["utilisation"]
    assert utilisation["instance"] == "affine:1#0" and utilisation["device"] == 0
    assert 0.0 <= utilisation["compute_busy"] <= 1.0


def test_metrics_are_compressed_for_a_scraper_that_asks(server):
    """Prometheus sends Accept-Encoding: gzip on every scrape; the text (2.4 MB at 420 versions)
    came back as it was."""
    import gzip
    import urllib.request
    import zlib
    url = f"http://{server.url}/metrics"
    plain = urllib.request.urlopen(url, timeout=30)
    assert plain.headers.get("Content-Encoding") is None and plain.headers["Vary"] == "Accept-Encoding"
    text = plain.read().decode()
    for asked, coding, inflate in (("gzip", "gzip", gzip.decompress), ("deflate;q=1, gzip;q=0.5", "deflate",
                                                                        zlib.decompress)):
        answer = urllib.request.urlopen(urllib.request.Request(url, headers={"Accept-Encoding": asked}), timeout=30)
        assert answer.headers["Content-Encoding"] == coding and answer.headers["Vary"] == "Accept-Encoding"
        body = answer.read()
        assert len(body) < len(text) / 3
        families = {f.name for f in text_string_to_metric_families(inflate(body).decode())}
        assert families == {f.name for f in text_string_to_metric_families(text)}


def test_the_readme_names_every_metric_family(server):
    """Sixteen families the server writes were named nowhere in the README (found by an
    independent walk through it); its table of families must list each one."""
    import re
    import urllib.request

    from tests import REPO
    text = urllib.request.urlopen(f"http://{server.url}/metrics", timeout=30).read().decode()
    written = {f.name + ("_total" if f.type == "counter" else ""): f.documentation
               for f in text_string_to_metric_families(text)}
    readme = (REPO / "README.md").read_text()
    table = readme.split("### Every `/metrics` family", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `(aclserve_[a-z_]+)` \| [a-z]+ \| [a-z, ]* \| (.*) \|$", table, re.MULTILINE))
    assert len(written) > 40 and set(written) <= set(listed), sorted(set(written) - set(listed))
    assert [name for name, doc in written.items() if not listed[name].startswith(doc)] == []  # its help text


def test_request_duration_starts_once_the_body_is_in_hand(models_dir, caplog):
    """aiohttp's path started the histogram's clock before its body was read, so a client's slow
    upload counted as time in the server (an SRE's audit: a body held 0.8 s added 0.8 s to
    `_sum`); the guard's direct answers and gRPC have their body before the clock starts. The
    body is held HOLD_S from when the request is in flight (its clock started by then): the
    request log, which counts from the arrival, then holds at least HOLD_S more than the
    histogram, whatever the machine's speed."""
    import time

    from tests.serving import ServerThread, server_config
    from tests.server.hostile import head, metric, open_raw, read_response, wait_for

    hold_s = 0.3
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}).encode()
    config = server_config(models_dir, request_log=True, direct_infer=False, model_control_mode="none")
    caplog.set_level(logging.INFO, logger="aclserve.requests")

    async def slow_upload(url):
        reader, writer = await open_raw(url)
        writer.write(head("/v2/models/double/infer", {"Content-Length": len(body)}) + body[:20])
        await wait_for(lambda: metric(url, "aclserve_requests_in_flight") == 1)
        time.sleep(hold_s)  # (the server's loop runs in its own thread meanwhile)
        writer.write(body[20:])
        status, _ = await read_response(reader)
        writer.close()
        return status

    with ServerThread(config) as srv:
        assert asyncio.run(slow_upload(srv.url)) == 200
        found = samples(urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode())
    mv = {"model": "double", "version": "1"}
    assert value(found, "aclserve_request_duration_seconds_count", **mv) == 1
    in_server_ms = value(found, "aclserve_request_duration_seconds_sum", **mv) * 1000
    (line,) = [r.fields for r in caplog.records if r.name == "aclserve.requests"]
    assert in_server_ms <= line["duration_ms"] - hold_s * 1000 + 0.001, (in_server_ms, line["duration_ms"])


def test_the_version_is_in_metrics_and_in_the_start_up_line(models_dir, tmp_path, caplog):
    """Neither the start-up log nor /metrics said which aclserve a replica runs (an independent
    tester): the conventional info gauge, and the version in the line that says it listens."""
    from aclserve import __version__
    from tests.serving import ServerThread, server_config

    caplog.set_level(logging.INFO, logger="aclserve.server.app")
    with ServerThread(server_config(tmp_path, model_control_mode="none")) as srv:
        found = samples(urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode())
    assert [(s.labels, s.value) for s in found["aclserve_build_info"]] == [({"version": __version__}, 1.0)]
    assert f"aclserve {__version__} listening on http://{srv.url}" in caplog.messages


def test_trace_files_the_server_could_not_write_are_counted(models_dir, tmp_path, caplog):
    """Each trace file write that failed was an ERROR line and counted nowhere (a tester, t87, its
    trace folder on a full disk). Here the file's place is taken by a folder with a file in it once
    the trace settings have taken its name (they check it can be written): the one traced
    request's file fails, and /metrics counts it."""
    from tests.serving import ServerThread, request, server_config, wait_until
    traces = tmp_path / "traces"
    with ServerThread(server_config(models_dir, trace_dir=str(traces))) as srv:
        def failed() -> float:
            return value(samples(request(srv, "GET", "/metrics")[2].decode()), "aclserve_trace_files_failed_total")
        assert failed() == 0
        status, _, said = request(srv, "POST", "/v2/trace/setting", json={
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "1", "trace_file": "t.json"})
        assert status == 200, said
        (traces / "t.json").mkdir()
        (traces / "t.json" / "kept").write_text("a folder with a file in it: no rename replaces it")
        assert request(srv, "POST", "/v2/models/affine/infer", json=BODY)[0] == 200  # the count spent: written
        wait_until(lambda: "trace: could not write" in caplog.text, "the write failed")
        assert failed() == 1
    assert sorted(p.name for p in traces.iterdir()) == ["t.json"]  # (nothing else written, no part left)
