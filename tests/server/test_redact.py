"""The path redactor's rule, which reads the text only (redact.py says why)."""
from __future__ import annotations

import pytest

from aclserve.server.redact import PathRedactor


@pytest.mark.parametrize("text, shown", [
    ("cannot read /srv/models/a/1/model.om.", "cannot read <models>/a/1/model.om."),
    ("folder /srv/models is read-only", "folder <models> is read-only"),
    ("in /usr/lib/python3/site-packages/x.py, line 3", "in x.py, line 3"),
    ("unknown input '/etc/shadow'", "unknown input 'shadow'"),
    ("unknown input '/no/such/place/here'", "unknown input 'here'"),
    ("/v2/models/m/infer: not supported", "/v2/models/m/infer: not supported"),
    ("see /metrics/x", "see /metrics/x"),
    ("top level /etc or /etc/", "top level /etc or /etc/"),
    ("application/json at http://127.0.0.1:8000/v2/x, 3/4", "application/json at http://127.0.0.1:8000/v2/x, 3/4"),
])
def test_paths_are_rewritten_by_their_text(text, shown):
    assert PathRedactor("/srv/models")(text) == shown


def test_whether_a_path_exists_changes_nothing(tmp_path):
    (tmp_path / "here").write_text("x")
    redact = PathRedactor("/srv/models")
    assert redact(f"{tmp_path}/here") == "here" and redact("/aclserve-no-such-folder/here") == "here"


def test_a_models_folder_gone_is_not_named_by_its_path_in_the_index_or_metrics(make_config, tmp_path):
    """Its problem row was named by the folder's absolute path, in the index and in
    aclserve_model_state's labels (found by running the server on a folder made unreadable)."""
    import json
    import time

    from tests.serving import ServerThread, request
    models = tmp_path / "models"
    models.mkdir()
    with ServerThread(make_config(models, model_control_mode="poll", debounce_s=0.05)) as srv:
        models.rmdir()
        for _ in range(600):  # (a hang guard: the watcher's scan sees it within a moment)
            status, _, body = request(srv, "POST", "/v2/repository/index", data=b"{}")
            if json.loads(body):
                break
            time.sleep(0.05)
        assert status == 200 and json.loads(body) == [
            {"name": "<models>", "version": "", "state": "UNAVAILABLE", "reason": "the models folder does not exist"}]
        _, _, metrics = request(srv, "GET", "/metrics")
        assert str(tmp_path).encode() not in metrics and b'model="<models>"' in metrics
