"""Files the models folder's scan passes over (and an .om's `compile:` settings, a version_policy's
versions that are not there), said in notes: each was ignored without a word once, and left the
defaults in force or a model (or version) unserved."""
from __future__ import annotations

import os
from pathlib import Path

from ..config import PBTXT
from ..quoting import listed_names
from .models_folder import OUTSIDE, resolved_inside
from .names import is_ignored_name

_SHOWN = 3  # entries named per version folder, and version folders, in a reason


def config_notes(name: str, parts: dict, model_suffixes: tuple[str, ...]) -> list[str]:
    """A <name>.yaml/.yml the scan never reads: a typo in its name, a versioned model's settings
    put beside its folder, a .yml beside the .yaml. `parts`: the scan's kinds of files named so
    (a suffix, or "dir")."""
    configs = [f"{name}{k}" for k in (".yaml", ".yml") if k in parts]
    if not configs:
        return []
    if "dir" in parts:
        return [f"{' and '.join(configs)} not read: a versioned model's settings go in {name}/config.yaml"]
    if not any(k in parts for k in model_suffixes):
        return [f"{configs[0]} configures no model: there is no {name}.om or {name}.onnx beside it"]
    if len(configs) == 2:
        return [f"{configs[0]} is read; {configs[1]} beside it is ignored"]
    return []


def file_named_folder_note(name: str, model_suffixes: tuple[str, ...]) -> list[str]:
    """A folder with no version folder in it named like a model file (an exporter's output folder,
    an unpacked archive: `a.onnx/`) or a model's settings file (`a.yaml/`, the model then loading
    with the defaults): passed over as a model folder with nothing in it yet is, said here."""
    stem, suffix = os.path.splitext(name)
    if suffix in model_suffixes:
        return [f"{name}/ is a folder with no version folder in it, passed over: a model file {name} is a file, "
                f"and a versioned model's folder holds <version>/model.om or <version>/model.onnx"]
    if suffix in (".yaml", ".yml"):
        return [f"{name}/ is a folder with no version folder in it, not read: a model's settings file {name} "
                f"is a file (a versioned model's is {stem}/config.yaml)"]
    return []


def no_model_file(name: str, version_folders: list[Path], root: Path) -> str:
    """Why a model folder with a config or a version folder serves nothing, naming what its version
    folders hold (a Triton ensemble's empty 1/, a model.plan, a model.py): such a folder vanished
    from the index without a word (Triton refuses it: "at least one version must be available").
    "" while a model file is being written under a hidden or temporary name (`model.onnx.part`,
    rsync's `.model.onnx.X1b2c3`): the model is coming, as one with its file still settling is."""
    if any(is_ignored_name(e.name) and (".om" in e.name or ".onnx" in e.name)
           for folder in version_folders for e in _inside_entries(folder, root) or ()):
        return ""
    if not version_folders:
        return (f"no version folder: a versioned model's file goes in {name}/<version>/model.om or model.onnx, "
                "<version> a positive integer such as 1")
    held = []
    for folder in version_folders[:_SHOWN]:
        where = folder.relative_to(root)
        if (entries := _inside_entries(folder, root)) is None:  # (_pick said so where a model file was named)
            held.append(f"{where}/ {OUTSIDE}")
            continue
        names = sorted(e.name + ("/" if e.is_dir() else "") for e in entries if not is_ignored_name(e.name))
        held.append(f"{where}/ holds {listed_names(names, _SHOWN)}" if names
                    else f"{where}/ holds only hidden or temporary names" if entries else f"{where}/ is empty")
    more = f"; {len(version_folders) - _SHOWN} more version folders" if len(version_folders) > _SHOWN else ""
    return f"no version folder holds model.om or model.onnx ({'; '.join(held)}{more})"


def _inside_entries(folder: Path, root: Path) -> list[Path] | None:
    """What `folder` holds, None when it resolves outside the repository (not listed)."""
    real = resolved_inside(root, folder)
    return None if real is None else list(real.iterdir())


def capitals_note(path: Path, root: Path, known: tuple[str, ...], stem: str | None = None) -> list[str]:
    """A file whose suffix is one of `known` in capitals (Model.ONNX, config.YAML): suffixes are
    matched as written, as Triton's file names are. `stem`: the name it must have there (model
    in a version folder, config in a model's folder), else its own."""
    own, suffix = os.path.splitext(path.name)
    if suffix in known or suffix.lower() not in known:
        return []
    return [f"{path.relative_to(root)} not read: file suffixes are lower case (rename it "
            f"{stem or own}{suffix.lower()})"]


def model_folder_notes(name: str, folder: Path, version_folders: list[Path], root: Path, read: set[str]) -> list[str]:
    """Each .yaml/.yml in a versioned model's folder or its version folders that it does not read
    (`config.yml`, `Config.yaml`, `model.yaml`, `1/config.yaml`: the model served with the defaults
    without a word). `read`: the files it reads (its config file, the labels files it names)."""
    read = {os.path.realpath(path) for path in read}
    has_config = os.path.realpath(folder / "config.yaml") in read
    notes = []
    for where in [folder, *version_folders]:
        if resolved_inside(root, where) is None:  # (a version folder resolving outside: _pick said so)
            continue
        for path in sorted(where.iterdir()):
            if (is_ignored_name(path.name) or os.path.splitext(path.name)[1].lower() not in (".yaml", ".yml")
                    or path.is_dir() or os.path.realpath(path) in read):
                continue
            why = (f"a versioned model's settings go in {name}/config.yaml, beside its version folders"
                   if where != folder else _unread_in_model_folder(path.name, name, has_config))
            notes.append(f"{path.relative_to(root)} not read: {why}")
    return notes


def _unread_in_model_folder(file: str, name: str, has_config: bool) -> str:
    """Why the .yaml/.yml `file` in the model `name`'s folder is not read, with a hint."""
    stem, suffix = os.path.splitext(file)
    if stem.lower() != "config":  # (model.yaml, name.yaml, notes.yaml: not told to become config.yaml)
        return (f"{name}/config.yaml is the model's settings file" if has_config
                else f"a versioned model's settings go in {name}/config.yaml")
    if has_config:
        return f"{name}/config.yaml beside it is (a model's settings come from one file)"
    if suffix.lower() == ".yml":
        return "a versioned model's settings file is config.yaml (rename it config.yaml)"
    if stem == "config":
        return "file suffixes are lower case (rename it config.yaml)"
    return "file names are matched as written (rename it config.yaml)"


def compile_note(config_path: Path, served: list[str], root: Path, preferred: tuple[int, ...] = ()) -> list[str]:
    """`compile:` in the config of a model served from an .om, which the server does not compile:
    its batch sizes and shapes were fixed when ATC built it (the settings were passed over in
    silence). `served`: the model files of the versions served. A config.pbtxt sets no compile:,
    but its `preferred` batch sizes, compiled into an .onnx's, are passed over for an .om."""
    oms = [os.path.relpath(path, root) for path in served if path.endswith(".om")]
    if not oms:
        return []
    if config_path.name == PBTXT:
        return [f"{config_path.relative_to(root)}: dynamic_batching.preferred_batch_size {list(preferred)} passed "
                f"over for {', '.join(oms)}: an .om's batch sizes were fixed by ATC; batches form at them, which "
                "/config lists as preferred_batch_size"] if preferred else []
    return [f"{config_path.relative_to(root)}: compile is ignored for {', '.join(oms)}: an .om was compiled "
            f"already (its batch sizes were fixed by ATC); compile applies to an .onnx the server compiles"]


def policy_text(policy: tuple) -> str:
    """A version policy as its YAML reads: all, {latest: N}, {specific: [...]}."""
    kind = policy[0]
    if kind == "all":
        return "all"
    return f"{{{kind}: {list(policy[1]) if kind == 'specific' else policy[1]}}}"


def versions_not_found(name: str, policy: tuple, available, flat: bool = False) -> str:
    """The versions a model's `specific` version_policy names that no version folder of it holds
    a model file for, said (Triton logs them as errors; they were served without a word, the
    others serving); "" when none is missing. `flat`: a <name>.om (or .onnx), version 1 alone."""
    if policy[0] != "specific":
        return ""
    missing = [str(v) for v in policy[1] if str(v) not in available]
    if not missing:
        return ""
    many = len(missing) > 1
    named = f"its version_policy {policy_text(policy)} names version{'s' * many} {', '.join(missing)}"
    if flat:
        return (f"{name}: {named}, which a flat model has not: {name}.om (or .onnx) is version 1 alone, other "
                f"versions go in {name}/<version>/model.om: not served")
    return (f"{name}: {named}, which {'have' if many else 'has'} no model file "
            f"({', '.join(f'{name}/{v}/' for v in missing)}): not served")
