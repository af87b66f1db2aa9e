"""`aclserve profile`'s lines count one request as one ("1 request answered", "1 client"), as every message
writes a number of things (quoting.counted): its first line, and the line of a server gone mid-run. A run
that answers exactly one request is hard to make: the functions writing those lines, with the real Outcomes."""
from __future__ import annotations

import argparse

from aclserve.cli.load import Outcomes
from aclserve.cli.profile import _report
from aclserve.cli.profile_remote import answered_so_far


def first_line(tmp_path, capsys, outcomes: Outcomes, clients: int) -> str:
    args = argparse.Namespace(model="digits", clients=clients, rows=1, seconds=1.0, png=None)
    assert _report(args, str(tmp_path / "trace.json"), [], outcomes, None) == 0
    return capsys.readouterr().out.splitlines()[0]


def test_the_first_line_says_one_request_and_one_client_in_the_singular(tmp_path, capsys):
    line = first_line(tmp_path, capsys, Outcomes(answered=1, seconds=1.0, warm_up=Outcomes(answered=1, seconds=1.0)),
                      clients=1)
    assert line == (f"digits: 1 request answered in 1.0 s (1 req/s; after 1 in a 1.0 s warm-up, not counted), "
                    f"1 client, 1 row(s) each; trace: {tmp_path / 'trace.json'}")


def test_the_first_line_says_more_in_the_plural(tmp_path, capsys):
    line = first_line(tmp_path, capsys, Outcomes(answered=12_928, seconds=3.0), clients=8)
    assert line.startswith("digits: 12,928 requests answered in 3.0 s (4,309 req/s), 8 clients, 1 row(s) each; ")


def test_a_server_gone_says_one_request_answered_in_the_singular():
    assert answered_so_far(0, 0, None) == "1 request answered in the warm-up, before the run"
    warm = Outcomes(answered=1, seconds=1.0)
    assert answered_so_far(2, 1, warm) == "1 request answered (after 1 in a 1.0 s warm-up, not counted)"
    assert answered_so_far(5, 1, warm) == "4 requests answered (after 1 in a 1.0 s warm-up, not counted)"
