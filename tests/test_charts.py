"""tools/charts.py: a Markdown benchmark table (the README's server table) drawn as a chart."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import charts  # noqa: E402


def test_reads_the_readme_server_table():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        rows = charts.parse_markdown_table(f.read(), "**Server**")
    assert {"model", "body", "clients", "req/s", "p99 ms"} <= set(rows[0])
    assert {r["model"] for r in rows} == {"light MLP", "medium CNN"}
    assert charts.number("1,082") == 1082.0 and charts.number("-") is None


TABLE = ("| server | clients | req/s | p99 ms |\n|---|---:|---:|---:|\n"
         "| a | 1 | 1,000 | 1.0 |\n| a | 16 | 5,000 | 4.0 |\n| b | 1 | 900 | 2.0 |\n| b | 16 | - | 9.0 |\n")


def test_draws_throughput_and_p99_against_clients(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    table = tmp_path / "t.md"
    table.write_text(TABLE)
    out = tmp_path / "c.png"
    assert charts.main([str(table), "--x", "clients", "--y", "req/s", "--y", "p99 ms", "--series", "server",
                        "-o", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "7 points" in capsys.readouterr().out  # the "-" cell is skipped
    with pytest.raises(SystemExit):
        charts.main([str(table), "--x", "nope", "--y", "req/s", "-o", str(out)])


def test_a_dash_for_the_table_reads_stdin(tmp_path):
    """`charts.py - ...`, as other commands take `-`: it read a file named '-' (FileNotFoundError)."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "c.png"
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", "charts.py"), "-", "--x", "clients",
                           "--y", "req/s", "--series", "server", "-o", str(out)],
                          input=TABLE, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "3 points" in done.stdout and out.read_bytes()[:4] == b"\x89PNG"


def test_what_cannot_be_drawn_is_one_usage_line(tmp_path, capsys):
    """A missing table file, an --after text not found and an output folder that does not exist
    were tracebacks (exit 1) where a bad --x was one usage line (exit 2), and a --y column of no
    numbers wrote an empty chart, "0 points", and exited 0 (a tester, t80). Nothing here is drawn:
    no matplotlib needed."""
    table = tmp_path / "t.md"
    table.write_text("| server | body | clients | req/s |\n|---|---|---:|---:|\n| a | json | 1 | 1,000 |\n")
    out = str(tmp_path / "c.png")
    for argv, said in (([str(tmp_path / "nope.md"), "-o", out], "cannot read"),
                       ([str(table), "--after", "no such text", "-o", out], "no line contains 'no such text'"),
                       ([str(table), "-o", str(tmp_path / "no-folder" / "c.png")], "no folder"),
                       ([str(table), "--y", "body", "-o", out], "column 'body' holds no numbers")):
        with pytest.raises(SystemExit) as ended:
            charts.main(argv + ["--x", "clients", "--y", "req/s"])
        err = capsys.readouterr().err
        assert ended.value.code == 2 and "error: " in err and said in err, (argv, err)
    assert not os.path.exists(out)


def test_a_short_first_row_does_not_hide_a_column(tmp_path, capsys):
    """Columns were those of the first row: one short of cells made a later row's column
    "no column" (exit 2). Refused only when no row has it."""
    pytest.importorskip("matplotlib")
    table = tmp_path / "t.md"
    table.write_text("| clients | req/s | p99 ms |\n|---:|---:|---:|\n| 1 | 900 |\n| 2 | 1,700 | 3.5 |\n"
                     "| 4 | 2,000 | 6.0 |\n")
    out = tmp_path / "c.png"
    assert charts.main([str(table), "--x", "clients", "--y", "p99 ms", "-o", str(out)]) == 0
    assert "2 points" in capsys.readouterr().out
