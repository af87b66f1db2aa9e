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


@pytest.mark.parametrize("folders, text, shown", [
    (("/home/John Smith/srv/models",), "cannot read /home/John Smith/srv/models/x.yaml: bad",
     "cannot read <models>/x.yaml: bad"),
    (("/tmp/x/my models:x",), "no model 'digits.om' in /tmp/x/my models:x", "no model 'digits.om' in <models>"),
    (("/tmp/x/my models:x",), "/tmp/x/my models:x/badlabels.yaml: outputs.y.labels: missing",
     "<models>/badlabels.yaml: outputs.y.labels: missing"),
    (("/srv/models",), "folder /srv/models: gone; /srv/models.", "folder <models>: gone; <models>."),
    (("/srv/models",), "/srv/models2/a/b and /srv/models:x/a/b", "b and b"),  # other folders, by their last component
    (("/srv/models", "/var/lib/my traces", ""), "cannot write /var/lib/my traces/run 1.json: full",
     "cannot write run 1.json: full"),  # another folder the server knows: relative to it
    (("/srv/models", "/var/lib/my traces"), "/var/lib/my traces is not writable", "my traces is not writable"),
    (("/srv/models",), "path:/opt/secret/a/b.so", "path:b.so"),
    (("/srv/models",), "PATH=/opt/a/bin:/opt/b/bin", "PATH=bin:bin"),
])
def test_known_folders_are_found_as_written_and_a_path_after_a_colon_is_one(folders, text, shown):
    """A space or a colon ended a path: the folder names before it were shown (`John
    Smith/srv/models/x.yaml`, `my models:x/badlabels.yaml`), and a path after a colon whole."""
    assert PathRedactor(*folders)(text) == shown


def test_a_models_folder_with_a_space_and_a_colon_is_not_named_in_answers(models_dir, tmp_path):
    """Served from "my models:x": the index, /config and load errors showed the folder's name
    (`my models:x/badlabels.yaml: ...`, `no model 'digits.om' in my models:x`); the trace
    settings showed the operator's trace file's folders from their blank on (`a b/traces:x/t.json`)."""
    import json
    import shutil

    from tests.serving import ServerThread, request, server_config
    models = tmp_path / "my models:x"
    models.mkdir()
    shutil.copy(models_dir / "double.om", models / "double.om")
    shutil.copy(models_dir / "double.om", models / "badlabels.om")
    (models / "badlabels.yaml").write_text("outputs: {y: {labels: nosuch.txt}}\n")
    trace_file = str(tmp_path / "a b" / "traces:x" / "t.json")  # the operator's: any path
    with ServerThread(server_config(models, trace={"level": "TIMESTAMPS", "file": trace_file})) as srv:
        answers = [request(srv, "POST", "/v2/repository/index", data=b"{}"),
                   request(srv, "GET", "/v2/models/badlabels/config"),
                   request(srv, "POST", "/v2/repository/models/badlabels/load", data=b"{}"),
                   request(srv, "POST", "/v2/repository/models/double.om/load", data=b"{}"),
                   request(srv, "GET", "/v2/trace/setting")]
    index, config, load, unknown, trace = (json.loads(body) for _, _, body in answers)
    assert [status for status, _, _ in answers] == [200, 404, 400, 400, 200]
    assert trace["trace_file"] == "t.json"
    reason = "<models>/badlabels.yaml: outputs.y.labels: the file does not exist"
    assert index[0]["name"] == "badlabels" and index[0]["reason"].startswith(reason)
    assert reason in config["error"] and load["error"].startswith(f"failed to load badlabels: {reason}")
    assert unknown == {"error": "failed to load double.om: no model 'double.om' in <models>"}
    assert not any(b"my models" in body or b"a b" in body for _, _, body in answers)


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


def test_the_operators_trace_file_is_known_as_itself_not_its_folder():
    """The folder of `--trace /home/me/trace.json` was a known folder, so every path under a home
    folder was shown from there on (`.local/lib/python3.11/site-packages/acl/libacl.so`; a
    reviewer's find): the file itself is known, any other path shown by its last component."""
    from aclserve.config import load_server_config
    from aclserve.server.state import _known_folders
    config = load_server_config(None, {"models_dir": "/srv/models", "trace": {"file": "/home/me/trace.json"}})
    redact = PathRedactor(config.models_dir, *_known_folders(config))
    assert redact("cannot write /home/me/trace.json: full") == "cannot write trace.json: full"
    assert redact("loading /home/me/.local/lib/python3.11/site-packages/acl/libacl.so failed") == \
        "loading libacl.so failed"


def test_a_models_folder_given_as_a_link_is_not_named_by_its_target(models_dir, tmp_path):
    """The scan names the files by the folder's real path (layout.scan resolves it), which the
    redactor did not know: with --models a link to `.../real/My Models`, a broken config's index
    reason read `My Models/broken.yaml: ...` (a tester, t44)."""
    import json
    import os
    import shutil

    from tests.serving import ServerThread, request, server_config
    real = tmp_path / "real" / "My Models"
    real.mkdir(parents=True)
    shutil.copy(models_dir / "double.om", real / "double.om")
    shutil.copy(models_dir / "double.om", real / "broken.om")
    (real / "broken.yaml").write_text("instances: [\n")
    os.symlink(real, tmp_path / "models")
    with ServerThread(server_config(tmp_path / "models")) as srv:
        status, _, body = request(srv, "POST", "/v2/repository/index", data=b"{}")
    reasons = {row["name"]: row.get("reason", "") for row in json.loads(body)}
    assert status == 200 and reasons["broken"].startswith("<models>/broken.yaml: "), reasons
    assert b"My Models" not in body and b"real" not in body


def test_a_known_folder_is_found_by_its_real_path_too(tmp_path):
    """As written and as the disk names it: a compile cache folder given as a link is shown
    relative to itself by either spelling, and by the name it was given."""
    import os
    real = tmp_path / "real cache"
    real.mkdir()
    os.symlink(real, tmp_path / "cache")
    redact = PathRedactor("/srv/models", str(tmp_path / "cache"))
    assert redact(f"cannot write {real}/m-1.om: full") == "cannot write m-1.om: full"
    assert redact(f"{tmp_path}/cache/m-1.om is gone") == "m-1.om is gone"
    assert redact(f"{real} is read-only") == "cache is read-only"


@pytest.mark.parametrize("given", ["relative", "absolute"])
def test_the_models_folder_is_named_so_however_it_was_given(tmp_path, given):
    """Served from the default `models` (relative) folder, a load of no model said `no model 'xx' in
    models` and a folder gone was the index's row `models`, where an absolute --models read `<models>`
    in both (the repository formatted its root as given; the redactor rewrites absolute paths)."""
    import json
    import os
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    from tests import REPO
    from tests.serving import free_port
    (tmp_path / "models").mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}/v2"
    flags = ["--models", str(tmp_path / "models")] if given == "absolute" else []  # (else the default, `models`)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "aclserve", "serve", "--port", str(port), "--grpc-port", "0",
                                 "--device", "cpu", *flags], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                                stdout=out, stderr=subprocess.STDOUT)

    def post(path: str) -> tuple[int, dict | list]:
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, b"{}", method="POST"), timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
    try:
        for _ in range(600):  # (a hang guard: it listens within seconds)
            assert proc.poll() is None, log.read_text()
            try:
                urllib.request.urlopen(f"{url}/health/live", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"the server never listened: {log.read_text()}")
        unknown = post("/repository/models/xx/load")
        (tmp_path / "models").rmdir()
        for _ in range(600):  # (the watcher's scan sees it within a moment)
            index = post("/repository/index")
            if index[1]:
                break
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert unknown == (400, {"error": "failed to load xx: no model 'xx' in <models>"})
    assert index == (200, [{"name": "<models>", "version": "", "state": "UNAVAILABLE",
                            "reason": "the models folder does not exist"}])


def test_a_models_folder_given_as_a_link_then_dot_dot_is_the_folder_the_os_reads(tmp_path, monkeypatch):
    """`link/..`, its link to real/sub, is real/ to the OS (`..` taken after the link); made absolute by text
    (abspath) it was the folder holding the link, and the model in real/ was not served."""
    import os
    import shutil

    from tests import REPO
    from tests.serving import ServerThread, json_call, server_config
    (tmp_path / "real" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "real" / "sub", tmp_path / "link")
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "real" / "digits.om")
    os.utime(tmp_path / "real" / "digits.om", (1, 1))  # (complete: served without the settle wait)
    monkeypatch.chdir(tmp_path)
    with ServerThread(server_config("link/..", model_control_mode="poll")) as server:
        index = json_call(server.url, "/v2/repository/index", b"{}")
        assert index == (200, [{"name": "digits", "version": "1", "state": "READY", "reason": ""}]), index
        status, answer = json_call(server.url, "/v2/repository/models/xx/load", b"{}")
    assert (status, answer) == (400, {"error": "failed to load xx: no model 'xx' in <models>"})
