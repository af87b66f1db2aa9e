"""`aclserve profile`'s mistakes, each one line before anything runs: flags of the other mode, a
model or a setting it cannot profile, outputs it could not write; its PNG is written to the name
given."""
from __future__ import annotations

import os
import shutil

import pytest

from tests import REPO
from tests.aclserve_command import run_aclserve


def test_profile_user_mistakes_are_one_line_each(tmp_path):
    cases = [(("--url", "nonsense"), "--url"),
             (("--url", "http://127.0.0.1:1"), "cannot reach"),  # nothing listens on port 1
             (("--url", "http://127.0.0.1:1", "--trace", "no/such/folder/t.json"), "no/such/folder"),
             (("--url", "http://127.0.0.1:1", "--png", "no/such/folder/t.png"), "no/such/folder"),
             # flags of the other mode did nothing
             (("--url", "http://127.0.0.1:1", "--models", "elsewhere"), "--models applies to the in-process mode"),
             (("--url", "http://127.0.0.1:1", "--device", "cpu"), "--device applies to the in-process mode"),
             (("--trace-dir", "traces"), "--trace-dir applies with --url"),
             (("--timeout", "5"), "--timeout applies with --url"),
             (("--url", "http://127.0.0.1:1", "--timeout", "nan"), "--timeout must be a positive number"),
             # as infer's (it took 1e12: a tester, t86)
             (("--url", "http://127.0.0.1:1", "--timeout", "1e12"), "at most 2,592,000 (30 days)")]
    for args, said in cases:
        proc = run_aclserve("profile", "m", "--seconds", "1", *args, cwd=tmp_path)
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr


def test_profile_says_in_one_line_what_it_cannot_profile(tmp_path):
    models = tmp_path / "models"  # (apart from the folder the trace goes to: profile writes nothing in it)
    models.mkdir()
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt", "digits.om"):
        shutil.copy(REPO / "models" / name, models / name)
    cases = [(("digits_image",), "takes encoded images (BYTES)"),
             (("digits", "--rows", "100000"), "exceeds the model's max_batch_size"),
             (("digits", "--device", "npu"), "CANN's `acl` module is not importable")]
    for args, said in cases:
        proc = run_aclserve("profile", *args, "--seconds", "1", "--models", str(models), cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr
    proc = run_aclserve("profile", "digits", "--seconds", "nan", "--models", str(models), cwd=tmp_path)
    assert proc.returncode == 2 and "--seconds finite" in proc.stderr
    assert not (tmp_path / "profile-digits.json").exists()


def test_profile_refuses_what_it_could_not_write_before_the_run(tmp_path):
    """A folder as --trace or --png was a traceback after the whole run (or, for --png, a
    folder.png beside it); a negative --png-window-ms drew an empty timeline."""
    (tmp_path / "out").mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    cases = [(("--trace", "out"), "cannot write out: it is a folder"),
             (("--png", "out"), "cannot write out: it is a folder"),
             (("--png", "t.png", "--png-window-ms", "-5"), "--png-window-ms must be positive"),
             (("--png-window-ms", "-3"), "--png-window-ms must be positive"),  # (was taken without --png)
             (("--models", "file"), "models folder 'file' is a file, not a folder")]
    for args, said in cases:
        proc = run_aclserve("profile", "digits", "--seconds", "0.5", "--models", "models", *args, cwd=tmp_path,
                            timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["file", "models", "out"]


def test_profile_png_is_written_to_the_name_given(tmp_path):
    """matplotlib took the format from the name: "timeline" became timeline.png, "t.txt" a traceback."""
    pytest.importorskip("matplotlib")
    from aclserve.trace.plot import render_png
    events = [{"ph": "X", "name": "compute", "pid": 1, "tid": 1, "ts": 0.0, "dur": 5000.0}]
    for name in ("timeline", "t.txt"):
        render_png(events, str(tmp_path / name), 20.0)
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG"), name
    assert sorted(os.listdir(tmp_path)) == ["t.txt", "timeline"]
