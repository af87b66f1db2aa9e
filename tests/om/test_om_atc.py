"""The ATC path, with a stand-in `atc` (real ATC cannot be installed here): argument mapping,
streaming, failure quoting, output checks, and never a partial output file. How an ATC build
ends (its timeout, a signal, its process gone): test_atc_ends.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from aclserve.om import atc_om
from aclserve.om.atc import AtcFailed
from aclserve.om.spec import CompileError
from aclserve.om.compile import compile_model
from .atc_stand_in import leftovers
from .conftest import run_cli


def test_argument_mapping_and_valid_output(tmp_path, fake_atc, multi_io_onnx):
    atc, record = fake_atc
    out = tmp_path / "net.om"
    lines = []
    result = compile_model(multi_io_onnx, out, batch="1,2,4", soc_version="Ascend910B3",
                           precision_mode="allow_mix_precision", atc=str(atc), log=lines.append)
    argv = json.loads(record.read_text())["argv"]
    work = json.loads(record.read_text())["cwd"]
    assert argv[0] == f"--model={os.path.abspath(multi_io_onnx)}"
    assert argv[1] == "--framework=5"
    assert argv[2] == f"--output={os.path.join(work, 'net')}"  # no .om: ATC appends it
    assert argv[3:] == ["--soc_version=Ascend910B3", "--input_shape=a:-1,4;b:-1,3;c:-1,2;d:-1,5",
                        "--dynamic_batch_size=1,2,4", "--precision_mode=allow_mix_precision", "--log=error"]
    kind, header = atc_om.identify(out)
    assert kind == "atc_om" and header.name == "net" and not header.is_dynamic  # gears: not an unknown shape
    assert os.stat(out).st_mode & 0o777 == 0o644  # ATC writes 0600: shared with replicas and the server's user
    assert result.target == "npu" and result.header["name"] == "net" and result.header["gears"] == [1, 2, 4]
    assert any("ATC run success" in ln and ln.startswith("[") and "s] " in ln for ln in lines)
    assert not os.path.exists(work) and leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["model", "output"])
def test_a_path_atc_would_refuse_for_a_character_is_refused_before_it_runs(tmp_path, fake_atc, static_onnx, where):
    """ATC accepts only a-z A-Z 0-9 . / _ - and Chinese characters in its paths (E10001): a
    space in the model's or the output's folder is said plainly, naming it, before ATC runs."""
    atc, record = fake_atc
    spaced = tmp_path / "my models"
    spaced.mkdir()
    model = static_onnx
    if where == "model":
        model = spaced / "s.onnx"
        shutil.copyfile(static_onnx, model)
    out = (spaced if where == "output" else tmp_path) / "s.om"
    with pytest.raises(CompileError, match=f"the {where}( folder)? path .*my models.* has ' '; rename or move it"):
        compile_model(model, out, soc_version="Ascend310P3", atc=str(atc), log=lambda s: None)
    assert not record.exists()  # ATC never ran
    assert not out.exists() and leftovers(out.parent) == []


def test_static_model_gets_no_dynamic_batch_flag(tmp_path, fake_atc, static_onnx):
    atc, record = fake_atc
    compile_model(static_onnx, tmp_path / "s.om", soc_version="Ascend310P3", atc=str(atc), log=lambda s: None)
    argv = json.loads(record.read_text())["argv"]
    assert "--input_shape=x:2,3" in argv and not any(a.startswith("--dynamic_batch_size") for a in argv)
    assert "--precision_mode=force_fp16" in argv and "--soc_version=Ascend310P3" in argv


def test_output_is_streamed_while_atc_runs(tmp_path, fake_atc, multi_io_onnx, monkeypatch):
    atc, _ = fake_atc
    gate = tmp_path / "gate"
    monkeypatch.setenv("FAKE_ATC_MODE", "gate")
    monkeypatch.setenv("FAKE_ATC_GATE", str(gate))
    seen_before_exit = threading.Event()

    def log(line):
        if "waiting for the gate" in line:  # ATC is still running: it waits for this file
            seen_before_exit.set()
            gate.touch()

    compile_model(multi_io_onnx, tmp_path / "g.om", batch="1", soc_version="Ascend310P3", atc=str(atc), timeout=120,
                  log=log)
    assert seen_before_exit.is_set()


@pytest.mark.parametrize("mode,expected", [("nofile", "wrote no t.om"), ("truncated", "not a valid OM"),
                                           # (it was "not a valid OM: not an OM file: the file is empty": i221)
                                           pytest.param("empty", r"^ATC wrote t\.om but it is not a loadable OM: "
                                                                 r"the file is empty \(0 bytes\)$", id="empty"),
                                           # (it was "not a valid OM: not an OM file (neither ...)": i230)
                                           pytest.param("junk", r"^ATC wrote t\.om but it is not an OM file \(neither "
                                                                r"a CPU OM nor an ATC 'IMOD' header\)$", id="junk")])
def test_bad_atc_output_is_refused(tmp_path, fake_atc, multi_io_onnx, mode, expected, monkeypatch):
    atc, _ = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", mode)
    with pytest.raises(AtcFailed, match=expected):
        compile_model(multi_io_onnx, tmp_path / "t.om", batch="1", soc_version="Ascend310P3", atc=str(atc),
                      log=lambda s: None)
    assert not (tmp_path / "t.om").exists() and leftovers(tmp_path) == []


def test_cli_failure_quotes_atc_errors(tmp_path, fake_atc, multi_io_onnx):
    atc, record = fake_atc
    proc = run_cli("compile", multi_io_onnx, "-o", tmp_path / "f.om", "--soc-version", "Ascend310P3", env={
        "PATH": f"{atc.parent}:/usr/bin:/bin", "FAKE_ATC_MODE": "fail", "FAKE_ATC_RECORD": str(record)})
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr
    assert "exit status 1" in err[0] and "E10001: Value [x:-1,4]" in err[0] and "ATC run failed" in err[0]
    assert "[INFO] parsing model" not in err[0]
    assert "ATC start working now" in proc.stdout  # streamed to stdout as it ran
    assert not (tmp_path / "f.om").exists() and leftovers(tmp_path) == []


def test_cli_finds_atc_on_path_and_inspects_result(tmp_path, fake_atc, multi_io_onnx):
    atc, record = fake_atc
    env = {"PATH": f"{atc.parent}:/usr/bin:/bin", "FAKE_ATC_RECORD": str(record)}
    out = tmp_path / "p.om"
    proc = run_cli("compile", multi_io_onnx, "-o", out, "--batch", "2,4", "--soc-version", "Ascend310P3", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ATC OM" in proc.stdout and "needs CANN" in proc.stdout
    assert "--dynamic_batch_size=2,4" in json.loads(record.read_text())["argv"]
    shown = run_cli("inspect", out)
    assert shown.returncode == 0, shown.stderr
    for text in ("atc_om", "name: p", "model type: standard", "encrypted: no", "dynamic shape: no",
                 "platform version: 7.6.0.1", "needs CANN"):
        assert text in shown.stdout
    assert json.loads(run_cli("inspect", out, "--json").stdout)["header"]["is_dynamic"] is False


def test_target_cpu_ignores_atc_on_path(tmp_path, fake_atc, multi_io_onnx):
    atc, record = fake_atc
    env = {"PATH": f"{atc.parent}:/usr/bin:/bin", "FAKE_ATC_RECORD": str(record)}
    proc = run_cli("compile", multi_io_onnx, "-o", tmp_path / "c.om", "--batch", "1", "--target", "cpu", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not record.exists() and atc_om.identify(tmp_path / "c.om")[0] == "cpu_om"


def test_one_batch_size_compiles_a_static_batch_on_both_targets(tmp_path, fake_atc, multi_io_onnx):
    """ATC's --dynamic_batch_size takes 2 to 100 sizes: --batch 8 is a static batch of 8."""
    atc, record = fake_atc
    compile_model(multi_io_onnx, tmp_path / "s8.om", batch="8", soc_version="Ascend310P3", atc=str(atc),
                  log=lambda s: None)
    argv = json.loads(record.read_text())["argv"]
    assert "--input_shape=a:8,4;b:8,3;c:8,2;d:8,5" in argv
    assert not any(a.startswith("--dynamic_batch_size") for a in argv)
    cpu = compile_model(multi_io_onnx, tmp_path / "c8.om", batch="8", target="cpu", log=lambda s: None)
    header = cpu.header
    assert header["gears"] == [] and [t["dims"][0] for t in header["inputs"]] == [8, 8, 8, 8]
    assert all(t["name"] != "ascend_mbatch_shape_data" for t in header["inputs"])


def test_relative_output_paths_work_with_atc(tmp_path, fake_atc, multi_io_onnx):
    """ATC runs in a work folder: -o relative to the caller's folder, and the default output
    beside a relative input, must still be handed to it as absolute paths."""
    atc, record = fake_atc
    env = dict(os.environ, PATH=f"{atc.parent}:/usr/bin:/bin", FAKE_ATC_RECORD=str(record))
    (tmp_path / "sub").mkdir()
    os.replace(multi_io_onnx, tmp_path / "sub" / "m.onnx")
    for args, built in ((["sub/m.onnx", "-o", "sub/rel.om"], tmp_path / "sub" / "rel.om"),
                        (["sub/m.onnx"], tmp_path / "sub" / "m.om")):
        proc = subprocess.run([sys.executable, "-m", "aclserve", "compile", *args, "--soc-version", "Ascend310P3"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert atc_om.identify(built)[0] == "atc_om"
        output_arg = [a for a in json.loads(record.read_text())["argv"] if a.startswith("--output=")][0]
        assert os.path.isabs(output_arg.split("=", 1)[1])


def test_without_soc_version_and_without_a_device_compile_asks_for_it(tmp_path, fake_atc, multi_io_onnx):
    atc, record = fake_atc
    env = {"PATH": f"{atc.parent}:/usr/bin:/bin", "FAKE_ATC_RECORD": str(record)}
    proc = run_cli("compile", multi_io_onnx, "-o", tmp_path / "n.om", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "--soc-version" in err[0]
    assert not record.exists() and not (tmp_path / "n.om").exists()


def _over_2gb_model(tmp_path) -> str:
    """A model whose external data file is 2.2 GB (sparse: nothing on disk), its one tensor small."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "big.onnx"), save_as_external_data=True, location="big.data", size_threshold=0)
    with open(tmp_path / "big.data", "r+b") as f:
        f.truncate(2_200_000_000)
    return str(tmp_path / "big.onnx")


def test_a_model_over_2gb_reaches_atc_without_its_weights_read(tmp_path, fake_atc, monkeypatch):
    """Its weights were read and the checker then refused the 2.2 GB message ("protobuf ... too
    large"): 22 s and 6.4 GB, and no such model could reach ATC (found by a review). ATC reads
    the model from its path: the weights are not read here at all."""
    import onnx
    atc, record = fake_atc
    src = _over_2gb_model(tmp_path)
    monkeypatch.setattr(onnx, "load_external_data_for_model", lambda *a: pytest.fail("read the weights"))
    compile_model(src, tmp_path / "big.om", batch="1,2", soc_version="Ascend910B3", atc=str(atc), log=lambda s: None)
    assert json.loads(record.read_text())["argv"][0] == f"--model={os.path.abspath(src)}"


def test_a_model_over_2gb_is_refused_by_the_cpu_compiler_before_its_weights_are_read(tmp_path):
    src = _over_2gb_model(tmp_path)
    with pytest.raises(CompileError, match="the model with its external data is 2.0 GiB; the CPU compiler takes "
                                           "models up to 2 GiB"):
        compile_model(src, tmp_path / "big.om", target="cpu", log=lambda s: None)


def _named_input(tmp_path, name: str) -> str:
    from onnx import TensorProto, helper
    from .conftest import save
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", [name], ["y"])], "g", [vi(name, TensorProto.FLOAT, [-1, 4])],
                              [vi("y", TensorProto.FLOAT, None)])  # (a batch stored as dim_value -1; y no shape)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")


@pytest.mark.parametrize("name", ["a,b", "in:0", "input ids"])
def test_names_and_shapes_atc_reads_reach_it_as_they_are(tmp_path, fake_atc, name):
    """ATC splits --input_shape at ';' and takes a name up to its last ':' (ParseInputShape,
    SplitInputShape): ',' and ':' in a name are fine. A batch stored as dim_value -1 (a TypeError
    here) and an output declaring no shape (the checker's refusal) reach it too."""
    atc, record = fake_atc
    compile_model(_named_input(tmp_path, name), tmp_path / "m.om", batch="1,2", soc_version="Ascend310P3",
                  atc=str(atc), log=lambda s: None)
    assert f"--input_shape={name}:-1,4" in json.loads(record.read_text())["argv"]


def test_an_input_name_holding_a_semicolon_is_refused_before_atc_runs(tmp_path, fake_atc):
    atc, record = fake_atc
    with pytest.raises(CompileError, match="ATC's --input_shape cannot name input 'a;b': it splits the option at ';'"):
        compile_model(_named_input(tmp_path, "a;b"), tmp_path / "m.om", soc_version="Ascend310P3", atc=str(atc),
                      log=lambda s: None)
    assert not record.exists() and leftovers(tmp_path) == []
    compile_model(_named_input(tmp_path, "a;b"), tmp_path / "m.om", target="cpu", log=lambda s: None)  # (CPU: fine)


@pytest.mark.skipif(not os.path.isdir("/sys"), reason="needs /sys, a folder no one can create files in")
@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_an_output_folder_that_cannot_be_written_is_named_as_the_output(tmp_path, fake_atc, static_onnx, target):
    """The message named the temporary file (/sys/.x.om.ima1d8yr.part) or ATC's work folder."""
    atc, _ = fake_atc
    args = ["--atc", atc, "--soc-version", "Ascend310P3"] if target == "npu" else ["--target", "cpu"]
    proc = run_cli("compile", static_onnx, "-o", "/sys/x.om", *args)
    assert proc.returncode == 2 and proc.stderr.startswith("aclserve compile: error: cannot write /sys/x.om: "), \
        proc.stderr


def test_declared_dims_size_what_the_model_leaves_variable_for_atc_too(tmp_path, fake_atc):
    """A config.pbtxt's dims (the server's declared_dims) reach ATC's --input_shape for the
    dimensions the model leaves variable but the batch; an input --input-shape names keeps that."""
    from onnx import TensorProto, helper
    from .conftest import save
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["b"], ["z"])], "g",
                              [vi("a", TensorProto.FLOAT, ["N", "L"]), vi("b", TensorProto.FLOAT, ["N", "L"])],
                              [vi("y", TensorProto.FLOAT, ["N", "L"]), vi("z", TensorProto.FLOAT, ["N", "L"])])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    atc, record = fake_atc
    compile_model(model, tmp_path / "m.om", batch="1,2", input_shape="b:-1,3", declared_dims={"a": [5], "b": [7]},
                  soc_version="Ascend310P3", atc=str(atc), log=lambda s: None)
    assert "--input_shape=a:-1,5;b:-1,3" in json.loads(record.read_text())["argv"]
