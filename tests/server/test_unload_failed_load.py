"""An unload of a model whose load failed clears the failure: its index row says "unloaded" and
aclserve_model_load_failure has no series for it, as for a model unloaded after serving. Its
failure was kept (UNAVAILABLE with the load's reason, the metric at 1): the unload acted only on
the versions that had loaded."""
from __future__ import annotations

import json

from tests.serving import ServerThread, request


def test_an_unload_of_a_model_whose_load_failed_clears_its_failure(make_config, models_dir, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "affine.om").write_bytes((models_dir / "affine.om").read_bytes())
    config = make_config(folder, model_control_mode="explicit", settle_s=0.0)
    with ServerThread(config) as server:
        (folder / "broken.om").write_bytes(b"not an om file at all")  # a corrupt .om: its load fails
        status, _, body = request(server, "POST", "/v2/repository/models/broken/load")
        assert status == 400, body
        assert 'model="broken"' in request(server, "GET", "/metrics")[2].decode()
        status, _, body = request(server, "POST", "/v2/repository/models/broken/unload")
        assert status == 200, body
        status, _, body = request(server, "POST", "/v2/repository/index")
        row = next(r for r in json.loads(body) if r["name"] == "broken")
        assert (row["state"], row["reason"]) == ("UNAVAILABLE", "unloaded"), row
        metrics = request(server, "GET", "/metrics")[2].decode()
        failures = [line for line in metrics.splitlines() if line.startswith("aclserve_model_load_failure{")]
        assert not any('model="broken"' in line for line in failures), failures
        # a load call tries the file again, and says why it fails
        status, _, body = request(server, "POST", "/v2/repository/models/broken/load")
        assert status == 400, body
