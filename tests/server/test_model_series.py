"""The per-model series of /metrics (aclserve_model_loads_total, _load_duration_seconds,
_reloads_total, _unloads_total, _load_retries_total), as an independent tester found them:
reloads, unloads and load retries appeared only with their first event, so Prometheus'
increase() missed that one (the reason the per-version series are made at 0); and no model's
series were ever removed, so their label sets grew with every model dropped into the folder
and taken out again. Now: made at 0 when the model first appears, removed once the repository
lists nothing of it (model_series.py)."""
from __future__ import annotations

import shutil
import time
import urllib.request

from tests.serving import ServerThread, json_call, server_config

from .metrics_samples import samples

MODEL_FAMILIES = ("aclserve_model_loads_total", "aclserve_model_load_duration_seconds_count",
                  "aclserve_model_reloads_total", "aclserve_model_unloads_total", "aclserve_model_load_retries_total")


def _of(found, model: str) -> dict:
    """family -> {result label or "": value} of `model`'s per-model series."""
    return {name: {s.labels.get("result", ""): s.value for s in found.get(name, []) if s.labels["model"] == model}
            for name in MODEL_FAMILIES}


def _scrape(srv):
    return samples(urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode())


def test_a_models_series_are_there_at_0_from_its_first_load(models_dir, tmp_path):
    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "double.om", own / "double.om")
    with ServerThread(server_config(own, model_control_mode="none")) as srv:
        found = _of(_scrape(srv), "double")
    assert found == {"aclserve_model_loads_total": {"ok": 1, "failed": 0},
                     "aclserve_model_load_duration_seconds_count": {"": 1},
                     "aclserve_model_reloads_total": {"": 0}, "aclserve_model_unloads_total": {"": 0},
                     "aclserve_model_load_retries_total": {"": 0}}


def test_a_models_series_go_once_its_files_are_gone_and_start_again_when_it_comes_back(models_dir, tmp_path):
    own = tmp_path / "models"
    own.mkdir()
    for name in ("double", "affine"):
        shutil.copy(models_dir / f"{name}.om", own / f"{name}.om")
    config = server_config(own, model_control_mode="poll", settle_s=0.1, debounce_s=0.05)

    def until(predicate):
        for _ in range(3000):  # a hang guard
            found = _scrape(srv)
            if predicate(found):
                return found
            time.sleep(0.01)
        raise AssertionError("never came")

    def listed(found) -> bool:
        return any(s.labels["model"] == "double" for s in found.get("aclserve_model_state", []))

    def serving(found) -> bool:
        return any(s.labels["model"] == "double" and s.labels["state"] == "READY"
                   for s in found.get("aclserve_model_state", []))

    with ServerThread(config) as srv:
        until(serving)
        (own / "double.om").unlink()
        gone = until(lambda found: not listed(found))
        shutil.copy(models_dir / "double.om", own / ".double.tmp")
        (own / ".double.tmp").rename(own / "double.om")
        back = until(serving)
    assert _of(gone, "double") == dict.fromkeys(MODEL_FAMILIES, {})
    assert _of(gone, "affine")["aclserve_model_loads_total"] == {"ok": 1, "failed": 0}  # (the others stay)
    assert _of(back, "double")["aclserve_model_loads_total"] == {"ok": 1, "failed": 0}
    assert _of(back, "double")["aclserve_model_unloads_total"] == {"": 0}


def test_load_retries_start_at_0_for_a_model_and_again_when_it_comes_back():
    """The repository counts retries per model name for good; a model's series counts those
    made since it appeared."""
    from aclserve.server.metrics import ServerMetrics

    rows, retries = [{"name": "m", "version": "1"}], {"m": 3}
    metrics = ServerMetrics(lambda index: [], lambda: [], index=lambda: rows, load_retries=lambda: retries)

    def counted():
        found = samples(metrics.render().decode())
        return [s.value for s in found.get("aclserve_model_load_retries_total", [])]

    assert counted() == [0]
    retries["m"] = 5
    assert counted() == [2]
    rows = []
    assert counted() == []
    rows = [{"name": "m", "version": "", "state": "LOADING"}]  # a load call's row of a name no listing knows
    assert counted() == []
    rows = [{"name": "m", "version": "", "state": "UNAVAILABLE"}]  # known only as a problem (its config broken)
    assert counted() == [0]
    rows = [{"name": "m", "version": "1"}]
    assert counted() == [0]


def test_a_load_as_long_as_the_default_compile_timeout_has_a_finite_bucket():
    """A load's seconds hold its .onnx's compile, which may take up to compile_timeout_s (an
    hour by default): the top bucket was 300 s, so every ATC compile of 5 to 60 minutes fell in +Inf."""
    from aclserve.om.compile_error import DEFAULT_TIMEOUT_S
    from aclserve.server.model_series import LOAD_BUCKETS
    assert LOAD_BUCKETS[-1] >= DEFAULT_TIMEOUT_S
    assert list(LOAD_BUCKETS) == sorted(LOAD_BUCKETS)


def _broken_config(folder, max_batch_size: int) -> None:
    (folder / "m" / "1").mkdir(parents=True, exist_ok=True)
    (folder / "m" / ".config.tmp").write_text(f"batching: {{max_batch_size: {max_batch_size}}}\n")
    (folder / "m" / ".config.tmp").rename(folder / "m" / "config.yaml")


def test_a_model_whose_config_is_broken_counts_a_failed_load_per_load_call_refused(models_dir, tmp_path):
    """A config that does not read (`POST .../load` answered 400) showed in aclserve_model_load_failure
    and aclserve_model_state with the version empty, but the model had no aclserve_model_loads_total
    at all, though its series are to exist from when the index first lists it (a tester's find):
    only rows with a version made them, and a config's failure was no repository event. Explicit
    mode: listed by an index read, its series are there at 0; each load call refused is one failed
    load; the index reads between them (scans loading nothing) count none."""
    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "double.om", own / "double.om")
    with ServerThread(server_config(own, model_control_mode="explicit")) as srv:
        shutil.copy(models_dir / "double.om", _model_file(own))
        _broken_config(own, -3)
        assert json_call(srv.url, "/v2/repository/index", b"{}")[1][-1]["name"] == "m"  # read as it is now
        listed = _of(_scrape(srv), "m")
        counts = []
        for _ in range(2):
            status, said = json_call(srv.url, "/v2/repository/models/m/load", b"{}")
            assert status == 400 and "max_batch_size" in said["error"], said
            json_call(srv.url, "/v2/repository/index", b"{}")
            counts.append(_of(_scrape(srv), "m")["aclserve_model_loads_total"])
    assert listed == {"aclserve_model_loads_total": {"ok": 0, "failed": 0},
                      "aclserve_model_load_duration_seconds_count": {"": 0},
                      "aclserve_model_reloads_total": {"": 0}, "aclserve_model_unloads_total": {"": 0},
                      "aclserve_model_load_retries_total": {"": 0}}
    assert counts == [{"ok": 0, "failed": 1}, {"ok": 0, "failed": 2}]


def _model_file(folder):
    (folder / "m" / "1").mkdir(parents=True, exist_ok=True)
    return folder / "m" / "1" / "model.om"


def test_a_broken_config_is_one_failed_load_while_it_lasts_in_poll_mode(models_dir, tmp_path):
    """Poll mode loads what its scans find: the start's finding the config broken is one failed
    load; the rescans that find it so again are not more; the config broken another way is one
    more, as is a load call refused for it."""
    own = tmp_path / "models"
    own.mkdir()
    shutil.copy(models_dir / "double.om", _model_file(own))
    _broken_config(own, -3)
    config = server_config(own, model_control_mode="poll", settle_s=0.1, debounce_s=0.05)

    def until(predicate):
        for _ in range(3000):  # a hang guard
            found = _scrape(srv)
            if predicate(found):
                return _of(found, "m")["aclserve_model_loads_total"]
            time.sleep(0.01)
        raise AssertionError("never came")

    def failing(why: str):
        return lambda found: any(s.labels["model"] == "m" and why in s.labels["reason"]
                                 for s in found.get("aclserve_model_load_failure", []))

    def serving(name: str):
        return lambda found: any(s.labels["model"] == name and s.labels["state"] == "READY"
                                 for s in found.get("aclserve_model_state", []))

    with ServerThread(config) as srv:
        at_start = until(failing("got -3"))
        shutil.copy(models_dir / "double.om", own / ".double.tmp")  # another model's file: rescans
        (own / ".double.tmp").rename(own / "double.om")
        rescanned = until(serving("double"))
        _broken_config(own, -4)
        broken_again = until(failing("got -4"))
        status, _ = json_call(srv.url, "/v2/repository/models/m/load", b"{}")
        refused = _of(_scrape(srv), "m")["aclserve_model_loads_total"]
    assert status == 400
    assert [at_start, rescanned, broken_again, refused] == [{"ok": 0, "failed": n} for n in (1, 1, 2, 3)]
