"""A load that failed for a transient device error says when its retry is due: the seconds in
"retry 1 in 41.7 s" are counted to the moment the index (or a request for the model) is read.
They were the delay drawn at the failure, the same at every read however long ago that was
(found by an independent tester polling the index each second). The log line keeps the delay
drawn, and /metrics' aclserve_model_load_failure names no retry: one failure, one series. Real
server on a real port, the load failed by the CPU runtime's fault injection."""
from __future__ import annotations

import json
import math
import re
import shutil
import time
import urllib.request

from aclserve.acl.cpu import faults
from aclserve.repository.retry import RetrySchedule
from tests.serving import ServerThread, request, server_config

HANG_GUARD_S = 60  # (not a timing: the fixed server's reason changes within a read or two)
RETRY = re.compile(r"(.*507899.*\(transient device error: )retry 1 in (\d+\.\d) s\)")


def reason(srv) -> str:
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    return next(row["reason"] for row in json.loads(body) if row["name"] == "double")


def failure_series(srv) -> list[str]:
    text = urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode()
    return [line for line in text.splitlines() if line.startswith("aclserve_model_load_failure{")]


def test_a_retry_s_reason_counts_down_to_when_it_is_due(models_dir, tmp_path, clean_faults):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    faults.inject("load", count=3, code=507899)  # (its first retry comes 30-60 s later: none during the test)
    config = server_config(folder, load_retry_initial_s=60.0, load_retry_max_s=60.0)
    with ServerThread(config) as srv:
        first = reason(srv)
        series = failure_series(srv)
        give_up = time.monotonic() + HANG_GUARD_S  # a hang guard: without the change it never changed
        while (later := reason(srv)) == first and time.monotonic() < give_up:
            time.sleep(0.05)
        status, _, body = request(srv, "GET", "/v2/models/double")
        said = json.loads(body)["error"]
        series_later = failure_series(srv)
    told, later_told = RETRY.fullmatch(first), RETRY.fullmatch(later)
    assert told and later_told, (first, later)
    assert later_told[1] == told[1]  # the same failure, the same retry
    assert float(later_told[2]) < float(told[2]) <= 60.0, (first, later)
    asked = re.search(r"retry 1 in (\d+\.\d) s\)", said)  # a request for it says so too
    assert status == 503 and asked and float(asked[1]) <= float(later_told[2]), (status, said)
    assert series == series_later and len(series) == 1 and "retry" not in series[0], (series, series_later)
    assert series[0].endswith('(transient device error)",version="1"} 1.0'), series


def test_a_request_naming_no_version_counts_down_the_retry_of_the_version_it_names(
        models_dir, tmp_path, clean_faults, monkeypatch):
    """Two versions waiting for their retries: a request naming no version is told of the latest
    recorded one, with that version's countdown and a Retry-After that agrees with it. It was told
    the soonest retry of any version with the other's text, and Retry-After: 1 (reviewer r16:
    "model double:2#0 ... retry 1 in 44.0 s" where the index said v2's was 56.4 s, v1's 44.1 s)."""
    folder = tmp_path / "models"
    for version in ("1", "2"):
        (folder / "double" / version).mkdir(parents=True)
        shutil.copy(models_dir / "double.om", folder / "double" / version / "model.om")
    (folder / "double" / "config.yaml").write_text("version_policy: all\n")
    delays = iter([100.0, 1000.0])  # the first failure's retry is the sooner (none comes during the test)
    monkeypatch.setattr(RetrySchedule, "delay", lambda self, attempt: next(delays))
    faults.inject("load", count=10, code=507899)
    config = server_config(folder, load_retry_initial_s=60.0, load_retry_max_s=60.0)
    with ServerThread(config) as srv:
        status, _, body = request(srv, "POST", "/v2/repository/index")
        rows = {row["version"]: row["reason"] for row in json.loads(body)}
        answers = [request(srv, "GET", "/v2/models/double"),
                   request(srv, "POST", "/v2/models/double/infer", json={"inputs": []})]
    index_said = {version: float(RETRY.fullmatch(reason)[2]) for version, reason in rows.items()}
    assert 100.0 >= index_said["1"] and index_said["2"] > 100.0, rows  # (v2's first: its load failed last)
    for status, headers, body in answers:
        said = json.loads(body)["error"]
        told = re.search(r"model double:(\d)#0: .*retry 1 in (\d+\.\d) s\)\)$", said)
        assert status == 503 and told and told[1] == "2", (status, said)  # the latest recorded: v2
        assert 100.0 < float(told[2]) <= index_said["2"], (said, rows)  # v2's own countdown, not v1's
        assert headers["Retry-After"] == str(math.ceil(float(told[2]))), (headers, said)
