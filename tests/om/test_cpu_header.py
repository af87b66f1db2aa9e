"""A CPU OM's header has one reader (om/cpu_header.py): what `aclserve inspect` says of a header
is what the CPU runtime's loader does with it, a malformed header is refused by both with one
message naming the field, and a header changed after compile fails its checksum."""
from __future__ import annotations

import json

import pytest

from aclserve.errors import LoadError
from aclserve.om import container
from tests.tiny_models import affine_onnx, compile_cpu_om

from .conftest import run_cli


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("header")
    om = compile_cpu_om(affine_onnx(folder / "affine.onnx"), folder / "affine.om")
    return container.read(om)


def _write(path, header: dict, payload: bytes, checksum: bool = False):
    """An OM whose header is `header` as given: without a checksum (an OM from before it), or
    with the one the compiler writes."""
    data = container.encode(header, payload)
    if not checksum:
        prefix = container.PREFIX_SIZE
        hlen = int.from_bytes(data[12:16], "little")
        body = json.loads(data[prefix:prefix + hlen])
        body.pop("header_sha256", None)
        raw = json.dumps(body, indent=1, sort_keys=True).encode()
        data = data[:12] + len(raw).to_bytes(4, "little") + data[16:prefix] + raw + data[prefix + hlen:]
    path.write_bytes(data)
    return path


def _inspect_and_load(engine, path):
    proc = run_cli("inspect", path)
    with pytest.raises(LoadError) as refused:
        engine.load(path, warmup=False)
    return proc, str(refused.value)


@pytest.fixture(scope="module")
def engine():
    from aclserve import Engine
    with Engine(device="cpu") as engine:
        yield engine


def _header(compiled, **changes) -> dict:
    header = json.loads(json.dumps(compiled.header))
    for key in ("header_sha256", "payload_sha256"):
        header.pop(key, None)
    header.update(changes)
    return header


@pytest.mark.parametrize("change, field", [
    (lambda h: h["inputs"][0].update(label=h["inputs"][0].pop("name")), "inputs[0].name is not a non-empty string"),
    (lambda h: h["outputs"][0].update(datatype="FP16"), "outputs[0].datatype FP16 disagrees with its acl_dtype"),
    (lambda h: h["outputs"][0].update(dims="[1]"), "outputs[0].dims is not a list"),
    (lambda h: h["inputs"][0].pop("datatype") and h["inputs"][0].pop("acl_dtype"), "inputs[0].datatype is missing"),
    (lambda h: h.update(gears=[]), "gears: a ascend_mbatch_shape_data input but no gears"),
    (lambda h: h["inputs"][0].pop("datatype") and h["inputs"][0].update(acl_dtype=27),
     "inputs[0]: ACL data type 27 (BF16) has no KServe datatype"),
])
def test_inspect_and_the_loader_refuse_a_malformed_header_naming_the_field(tmp_path, compiled, engine, change, field):
    header = _header(compiled)
    change(header)
    path = _write(tmp_path / "bad.om", header, compiled.payload)
    proc, refusal = _inspect_and_load(engine, path)
    assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert field in refusal, refusal


def test_a_header_changed_after_compile_fails_its_checksum(tmp_path, compiled, engine):
    path = _write(tmp_path / "flipped.om", _header(compiled), compiled.payload, checksum=True)
    data = bytearray(path.read_bytes())
    at = data.index(b'"created": "') + 12  # a digit of its date changed: only the checksum sees it
    data[at] = ord("1") if data[at] != ord("1") else ord("2")
    path.write_bytes(bytes(data))
    proc, refusal = _inspect_and_load(engine, path)
    assert proc.returncode == 2 and "header checksum mismatch" in proc.stderr, proc.stderr
    assert "header checksum mismatch" in refusal, refusal


def test_an_om_from_before_the_checksum_still_loads_and_inspects(tmp_path, compiled, engine):
    path = _write(tmp_path / "old.om", _header(compiled), compiled.payload)
    assert "header_sha256" not in container.read_header(path)
    proc = run_cli("inspect", path)
    assert proc.returncode == 0 and "loads on the aclserve CPU runtime" in proc.stdout, proc.stderr
    engine.load(path, name="old", warmup=False).close()


def test_an_acl_data_type_aclserve_does_not_serve_is_named():
    """A BF16 tensor was "ACL data type 27, which aclserve cannot serve" (runtime/om_model.py, on
    an NPU: the CPU runtime refuses such a header first, above), a number to look up in CANN's
    headers. Every aclDataType code is named now."""
    from aclserve.dtypes import acl_type
    assert acl_type(27) == "ACL data type 27 (BF16)"
    assert [acl_type(code) for code in (16, 17, 13, 29, 42)] == [
        "ACL data type 16 (COMPLEX64)", "ACL data type 17 (COMPLEX128)", "ACL data type 13 (STRING)",
        "ACL data type 29 (INT4)", "ACL data type 42 (HIFLOAT4)"]
    assert acl_type(5) == "ACL data type 5 (not one of aclDataType)"
