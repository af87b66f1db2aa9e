"""Reading the models folder: a pure scan that returns the desired state, nothing loaded.

Layouts (anything else is ignored, with a problem recorded for the index when it looks like an
attempted model):

    <root>/<name>.om                    version "1"
    <root>/<name>.onnx                  version "1", compiled on load (an .om of the same name wins)
    <root>/<name>.yaml                  config of the flat model <name>
    <root>/<name>/<version>/model.om    versioned; <version> a positive integer
    <root>/<name>/<version>/model.onnx  compiled on load (model.om in the same folder wins); a folder
                                        model.onnx/ holding model.onnx and its external data is
                                        Triton's layout of it, read so too
    <root>/<name>/config.yaml           config of the versioned model <name>
    <root>/<name>/config.pbtxt          a Triton config of it, read when there is no config.yaml
                                        (config/triton_config.py)

Hidden names (`.*`) and temporary names (`*.tmp`, `*.part`) are skipped everywhere. Symlinks
are followed only when they resolve inside the repository; anything resolving outside is
refused. A model's config that fails to parse (or is over config.MAX_CONFIG_BYTES; each parsed
once while unchanged: config_reads.py) makes the model a problem (not loadable) with the
ConfigError text as reason; so does a model folder with a config or a version folder but
no model file in a version folder (its config read first: a Triton ensemble's or TensorRT
model's refusal names the field that is why). A version folder holding only the model file a
config.pbtxt's default_model_filename does not name is that version's failed load, not the
model's problem (VersionFile.refused): its other versions serve. A FIFO, socket or device node
(or a symlink to one) where a model file, config, labels file or version folder belongs is a
problem too, found by stat and never opened: opening a FIFO for reading would hold the scan
until someone writes to it.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..config import MAX_VERSION_DIGITS, PBTXT, ConfigError, ModelConfig, model_file_named
from ..regular_files import node_kind, stat_identity
from . import batch_gaps, external_data, unread
from .config_reads import ConfigReads
from .models_folder import OUTSIDE, folder_entries, not_inside, resolved_inside
from .names import check_model_name, escape_undecodable, is_ignored_name
from .scan_failure import ScanFailure

MODEL_SUFFIXES = (".om", ".onnx")  # order = preference when both exist
KNOWN_SUFFIXES = MODEL_SUFFIXES + (".yaml", ".yml")
# fullmatch: a folder "2\n" is no version (int() read it as 2)
_VERSION_RE = re.compile(rf"[1-9][0-9]{{0,{MAX_VERSION_DIGITS - 1}}}")


@dataclass(frozen=True)
class VersionFile:
    """One version's model file as found on disk; its identity changes whenever its content may
    have (size, mtime, ctime and inode: regular_files.stat_identity says why all four)."""

    path: str  # absolute, resolved inside the repository
    kind: str  # "om" | "onnx"
    size: int
    mtime_ns: int
    ctime_ns: int = 0
    inode: int = 0
    # the same of the model's config file and labels files: a version is the file served with
    # them, so editing (or touching) one reloads it, and a fixed config is tried again after a
    # load it made fail
    config_stamp: tuple = ()
    data_stamp: tuple = ()  # the same of an .onnx's external data files (external_data.py)
    # why the scan found it is not to be served (a config.pbtxt's default_model_filename names a
    # file its version folder has not): its version's load fails saying so (loader.py), the others serve
    refused: str = ""

    @property
    def model_identity(self) -> tuple:
        """The model file's own (its external data's with it), without its config and labels files'."""
        return (self.path, self.size, self.mtime_ns, self.ctime_ns, self.inode) + self.data_stamp

    @property
    def identity(self) -> tuple:
        return self.model_identity + self.config_stamp


@dataclass(frozen=True)
class ModelEntry:
    """A model on disk: every version file found, the ones its version policy selects, its config."""

    config: ModelConfig
    available: dict[str, VersionFile]  # version -> file, everything found
    selected: tuple[str, ...]  # versions the policy asks to serve, ascending


@dataclass
class ScanResult:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # model name (or path) -> reason
    notes: list[str] = field(default_factory=list)  # worth a log line, not a problem
    # model name -> the versions whose files were found, a model with a problem included (its
    # files listed before its config was read; absent when even they could not be)
    versions_found: dict[str, set[str]] = field(default_factory=dict)
    # model name -> (its config file, the problem) for problems found reading that file: one
    # still being written is not yet a problem (planner.Planner holds it back until it rests)
    config_problems: dict[str, tuple[str, str]] = field(default_factory=dict)
    selects_none: set[str] = field(default_factory=set)  # models whose version policy selects no version found
    # model name -> the versions its version policy names that are not there, said (a WARNING once per config read)
    versions_not_found: dict[str, str] = field(default_factory=dict)
    # model name -> what a bug of the scan raised on its files (a problem too): planner.Planner logs its traceback
    errors: dict[str, ScanFailure] = field(default_factory=dict)
    unreadable: bool = False  # the folder itself is missing or could not be listed: nothing is known of it


def version_sort_key(version: str) -> int:
    return int(version)


def select_versions(available, policy: tuple) -> tuple[str, ...]:
    versions = sorted(available, key=version_sort_key)
    kind = policy[0]
    if kind == "all":
        return tuple(versions)
    if kind == "latest":
        return tuple(versions[-policy[1]:]) if versions else ()
    wanted = {str(v) for v in policy[1]}
    return tuple(v for v in versions if v in wanted)


def _version_file(root: Path, path: Path, kind: str) -> VersionFile | str | None:
    """The file at `path`, why it cannot be one (outside, a FIFO...), or None when it is gone.
    Only stats: a FIFO, socket or device node is never opened."""
    real = resolved_inside(root, path)
    if real is None:
        return not_inside(path)
    try:
        st = real.stat()
    except OSError:
        return None  # removed since it was listed
    special = node_kind(st.st_mode)
    if special is not None:
        return f"is {special}, not a regular file"
    data = external_data.stamp(str(real)) if kind == "onnx" else ()
    return VersionFile(str(real), kind, *stat_identity(st), data_stamp=data)


def _pick(root: Path, folder: Path, stem: str, result: "ScanResult", key: str, named: str = "") -> VersionFile | None:
    """The preferred model file `<folder>/<stem>.om|.onnx` (the .om when both are there), or None;
    only the one `named` (a config.pbtxt's default_model_filename: Triton loads that file alone),
    or, when the folder has the other one only, that one `refused`."""
    suffixes = (os.path.splitext(named)[1],) if named else MODEL_SUFFIXES
    for suffix in suffixes:
        candidate = folder / f"{stem}{suffix}"
        if not os.path.lexists(candidate):
            continue
        if suffix == ".onnx" and folder != root and candidate.is_dir():
            # Triton's layout of an ONNX model with external data: <version>/model.onnx/model.onnx, its
            # data files beside it (external_data.py finds them there; the inner file is checked as any)
            candidate = candidate / candidate.name
            if not os.path.lexists(candidate):
                result.problems[key] = (f"{candidate.parent.relative_to(root)} is a folder without "
                                        f"{candidate.name} in it (Triton's layout of an ONNX model with "
                                        f"external data: {candidate.relative_to(root)}, its data files beside it)")
                continue
        found = _version_file(root, candidate, suffix[1:])
        if not isinstance(found, VersionFile):
            if found is not None:
                result.problems[key] = f"{candidate.relative_to(root)} {found}"
            continue
        others = [folder / f"{stem}{s}" for s in MODEL_SUFFIXES if s != suffix]
        shadowed = [o for o in others if os.path.lexists(o)]
        if shadowed and (named or suffix == MODEL_SUFFIXES[0]):
            why = f"{PBTXT}'s default_model_filename names it" if named else \
                "an .om wins over an .onnx of the same name"
            result.notes.append(f"{candidate.relative_to(root)} is served; {shadowed[0].relative_to(root)} "
                                f"beside it is ignored ({why})")
        return found
    other = [folder / f"{stem}{s}" for s in MODEL_SUFFIXES if s not in suffixes][0] if named else None
    if other is not None and os.path.lexists(other) and not os.path.lexists(folder / named):
        why = (f"{other.relative_to(root)} is not served: {PBTXT}'s default_model_filename names {named}, which "
               f"{folder.relative_to(root)} has not (Triton loads only the file it names)")
        found = _version_file(root, other, other.suffix[1:])
        if isinstance(found, VersionFile):  # that version fails to load, saying why; the others serve
            return dataclasses.replace(found, refused=why)
        result.problems[key] = why  # (not even a regular file inside the repository: the model's problem)
    return None


def _model_files(path: Path) -> list[Path]:
    """Model files at `path` itself or directly in it (where a version was probably meant), a
    suffix in capitals too (Model.OM: misplaced all the same)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix.lower() in MODEL_SUFFIXES and not is_ignored_name(p.name))
    return [path] if path.suffix.lower() in MODEL_SUFFIXES else []


def _config(path: Path | None, root: Path, model: str, reads: ConfigReads, notes: list[str],
            pbtxt=None) -> ModelConfig:
    """`pbtxt`: a config.pbtxt's message, read once for the scan (_folder_config); None: read here."""
    defaults = reads.defaults
    if path is None:
        return defaults
    if resolved_inside(root, path) is None:
        raise ConfigError("", f"config file {not_inside(path)}", str(path))
    triton = path.name == PBTXT
    config, said = reads.settings(path, model, pbtxt)  # (a FIFO, socket or device node refused unopened)
    notes.extend(f"{_relative(root, path) or path}: {note}" for note in said)
    for name, options in config.outputs.items():
        if options.labels and options.labels not in {o.labels for o in defaults.outputs.values()}:
            key = f"output[{name}].label_filename" if triton else f"outputs.{name}.labels"
            real = resolved_inside(root, Path(options.labels))
            if real is None:
                raise ConfigError(key, "the file does not exist or resolves outside the repository", str(path))
            special = _special(real)
            if special is not None:  # read when the version loads: a FIFO would hold that load
                raise ConfigError(key, f"{Path(options.labels).name} is {special}, not a regular file", str(path))
    return config


def _special(path: Path) -> str | None:
    """What `path` is when not a regular file ("a FIFO", ...), else None (also when it is gone)."""
    try:
        return node_kind(path.stat().st_mode)
    except OSError:
        return None


def scan(directory: str | os.PathLike, defaults: ModelConfig, reads: ConfigReads | None = None) -> ScanResult:
    """Read `directory` and return what should be served. Pure apart from reading the disk, and
    `reads` (for `defaults`): the config files as earlier scans read them (None: read them all)."""
    reads = ConfigReads(defaults) if reads is None else reads
    if reads.defaults is not defaults:
        raise ValueError("the config files' reads are kept over other defaults")
    result = ScanResult()
    root = Path(directory)
    try:
        if not root.is_dir():  # (raises, not False, where a folder above cannot be searched)
            result.problems[str(directory)] = "the models folder does not exist"
            result.unreadable = True  # moved away for a moment, a volume not mounted yet: nothing known either
            return result
        root = root.resolve()
        children = folder_entries(root)  # (raises too where its entries cannot be looked at)
    except OSError as e:  # e.g. its permissions changed: nothing served is touched (planner.py)
        result.problems[str(directory)] = f"the models folder cannot be read ({e.strerror or e})"
        result.unreadable = True
        return result
    began = external_data.scan_began()
    files: dict[str, dict] = {}  # name -> {"file": VersionFile?, "dir": Path?, "config": Path?}
    for child in children:
        base = child.name
        if is_ignored_name(base):
            continue
        if child.is_dir():
            stem, kind = base, "dir"
        else:
            stem, suffix = os.path.splitext(base)
            if suffix not in KNOWN_SUFFIXES:
                result.notes.extend(unread.capitals_note(child, root, KNOWN_SUFFIXES))
                continue
            kind = suffix
        reason = check_model_name(stem)
        if reason:
            result.problems[base] = reason
            continue
        files.setdefault(stem, {})[kind] = child
    for name, parts in files.items():
        result.notes.extend(unread.config_notes(name, parts, MODEL_SUFFIXES))
        try:
            _scan_model(root, name, parts, reads, result)
        except ConfigError as e:
            result.problems[name] = str(e)
            if e.source:
                result.config_problems[name] = (e.source, str(e))
        except OSError as e:  # a folder of the model that cannot be listed: that model alone
            where = _relative(root, e.filename)
            result.problems[name] = f"{where + ' ' if where else ''}cannot be read ({e.strerror or e})"
        except Exception as e:  # a bug of the scan: that model alone (it stopped every scan, hot reload with it)
            result.errors[name] = ScanFailure.of(e)
            result.problems[name] = "its files could not be scanned (internal error; see the server log)"
    reads.scanned()  # (the config files not read now are forgotten; a folder not listed forgets nothing)
    external_data.scan_ended(str(root), began)  # (so are the .onnx files not looked at, what they named)
    # names that are not UTF-8 reach the index, the logs and /metrics: escaped once here
    result.problems = {escape_undecodable(k): escape_undecodable(v) for k, v in result.problems.items()}
    result.notes = [escape_undecodable(note) for note in result.notes]
    result.errors = {escape_undecodable(k): e for k, e in result.errors.items()}
    return result


def _relative(root: Path, filename) -> str:
    """`filename` (an OSError's) relative to the models folder, or "" when it is not in it."""
    try:
        return str(Path(os.fsdecode(filename)).relative_to(root)) if filename else ""
    except ValueError:
        return ""


def _scan_model(root: Path, name: str, parts: dict, reads: ConfigReads, result: ScanResult) -> None:
    if "dir" in parts:
        if any(k in parts for k in MODEL_SUFFIXES):
            result.problems[name] = f"both {name}/ and a flat {name}.om/.onnx exist; remove one"
            return
        folder = parts["dir"]
        if resolved_inside(root, folder) is None:
            result.problems[name] = f"{name}/ {OUTSIDE}"
            return
        config_path, pbtxt = _folder_config(root, folder, name, result, reads)
        named = model_file_named(pbtxt)
        available, misplaced, version_folders = {}, [], []
        for sub in sorted(folder.iterdir()):
            if is_ignored_name(sub.name):
                continue
            if not sub.is_dir() or not _VERSION_RE.fullmatch(sub.name):
                if _model_files(sub):  # (a .yaml/.yml: unread.model_folder_notes, once its config is read)
                    misplaced.append(f"{sub.relative_to(root)} is not a version folder")
                elif _VERSION_RE.fullmatch(sub.name) and (special := _special(sub)):
                    misplaced.append(f"{sub.relative_to(root)} is {special}, not a version folder")
                continue
            version_folders.append(sub)
            found = _pick(root, sub, "model", result, name, named)
            if found is not None:
                available[str(int(sub.name))] = found
            elif files := [f for f in _model_files(sub) if f.stem != "model"]:  # model.*: _pick said why
                misplaced.append(f"{files[0].relative_to(root)} is not named model.om or model.onnx")
            elif said := [n for f in sorted(sub.iterdir()) if not is_ignored_name(f.name)
                          for n in unread.capitals_note(f, root, MODEL_SUFFIXES, "model")]:
                misplaced.append(said[0])  # model.OM
        result.versions_found[name] = set(available)
        why = ("; ".join(misplaced) + f" (a versioned model's file goes in {name}/<version>/model.om, "
               "<version> a positive integer such as 1)") if misplaced else ""
        if available:
            if why:  # an attempted version the operator would otherwise never hear of
                result.notes.append(f"{name}: {why}")
        else:
            if config_path is not None or version_folders:  # a model meant: one Triton refuses too, said
                _config(config_path, root, name, reads, [], pbtxt)  # its refusal (ensemble_scheduling...) is why
                why = why or result.problems.get(name) or unread.no_model_file(name, version_folders, root)
            if why:  # (_pick's reason, a FIFO say, stands)
                result.problems[name] = why
            else:  # an empty folder: no problem in the index, which strict readiness would wait on for good
                result.notes.extend(unread.file_named_folder_note(name, MODEL_SUFFIXES))
            return
    else:
        found = _pick(root, root, name, result, name)
        result.versions_found[name] = set() if found is None else {"1"}
        if found is None:
            return
        available = {"1": found}
        config_path, pbtxt = parts.get(".yaml") or parts.get(".yml"), None
    config = _config(config_path, root, name, reads, result.notes, pbtxt)
    if "dir" in parts:  # the .yaml/.yml files in its folders it does not read
        read = {str(config_path)} | {o.labels for o in config.outputs.values() if o.labels}
        result.notes.extend(unread.model_folder_notes(name, parts["dir"], version_folders, root, read))
    selected = select_versions(available, config.version_policy)
    if not selected:  # as Triton, which fails such a load: the model would serve nothing
        result.problems[name] = (f"its version_policy {unread.policy_text(config.version_policy)} selects none of "
                                 f"the versions found ({', '.join(sorted(available, key=version_sort_key))})")
        result.selects_none.add(name)
        return
    stamp = _config_stamp(config_path, config)
    available = {v: dataclasses.replace(f, config_stamp=stamp) for v, f in available.items()}
    result.models[name] = ModelEntry(config, available, selected)
    said = unread.versions_not_found(name, config.version_policy, available, flat="dir" not in parts)
    # (not for a flat model's policy from model_defaults, meant for every model: its own file's only)
    if said and ("dir" in parts or config_path is not None and config.origin_of("version_policy") == str(config_path)):
        result.versions_not_found[name] = said
    if config_path is not None and config.compile != reads.defaults.compile:  # (the defaults' are the .onnx files')
        served = [available[v].path for v in selected]
        result.notes.extend(unread.compile_note(config_path, served, root, config.preferred_batch_sizes)
                            + batch_gaps.gap_note(config_path, served, root, config))


def _folder_config(root: Path, folder: Path, name: str, result: ScanResult,
                   reads: ConfigReads) -> tuple[Path | None, object]:
    """A versioned model's config file: its config.yaml, else a Triton folder's config.pbtxt
    (one beside a config.yaml is not read, said in a note), else None; and a config.pbtxt's
    message, parsed once for the scan (its default_model_filename picks the version files, then
    _config reads its settings), or None (not a config.pbtxt, or one that does not read or
    resolves outside the repository: _config refuses it, saying why)."""
    yaml_path, pbtxt = folder / "config.yaml", folder / PBTXT
    if not os.path.lexists(pbtxt):
        return (yaml_path if os.path.lexists(yaml_path) else None), None
    if os.path.lexists(yaml_path):
        result.notes.append(f"{name}/{PBTXT} not read: {name}/config.yaml beside it is (a model's settings come "
                            "from one file)")
        return yaml_path, None
    try:
        return pbtxt, reads.pbtxt(pbtxt) if resolved_inside(root, pbtxt) is not None else None
    except ConfigError:
        return pbtxt, None


def _config_stamp(config_path: Path | None, config: ModelConfig) -> tuple:
    """Path, size, mtime, ctime and inode of the config file and of each labels file it names
    (None for one gone meanwhile: the load reads it and says so)."""
    paths = ([str(config_path)] if config_path is not None else []) + sorted(
        {o.labels for o in config.outputs.values() if o.labels})
    stamp = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamp.append((path, None))
            continue
        stamp.append((path, *stat_identity(st)))
    return tuple(stamp)
