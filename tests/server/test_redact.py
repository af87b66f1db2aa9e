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
