"""A server on an NPU compiles a dropped .onnx with ATC; with no `atc` on its PATH the version's
reason says so in the server's words: the program `atc` not found on PATH, and what to do (install
CANN's toolkit and source its set_env.sh, or drop in an .om compiled with ATC). It said `aclserve
compile`'s words, "ATC asked for but not found: no `atc` on PATH (install CANN's toolkit or pass
--atc PATH)": the server asked for nothing and has no --atc. No NPU here: the repository's own
compile (its cache, the compile's child process) is run for the NPU target, as a server on one runs
it, with a PATH that has no `atc`; its error is recorded as a failed load's reason."""
from __future__ import annotations

import os

import pytest

from aclserve.config import CompileOptions
from aclserve.om.compile_error import CompileError
from aclserve.repository.compile_cache import CompileCache
from aclserve.repository.failures import LoadFailures
from aclserve.repository.layout import VersionFile

from tests.tiny_models import double_onnx


def test_an_onnx_compiled_for_the_npu_without_atc_on_path_says_the_program_is_not_found(tmp_path, monkeypatch):
    models, no_tools = tmp_path / "models", tmp_path / "bin"
    models.mkdir()
    no_tools.mkdir()
    monkeypatch.setenv("PATH", str(no_tools))  # (the compile's child inherits it; its Python is named in full)
    source = double_onnx(models / "m.onnx")
    cache = CompileCache(str(tmp_path / "cache"), str(models))
    with pytest.raises(CompileError) as refused:
        cache.compiled(str(source), "m", CompileOptions(), "npu", "Ascend310P3")
    st = os.stat(source)
    reason = LoadFailures(1.0, 60.0, lambda name, version: None).record(
        "m", "1", VersionFile(str(source), "onnx", st.st_size, st.st_mtime_ns), refused.value)
    assert reason == ("the program `atc` (CANN's ATC, which compiles an .onnx for the NPU) was not found on the "
                      "server's PATH: install CANN's toolkit and source its set_env.sh before the server starts, "
                      "or drop in an .om compiled with ATC (aclserve compile --target npu)"), reason
