"""The pure scan on temporary folders: layouts, ignored and invalid names, symlinks, folders that
cannot be read."""
from __future__ import annotations

import os

import pytest

from aclserve.config import ModelConfig
from aclserve.repository.layout import check_model_name, scan
from aclserve.repository.planner import Planner
from aclserve.repository.settle import SettleGate

from .repo_helpers import touch, unlistable


DEFAULTS = ModelConfig()


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


def test_flat_and_folder_of_the_same_name_is_a_problem(tmp_path):
    touch(tmp_path / "dup.om")
    touch(tmp_path / "dup" / "1" / "model.om")
    result = scan(tmp_path, DEFAULTS)
    assert "dup" not in result.models and "dup" in result.problems


def test_missing_folder_is_a_problem(tmp_path):
    result = scan(tmp_path / "nope", DEFAULTS)
    assert result.problems == {str(tmp_path / "nope"): "the models folder does not exist"}
    assert result.models == {} and result.unreadable  # nothing known: what is served stays (planner.py)


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
