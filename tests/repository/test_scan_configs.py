"""The scan reads each model's settings: config files and their errors, version policies, labels
files, the levels model_defaults gives; a settings file no model reads, or a compile an .om
ignores, gets a note."""
from __future__ import annotations

import pytest

from aclserve.config import ModelConfig, parse_model_config
from aclserve.repository.layout import scan, select_versions

from .repo_helpers import touch


DEFAULTS = ModelConfig()


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
