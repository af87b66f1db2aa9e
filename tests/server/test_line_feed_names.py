"""A name that ends in a line feed is no model's and no version's name (a tester, t44): the
validating regular expressions ended in `$`, which also matches before a final line feed, so
"double\\n" passed check_model_name (a load of it was a 404 "no model", not a 400), a file
`ev<LF>.om` was served as model "ev\\n" and a folder `2<LF>` as version 2 (int() reads "2\\n").
Real server on a real port, real CPU runtime."""
from __future__ import annotations

import json
import shutil

from onnx import helper

from aclserve.om.atc_options import cpu_warnings
from aclserve.repository.entry_locks import sweep
from tests.serving import ServerThread, index_of, request, server_config


def test_a_name_ending_in_a_line_feed_is_refused_and_never_served(models_dir, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    shutil.copy(models_dir / "double.om", folder / "ev\n.om")
    for version in ("1", "2\n"):
        (folder / "v" / version).mkdir(parents=True)
        shutil.copy(models_dir / "double.om", folder / "v" / version / "model.om")
    with ServerThread(server_config(folder)) as srv:
        index = index_of(srv)
        status, _, body = request(srv, "POST", "/v2/repository/models/double%0A/load")
        metadata = request(srv, "GET", "/v2/models/v")
    assert index[("ev\n.om", "")] == ("UNAVAILABLE", "model names use ASCII letters, digits, '_', '-', '.' (at "
                                      "most 128, not starting with '-' or '.')"), index
    assert ("ev\n", "1") not in index
    assert {key: state for key, (state, _) in index.items() if key[0] in ("double", "v")} == {
        ("double", "1"): "READY", ("v", "1"): "READY"}
    assert status == 400 and json.loads(body)["error"].startswith("invalid model name 'double\\n': "), body
    assert json.loads(metadata[2])["versions"] == ["1"]


def test_a_compile_cache_entry_or_a_soc_name_ending_in_a_line_feed_is_none(tmp_path):
    """The compile cache's sweep takes only its own entries' names (an OM of the user's own in a
    configured cache folder is never removed); a SoC name with a line feed is one ATC refuses."""
    entry = f"m-{'1' * 32}.om"
    (tmp_path / entry).write_bytes(b"om")  # an interrupted compile's: no manifest
    (tmp_path / f"{entry}\n").write_bytes(b"om")  # the user's own
    assert sweep(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == [f"{entry}\n"]
    model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 17)])
    assert cpu_warnings(model, "Ascend310P3") == []
    assert cpu_warnings(model, "Ascend310P3\n")[0].startswith("--soc-version 'Ascend310P3\\n' does not look like")
