"""`aclserve profile`: in-process and against a running server; the trace it writes, its summary,
its PNG."""
from __future__ import annotations

import json
import re

import pytest

from aclserve.cli import main

from tests.serving import ServerThread, server_config
from tests.tiny_models import save_graph, token_graph


def _check(out: str, trace_path):
    assert "verdict" in out and "device busy" in out and "at the p99" in out
    events = json.loads(trace_path.read_bytes())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"].startswith("compute batch #") for e in events)
    assert any(e["ph"] == "s" for e in events)


def test_profile_in_process_with_png(models_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    trace, png = tmp_path / "p.json", tmp_path / "p.png"
    assert main(["profile", "double", "--models", str(models_dir), "--device", "cpu", "--seconds", "1",
                 "--clients", "4", "--rows", "2", "--trace", str(trace), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    _check(out, trace)
    assert "process CPU" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_in_process_gives_shares_of_cpu_that_add_up(models_dir, tmp_path, capsys):
    """The CPU line divided the spans' wall-clock time by the process's CPU time: `compute 146%` on
    a shared core (a tester's), the event loop's share left out. A real run's shares are of the
    threads' CPU time: whole percentages adding up to 100, the event loop's and the compute's among
    them."""
    assert main(["profile", "double", "--models", str(models_dir), "--device", "cpu", "--seconds", "0.5",
                 "--clients", "2", "--trace", str(tmp_path / "p.json")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("process CPU"))
    shares = dict((role, int(share)) for role, share in re.findall(r"(?:: |, )([a-zA-Z][^%]*?) (\d+)%", line))
    assert sum(shares.values()) == 100, line
    assert "event loop (decode, batching, encode)" in shares and "CPU runtime streams (compute, copies)" in shares


def test_profile_against_a_url(models_dir, tmp_path, capsys):
    srv = ServerThread(server_config(models_dir, trace_dir=str(tmp_path / "traces"))).start()
    try:
        trace = tmp_path / "remote.json"
        import tritonclient.http as http
        with http.InferenceServerClient(srv.url) as client:  # the model's own settings, to be kept
            client.update_trace_settings(model_name="double", settings={"trace_rate": "7", "trace_file": "mine.json"})
            client.update_trace_settings(settings={"trace_count": "50"})  # a global one it follows
            before = client.get_trace_settings(model_name="double")
        assert main(["profile", "double", "--url", f"http://{srv.url}", "--trace-dir", str(tmp_path / "traces"),
                     "--seconds", "1", "--clients", "3", "--trace", str(trace)]) == 0
        _check(capsys.readouterr().out, trace)
        with http.InferenceServerClient(srv.url) as client:
            # left as found (they were cleared, the model following the global settings)
            assert client.get_trace_settings(model_name="double") == before
            assert before["trace_level"] == ["OFF"] and before["trace_rate"] == "7"
            client.update_trace_settings(settings={"trace_count": "60"})  # still followed, not copied
            assert client.get_trace_settings(model_name="double")["trace_count"] == "60"
    finally:
        srv.close()


def test_profile_refuses_bad_arguments(models_dir, capsys):
    assert main(["profile", "double", "--models", str(models_dir), "--seconds", "0"]) == 2
    assert main(["profile", "nope", "--models", str(models_dir), "--device", "cpu", "--seconds", "0.2"]) == 2
    err = capsys.readouterr().err
    assert "must be positive" in err and "model 'nope'" in err


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory):
    """tokens.onnx dropped into a folder: its compile finds that `ids` indexes a table of 50 rows,
    and the server refuses ids outside 0..49 (both modes' loads share its compile cache)."""
    folder = tmp_path_factory.mktemp("profile_tokens")
    save_graph(token_graph(), folder / "tokens.onnx")
    return folder


def test_profile_sends_integer_inputs_within_the_value_range_in_process(tokens_dir, tmp_path, capsys):
    """Every input was drawn from a standard normal: a negative id, "model 'tokens' refused the
    request: input 'ids': value -2 is outside 0..49", exit 2."""
    assert main(["profile", "tokens", "--models", str(tokens_dir), "--device", "cpu", "--seconds", "0.5",
                 "--clients", "2", "--rows", "4", "--trace", str(tmp_path / "p.json")]) == 0, capsys.readouterr().err
    assert "refused" not in capsys.readouterr().out


def test_profile_sends_integer_inputs_within_the_value_range_of_a_url(tokens_dir, tmp_path, capsys):
    """The model's metadata gives the range (its input's `value_range` parameter)."""
    with ServerThread(server_config(tokens_dir, trace_dir=str(tmp_path / "traces"))) as srv:
        assert main(["profile", "tokens", "--url", f"http://{srv.url}", "--trace-dir", str(tmp_path / "traces"),
                     "--seconds", "0.5", "--clients", "2", "--rows", "4", "--trace", str(tmp_path / "r.json")]) == 0
    assert "refused" not in capsys.readouterr().out
