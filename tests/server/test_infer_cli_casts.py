"""`aclserve infer` casts its inputs to the types the model's metadata declares, as the Python API
does: a cast that keeps the values is made and said, one that would change them is refused before
anything is sent (exit 2, bad input). Real server (affine: x FP32 [N,8], idx INT64 [N,3]), CPU runtime."""
import subprocess
import sys

import numpy as np


def _infer(server, cwd, *inputs: str) -> subprocess.CompletedProcess:
    given = [arg for pair in inputs for arg in ("-i", pair)]
    return subprocess.run([sys.executable, "-m", "aclserve", "infer", "affine", *given,
                           "--url", f"http://{server.url}"], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_float_data_for_an_integer_input_is_refused_before_it_is_sent(server, tmp_path):
    """A float32 .npy for an integer input went to the server, whose 400 (`datatype "FP32" does not
    match the model's INT64`) was exit 1, a server's error, where the README promised exit 2 as
    Engine refuses it (a tester's find)."""
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    np.save(tmp_path / "floats.npy", np.ones((1, 3), np.float32))
    np.save(tmp_path / "ints.npy", np.ones((1, 3), np.int32))
    refused = _infer(server, tmp_path, "x=x.npy", "idx=floats.npy")
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert refused.stderr == ("aclserve infer: error: input idx is float32, the model takes int64: a cast would "
                              "change its values; convert it first\n")
    cast = _infer(server, tmp_path, "x=x.npy", "idx=ints.npy")  # (int32 -> INT64 keeps them: made, and said)
    assert cast.returncode == 0, cast.stderr
    assert cast.stderr == "aclserve infer: input idx: int32 cast to INT64 as the model declares\n"
    assert cast.stdout.startswith("y float32 [1, 4]\n")


def test_a_byte_order_alone_is_no_cast_to_speak_of(server, tmp_path):
    """A big-endian float32 .npy is FP32: it goes in the machine's byte order with the answer of its
    little-endian twin, and nothing on stderr (it said `input x: >f4 cast to FP32 as the model
    declares`; a tester, t93)."""
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    np.save(tmp_path / "big.npy", x.astype(">f4"))
    np.save(tmp_path / "little.npy", x)
    np.save(tmp_path / "idx.npy", np.ones((1, 3), np.int64))
    big, little = (_infer(server, tmp_path, f"x={name}.npy", "idx=idx.npy") for name in ("big", "little"))
    assert (big.returncode, big.stderr) == (0, "")
    assert big.stdout == little.stdout and big.stdout.startswith("y float32 [1, 4]\n")
