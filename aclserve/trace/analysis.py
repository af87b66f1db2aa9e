"""What a trace says, in a form a person reads in ten seconds (`aclserve profile`).

Works on Chrome trace events as chrome.py writes them (so on a file from any aclserve server):
  device busy      the union of each instance's compute-stream spans over the traced window
  copy overlap     the share of stream copy time (H2D, D2H) spent while that instance's compute
                   stream was executing (a direct batch's copies run on that stream: never)
  stages           per request: receive, decode, queue, execute (split into pack, copy in,
                   compute, copy out, unpack, and "hand-offs": waiting between the event loop,
                   the launcher and completion threads), encode, and the rest ("other")
  p99              the same split, averaged over the requests at or above the 99th percentile
  cost             each stage's total time over the run, a batch's stages counted once per batch
                   (wall-clock: a stage preempted counts the time it waited)
  process CPU      in-process, the server's CPU time split by the threads that took it (host_cpu.py):
                   shares of CPU come from CPU time, never from the spans' wall-clock durations
  verdict          device-bound when the busiest compute stream exceeded DEVICE_BOUND, on an NPU
                   (the CPU runtime's compute stream is the host's cores: host work); else, the
                   server's threads kept waiting for a core (HOST_WAITED) while its CPU quota
                   throttled it, all of the quota used (QUOTA_USED): held back by its quota; else,
                   they kept waiting for a core it left to others (HOST_SPARE), the host's CPU
                   taken by other processes; else, when the host
                   bounds the run (its traced stages HOST_SHARE of a request's time or more, or
                   the server's CPU, when known, HOST_BUSY_CORES or more), the threads
                   that took the most of the server's CPU when known (the CPU runtime's streams,
                   its compute, on the host's cores: compute-bound on the host), else the host
                   stage with the most traced time (wall-clock, against the other host stages);
                   else neither bounds it: "queueing" when the queue is the largest part of a
                   request's time, "undetermined" otherwise, with the parts that are largest
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

from .chrome import REQUESTS_PROCESS, STREAM_TRACKS
from .host_cpu import STREAMS, HostCpu

DEVICE_BOUND = 0.85
# Below DEVICE_BOUND the host bounds the run when its traced stages are this much of a request's
# time, or (CPU time known) when the server used this many cores: below it the event loop, one
# thread under the interpreter lock, idled at least half the run
HOST_SHARE = 0.5
HOST_BUSY_CORES = 0.5
# The host's CPU was taken by other processes when the server's threads, together, waited for a
# core (runnable, not running) this much of the run or more while it left HOST_SPARE of the cores
# it may use: it was held back, not idle, so its wall-clock figures (queue, hand-offs) include the wait
HOST_WAITED = 0.5
HOST_SPARE = 0.25
# A CPU quota (cgroups: docker --cpus, Kubernetes limits.cpu) throttling the server keeps its threads
# runnable, not running, as other processes do: the quota, not they, held it back when it throttled
# the server and the server used this much of the quota or more (no free core would have run it).
# Throttled time is per CPU and the wait per thread (four threads waiting out one throttled CPU's
# 2.1 s waited 5 s), so the two are not weighed against each other
QUOTA_USED = 0.9
REQUEST_PHASES = ("receive", "decode", "queue", "execute", "encode")
BATCH_PHASES = ("pack", "copy in", "compute", "copy out", "unpack")
HOST_STAGES = ("decode", "encode", "pack", "unpack", "copy in", "copy out")
HOST_COMPUTE = "the CPU runtime's compute"
# a direct batch's copies: drawn on its compute stream's track (servers before 2026-12-06 wrote "H2D #N",
# "pack #N" and so on for every batch span: read too)
_DIRECT_COPIES = ("H2D batch #", "D2H batch #", "H2D #", "D2H #")


@dataclass
class Summary:
    requests: int = 0  # answered (status 200, or none recorded): the figures below are theirs
    failed: int = 0  # traced with another status (refused, timed out): left out of the figures
    window_s: float = 0.0
    device_busy: dict[str, float] = field(default_factory=dict)  # instance -> fraction of the window
    copy_overlap: float | None = None  # None: no stream copies traced
    stages_us: dict[str, float] = field(default_factory=dict)  # mean per request
    p99_ms: float = 0.0
    p99_stages: dict[str, float] = field(default_factory=dict)  # share of the p99 requests' time
    host: HostCpu | None = None  # the server's CPU over the run, when known (in-process)
    compute_on_host: bool = False  # the CPU runtime's: its compute is part of the host's CPU
    cost_s: dict[str, float] = field(default_factory=dict)  # stage -> total seconds (batches once)
    verdict: str = ""


def _overlap(span: tuple[float, float], merged: list[tuple[float, float]], ends: list[float]) -> float:
    """How much of `span` the disjoint, sorted `merged` spans cover (`ends`: their ends), found
    by bisection: a trace holds tens of thousands of batches."""
    a, b = span
    total = 0.0
    for x, y in itertools.islice(merged, bisect.bisect_right(ends, a), None):
        if x >= b:
            break
        total += min(b, y) - max(a, x)
    return total


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _batch_id(name: str) -> int | None:
    head, sep, tail = name.rpartition("#")
    return int(tail) if sep and tail.isdigit() else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _id(value) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def malformed(events: list) -> str | None:
    """What makes `events` unreadable to summarize() and the PNG (a file written by another tool,
    or damaged), naming the first such event; None when they read."""
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            return f"event {i} is not an object"
        args = e.get("args", {})
        if not isinstance(args, dict):
            return f"event {i}: args is not an object"
        if e.get("ph") == "X":
            if not (isinstance(e.get("name"), str) and _number(e.get("ts")) and _number(e.get("dur"))
                    and _id(e.get("pid")) and _id(e.get("tid")) and (args.get("batch") is None or _id(args["batch"]))):
                return f"event {i}: a span needs name, ts, dur, pid and tid (and args.batch an id)"
        elif e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            if not (isinstance(args.get("name"), str) and _id(e.get("pid"))
                    and (e["name"] == "process_name" or _id(e.get("tid")))):
                return f"event {i}: a {e['name']} needs pid, tid and args.name"
    return None


def without_requests(events: list[dict], ids: set[str]) -> list[dict]:
    """The events but the request spans of the requests named `ids` (`aclserve profile`'s cut ones: its
    summary covers the requests it counts); their phases and batches stay (a batch holds others too)."""
    if not ids:
        return events
    return [e for e in events if not (e.get("ph") == "X" and str(e.get("name")).startswith("request ")
                                      and isinstance(e.get("args"), dict) and e["args"].get("request_id") in ids)]


def summarize(events: list[dict], host: HostCpu | None = None, compute_on_host: bool = False) -> Summary:
    spans = [e for e in events if e.get("ph") == "X"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    requests, failed, children = [], [], {}
    batch_parts: dict[int, dict[str, float]] = {}
    compute: dict[int, list[tuple[float, float]]] = {}
    copies: dict[int, list[tuple[float, float]]] = {}
    host_copy = 0.0
    for e in spans:
        start, dur = e["ts"], e["dur"]
        name = e["name"]
        if processes.get(e["pid"]) == REQUESTS_PROCESS:
            if name.startswith("request "):
                (requests if e.get("args", {}).get("status", 200) == 200 else failed).append(e)
            else:
                children.setdefault(e["tid"], []).append(e)
            continue
        bid = _batch_id(name)
        part = STREAM_TRACKS.get(threads.get((e["pid"], e["tid"]), ""))
        if part == "compute" and name.startswith(_DIRECT_COPIES):  # a direct batch's, on its compute stream
            part = "copy in" if name.startswith("H2D") else "copy out"
        if part == "compute":
            compute.setdefault(e["pid"], []).append((start, start + dur))
        elif part is not None:
            copies.setdefault(e["pid"], []).append((start, start + dur))
        elif name.startswith("memcpy H2D"):  # host copies: traces of servers before 2026-12-01
            part, host_copy = "copy in", host_copy + dur
        elif name.startswith("memcpy D2H"):
            part, host_copy = "copy out", host_copy + dur
        elif name.startswith(("pack batch #", "pack #")):
            part = "pack"
        elif name.startswith(("unpack batch #", "unpack #")):
            part = "unpack"
        if part and bid is not None:
            parts = batch_parts.setdefault(bid, {})
            parts[part] = parts.get(part, 0.0) + dur
    s = Summary(requests=len(requests), failed=len(failed), host=host, compute_on_host=compute_on_host)
    if not requests:  # (a refusal's few microseconds averaged in made "per request" and its p99 theirs)
        s.verdict = f"no answered requests among {len(failed)} traced: nothing to say" if failed else \
            "no traced requests: nothing to say"
        return s
    t0 = min(r["ts"] for r in requests)
    t1 = max(r["ts"] + r["dur"] for r in requests)
    window = max(t1 - t0, 1e-9)
    s.window_s = window / 1e6
    merged = {pid: _merge(spans_) for pid, spans_ in compute.items()}  # each device's busy spans, once
    for pid, busy in merged.items():  # (within the window: a batch after the last request counted is none of theirs)
        within = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in busy)
        s.device_busy[processes.get(pid, str(pid))] = min(1.0, within / window)
    copy_total = sum(b - a for spans_ in copies.values() for a, b in spans_) + host_copy
    if copy_total > 0:
        overlapped = 0.0
        for pid, spans_ in copies.items():
            busy = merged.get(pid, [])
            ends = [y for _, y in busy]
            overlapped += sum(_overlap(c, busy, ends) for c in spans_)
        s.copy_overlap = overlapped / copy_total
    for kids in children.values():
        kids.sort(key=lambda e: e["ts"])
    starts = {tid: [e["ts"] for e in kids] for tid, kids in children.items()}
    rows = [_stages(r, children.get(r["tid"], []), starts.get(r["tid"], []), batch_parts) for r in requests]
    keys = list(REQUEST_PHASES[:3]) + ["hand-offs"] + list(BATCH_PHASES) + ["encode", "other"]
    s.stages_us = {k: sum(row.get(k, 0.0) for row in rows) / len(rows) for k in keys}
    totals = sorted(row["total"] for row in rows)
    p99 = totals[min(len(totals) - 1, math.ceil(0.99 * len(totals)) - 1)]
    s.p99_ms = p99 / 1000.0
    tail = [row for row in rows if row["total"] >= p99]
    tail_total = sum(row["total"] for row in tail) or 1.0
    s.p99_stages = {k: sum(row.get(k, 0.0) for row in tail) / tail_total for k in keys}
    for k in ("decode", "encode"):
        s.cost_s[k] = sum(row.get(k, 0.0) for row in rows) / 1e6
    for k in BATCH_PHASES:
        s.cost_s[k] = sum(parts.get(k, 0.0) for parts in batch_parts.values()) / 1e6
    s.verdict = _verdict(s)
    return s


def _stages(request: dict, kids: list[dict], starts: list[float], batch_parts: dict[int, dict[str, float]]
            ) -> dict[str, float]:
    a, b = request["ts"], request["ts"] + request["dur"]
    row: dict[str, float] = {"total": request["dur"]}
    for kid in kids[bisect.bisect_left(starts, a):bisect.bisect_right(starts, b)]:
        if kid["ts"] + kid["dur"] <= b + 1e-3 and kid["name"] in REQUEST_PHASES:
            row[kid["name"]] = row.get(kid["name"], 0.0) + kid["dur"]
    execute = row.pop("execute", 0.0)
    parts = batch_parts.get(request.get("args", {}).get("batch"), {})
    inside = 0.0
    for part in BATCH_PHASES:
        row[part] = min(parts.get(part, 0.0), execute - inside)
        inside += row[part]
    row["hand-offs"] = max(0.0, execute - inside)
    row["other"] = max(0.0, row["total"] - sum(v for k, v in row.items() if k != "total"))
    return row


def _verdict(s: Summary) -> str:
    busy = max(s.device_busy.values(), default=0.0)
    if busy >= DEVICE_BOUND and not s.compute_on_host:  # (the CPU runtime's "device" is the host's cores)
        return (f"device-bound: the compute stream was busy {busy:.0%} of the time; more instances or "
                f"devices help, host work does not")
    if _quota_held(s.host):
        return _quota_verdict(s.host, busy)
    if _taken(s.host):
        return _taken_verdict(s.host, busy)
    request_us = max(sum(s.stages_us.values()), 1e-9)
    host_share = sum(s.stages_us.get(k, 0.0) for k in HOST_STAGES) / request_us
    cores = s.host.used if s.host is not None else None
    if host_share >= HOST_SHARE or (cores is not None and cores >= HOST_BUSY_CORES) or busy >= DEVICE_BOUND:
        return _host_verdict(s, busy, host_share, request_us)
    # (a host stage that is most of a little host time is not what the requests wait for)
    host = f"traced stages {_share(host_share)} of a request's {request_us / 1000:.3g} ms"
    if cores is not None:
        host += f", {cores:.2f} CPU cores used"
    neither = f"neither the host ({host}) nor the device (busy {busy:.0%}; device-bound from {DEVICE_BOUND:.0%})"
    shares = sorted(((k, v / request_us) for k, v in s.stages_us.items() if v / request_us >= 0.005),
                    key=lambda kv: -kv[1])
    if shares and shares[0][0] == "queue":
        rest = ", ".join(f"{k} {share:.0%}" for k, share in shares[1:3])
        return (f"queueing: a request waits in its queue {shares[0][1]:.0%} of its time ({rest}); {neither} "
                f"bounds it")
    return f"undetermined: {neither} bounds it; a request's time is " + ", ".join(
        f"{k} {share:.0%}" for k, share in shares[:3])


def _kept_waiting(cpu: HostCpu | None) -> bool:
    """Whether the server's threads, together, waited for a core HOST_WAITED of the run or more."""
    return cpu is not None and cpu.waited_s is not None and cpu.waited_s >= HOST_WAITED * cpu.seconds


def _quota_held(cpu: HostCpu | None) -> bool:
    return (_kept_waiting(cpu) and cpu.quota is not None and cpu.used >= QUOTA_USED * cpu.quota
            and (cpu.throttled_s or 0.0) > 0)


def _taken(cpu: HostCpu | None) -> bool:
    return _kept_waiting(cpu) and cpu.used <= cpu.cores - HOST_SPARE


def _own(cpu: HostCpu) -> str:
    if not cpu.roles:
        return ""
    role, share = _percentages(cpu.roles)[0]
    return f"; of its own CPU, {role} took {share}%"


def _taken_verdict(cpu: HostCpu, busy: float) -> str:
    return (f"host CPU taken by others: the server's threads waited {cpu.waited_s:.2f} s for a core (runnable, not "
            f"running) over the {cpu.seconds:.2f} s run while it used {cpu.used:.2f} of its {_cores(cpu.cores)}: "
            f"other processes held them, and the times above include that wait{_own(cpu)}; the device was busy "
            f"{busy:.0%}")


def _quota_verdict(cpu: HostCpu, busy: float) -> str:
    return (f"held back by its CPU quota: the server used {cpu.used:.2f} of its cgroup's CPU quota of "
            f"{_cores(cpu.quota)}, throttled {cpu.throttled_s:.2f} s by it, its threads waiting {cpu.waited_s:.2f} s "
            f"for a core (runnable, not running) over the {cpu.seconds:.2f} s run: the quota held them, not other "
            f"processes, and the times above include that wait; more instances share the quota, not add to it: a "
            f"larger one (docker --cpus, Kubernetes limits.cpu) helps{_own(cpu)}; the device was busy {busy:.0%}")


def _share(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.005 else "under 1%"


def _host_verdict(s: Summary, busy: float, host_share: float, request_us: float) -> str:
    """The threads that took the most of the server's CPU, known (in-process); else the host stage
    with the most traced time, against the other host stages (wall-clock, not CPU: --url)."""
    cpu = s.host
    if cpu is not None and cpu.roles:
        role, share = _percentages(cpu.roles)[0]  # (the share the CPU line gives it)
        took = f"{role} took {share}% of the server's CPU ({cpu.used:.2f} of {_cores(cpu.cores)})"
        if role == STREAMS:  # (the CPU runtime's alone: an NPU's compute is not the server's CPU)
            return f"compute-bound on the host's cores: {took}; {_sharing(cpu, busy)}"
        return f"host-bound: {took}; the device was busy {busy:.0%}"
    host = {k: s.cost_s.get(k, 0.0) for k in HOST_STAGES}
    if s.compute_on_host:
        host[HOST_COMPUTE] = s.cost_s.get("compute", 0.0)
    of = f"traced host time (itself {host_share:.0%} of a request's {request_us / 1000:.3g} ms)"
    stage, seconds = max(host.items(), key=lambda kv: kv[1])
    share = f"{stage} is {seconds / max(sum(host.values()), 1e-9):.0%} of {of}; the device was busy {busy:.0%}"
    if stage == HOST_COMPUTE:
        return f"compute-bound on the host's cores (an NPU takes the compute off them): {share}"
    return f"host-bound: {share}"


def _sharing(cpu: HostCpu, busy: float) -> str:
    """What more instances do on the CPU runtime: its compute shares the host's cores with the
    server's own work, so they add compute only while cores are free."""
    free = cpu.cores - cpu.used
    more = ("its cores are full: more instances would share them, not add to them" if free < HOST_BUSY_CORES
            else f"about {free:.1f} of its {_cores(cpu.cores)} free: more instances help up to them, not past")
    return (f"the compute and the host's work share those cores ({more}; an NPU takes the compute off them); "
            f"the compute stream was busy {busy:.0%}")


def _cores(count: float) -> str:
    return "1 core" if count == 1 else f"{count:.3g} cores"  # (a quota's may be a fraction: 0.3 cores)


def _percentages(parts: dict[str, float]) -> list[tuple[str, int]]:
    """Whole percentages of `parts`' total that add up to 100 (largest remainders rounded up),
    largest first."""
    total = sum(parts.values())
    if total <= 0:
        return []
    exact = {k: 100 * v / total for k, v in parts.items()}
    whole = {k: math.floor(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: whole[k] - exact[k])[:100 - sum(whole.values())]:
        whole[k] += 1
    return sorted(whole.items(), key=lambda kv: -kv[1])


def _cpu_line(cpu: HostCpu) -> str:
    line = f"process CPU   {cpu.cpu_s:.2f} s over {cpu.seconds:.2f} s ({cpu.used:.2f} of {_cores(cpu.cores)}"
    if cpu.quota is not None and cpu.quota <= cpu.cores:
        line += ", its CPU quota"
    if cpu.waited_s is not None:
        line += f"; its threads waited {cpu.waited_s:.2f} s for a core"
    if cpu.throttled_s is not None:
        line += f"; the quota throttled it {cpu.throttled_s:.2f} s"
    if not cpu.roles:
        return line + "): not split by thread (no /proc/self/task)"
    return line + "): " + ", ".join(f"{role} {share}%" for role, share in _percentages(cpu.roles) if share)


def format_summary(s: Summary) -> str:
    lines = [f"{s.requests:,} traced requests over {s.window_s:.2f} s"
             + (f" ({s.failed:,} more failed: left out of the figures below)" if s.failed else "")]
    for name, busy in sorted(s.device_busy.items()):
        lines.append(f"device busy   {busy:6.1%}  {name} (compute stream, from events)")
    if s.copy_overlap is not None:
        lines.append(f"copy overlap  {s.copy_overlap:6.1%}  of copy time ran while compute ran")
    total = sum(s.stages_us.values())
    lines.append(f"per request   {total / 1000:.3f} ms: " + ", ".join(
        f"{k} {v:.0f} us" for k, v in s.stages_us.items() if v >= 0.5))
    lines.append(f"at the p99    >= {s.p99_ms:.3f} ms: " + ", ".join(
        f"{k} {v:.0%}" for k, v in sorted(s.p99_stages.items(), key=lambda kv: -kv[1]) if v >= 0.005))
    if s.host is not None:
        lines.append(_cpu_line(s.host))
    lines.append(f"verdict       {s.verdict}")
    return "\n".join(lines)
