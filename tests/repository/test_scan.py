"""The pure scan and diff on temporary folders: layouts, configs, ignored and invalid names,
symlinks, version policies."""
from __future__ import annotations

import gc
import json
import logging
import os
import weakref

import pytest

from aclserve.config import ModelConfig, parse_model_config
from aclserve.logs import JsonFormatter, TextFormatter
from aclserve.repository import layout
from aclserve.repository.layout import check_model_name, scan, select_versions
from aclserve.repository.plan import diff
from aclserve.repository.planner import Planner
from aclserve.repository.settle import SettleGate

DEFAULTS = ModelConfig()


def touch(path, data=b"om"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_flat_and_versioned_layouts(tmp_path):
    touch(tmp_path / "flat.om")
    touch(tmp_path / "multi" / "1" / "model.om")
    touch(tmp_path / "multi" / "10" / "model.om")
    touch(tmp_path / "multi" / "2" / "model.om")
    result = scan(tmp_path, DEFAULTS)
    assert set(result.models) == {"flat", "multi"}
    assert list(result.models["flat"].available) == ["1"]
    assert result.models["flat"].available["1"].path == str((tmp_path / "flat.om").resolve())
    assert sorted(result.models["multi"].available, key=int) == ["1", "2", "10"]
    assert result.models["multi"].selected == ("10",)  # latest 1 by number, not by string
    assert result.problems == {}


def test_onnx_is_found_and_om_of_the_same_name_wins(tmp_path):
    touch(tmp_path / "a.onnx")
    touch(tmp_path / "b.onnx")
    touch(tmp_path / "b.om")
    touch(tmp_path / "c" / "1" / "model.onnx")
    touch(tmp_path / "c" / "2" / "model.onnx")
    touch(tmp_path / "c" / "2" / "model.om")
    models = scan(tmp_path, DEFAULTS).models
    assert models["a"].available["1"].kind == "onnx"
    assert models["b"].available["1"].kind == "om"
    assert models["c"].available["1"].kind == "onnx"
    assert models["c"].available["2"].kind == "om"


def test_a_model_config_yaml_cannot_build_is_that_models_problem_alone(tmp_path):
    """100,000 nested lists (RecursionError) or a 5,000-digit integer (ValueError) in one model's
    YAML escaped the scan: every rescan failed, a model added later was never loaded, and the
    index showed nothing wrong (found by a helper's fuzz of the config)."""
    touch(tmp_path / "deep.om")
    touch(tmp_path / "deep.yaml", b"instances: " + b"[" * 100_000 + b"]" * 100_000)
    touch(tmp_path / "digits.om")
    touch(tmp_path / "digits.yaml", b"instances: " + b"9" * 5000)
    touch(tmp_path / "added.om")
    result = scan(tmp_path, DEFAULTS)
    assert set(result.models) == {"added"}
    assert "nested too deeply" in result.problems["deep"]
    assert "Exceeds the limit (4300 digits)" in result.problems["digits"]


def test_ignored_names(tmp_path):
    for name in ("x.om.tmp", "x.om.part", ".hidden.om", "notes.txt", "y.pt"):
        touch(tmp_path / name)
    touch(tmp_path / ".cache" / "1" / "model.om")
    touch(tmp_path / "m" / "1" / "model.om.part")
    touch(tmp_path / "m" / ".2" / "model.om")
    result = scan(tmp_path, DEFAULTS)
    assert result.models == {}
    assert result.problems == {}


def test_a_version_folder_that_is_no_version_is_a_problem(tmp_path):
    touch(tmp_path / "m" / "v3" / "model.om")  # not an integer version
    touch(tmp_path / "m" / "0" / "model.om")  # versions are positive
    result = scan(tmp_path, DEFAULTS)
    assert result.models == {}
    assert "m/0 is not a version folder; m/v3 is not a version folder" in result.problems["m"]


def test_a_folder_named_like_a_model_file_is_named_in_a_note(tmp_path):
    """A folder `a.onnx` (an exporter's output folder, an unpacked archive) was read as an empty
    versioned model and passed over without a word; it is passed over still (an empty model
    folder is too), but said."""
    touch(tmp_path / "a.onnx" / "README.txt")
    (tmp_path / "b.om").mkdir()
    (tmp_path / "empty").mkdir()  # a model folder being filled
    touch(tmp_path / "c.onnx" / "1" / "model.om")  # a versioned model named c.onnx
    result = scan(tmp_path, DEFAULTS)
    assert set(result.models) == {"c.onnx"} and result.problems == {}
    assert [note.split("/")[0] for note in result.notes] == ["a.onnx", "b.om"]
    assert result.notes[1].startswith("b.om/ is a folder with no version folder in it, passed over")


def test_a_folder_named_like_a_models_settings_file_is_named_in_a_note(tmp_path):
    """A folder `q.yaml` beside `q.om` was passed over without a word, the model loading with the
    defaults (an independent check); it is named, as the other .yaml files no model reads are."""
    touch(tmp_path / "q.om")
    (tmp_path / "q.yaml").mkdir()
    touch(tmp_path / "r.yml" / "settings.yaml")
    result = scan(tmp_path, DEFAULTS)
    assert set(result.models) == {"q"} and result.problems == {}
    assert result.notes == [
        "q.yaml/ is a folder with no version folder in it, not read: a model's settings file q.yaml is a file "
        "(a versioned model's is q/config.yaml)",
        "r.yml/ is a folder with no version folder in it, not read: a model's settings file r.yml is a file "
        "(a versioned model's is r/config.yaml)"]


_EMPTY = "model names may not be empty, '.' or '..'"
_CHARACTERS = "model names use ASCII letters, digits, '_', '-', '.' (at most 128, not starting with '-' or '.')"


@pytest.mark.parametrize("name, reason", [
    ("", _EMPTY), (".", _EMPTY), ("..", _EMPTY),
    ("a/b", "model names may not contain path separators ('/', '\\')"),
    ("a\\b", "model names may not contain path separators ('/', '\\')"),
    ("a..b", "model names may not contain '..'"), (".x", "model names may not start with '.'"),
    ("-x", _CHARACTERS), ("x" * 200, _CHARACTERS), ("sp ace", _CHARACTERS)])
def test_invalid_model_names_are_refused(name, reason):
    assert check_model_name(name) == reason


@pytest.mark.parametrize("name", ["resnet50", "m_1", "a-b", "v1.2"])
def test_valid_model_names(name):
    assert check_model_name(name) is None


def test_invalid_name_on_disk_is_a_problem_not_a_model(tmp_path):
    touch(tmp_path / "bad name.om")
    result = scan(tmp_path, DEFAULTS)
    assert result.models == {}
    assert "bad name.om" in result.problems


def test_symlinks_escaping_the_repository_are_never_taken(tmp_path):
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    touch(outside / "evil.om")
    touch(outside / "1" / "model.om")
    repo.mkdir()
    os.symlink(outside / "evil.om", repo / "evil.om")
    os.symlink(outside, repo / "evildir")
    touch(repo / "v" / "1" / "model.om")
    os.symlink(outside / "1", repo / "v" / "2")
    touch(repo / "real.om")
    os.symlink(repo / "real.om", repo / "alias.om")  # inside: allowed
    result = scan(repo, DEFAULTS)
    assert set(result.models) == {"v", "real", "alias"}
    assert list(result.models["v"].available) == ["1"]
    assert "outside the repository" in result.problems["evil"]
    assert "outside the repository" in result.problems["evildir"]
    assert "outside the repository" in result.problems["v"]


def test_a_link_out_of_the_folder_says_it_is_not_followed(tmp_path):
    """KServe's storage initializer without its direct PVC mount (before 0.12, or turned off) fills
    /mnt/models with links into /mnt/pvc/...: the runtime was never ready and its log said only
    "digits.om resolves outside the repository" (a tester, t59). The reason now says that such a
    link is not followed and the folder must hold the files themselves."""
    models, pvc = tmp_path / "mnt" / "models", tmp_path / "mnt" / "pvc" / "kserve" / "digits"
    touch(pvc / "digits.om")
    models.mkdir(parents=True)
    os.symlink(pvc / "digits.om", models / "digits.om")
    result = scan(models, DEFAULTS)
    assert result.problems == {"digits": "digits.om resolves outside the repository (links out of the models folder "
                                         "are not followed: it must hold the files themselves)"}


def test_a_link_loop_or_a_link_to_nothing_is_named_so(tmp_path):
    os.symlink(tmp_path / "loop1.om", tmp_path / "loop2.om")
    os.symlink(tmp_path / "loop2.om", tmp_path / "loop1.om")
    os.symlink(tmp_path / "gone.om", tmp_path / "dangling.om")
    problems = scan(tmp_path, DEFAULTS).problems
    assert problems == {"loop1": "loop1.om is a symbolic link loop", "loop2": "loop2.om is a symbolic link loop",
                        "dangling": "dangling.om is a link to nothing"}


def test_a_config_file_that_is_a_link_loop_is_named_so(tmp_path):
    touch(tmp_path / "m.om")
    os.symlink(tmp_path / "m.yaml", tmp_path / "m.yaml")
    touch(tmp_path / "n.om")
    os.symlink(tmp_path / "gone.yaml", tmp_path / "n.yaml")
    problems = scan(tmp_path, DEFAULTS).problems
    assert "config file is a symbolic link loop" in problems["m"], problems
    assert "config file is a link to nothing" in problems["n"], problems


def test_config_files_and_errors(tmp_path):
    touch(tmp_path / "flat.om")
    (tmp_path / "flat.yaml").write_text("instances: 2\n")
    touch(tmp_path / "multi" / "1" / "model.om")
    touch(tmp_path / "multi" / "2" / "model.om")
    (tmp_path / "multi" / "config.yaml").write_text("version_policy: all\nslots: 3\n")
    touch(tmp_path / "broken.om")
    (tmp_path / "broken.yaml").write_text("batching: {max_queue_delay_ms: -1}\n")
    result = scan(tmp_path, DEFAULTS)
    assert result.models["flat"].config.instances == 2
    assert result.models["multi"].config.slots == 3
    assert result.models["multi"].selected == ("1", "2")
    assert "broken" not in result.models
    assert "batching.max_queue_delay_ms: must be >= 0" in result.problems["broken"]


def test_flat_and_folder_of_the_same_name_is_a_problem(tmp_path):
    touch(tmp_path / "dup.om")
    touch(tmp_path / "dup" / "1" / "model.om")
    result = scan(tmp_path, DEFAULTS)
    assert "dup" not in result.models and "dup" in result.problems


@pytest.mark.parametrize("policy, expected", [
    ({"latest": 1}, ("9",)), ({"latest": 2}, ("3", "9")), ({"latest": 10}, ("1", "3", "9")),
    ("all", ("1", "3", "9")), ({"specific": [1, 3, 7]}, ("1", "3")),
])
def test_version_policies(policy, expected):
    config = parse_model_config({"version_policy": policy})
    assert select_versions({"1": 0, "9": 0, "3": 0}, config.version_policy) == expected


def test_a_version_policy_that_selects_no_version_found_is_a_problem(tmp_path):
    """The model would serve nothing while strict readiness said ready (found by an independent
    check); Triton fails such a load."""
    touch(tmp_path / "flat.om")
    (tmp_path / "flat.yaml").write_text("version_policy: {specific: [2]}\n")
    touch(tmp_path / "multi" / "1" / "model.om")
    (tmp_path / "multi" / "config.yaml").write_text("version_policy: {specific: [2, 3]}\n")
    result = scan(tmp_path, DEFAULTS)
    assert not result.models
    assert result.problems["flat"] == "its version_policy {specific: [2]} selects none of the versions found (1)"
    assert "{specific: [2, 3]}" in result.problems["multi"]


def test_a_flat_models_own_specific_policy_naming_other_versions_is_said_model_defaults_not(tmp_path):
    """A flat m.om is version 1 alone: its own m.yaml's `{specific: [1, 2]}` served 1 without a word
    (the warning left out every flat model, meant to leave out model_defaults' policy only, which is
    for every model: found in review). Said for a flat model's own policy, as for a versioned one."""
    touch(tmp_path / "own.om")
    (tmp_path / "own.yaml").write_text("version_policy: {specific: [1, 2]}\n")
    touch(tmp_path / "inherits.om")
    (tmp_path / "inherits.yaml").write_text("instances: 1\n")
    touch(tmp_path / "bare.om")
    touch(tmp_path / "multi" / "1" / "model.om")
    result = scan(tmp_path, parse_model_config({"version_policy": {"specific": [1, 2]}}))
    assert set(result.models) == {"own", "inherits", "bare", "multi"}
    assert result.versions_not_found == {
        "own": "own: its version_policy {specific: [1, 2]} names version 2, which a flat model has not: own.om (or "
               ".onnx) is version 1 alone, other versions go in own/<version>/model.om: not served",
        "multi": "multi: its version_policy {specific: [1, 2]} names version 2, which has no model file (multi/2/): "
                 "not served"}


def test_missing_folder_is_a_problem(tmp_path):
    result = scan(tmp_path / "nope", DEFAULTS)
    assert result.problems == {str(tmp_path / "nope"): "the models folder does not exist"}
    assert result.models == {} and result.unreadable  # nothing known: what is served stays (planner.py)


# ---- diff ------------------------------------------------------------------------------------

def desired(tmp_path):
    """What the repository wants served from the folder, every file taken as complete."""
    return SettleGate(0.0).desired(scan(tmp_path, DEFAULTS), {}, trust="all")[0]


def unlistable(monkeypatch, folder) -> None:
    """Listing `folder` fails as it does for a user without read permission on it (the tests
    run as root, who reads everything)."""
    folder, listdir = folder.resolve(), type(folder).iterdir

    def iterdir(self):
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return listdir(self)
    monkeypatch.setattr(type(folder), "iterdir", iterdir)


def test_a_name_that_is_not_utf8_is_a_problem_shown_escaped(tmp_path):
    """os.listdir hands such bytes over as surrogates, which no UTF-8 encoder takes (the index,
    the logs and /metrics encode every problem): escaped as \\xNN once, in the scan."""
    touch(tmp_path / "ok.om")
    touch(tmp_path / os.fsdecode(b"bad\xffname.om"))
    os.mkdir(tmp_path / os.fsdecode(b"d\xfe"))
    result = scan(tmp_path, DEFAULTS)
    assert set(result.models) == {"ok"}
    assert set(result.problems) == {"bad\\xffname.om", "d\\xfe"}
    for key, reason in result.problems.items():
        (key + reason).encode("utf-8")


def test_a_model_folder_that_cannot_be_read_is_that_models_problem(tmp_path, monkeypatch):
    """As the server's user meets a folder without read permission (the tests run as root, who
    reads everything, so listing it fails here by hand): the model is a problem naming the folder
    inside the repository, and the other models are scanned as ever."""
    touch(tmp_path / "ok.om")
    touch(tmp_path / "vm" / "1" / "model.om")
    # no model.om to stat in it, as for the server's user, who may not stat anything there either
    unlistable(monkeypatch, touch(tmp_path / "vm" / "2" / "weights.bin").parent)
    result = scan(tmp_path, DEFAULTS)
    assert set(result.models) == {"ok"}
    assert result.problems == {"vm": "vm/2 cannot be read (Permission denied)"}


def test_a_models_folder_that_cannot_be_read_changes_nothing(tmp_path, monkeypatch):
    touch(tmp_path / "ok.om")
    unlistable(monkeypatch, tmp_path)
    result = scan(tmp_path, DEFAULTS)
    assert result.unreadable and not result.models
    assert result.problems == {str(tmp_path): "the models folder cannot be read (Permission denied)"}
    # what serves stays: no plan unloads it, nor while the folder is missing (moved away for a
    # moment, a volume not mounted yet: an independent tester's find, every model unloaded and
    # loaded again); an empty folder at its path, by contrast, unloads its models
    acted = {"ok": {"1": object()}}
    planner = Planner(tmp_path, DEFAULTS, SettleGate(0.0), unload_missing=True)
    planner.scan = result
    assert planner.plans(acted, "all", frozenset(), set()) == []
    planner.scan = scan(tmp_path / "nope", DEFAULTS)
    assert planner.scan.unreadable and planner.plans(acted, "all", frozenset(), set()) == []
    planner.scan = scan(touch(tmp_path / "empty" / "x.tmp").parent, DEFAULTS)
    assert [plan.name for plan in planner.plans(acted, "all", frozenset(), set())] == ["ok"]


def test_diff_new_changed_deleted(tmp_path):
    touch(tmp_path / "a.om")
    touch(tmp_path / "b.om")
    first = desired(tmp_path)
    plans = diff({}, first)
    assert [(p.name, list(p.load), p.unload) for p in plans] == [("a", ["1"], []), ("b", ["1"], [])]
    assert diff(first, desired(tmp_path)) == []  # nothing changed

    touch(tmp_path / "a.om", b"new content")  # size changes -> identity changes
    (tmp_path / "b.om").unlink()
    touch(tmp_path / "c.om")
    plans = {p.name: p for p in diff(first, desired(tmp_path))}
    assert list(plans["a"].load) == ["1"] and plans["a"].unload == []
    assert plans["b"].unload == ["1"] and not plans["b"].load
    assert list(plans["c"].load) == ["1"]

    kept = {p.name for p in diff(first, desired(tmp_path), unload_missing=False)}
    assert kept == {"a", "c"}


def test_diff_new_version_pushes_out_old_under_latest_1(tmp_path):
    touch(tmp_path / "m" / "1" / "model.om")
    first = desired(tmp_path)
    touch(tmp_path / "m" / "2" / "model.om")
    (plan,) = diff(first, desired(tmp_path))
    assert list(plan.load) == ["2"] and plan.unload == ["1"]
    carried_out = {v: w for v, w in first["m"].items() if v not in plan.unload} | plan.load
    assert carried_out == desired(tmp_path)["m"]


def test_diff_config_change_reloads(tmp_path):
    touch(tmp_path / "m.om")
    first = desired(tmp_path)
    (tmp_path / "m.yaml").write_text("slots: 4\n")
    (plan,) = diff(first, desired(tmp_path))
    assert list(plan.load) == ["1"] and plan.load["1"].config.slots == 4


def test_diff_a_version_policy_change_loads_and_unloads_only_the_difference(tmp_path):
    for v in (1, 2, 3):
        touch(tmp_path / "m" / str(v) / "model.om")
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {latest: 2}\n")
    first = desired(tmp_path)
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {specific: [1, 3]}\n")
    (plan,) = diff(first, desired(tmp_path))
    assert list(plan.load) == ["1"] and plan.unload == ["2"] and list(plan.keep) == ["3"]
    assert plan.keep["3"].config.version_policy == ("specific", (1, 3))
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {specific: [1, 3]}\nslots: 4\n")
    (plan,) = diff(first, desired(tmp_path))  # another setting changed with it: a reload, as ever
    assert list(plan.load) == ["1", "3"] and plan.unload == ["2"] and not plan.keep


def test_a_config_file_the_scan_does_not_read_gets_a_note(tmp_path):
    """These were ignored without a word: a misspelt name, a versioned model's settings beside its
    folder instead of in it, a .yml beside the .yaml, a Triton model folder's config.pbtxt beside
    its config.yaml (which wins), a suffix in capitals (the model was not served)."""
    touch(tmp_path / "digits.om")
    touch(tmp_path / "t" / "1" / "model.om")
    (tmp_path / "t" / "config.pbtxt").write_text("max_batch_size: 1\n")
    (tmp_path / "t" / "config.yaml").write_text("instances: 2\n")
    (tmp_path / "digit.yaml").write_text("instances: 2\n")
    (tmp_path / "digits.yaml").write_text("instances: 3\n")
    (tmp_path / "digits.yml").write_text("instances: 2\n")
    touch(tmp_path / "v" / "1" / "model.om")
    (tmp_path / "v.yaml").write_text("instances: 2\n")
    touch(tmp_path / "Upper.ONNX")
    (tmp_path / "digits.YAML").write_text("instances: 2\n")
    (tmp_path / "v" / "config.YAML").write_text("instances: 2\n")
    touch(tmp_path / "w" / "1" / "MODEL.OM")  # (w alone: its only version not read)
    touch(tmp_path / "w" / "Model.OM")  # beside the version folders: misplaced (a third review)
    touch(tmp_path / "x" / "1" / "model.OM")
    (tmp_path / "v" / "notes.YAML").write_text("")  # named unread, but not told to become config.yaml
    touch(tmp_path / "w" / "1" / ".model.OM")  # (a hidden name: passed over, as everywhere)
    result = scan(tmp_path, DEFAULTS)
    assert result.problems == {"w": "w/1/MODEL.OM is not named model.om or model.onnx; w/Model.OM is not a version "
                                    "folder (a versioned model's file goes in w/<version>/model.om, <version> a "
                                    "positive integer such as 1)",
                               "x": "x/1/model.OM not read: file suffixes are lower case (rename it model.om) (a "
                                    "versioned model's file goes in x/<version>/model.om, <version> a positive "
                                    "integer such as 1)"}
    del result.problems["w"], result.problems["x"]
    assert sorted(result.notes) == [
        "Upper.ONNX not read: file suffixes are lower case (rename it Upper.onnx)",
        "digit.yaml configures no model: there is no digit.om or digit.onnx beside it",
        "digits.YAML not read: file suffixes are lower case (rename it digits.yaml)",
        "digits.yaml is read; digits.yml beside it is ignored",
        "t/config.pbtxt not read: t/config.yaml beside it is (a model's settings come from one file)",
        "v.yaml not read: a versioned model's settings go in v/config.yaml",
        "v/config.YAML not read: file suffixes are lower case (rename it config.yaml)",
        "v/notes.YAML not read: a versioned model's settings go in v/config.yaml"]
    assert sorted(result.models) == ["digits", "t", "v"] and not result.problems


def test_compile_in_the_config_of_an_om_is_said_to_be_ignored(tmp_path):
    """An .om is not compiled here: its own config's `compile:` was passed over in silence. Not
    said for an .onnx, nor for the defaults' compile (meant for the folder's .onnx files)."""
    for model in ("flat.om", "source.onnx", "v/2/model.om"):
        touch(tmp_path / model)
    touch(tmp_path / "v" / "1" / "model.onnx")
    touch(tmp_path / "plain.om")  # no config of its own: the defaults' compile
    for config in ("flat.yaml", "source.yaml", "v/config.yaml"):
        (tmp_path / config).write_text("compile: {batch: [1, 8]}\nversion_policy: all\n")
    defaults = parse_model_config({"compile": {"batch": [1, 4]}})
    result = scan(tmp_path, defaults)
    assert sorted(result.models) == ["flat", "plain", "source", "v"] and not result.problems
    ignored = ("an .om was compiled already (its batch sizes were fixed by ATC); compile applies to an .onnx the "
               "server compiles")
    assert sorted(result.notes) == [f"flat.yaml: compile is ignored for flat.om: {ignored}",
                                    f"v/config.yaml: compile is ignored for v/2/model.om: {ignored}"]


def test_a_models_folder_listed_but_not_searched_cannot_be_read(tmp_path, monkeypatch):
    """`chmod 644 models`: the folder lists, but nothing in it can be looked at (no search
    permission); the scan raised on its first entry, a traceback in the log every rescan while
    what it served went on unremarked (found by running the server so). It is a folder that
    cannot be read now: said once, what serves stays."""
    touch(tmp_path / "ok.om")
    folder, stat = tmp_path.resolve(), type(tmp_path).stat

    def unsearchable(self, *args, **kwargs):  # (as a user without search permission: the tests run as root)
        if self.parent == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return stat(self, *args, **kwargs)
    monkeypatch.setattr(type(tmp_path), "stat", unsearchable)
    result = scan(tmp_path, DEFAULTS)
    assert result.unreadable and not result.models
    assert result.problems == {str(tmp_path): "the models folder cannot be read (Permission denied)"}


def test_a_models_folder_under_one_that_cannot_be_searched_cannot_be_read(tmp_path, monkeypatch):
    """`chmod 000` on the folder above: Path.is_dir raises (EACCES), not False, and the scan
    raised, which also stopped the safety rescan (found by running the server so)."""
    models = tmp_path / "m"
    models.mkdir()
    is_dir = type(models).is_dir

    def unsearchable(self):
        if self == models:
            raise PermissionError(13, "Permission denied", str(self))
        return is_dir(self)
    monkeypatch.setattr(type(models), "is_dir", unsearchable)
    result = scan(models, DEFAULTS)
    assert result.unreadable and result.problems == {str(models): "the models folder cannot be read (Permission denied)"}


def test_a_labels_file_model_defaults_names_is_the_same_file_for_every_model(tmp_path, monkeypatch):
    """model_defaults' `outputs: {y: {labels: labels.txt}}` was the working directory's file for a
    model without a config and its config's folder's for one with (a.om failed, b.om loaded: an
    operator's audit). Relative to the working directory, as every path of the server config;
    a labels file a model's own config names is relative to that config."""
    monkeypatch.chdir(tmp_path)
    models = tmp_path / "models"
    touch(tmp_path / "labels.txt", b"zero\none\n")
    for name in ("a.om", "b.om", "c.om"):
        touch(models / name)
    touch(models / "b.yaml", b"instances: 1\n")
    touch(models / "c.yaml", b"outputs: {y: {labels: c_labels.txt}}\n")
    touch(models / "c_labels.txt", b"zero\none\n")
    defaults = parse_model_config({"outputs": {"y": {"labels": "labels.txt"}}})
    result = scan(models, defaults)
    assert result.problems == {}
    labels = {name: entry.config.outputs["y"].labels for name, entry in result.models.items()}
    assert labels == {"a": "labels.txt", "b": "labels.txt", "c": str(models.resolve() / "c_labels.txt")}


def test_levels_model_defaults_gives_past_a_models_own_are_left_out_with_a_note(tmp_path):
    """A model's `priority_levels: 1` was refused for model_defaults' level 2, a key not in its file."""
    touch(tmp_path / "m.om")
    touch(tmp_path / "m.yaml", b"batching: {priority_levels: 1}\n")
    defaults = parse_model_config({"batching": {"priority_queue_policy": {2: {"max_queue_size": 100}}}})
    result = scan(tmp_path, defaults)
    assert result.problems == {} and result.models["m"].config.batching.priority_queue_policy == {}
    assert result.notes == ["m.yaml: model_defaults' batching.priority_queue_policy level 2 left out: "
                            "the model has 1 priority level"]


def test_a_bug_of_the_scan_is_logged_with_its_traceback_once_while_it_lasts(tmp_path, monkeypatch, caplog):
    """An unexpected exception scanning one model's files was logged with its traceback at every
    rescan (every few seconds in poll mode), forever. Now once at ERROR, again only when the
    failure changes or after the model scanned fine; the repeats at DEBUG. The scan puts it on its
    result and the Planner says it, once per repository: two on one folder each say it (a record
    kept by the scan for the whole process said it in one repository's log only)."""
    touch(tmp_path / "ok.om")
    touch(tmp_path / "bad.om")
    failure = {"error": RuntimeError("boom")}
    real_pick = layout._pick

    def pick(root, folder, stem, result, name):
        if name == "bad" and failure["error"] is not None:
            raise failure["error"]
        return real_pick(root, folder, stem, result, name)

    monkeypatch.setattr(layout, "_pick", pick)
    caplog.set_level(logging.DEBUG, logger="aclserve.repository")
    planner = Planner(tmp_path, DEFAULTS, SettleGate(0.0), unload_missing=True)

    def errors_after_scans(times, planners=(planner,)):
        caplog.clear()
        for _ in range(times):
            for each in planners:
                each.scan = scan(tmp_path, DEFAULTS)
                assert "ok" in each.scan.models
                each.plans({}, "all", frozenset(), set())
        said = [r for r in caplog.records if "scanning its files failed" in r.getMessage()]
        assert all((r.exc_text or "").startswith("Traceback") for r in said), caplog.text  # the traceback even at DEBUG
        return sum(r.levelno >= logging.ERROR for r in said), len(said)

    assert errors_after_scans(3) == (1, 3)  # the repeats at DEBUG
    assert scan(tmp_path, DEFAULTS).problems["bad"].startswith("its files could not be scanned")
    failure["error"] = RuntimeError("another boom")  # another failure: said again
    assert errors_after_scans(2) == (1, 2)
    failure["error"] = None  # scanned fine, then the same failure again: said again
    assert errors_after_scans(1) == (0, 0)
    failure["error"] = RuntimeError("another boom")
    assert errors_after_scans(2) == (1, 2)
    other = Planner(tmp_path, DEFAULTS, SettleGate(0.0), unload_missing=True)  # another repository, same folder
    assert errors_after_scans(2, (planner, other)) == (1, 4)  # said in its log too, once


def test_a_bug_of_the_scan_is_kept_as_text_and_its_result_freed_with_its_last_reference(tmp_path, monkeypatch):
    """The scan's result kept the exception a bug raised, whose traceback held the scan's frames,
    the result among them: a cycle that kept every frame of the scan alive until the cycle
    collector ran, for as long as the planner kept the scan. It keeps the failure as text."""
    touch(tmp_path / "bad.om")

    def pick(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(layout, "_pick", pick)
    gc.disable()  # (freed by its last reference going, not by a collection)
    try:
        result = scan(tmp_path, DEFAULTS)
        failure = result.errors["bad"]
        assert failure.what == "RuntimeError: boom"
        assert failure.traceback.startswith("Traceback") and failure.traceback.endswith("RuntimeError: boom")
        freed = weakref.ref(result)
        del result
        assert freed() is None
    finally:
        gc.enable()


def test_a_scan_failure_kept_as_text_is_logged_with_its_traceback_in_either_log_format(tmp_path, monkeypatch):
    """The line the planner logs from the text, as it was from the exception: the message, then
    the traceback (text format), or the traceback as the JSON line's "exc"."""
    touch(tmp_path / "bad.om")

    def pick(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(layout, "_pick", pick)
    failure = scan(tmp_path, DEFAULTS).errors["bad"]
    records = []
    logger = logging.getLogger("tests.scan_failure")
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        failure.log(logger, logging.ERROR, "model %s: scanning its files failed", "bad")
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert TextFormatter("%(message)s").format(record) == "model bad: scanning its files failed\n" + failure.traceback
    assert json.loads(JsonFormatter().format(record))["exc"] == failure.traceback


def test_a_yaml_file_in_a_versioned_models_folders_that_no_model_reads_gets_a_note(tmp_path):
    """config.yml, Config.yaml, model.yaml beside the version folders and a config.yaml inside one
    were passed over without a word, the model served with the defaults (a configuration tester's
    finding). The files the model reads are not named: its config.yaml, a labels file it names
    (one in a version folder too), nor anything in a folder whose model does not serve."""
    for model in ("a", "b", "c", "d", "e"):
        touch(tmp_path / model / "1" / "model.om")
    (tmp_path / "a" / "config.yml").write_text("instances: 3\n")
    (tmp_path / "b" / "Config.yaml").write_text("instances: 3\n")
    (tmp_path / "b" / "model.yaml").write_text("instances: 3\n")
    (tmp_path / "c" / "1" / "config.yaml").write_text("instances: 3\n")
    (tmp_path / "d" / "config.yaml").write_text("outputs: {y: {labels: 1/labels.yaml}}\n")
    (tmp_path / "d" / "1" / "labels.yaml").write_text("zero\none\n")
    (tmp_path / "d" / "config.yml").write_text("instances: 3\n")
    (tmp_path / "d" / "notes.yaml").write_text("")
    (tmp_path / "e" / "config.pbtxt").write_text("max_batch_size: 1\ndynamic_batching { }\n")
    (tmp_path / "e" / "config.YAML").write_text("instances: 3\n")
    (tmp_path / "e" / ".config.yml").write_text("")  # (a hidden name: passed over, as everywhere)
    touch(tmp_path / "f" / "2" / "weights.bin")
    (tmp_path / "f" / "config.yml").write_text("instances: 3\n")  # (f serves nothing: its problem says why)
    result = scan(tmp_path, DEFAULTS)
    assert sorted(result.models) == ["a", "b", "c", "d", "e"] and list(result.problems) == ["f"]
    assert sorted(result.notes) == [
        "a/config.yml not read: a versioned model's settings file is config.yaml (rename it config.yaml)",
        "b/Config.yaml not read: file names are matched as written (rename it config.yaml)",
        "b/model.yaml not read: a versioned model's settings go in b/config.yaml",
        "c/1/config.yaml not read: a versioned model's settings go in c/config.yaml, beside its version folders",
        "d/config.yml not read: d/config.yaml beside it is (a model's settings come from one file)",
        "d/notes.yaml not read: d/config.yaml is the model's settings file",
        "e/config.YAML not read: file suffixes are lower case (rename it config.yaml)"]
