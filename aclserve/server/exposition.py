"""A /metrics family as plain rows, and the Prometheus text format (0.0.4) written from them.

prometheus_client's own path was most of a scrape: at 41 versions its families built ~5,600
Sample objects, label dicts and all, on the event loop (most of its ~18 ms there), and
generate_latest checked and escaped every label name of every line again (~90 ms of a worker
thread holding the GIL, so the loop stalled all the same). A Family holds (label values, value)
rows; `render` escapes each label value once a scrape and writes a family's lines through one
str.format template (a histogram series' 18 lines in one call): the text generate_latest writes,
byte for byte (tests/server/test_metrics_text.py compares the two, a real server's scrape among
them). `Family.prometheus()` is the same family as prometheus_client's, for that comparison and
any CollectorRegistry.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

KINDS = ("counter", "gauge", "histogram")
# the format `render` writes, named here: prometheus_client's CONTENT_TYPE_LATEST follows its own
# newest (0.26: "version=1.0.0"), which this text is not
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# lines written between two calls of render's `pause`: ~0.7 ms of a worker thread (~0.7 us a line at 1,000
# versions), the most the event loop then waits for the GIL it let go of (scrape_text.py)
CHUNK_LINES = 1000


class Family:
    """One metric family. A counter's name is without `_total` (written with it, as
    prometheus_client does). Rows: (label values, value); a histogram's (label values, counts
    per bucket, not cumulative, +Inf last, sum) over `bounds` (ascending, >= 0)."""

    __slots__ = ("kind", "name", "help", "labelnames", "bounds", "rows")

    def __init__(self, kind: str, name: str, help: str, labelnames: Sequence[str] = (),
                 bounds: Sequence[float] = ()):
        assert kind in KINDS, kind
        self.kind, self.name, self.help = kind, name, help
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(bounds)
        self.rows: list[tuple] = []

    def add(self, labels: tuple[str, ...], value: float) -> None:
        """A series: its label values (strings, in labelnames' order) and value (on the loop: no copy made)."""
        self.rows.append((labels, value))

    def prometheus(self):
        """The family as prometheus_client builds it (what generate_latest reads)."""
        if self.kind == "histogram":
            family = HistogramMetricFamily(self.name, self.help, labels=self.labelnames)
            names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
            for labels, counts, total_sum in self.rows:
                cumulative, total = [], 0
                for name, count in zip(names, counts):
                    total += count
                    cumulative.append((name, total))
                family.add_metric(list(labels), cumulative, sum_value=total_sum)
            return family
        made = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = made(self.name, self.help, labels=self.labelnames)
        for labels, value in self.rows:
            family.add_metric(list(labels), value)
        return family


def single(kind: str, name: str, help: str, value: float) -> Family:
    """A family of one series without labels."""
    family = Family(kind, name, help)
    family.add((), value)
    return family


def render(families: Iterable[Family], pause: Callable[[], None] | None = None) -> bytes:
    """The exposition text of `families`, in their order and their rows' order. `pause`, if given,
    is called after each CHUNK_LINES lines or so (a worker thread's: it gives the GIL back)."""
    text = _Text(pause)
    escaped = _Escaped()
    for family in families:
        name = family.name + "_total" if family.kind == "counter" else family.name
        text.out.append(f"# HELP {name} {_help(family.help)}\n# TYPE {name} {family.kind}\n")
        if family.kind == "histogram":
            _histogram(text, family, escaped.__getitem__)
        elif family.labelnames:
            labelled, value_of = _labels_format(family.labelnames), escaped.__getitem__
            for rows in slices(family.rows, CHUNK_LINES):
                text.out.extend(f"{name}{labelled(*map(value_of, labels))} {_number(value)}\n"
                                for labels, value in rows)
                text.wrote(len(rows))
        else:
            for _, value in family.rows:
                text.out.append(f"{name} {_number(value)}\n")
    return text.bytes()


class _Text:
    """The text being written, encoded a chunk at a time: one join and encode of all of it held the
    GIL for as long as they took (~11 MB at 1,000 versions)."""

    def __init__(self, pause: Callable[[], None] | None):
        self.out: list[str] = []
        self._pause = pause
        self._lines = 0
        self._chunks: list[bytes] = []

    def wrote(self, lines: int) -> None:
        self._lines += lines
        if self._lines >= CHUNK_LINES:
            self._chunk()
            if self._pause is not None:
                self._pause()

    def bytes(self) -> bytes:
        self._chunk()
        return b"".join(self._chunks)

    def _chunk(self) -> None:
        self._chunks.append("".join(self.out).encode("utf-8"))
        self.out.clear()
        self._lines = 0


def slices(rows: list, size: int) -> Iterator[list]:
    """`rows` in consecutive lists of `size` (the last shorter)."""
    for start in range(0, len(rows), size):
        yield rows[start:start + size]


def _histogram(text: _Text, family: Family, value_of) -> None:
    """Per series its buckets (cumulative), _count and _sum: one str.format of the family's
    block of lines, its placeholders the label values, then the numbers."""
    name, labelnames, n = family.name, family.labelnames, len(family.labelnames)
    les = [floatToGoString(b) for b in family.bounds] + ["+Inf"]
    bucket = _labels_template(labelnames + ("le",))  # `le` among the others in name order
    own = _labels_template(labelnames) if labelnames else ""
    lines = [f"{name}_bucket{bucket.replace('{%d}' % n, le)} {{{n + i}}}\n" for i, le in enumerate(les)]
    lines.append(f"{name}_count{own} {{{n + len(les)}}}\n{name}_sum{own} {{{n + len(les) + 1}}}\n")
    block, count_text = "".join(lines).format, _Counts().__getitem__
    series_lines = len(les) + 2
    for rows in slices(family.rows, max(1, CHUNK_LINES // series_lines)):
        for labels, counts, total_sum in rows:
            texts = list(map(count_text, accumulate(counts)))
            text.out.append(block(*map(value_of, labels), *texts, texts[-1], _number(total_sum)))
        text.wrote(len(rows) * series_lines)


def _labels_format(labelnames: tuple[str, ...]):
    """str.format of `{name="{0}",...}` for label values escaped, given in labelnames' order."""
    return _labels_template(labelnames).format


def _labels_template(labelnames: tuple[str, ...]) -> str:
    """`{name="{0}",...}` with braces doubled for str.format: names sorted, as generate_latest
    writes them (a label name cannot hold a brace)."""
    order = sorted(range(len(labelnames)), key=labelnames.__getitem__)
    return "{{" + ",".join(f'{labelnames[i]}="{{{i}}}"' for i in order) + "}}"


class _Counts(dict):
    """A histogram's cumulative counts (integers) as text, each number once a family."""

    def __missing__(self, count: int) -> str:
        text = self[count] = _number(count)
        return text


class _Escaped(dict):
    """Label values escaped as generate_latest escapes them (backslash, newline, double quote),
    each once a render: a model's name is on most lines."""

    def __missing__(self, label: str) -> str:
        escaped = self[label] = label.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        return escaped


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _number(value) -> str:
    """floatToGoString's text of `value`, most samples (counts, fractions, seconds) without its
    checks: below 1e6 a float is written as Python writes it, no exponent to move."""
    if value.__class__ is float and 0.0 <= value < 1e6:
        return repr(value)
    if value.__class__ is int and 0 <= value < 1_000_000:
        return f"{value}.0"
    return floatToGoString(value)
