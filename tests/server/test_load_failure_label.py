"""aclserve_model_load_failure's `reason` label is one text for one failure, however often it is
retried. A device's words carry what changes at every attempt (`EZ9999: [PID: 3058434]
2026-08-03-20:55:35.272.841 ... task_id=13`), and each retry of a model the device kept failing
labelled its failure anew: a new series each time, for as long as the model failed (series churn;
the retry plan had been taken out of the label before). The label now has those numbers as `#`
(retry.same_words, as the warm-up rule compares them) and is at most REASON_LABEL_CHARS long; the
index keeps the reason whole. Real server on a real port, the CPU runtime failing every run with
the words a device says (ACLSERVE_CPU_FAULTS' `says`)."""
from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from aclserve.acl.cpu import faults
from aclserve.server.health_metrics import REASON_LABEL_CHARS
from tests.serving import ServerThread, request, server_config

HANG_GUARD_S = 120  # (not a timing: the retries come within a second or two)


def _scrape(srv) -> tuple[float, list[tuple[str, str]]]:
    """One /metrics read: the retries of `double` started, and its load failure series as (version, reason)."""
    text = urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode()
    retries, series = 0.0, []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != "double":
                continue
            if sample.name == "aclserve_model_load_retries_total":
                retries = sample.value
            elif sample.name == "aclserve_model_load_failure":
                series.append((sample.labels["version"], sample.labels["reason"]))
    return retries, series


def _index_reason(srv, version: str) -> str:
    status, _, body = request(srv, "POST", "/v2/repository/index")
    assert status == 200, body
    return next(row["reason"] for row in json.loads(body) if row["name"] == "double" and row["version"] == version)


def test_a_failure_retried_keeps_one_series_though_the_device_words_change(models_dir, tmp_path, clean_faults):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    faults.inject("execute", code=507011, says=True)  # every run fails: the warm-up's at every attempt
    # (retries within a second; the same failure given up only once it has lasted a minute: not in this test)
    config = server_config(folder, load_retry_initial_s=0.2, load_retry_max_s=60.0)
    seen: list[tuple[float, list]] = []  # (retries started, failure series) of each read showing the failure
    with ServerThread(config) as srv:
        give_up = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < give_up:
            retries, series = _scrape(srv)
            if series:  # (none while a retry loads)
                seen.append((retries, series))
            if seen and retries >= seen[0][0] + 2 and series:  # the failure again, two retries after the first read
                break
            time.sleep(0.02)
        index_reason = _index_reason(srv, "1")
    assert seen and seen[-1][0] >= seen[0][0] + 2, seen
    labels = {s for _, series in seen for s in series}
    assert len(labels) == 1 and all(len(series) == 1 for _, series in seen), labels  # one series throughout
    ((version, reason),) = labels
    ours, says, device = reason.partition("; the device says: ")
    assert version == "1" and "failed with 507011" in ours and index_reason.startswith(ours + says), reason
    assert device.startswith("EZ9999: Inner Error! EZ9999: [PID: #] # The error from device(chipId:#"), reason
    assert "task_id=#" in device and len(reason) <= REASON_LABEL_CHARS, reason
    # the index says what the device said as it said it, and when the retry is due
    assert f"EZ9999: [PID: {os.getpid()}] 20" in index_reason and "task_id=#" not in index_reason, index_reason
    assert "(transient device error: retry " in index_reason, index_reason


def test_a_long_reason_is_cut_in_the_label_and_whole_in_the_index(tmp_path):
    """A model's problem (version empty) is labelled with REASON_LABEL_CHARS of its reason at most:
    a model folder whose files are all in folders that are no version's is refused naming each of
    them, and its label was the whole list."""
    folder = tmp_path / "models"
    for n in range(1, 31):
        (folder / "double" / f"v{n}").mkdir(parents=True)
        (folder / "double" / f"v{n}" / "model.om").write_bytes(b"")
    config = server_config(folder, model_control_mode="poll", settle_s=0.1, debounce_s=0.05, readiness="lenient")
    with ServerThread(config) as srv:
        give_up = time.monotonic() + HANG_GUARD_S
        while not (series := _scrape(srv)[1]) and time.monotonic() < give_up:  # (a hang guard)
            time.sleep(0.02)
        index_reason = _index_reason(srv, "")
    ((version, reason),) = series
    assert version == "" and "double/v30 is not a version folder" in index_reason, index_reason
    assert len(index_reason) > REASON_LABEL_CHARS, index_reason
    assert len(reason) == REASON_LABEL_CHARS and reason == index_reason[:REASON_LABEL_CHARS - 4] + " ...", reason


def test_a_failure_given_up_keeps_its_series_when_a_load_call_fails_it_again(models_dir, tmp_path, clean_faults):
    """A warm-up failing the same way for `load_retry_max_s` is given up, its reason saying how often
    and for how long (`failed the same way 3 times in a row over 0.6 s`); a load call failing it
    again said 4 times over more seconds, and labelled it anew. Those numbers are `#` in the label."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    faults.inject("execute", code=507011)  # every run fails, saying nothing: the same failure every time
    config = server_config(folder, load_retry_initial_s=0.05, load_retry_max_s=0.1)
    with ServerThread(config) as srv:
        give_up = time.monotonic() + HANG_GUARD_S
        while "not retried" not in _index_reason(srv, "1") and time.monotonic() < give_up:  # (a hang guard)
            time.sleep(0.02)
        before = _scrape(srv)[1]
        status, _, body = request(srv, "POST", "/v2/repository/models/double/load")
        after = _scrape(srv)[1]
    assert status == 400 and b"failed the same way" in body, body
    assert before == after and len(before) == 1, (before, after)
    assert "(failed the same way # times in a row over # s: the model's failure" in before[0][1], before
