#!/usr/bin/env python3
"""Benchmark tables as charts (matplotlib, PNG), beside the Markdown the benchmarks print.

As a library: `line_chart` (one panel per measure, one line per series against x) and
`bar_chart` (grouped bars). As a command, it reads a Markdown table (a file, or stdin: no file
or `-`) such as the README's or a benchmark's output and draws the chosen columns against x,
one line per series (rows with the same values in the --series columns):

    python tools/charts.py README.md --after "**Server**" --x clients --y req/s --y "p99 ms" \
        --series model,body -o server.png

Numbers may carry thousands separators ("1,082"); rows whose x or y is not a number are skipped.
What cannot be drawn (no such table file or column, --after text not found, a column of no numbers,
an output folder that does not exist) is one usage line, exit status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def line_chart(path: str, title: str, x_label: str, panels: dict[str, dict[str, list[tuple[float, float]]]]) -> None:
    """panels: measure -> series name -> [(x, y), ...]."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (measure, series) in zip(axes[0], panels.items()):
        for name, points in series.items():
            points = sorted(points)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_xlabel(x_label)
        ax.set_ylabel(measure)
        ax.set_title(measure)
        if len({p[0] for s in series.values() for p in s}) > 2:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bar_chart(path: str, title: str, categories: list[str], series: dict[str, list[float]], y_label: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(len(series), 1)
    for k, (name, values) in enumerate(series.items()):
        ax.bar([i + k * width for i in range(len(categories))], values, width, label=name)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(categories))])
    ax.set_xticklabels(categories)
    ax.set_ylabel(y_label)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_markdown_table(text: str, after: str = "") -> list[dict[str, str]]:
    """The first pipe table of `text` (after the first line containing `after`) as rows of
    header -> cell text (bold markers removed)."""
    lines = [line.strip() for line in text.splitlines()]
    first = next((i for i, line in enumerate(lines) if after in line), None) if after else 0
    if first is None:
        raise ValueError(f"no line contains {after!r}")
    start = next((i for i, line in enumerate(lines) if i >= first and line.startswith("|")), None)
    if start is None:
        raise ValueError("no Markdown table found")
    cells = lambda line: [c.strip().strip("*") for c in line.strip("|").split("|")]  # noqa: E731
    header = cells(lines[start])
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, cells(line))))
    return rows


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").rstrip("%"))
    except (ValueError, AttributeError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", nargs="?", help="Markdown file (default, or -: stdin)")
    ap.add_argument("--x", required=True, help="column on the x axis")
    ap.add_argument("--y", action="append", required=True, help="column to draw (repeat: one panel each)")
    ap.add_argument("--series", default="", help="comma-separated columns naming a line (default: one line, all)")
    ap.add_argument("--after", default="",
                    help="use the first table after the first line containing this text (default: the first table)")
    ap.add_argument("--title", default="", help="the chart's title (default none)")
    ap.add_argument("-o", "--output", required=True, help="PNG file")
    args = ap.parse_args(argv)
    # what cannot be drawn is one usage line, exit status 2, as a bad --x is (these were tracebacks, and
    # a --y of text an empty chart, exit 0)
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        ap.error(f"-o/--output: no folder {folder}")
    from_stdin = args.table in (None, "-")
    source = "stdin" if from_stdin else args.table
    try:
        text = sys.stdin.read() if from_stdin else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        ap.error(f"cannot read {source}: {getattr(e, 'strerror', None) or e}")
    try:
        rows = parse_markdown_table(text, args.after)
    except ValueError as e:
        ap.error(f"{source}: {e}")
    keys = [k for k in args.series.split(",") if k]
    columns = list(dict.fromkeys(name for row in rows for name in row))  # (a short first row lacks some)
    for column in [args.x, *args.y, *keys]:
        if rows and column not in columns:
            ap.error(f"no column {column!r} (columns: {', '.join(columns)})")
    for column in [args.x, *args.y]:
        if not any(number(row.get(column)) is not None for row in rows):  # (a short row lacks a cell)
            ap.error(f"column {column!r} holds no numbers to draw")
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {y: {} for y in args.y}
    for row in rows:
        x = number(row.get(args.x))
        name = " / ".join(row.get(k, "") for k in keys) or "all"
        for y in args.y:
            value = number(row.get(y))
            if x is not None and value is not None:
                panels[y].setdefault(name, []).append((x, value))
    try:
        line_chart(args.output, args.title, args.x, panels)
    except OSError as e:  # (the folder was checked: a file it may not write, a full disk)
        print(f"charts: error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"{args.output}: {sum(len(s) for p in panels.values() for s in p.values())} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
