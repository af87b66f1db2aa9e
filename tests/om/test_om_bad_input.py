"""Every bad input of `aclserve compile` / `inspect`: exit status 2, one stderr line, no traceback,
and no output file left behind."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import REPO

from .conftest import run_cli, save

GEARS_101 = ",".join(str(i) for i in range(1, 102))


def _saved(graph, path):
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _invalid_graph(path):
    """A node reading a tensor nothing produces: the ONNX checker refuses it."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Add", ["x", "ghost"], ["y"])], "bad",
                              [vi("x", TensorProto.FLOAT, ["n", 2])], [vi("y", TensorProto.FLOAT, ["n", 2])])
    return _saved(graph, path)


def _empty_tensor(path, where: str):
    """A fixed dimension of 0 in the model's input or (by a Slice of nothing) its output: the
    CPU runtime refused the OM at load, and the index blamed the host."""
    vi, node = helper.make_tensor_value_info, helper.make_node
    if where == "input":
        nodes, x_dims = [node("Identity", ["x"], ["y"])], ["n", 0]
    else:
        nodes, x_dims = [node("Constant", [], ["z"], value=helper.make_tensor("z", TensorProto.INT64, [1], [0])),
                         node("Constant", [], ["a"], value=helper.make_tensor("a", TensorProto.INT64, [1], [1])),
                         node("Slice", ["x", "z", "z", "a"], ["y"])], ["n", 2]
    graph = helper.make_graph(nodes, "empty", [vi("x", TensorProto.FLOAT, x_dims)],
                              [vi("y", TensorProto.FLOAT, ["n", 0])])
    return _saved(graph, path)


def _odd_names(path, what: str):
    """An input named as ATC's own dynamic-batch input, or an output listed twice: compiled,
    then refused at load with a reason about image sizes, or served with its output twice."""
    vi, node = helper.make_tensor_value_info, helper.make_node
    x = "ascend_mbatch_shape_data" if what == "reserved" else "x"
    outputs = [vi("y", TensorProto.FLOAT, ["n", 2])] * (2 if what == "twice" else 1)
    graph = helper.make_graph([node("Identity", [x], ["y"])], "odd", [vi(x, TensorProto.FLOAT, ["n", 2])], outputs)
    if what == "passthrough":  # no node: the output is the input itself
        x_info = vi("x", TensorProto.FLOAT, ["n", 2])
        graph = helper.make_graph([], "odd", [x_info], [x_info])
    if what == "no inputs":  # a constant, computed from no request
        graph = helper.make_graph([node("Constant", [], ["y"], value=helper.make_tensor("c", TensorProto.FLOAT, [1, 2],
                                                                                        [1.0, 2.0]))],
                                  "odd", [], [vi("y", TensorProto.FLOAT, [1, 2])])
    if what == "no outputs":  # (was ONNX Runtime's "At least one output should be requested" from the test run)
        graph = helper.make_graph([node("Identity", ["x"], ["y"])], "odd", [vi("x", TensorProto.FLOAT, ["n", 2])], [])
    return _saved(graph, path)


def _bad_external_entry(path, offset: str, length: str):
    """y = x @ w with w in `w.bin` beside it, its entry's offset and length as given: onnx's
    reader raised ValueError out of the compile (a traceback, exit 1)."""
    vi = helper.make_tensor_value_info
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", offset), ("length", length)):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    Path(path).with_name("w.bin").write_bytes(bytes(64))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                              [vi("x", TensorProto.FLOAT, ["n", 4])], [vi("y", TensorProto.FLOAT, ["n", 4])], [w])
    return _saved(graph, path)


# (case id, argv after "compile" with MODEL/STATIC/OUT placeholders, text the message must contain)
CASES = [
    ("missing file", ["NOFILE"], "no such file"),
    # its folder missing too: the default output's folder was said not to exist, not the model
    ("missing file in a missing folder", ["NOFOLDER"], "none/absent.onnx: no such file"),
    ("not onnx", ["TEXTFILE"], "not an ONNX model"),
    ("invalid graph", ["INVALID"], "invalid ONNX graph"),
    ("unknown input name", ["MODEL", "--input-shape", "nope:-1,4"], "unknown input 'nope'"),
    ("malformed shape", ["MODEL", "--input-shape", "a:-1,four"], "malformed --input-shape"),
    ("malformed shape no colon", ["MODEL", "--input-shape", "a-1,4"], "malformed --input-shape"),
    ("zero dim", ["MODEL", "--input-shape", "a:-1,0"], "malformed --input-shape"),
    ("wrong rank", ["MODEL", "--input-shape", "a:-1,4,1"], "gives input 'a' 3 dims"),
    ("non-numeric gears", ["MODEL", "--batch", "1,two"], "malformed --batch"),
    # Python's int() reads these (as 10 and 12): ATC does not
    ("underscore in a gear", ["MODEL", "--batch", "1_0"], "malformed --batch"),
    ("other script's digits", ["MODEL", "--batch", "1,\u0661\u0662"], "malformed --batch"),
    ("other script's digits in a dim", ["MODEL", "--input-shape", "a:-1,\u0664"], "malformed --input-shape"),
    ("zero gear", ["MODEL", "--batch", "0,2"], "must be positive"),
    ("negative gear", ["MODEL", "--batch=-2,4"], "must be positive"),
    ("descending gears", ["MODEL", "--batch", "4,2"], "strictly ascending"),
    ("duplicate gears", ["MODEL", "--batch", "2,2,4"], "unique"),
    ("too many gears", ["MODEL", "--batch", GEARS_101], "at most 100"),
    ("gears without batch dim", ["STATIC", "--batch", "1,2"], "no batch dimension"),
    # past int64 these were a traceback from protobuf (ValueError: Value out of range) or numpy's probe run
    ("gear past int64", ["MODEL", "--batch", "99999999999999999999"], "at most 2048"),
    ("largest gear past int64", ["MODEL", "--batch", "1,99999999999999999999"], "at most 2048"),
    ("dim past int64", ["MODEL", "--input-shape", "a:-1,99999999999999999999"], "at most 9223372036854775807"),
    # past ATC's documented range a size was compiled: a static one's test run allocated its rows first
    # (100000000: numpy's "Unable to allocate 23.8 GiB", a tester, t92); with 2**63-1, "would take"
    ("gear past ATC's range", ["MODEL", "--batch", "1,2049"],
     "--batch sizes are at most 2048, the largest ATC documents for --dynamic_batch_size, got 2049"),
    ("static gear past ATC's range", ["MODEL", "--batch", "9223372036854775807"], "at most 2048"),
    ("static 0 dim in an input", ["EMPTYIN"], "input 'x' has a dimension of 0"),
    ("static 0 dim in an output", ["EMPTYOUT"], "output 'y' has a dimension of 0"),
    ("reserved input name", ["RESERVED"], "has the name of the input ATC adds"),
    ("output listed twice", ["TWICE"], "output 'y' is listed twice"),
    # served, they answered zeros / refused every request (a new user's walk through the CLI)
    ("output is the input", ["PASSTHROUGH"], "output 'x' is the model's input itself"),
    ("no inputs", ["NOINPUTS"], "the model has no inputs"),
    ("no outputs", ["NOOUTPUTS"], "the model has no outputs"),
    ("negative external data offset", ["EXTNEG"],
     "its external data cannot be read (tensor 'w': its offset '-5' is not a non-negative integer)"),
    ("external data length not an integer", ["EXTABC"],
     "its external data cannot be read (tensor 'w': its length 'abc' is not a non-negative integer)"),
    ("empty path", [""], "no model file given"),  # a traceback from pathlib
    ("empty file", ["EMPTYFILE"], "not an ONNX model (an empty file)"),  # it said "(no graph)"
    ("unknown target", ["MODEL", "--target", "gpu"], "unknown target 'gpu'"),
    ("npu without atc", ["MODEL", "--target", "npu"], "ATC asked for but not found"),
    ("atc path missing", ["MODEL", "--atc", "/nonexistent/atc"], "ATC asked for but not found"),
    ("output not .om", ["MODEL", "-o", "OUTDIR/x.bin"], "must end with .om"),
    ("output folder missing", ["MODEL", "-o", "OUTDIR/none/x.om"], "does not exist"),
    ("output folder is a file", ["MODEL", "-o", "TEXTFILE/x.om"], "notes.onnx is a file, not a folder"),
    ("output is a folder", ["MODEL", "-o", "OUTDIR/folder.om"], "cannot write"),  # (said after the compile)
    # an ONNX model named w.om compiled with -o w.om was written over
    ("output is the model", ["ONNXOM", "-o", "ONNXOM"], "is the model file"),
    ("output links to the model", ["ONNXOM", "-o", "LINKOM"], "is the model file"),
    ("bad timeout", ["MODEL", "--timeout", "soon"], "invalid float value"),
    ("infinite timeout", ["MODEL", "--timeout", "inf"], "at most 2,592,000"),  # a Timer's traceback
    ("nan timeout", ["MODEL", "--timeout", "nan"], "timeout must be a positive number"),
    ("missing argument", [], "required"),
]


@pytest.fixture
def files(tmp_path, multi_io_onnx, static_onnx):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a protobuf\n" * 10)
    (tmp_path / "folder.om").mkdir()
    (tmp_path / "zero.onnx").write_bytes(b"")
    (tmp_path / "w.om").write_bytes(Path(multi_io_onnx).read_bytes())
    (tmp_path / "link.om").symlink_to("w.om")
    return {"NOFILE": str(tmp_path / "absent.onnx"), "NOFOLDER": str(tmp_path / "none" / "absent.onnx"),
            "TEXTFILE": str(text), "MODEL": multi_io_onnx,
            "STATIC": static_onnx, "INVALID": _invalid_graph(tmp_path / "invalid.onnx"), "OUTDIR": str(tmp_path),
            "EMPTYIN": _empty_tensor(tmp_path / "empty_in.onnx", "input"),
            "EMPTYOUT": _empty_tensor(tmp_path / "empty_out.onnx", "output"),
            "RESERVED": _odd_names(tmp_path / "reserved.onnx", "reserved"),
            "TWICE": _odd_names(tmp_path / "twice.onnx", "twice"),
            "PASSTHROUGH": _odd_names(tmp_path / "passthrough.onnx", "passthrough"),
            "NOINPUTS": _odd_names(tmp_path / "noinputs.onnx", "no inputs"),
            "NOOUTPUTS": _odd_names(tmp_path / "nooutputs.onnx", "no outputs"),
            "EXTNEG": _bad_external_entry(tmp_path / "ext_neg.onnx", "-5", "64"),
            "EXTABC": _bad_external_entry(tmp_path / "ext_abc.onnx", "0", "abc"),
            "EMPTYFILE": str(tmp_path / "zero.onnx"), "ONNXOM": str(tmp_path / "w.om"),
            "LINKOM": str(tmp_path / "link.om")}


def _assert_one_line_error(proc, expected):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and expected in lines[0], lines[0]


@pytest.mark.parametrize("case,argv,expected", CASES, ids=[c[0] for c in CASES])
def test_compile_bad_input(case, argv, expected, files, tmp_path):
    argv = [_fill(a, files) for a in argv]
    before = sorted(os.listdir(tmp_path))
    proc = run_cli("compile", *argv, env={"PATH": "/usr/bin:/bin"})
    _assert_one_line_error(proc, expected)
    if case != "static 0 dim in an output":  # (that one is known once the compile has run the graph)
        assert "compiling" not in proc.stdout  # refused before any compile began
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temporaries left


def _fill(arg: str, files: dict) -> str:
    for key, value in files.items():
        arg = arg.replace(key, value) if arg.startswith(key) else arg
    return arg


@pytest.mark.parametrize("content,expected", [(None, "no such file"), (b"hello world" * 30, "not an OM file"),
                                              (b"ACLSVOM\x00" + b"\x01" * 300, "CPU OM container version"),
                                              # (under 256 bytes, as any file: "CPU OM" before, i232)
                                              (b"ACLSVOM\x00" + b"\x01" * 40, "thing.om: not a loadable OM: "
                                                                             "the file is too short to be an "
                                                                             "OM (48 bytes)"),
                                              (b"IMOD" + b"\x00" * 300, "not an ATC OM header"),
                                              # the file's size was said as its header's: "its 526-byte header"
                                              (b"IMOD" + b"\x00" * 522, "its 256-byte header is not an ATC OM "
                                                                         "header (its size field says 0, not 256)"),
                                              (b"IMOD" + b"\x00" * 96, "is 100 bytes, shorter than an ATC OM's "
                                                                        "256-byte header"),
                                              # ("neither a CPU OM nor an ATC 'IMOD' header": i212; "not an
                                              # OM file: the file is ...", where the Engine said "not a
                                              # loadable OM: the file is ...": i221)
                                              (b"hello world", "thing.om: not a loadable OM: the file is too short "
                                                               "to be an OM (11 bytes)"),
                                              (b"", "thing.om: not a loadable OM: the file is empty (0 bytes)")],
                         ids=["missing", "text", "cpu om of another version", "truncated cpu om", "bad imod",
                              "bad imod header size", "short imod", "short text", "empty"])
def test_inspect_bad_file(tmp_path, content, expected):
    path = tmp_path / "thing.om"
    if content is not None:
        path.write_bytes(content)
    _assert_one_line_error(run_cli("inspect", path), expected)


def test_inspect_of_an_empty_path_says_so():
    _assert_one_line_error(run_cli("inspect", ""), "no OM file given (an empty path)")


def test_inspect_refuses_a_cpu_om_whose_payload_is_corrupt(tmp_path, multi_io_onnx):
    """serve refuses it (payload checksum); inspect described it and exited 0."""
    path = tmp_path / "m.om"
    assert run_cli("compile", multi_io_onnx, "-o", path, env={"PATH": "/usr/bin:/bin"}).returncode == 0
    assert run_cli("inspect", path).returncode == 0
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # same length, one payload byte changed
    path.write_bytes(bytes(data))
    _assert_one_line_error(run_cli("inspect", path), "checksum mismatch")


def test_no_atc_on_path_means_cpu_for_target_auto(tmp_path, multi_io_onnx):
    from aclserve.om import atc_om
    source = Path(multi_io_onnx).read_bytes()
    assert run_cli("compile", multi_io_onnx, "-o", tmp_path / "m.om", "--batch", "1,2",
                   env={"PATH": "/usr/bin:/bin"}).returncode == 0
    kind, header = atc_om.identify(tmp_path / "m.om")
    assert kind == "cpu_om" and header["gears"] == [1, 2]
    assert Path(multi_io_onnx).read_bytes() == source  # the source is untouched


def test_an_input_size_past_a_float_is_refused_in_one_line():
    """_check_size formatted the size with :.3g, an OverflowError (a traceback, exit status 1)
    once the product of the dims passed 1.8e308 (18 dims of 2**63-1 given by --input-shape)."""
    import numpy as np
    from aclserve.om.spec import MAX_DIM, CompileError, _check_size
    with pytest.raises(CompileError, match="would take more than"):
        _check_size("x", np.dtype(np.float32), [MAX_DIM] * 18, None)
    with pytest.raises(CompileError, match=r"would take 3\.4e\+38 bytes at batch"):
        _check_size("x", np.dtype(np.float32), [-1, MAX_DIM], MAX_DIM)


def test_inspect_refuses_a_cpu_om_header_of_another_shape_in_one_line(tmp_path, multi_io_onnx):
    """Tracebacks found by a helper's fuzz: a header nested 100,000 deep (RecursionError, both
    modes) and one whose aipp is a list of empty settings (KeyError in the text mode); serve
    refuses both."""
    import struct
    from aclserve.om import container
    deep = b"[" * 100_000 + b"]" * 100_000
    (tmp_path / "deep.om").write_bytes(struct.pack("<8sIIQ", b"ACLSVOM\x00", 1, len(deep), 0) + deep)
    assert run_cli("compile", multi_io_onnx, "-o", tmp_path / "m.om", env={"PATH": "/usr/bin:/bin"}).returncode == 0
    good = container.read(tmp_path / "m.om")
    header = dict(good.header, aipp=[{}])
    header.pop("payload_sha256", None)
    (tmp_path / "aipp.om").write_bytes(container.encode(header, good.payload))
    for args, said in ((("deep.om",), "nested too deeply"), (("deep.om", "--json"), "nested too deeply"),
                       (("aipp.om",), "CPU OM header field aipp[0].related_input_rank is missing")):
        _assert_one_line_error(run_cli("inspect", tmp_path / args[0], *args[1:]), said)


def test_a_long_error_keeps_its_end_where_the_reason_is():
    """ONNX Runtime names the file first and what went wrong last: a cut at 300 characters
    kept the path and lost the reason."""
    from aclserve.om.spec import one_line
    said = one_line(RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Load model from " + "d/" * 300
                                 + "m.onnx failed:\n Node (conv) Op (Conv) [ShapeInferenceError] kernel rank"))
    assert said.startswith("[ONNXRuntimeError] : 1 : FAIL") and said.endswith("[ShapeInferenceError] kernel rank")
    assert " ... " in said and len(said) <= 410 and "\n" not in said
    assert one_line(RuntimeError("short")) == "short" and one_line(RuntimeError()) == "RuntimeError"


def test_inspect_of_an_onnx_file_says_to_compile_it(multi_io_onnx):
    _assert_one_line_error(run_cli("inspect", multi_io_onnx), "makes an OM of it")


def test_inspect_suggests_compiling_an_onnx_file_only_when_it_parses_as_one(tmp_path):
    """A garbage `g.onnx` was "(an ONNX model: `aclserve compile g.onnx` makes an OM of it)",
    chosen by its name, and the compile then refused it (a new user's report)."""
    (tmp_path / "g.onnx").write_text("garbage\n")
    (tmp_path / "empty.onnx").write_bytes(b"")  # (parses, as an empty model with no graph)
    for name in ("g.onnx", "empty.onnx"):
        proc = run_cli("inspect", tmp_path / name)
        _assert_one_line_error(proc, "nor is it an ONNX model, whatever its name: it does not parse as one")
        assert "aclserve compile" not in proc.stderr, proc.stderr


def test_compile_of_an_om_says_it_is_compiled_already(tmp_path):
    """It said "not an ONNX model (Error parsing message with type 'onnx.ModelProto')"."""
    om = tmp_path / "digits.om"
    om.write_bytes((REPO / "models" / "digits.om").read_bytes())
    (tmp_path / "atc.om").write_bytes(b"IMOD" + bytes(252))
    for path, kind in ((om, "a CPU OM"), (tmp_path / "atc.om", "an ATC OM")):
        _assert_one_line_error(run_cli("compile", path, "-o", tmp_path / "out.om"),
                               f"{path}: already {kind}, not an ONNX model: nothing to compile; serve it as it is "
                               f"(`aclserve inspect {path}` shows what it holds)")
    assert not (tmp_path / "out.om").exists()


def test_compile_of_an_onnx_file_cut_short_says_so(tmp_path):
    """A model whose copy stopped early read "not an ONNX model (Error parsing message ...)" as garbage
    does (a tester, t87): its top-level fields tell the two apart."""
    whole = (REPO / "models" / "digits.onnx").read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(whole[:len(whole) // 2])
    proc = run_cli("compile", cut, "-o", tmp_path / "out.om")
    _assert_one_line_error(proc, f"{cut}: not an ONNX model (Error parsing message with type 'onnx.ModelProto'); its "
                                 f"graph (field 7) runs to byte ")
    assert proc.stderr.rstrip().endswith(f"but the file ends at {len(whole) // 2:,}: cut short (a copy or download "
                                         "not finished?)"), proc.stderr
    cut.write_bytes(whole[:1])  # the ir_version's tag alone
    _assert_one_line_error(run_cli("compile", cut, "-o", tmp_path / "out.om"),
                           "the file ends inside a field's tag, length or value, at byte 1: cut short")
    garbage = tmp_path / "g.onnx"
    garbage.write_bytes(b"\x3a" + bytes(200))  # a graph field first: no model's bytes begin so
    proc = run_cli("compile", garbage, "-o", tmp_path / "out.om")
    assert "cut short" not in proc.stderr and "not an ONNX model" in proc.stderr, proc.stderr
