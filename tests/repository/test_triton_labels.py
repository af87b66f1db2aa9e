"""A config.pbtxt's label_filename read as Triton reads it (repository/labels.py): a file of more
lines than the output has classes, or fewer, serves (extra lines unused; classes past the file's
lines answered without a label, "value:index", as Triton's classification writes a class with no
label), said in one WARNING line at load; a YAML's `labels` keeps its one line per class
(tests/repository/test_folder_changes.py). On the real server, CPU runtime, real files."""
from __future__ import annotations

import logging

import aiohttp
import pytest

from .repo_helpers import place, started_on_old_files, write_in

PBTXT = """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
"""


async def _classes(session, base: str, model: str) -> list[str]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 4, 3, 2]}],
            "outputs": [{"name": "y", "parameters": {"classification": 4}}]}
    async with session.post(f"{base}/v2/models/{model}/infer", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["outputs"][0]["data"]


@pytest.mark.asyncio
async def test_a_label_filename_of_another_count_serves_as_in_triton(models_dir, model_files, caplog):
    """A tester's find: a labels file of 5 lines on a 4-class output was refused ("labels file
    labels.txt has 5 labels; output 'y' has 4 classes"), and with strict readiness the whole
    server was not ready; Triton serves it (an ImageNet list of 1001 lines on 1000 classes)."""
    caplog.set_level(logging.WARNING, logger="aclserve.repository")
    for name, labels in (("more", "zero\none\ntwo\nthree\nfour (unused)\n"), ("fewer", "zero\n\ntwo\n")):
        place(model_files[1]["om"], models_dir / name / "1" / "model.om")
        write_in(models_dir / name / "config.pbtxt", PBTXT)
        write_in(models_dir / name / "labels.txt", labels)
    runner, _, base, _, _ = await started_on_old_files(models_dir)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/v2/health/ready") as resp:
                assert resp.status == 200
            assert await _classes(session, base, "more") == ["4.000000:1:one", "3.000000:2:two", "2.000000:3:three",
                                                             "1.000000:0:zero"]
            # class 1's line is empty and class 3 has none: "value:index", no ':' after it
            assert await _classes(session, base, "fewer") == ["4.000000:1", "3.000000:2:two", "2.000000:3",
                                                              "1.000000:0:zero"]
    finally:
        await runner.cleanup()
    said = [r.getMessage() for r in caplog.records if "label_filename" in r.getMessage()]
    assert sorted(said) == [
        "fewer:1: label_filename labels.txt of output 'y' has 3 lines and the output 4 classes: class 3 has no label "
        "(a classification says \"value:index\" there), as Triton reads the file (line i names class i, counted "
        "from 0)",
        "more:1: label_filename labels.txt of output 'y' has 5 lines and the output 4 classes: line 5 is not used, as "
        "Triton reads the file (line i names class i, counted from 0)"]
    assert all(r.levelno == logging.WARNING for r in caplog.records if "label_filename" in r.getMessage())
