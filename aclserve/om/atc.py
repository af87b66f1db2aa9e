"""Drive Huawei's ATC (`atc --framework=5 ...`; its options as CANN's ATC documentation gives them)
to build a real OM.

ATC runs in a private work folder beside the output (it drops fusion_result.json and
kernel_meta/ into its working directory), its console output is streamed line by line with
the elapsed time, a timeout kills its whole process group (atc_leash.end), and the built OM is checked
(`atc_om.identify` must say "atc_om") before it is renamed onto the output path, so a failed or
interrupted build never leaves a partial file. Blocks the calling thread for the whole build.
On Linux ATC's group dies with the process running it, however it ends (atc_leash.py).

A build still running when the process exits (a server shut down during a compile abandons its
daemon load thread) would go on in its own session until its timeout, its work folder left
behind: an exit hook kills the builds in progress and removes their work folders. A process
killed outright runs no hook (the out-of-memory killer's SIGKILL; its ATC dies with it:
atc_leash.py), so each work folder is locked while its build lives (temp_claims.claimed_folder:
flock on a lock file inside, held by the process running the build and by ATC's leash until ATC
is gone), and each build first removes the work folders beside its output that nobody holds.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import platform
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from . import atc_leash, atc_om, own_python
from ..temp_claims import claimed_folder, sweep_unclaimed_folders
from .compile_error import DEFAULT_TIMEOUT_S, AtcFailed, AtcKilled, killed_by
from .container import OmFormatError
from .spec import CompileError, ModelSpec

DEFAULT_LOG_LEVEL = "error"
# ATC error codes look like E10001, EZ3002, E19999; plus its closing failure sentence.
_ERROR_LINE = re.compile(r"\bE[0-9A-Z]\d{4}\b|ATC run failed|\[ERROR\]|\bERROR\b")
# What ATC accepts in the paths it is given, once symlinks are resolved (hicann/ge
# CheckInputPathValid / CheckOutputPathWithSuffix: "The path can only contain 'a-z' 'A-Z' '0-9'
# '-' '.' '_' and Chinese characters", E10001)
_NOT_IN_ATC_PATH = re.compile(r"[^A-Za-z0-9./_\-\u4e00-\u9fa5]")
_MAX_QUOTED = 5
WORK_PREFIX = ".atc-"  # ATC's work folders, beside the output
# what ATC inserts before ".om" in the name of the OM of a model that carries its operators' code
# (GE's ModelHelper: "_" + host_env_os + "_" + host_env_cpu, this host's unless ATC is told others)
OS_SPECIFIC_SUFFIX = f"_{platform.system().lower()}_{platform.machine()}"
NAME_MAX_FALLBACK = 255  # a file name's bytes where the folder's own limit cannot be read
END_WAIT_S = 5.0  # at exit, for each ATC ended to be gone


class _Running:
    """The ATC processes (atc_leash.command's) and work folders of the builds in progress in this process."""

    def __init__(self):
        self._lock = threading.Lock()
        self.processes: set[subprocess.Popen] = set()
        self.folders: set[str] = set()

    def add(self, kind: set, item) -> None:
        with self._lock:
            kind.add(item)

    def discard(self, kind: set, item) -> None:
        with self._lock:
            kind.discard(item)

    def end_all(self) -> None:
        """At exit: end every ATC, then remove every work folder (nothing writes there any more)."""
        with self._lock:
            processes, folders = list(self.processes), list(self.folders)
        for proc in processes:
            atc_leash.end(proc)
        for proc in processes:  # (its leash ends it in a moment: gone before its folder goes)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(END_WAIT_S)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


_RUNNING = _Running()
atexit.register(_RUNNING.end_all)


def end_builds() -> None:
    """End the builds in progress as the exit hook does (ATC killed, their work folders removed),
    for a process about to end without running it (os._exit: compile_child's stop)."""
    _RUNNING.end_all()


def find_atc(explicit: str | os.PathLike | None = None) -> str | None:
    """The ATC executable: `explicit` (must exist and be executable) or `atc` on PATH, else None."""
    if explicit is not None:
        path = os.fspath(explicit)
        resolved = shutil.which(path) if os.sep not in path else path
        if not resolved or not os.path.isfile(resolved) or not os.access(resolved, os.X_OK):
            raise CompileError(f"ATC asked for but not found: {path} is not an executable file")
        return os.path.abspath(resolved)
    return shutil.which("atc")


def build_argv(atc: str, model: str, output_base: str, spec: ModelSpec, *, soc_version: str,
               precision_mode: str | None, log_level: str = DEFAULT_LOG_LEVEL,
               insert_op_conf: str | None = None) -> list[str]:
    """ATC's argv; `output_base` is the output path without `.om` (ATC appends it);
    `insert_op_conf` the path of an AIPP config (the model's NCHW --input_shape stays)."""
    argv = [atc, f"--model={model}", "--framework=5", f"--output={output_base}", f"--soc_version={soc_version}"]
    if spec.inputs:
        argv.append(f"--input_shape={spec.atc_input_shape()}")
    if spec.gears:
        argv.append(f"--dynamic_batch_size={','.join(str(g) for g in spec.gears)}")
    if precision_mode:
        argv.append(f"--precision_mode={precision_mode}")
    if insert_op_conf:
        argv.append(f"--insert_op_conf={insert_op_conf}")
    argv.append(f"--log={log_level}")
    return argv


def run_streaming(argv: list[str], *, cwd: str, timeout: float, log: Callable[[str], None],
                  clock: Callable[[], float] = time.monotonic, pass_fds: tuple[int, ...] = ()) -> list[str]:
    """Run argv, passing each output line to `log` prefixed with the elapsed time.

    Returns all lines. Raises AtcFailed on a non-zero exit (quoting ATC's error lines; AtcKilled
    for ATC killed by a signal) or when `timeout` seconds pass (the process group is killed). On
    Linux argv runs on a leash (atc_leash.py): a process killed outright takes its process group
    with it. `pass_fds` stay open in the leash (where there is none, in ATC) until it ends.
    """
    start = clock()
    try:
        proc = subprocess.Popen(atc_leash.command(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=pass_fds,
                                env=own_python.environment())  # (ATC has no use for the API token)
    except OSError as e:
        raise AtcFailed(f"{atc_leash.not_started(argv[0])}{e.strerror or e}") from None
    _RUNNING.add(_RUNNING.processes, proc)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        atc_leash.end(proc)

    timer = threading.Timer(timeout, kill)
    timer.daemon = True
    timer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            lines.append(line)
            log(f"[{clock() - start:8.1f}s] {line}")
        proc.wait()
    except BaseException:
        kill()  # Ctrl-C or a failing log callback: do not leave ATC running
        proc.wait()
        raise
    finally:
        timer.cancel()
        proc.stdout.close()
        _RUNNING.discard(_RUNNING.processes, proc)
    if timed_out.is_set():
        raise AtcFailed(f"ATC timed out after {timeout:g} s and was killed")
    if proc.returncode == atc_leash.NOT_STARTED and len(lines) == 1 \
            and lines[0].startswith(atc_leash.not_started(argv[0])):
        raise AtcFailed(lines[0])  # (the leash's word: ATC itself never ran)
    if proc.returncode < 0:  # (the leash dies by ATC's signal: atc_leash.main)
        raise AtcKilled(f"ATC was killed by {killed_by(-proc.returncode)}: {quote_errors(lines)}", -proc.returncode)
    if proc.returncode != 0:
        raise AtcFailed(f"ATC failed (exit status {proc.returncode}): {quote_errors(lines)}")
    return lines


def quote_errors(lines: list[str]) -> str:
    """ATC's error lines joined into one line (the last lines of output when none match)."""
    picked = [ln.strip() for ln in lines if _ERROR_LINE.search(ln)] or [ln.strip() for ln in lines if ln.strip()][-3:]
    if not picked:
        return "no output"
    if len(picked) > _MAX_QUOTED:
        picked = picked[:_MAX_QUOTED - 1] + [picked[-1]]
    return " | ".join(picked)


def compile_with_atc(atc: str, onnx_path: str, output: Path, spec: ModelSpec, *, soc_version: str,
                     precision_mode: str | None, timeout: float = DEFAULT_TIMEOUT_S,
                     log: Callable[[str], None] = print, log_level: str = DEFAULT_LOG_LEVEL,
                     insert_op_conf: str | None = None) -> atc_om.AtcOmHeader:
    """Build `output` with ATC; returns the checked 256-byte header of the result.
    `insert_op_conf`: AIPP config text, written to the work folder and passed to ATC."""
    # ATC runs inside `work`, so every path it is given must be absolute (a relative --output
    # would land under work/ and the build would fail with "No such file or directory").
    output = Path(output).absolute()
    atc_path(onnx_path, "model")
    atc_path(output.parent, "output folder")
    atc_output_name(output)
    atc_input_names(spec)
    sweep_unclaimed_folders(WORK_PREFIX, str(output.parent))  # (those of builds killed outright)
    # (no model name in the folder's: ATC inserts its _<os>_<arch> at the first ".om" of the
    # whole output path when it packs custom operators, so a name beginning "om" moved its file)
    try:
        work, lock = claimed_folder(WORK_PREFIX, str(output.parent))
    except OSError as e:  # (named as the output, not as the work folder it could not make)
        raise OSError(e.errno, e.strerror, str(output)) from e
    _RUNNING.add(_RUNNING.folders, work)
    try:
        base = os.path.join(work, output.stem)
        conf = None
        if insert_op_conf is not None:
            conf = os.path.join(work, "aipp.cfg")
            with open(conf, "w", encoding="utf-8") as f:
                f.write(insert_op_conf)
        argv = build_argv(atc, os.path.abspath(onnx_path), base, spec, soc_version=soc_version,
                          precision_mode=precision_mode, log_level=log_level, insert_op_conf=conf)
        log("running: " + " ".join(argv))
        lines = run_streaming(argv, cwd=work, timeout=timeout, log=log, pass_fds=(lock,))
        built = _find_output(base)
        if built is None:
            raise AtcFailed(f"ATC exited 0 but wrote no {output.stem}.om: {quote_errors(lines)}")
        try:
            kind, header = atc_om.identify(built)
        except atc_om.NotAnOm as e:  # (its words say "not an OM file" or "not a loadable OM" already)
            raise AtcFailed(f"ATC wrote {os.path.basename(built)} but it is {e}") from None
        except OmFormatError as e:
            raise AtcFailed(f"ATC wrote {os.path.basename(built)} but it is not a valid OM: {e}") from None
        if kind != "atc_om":
            raise AtcFailed(f"ATC wrote {os.path.basename(built)} but it is a {kind} file, not an ATC OM")
        os.chmod(built, 0o644)  # ATC makes it 0600; a model file is meant to be shared (replicas, the server's user)
        os.replace(built, output)
        return header
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock)  # (after: a sweep never meets the folder unlocked)
        _RUNNING.discard(_RUNNING.folders, work)


def atc_path(path, what: str) -> None:
    """Raise CompileError when ATC would refuse `path` (symlinks resolved) for a character, before
    it runs (it would fail with E10001; the CPU target has no such limit)."""
    real = os.path.realpath(path)
    bad = _NOT_IN_ATC_PATH.search(real)
    if bad is not None:
        raise CompileError(f"ATC accepts only letters, digits, '.', '/', '_', '-' and Chinese characters in a "
                           f"file path: the {what} path {real!r} has {bad.group()!r}; rename or move it")


def atc_output_name(output: Path) -> None:
    """Raise CompileError, before ATC runs, when a name ATC may give the OM it writes for `output`
    is longer than a file name may be in its folder: `<stem>.om`, and `<stem>_<os>_<arch>.om` for
    a model carrying its operators' code (which only ATC's build finds). ATC would fail writing it
    (ENAMETOOLONG), at the end of its build."""
    try:
        limit = os.pathconf(output.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX_FALLBACK
    longest = len(os.fsencode(output.stem + OS_SPECIFIC_SUFFIX + ".om"))
    if longest > limit:
        room = limit - len(OS_SPECIFIC_SUFFIX)
        raise CompileError(f"output name too long for ATC: it names the OM of a model that carries its operators' "
                           f"code <name>{OS_SPECIFIC_SUFFIX}.om, here {longest} bytes, past the {limit} a file name "
                           f"may have; shorten the output name to {room} bytes at most (it is "
                           f"{len(os.fsencode(output.name))})")


def atc_input_names(spec: ModelSpec) -> None:
    """Raise CompileError for an input name --input_shape cannot carry, before ATC runs: ATC splits
    it at every ';' (then takes a name up to its last ':', so ':' and ',' are fine: ParseInputShape,
    SplitInputShape) and would fail with E10002 or look for a part of the name (E10016)."""
    for t in spec.inputs:
        if ";" in t.name:
            raise CompileError(f"ATC's --input_shape cannot name input {t.name!r}: it splits the option at ';', "
                               "which the name holds; rename the input in the model (the CPU target takes it)")


def _find_output(base: str) -> str | None:
    """ATC writes <base>.om, or <base>_<os>_<arch>.om for OS-specific models."""
    if os.path.isfile(base + ".om"):
        return base + ".om"
    folder, stem = os.path.split(base)
    candidates = sorted(n for n in os.listdir(folder) if n.startswith(stem + "_") and n.endswith(".om"))
    return os.path.join(folder, candidates[0]) if candidates else None
