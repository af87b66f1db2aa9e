"""What a soak run (tools/soak.py) saw, and its verdict: the good clients' answers, each 200
decoded and checked, the bombs' answers, and what failed the run.

Every failure is a line of `Tally.failures()` (or of soak_swaps.Swaps.report, the model swaps');
the run exits 1 when there is any. No request of a good client is expected to go unanswered,
chaos or not: the slow clients and the bombs have connections of their own (soak.py), and the
server answers every request it takes with a status (503 while a model is swapped or rebuilt).
"""
from __future__ import annotations

import json
from collections import Counter

import numpy as np

# a 503's reason, by its answer's error text: a full queue, the queue's deadline passed (behind
# an instance rebuilt, say), the model not ready or swapped, the request memory budget in use
UNAVAILABLE = (("queue full", ("queue is full",)),
               ("timed out in the queue", ("timed out after",)),
               ("model not ready, swapped or its instance rebuilt", ("is not ready", "was replaced by",
                                                                     "execution timeout")),
               ("memory budget in use", ("max_inflight_bytes",)))


def unavailable_reason(body: bytes) -> tuple[str, str]:
    """(the reason of a 503, from UNAVAILABLE or "other"; its answer's error text)."""
    try:
        text = str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        text = body[:200].decode(errors="replace")
    return next((reason for reason, words in UNAVAILABLE if any(w in text for w in words)), "other"), text


def decode_answer(header_length: str | None, raw: bytes) -> np.ndarray:
    """The first output of a 200's KServe v2 answer, binary (`header_length`: its
    Inference-Header-Content-Length) or JSON. Raises whatever a body that is not such an answer
    meets (bad JSON, a key missing, a shape its data does not fill, a truncated tensor)."""
    if header_length is not None:
        length = int(header_length)
        out = json.loads(raw[:length])["outputs"][0]
        return np.frombuffer(raw[length:], np.float32).reshape(out["shape"])
    out = json.loads(raw)["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


# The code of the device faults the soak injects (ACLSERVE_CPU_FAULTS: fault_spec): a runtime
# fault code (507xxx, handled as the device's failed execution, as 507011 is) that no CANN error
# has, so that a 500 saying it is one of ours; a real device fault (507011, say) says "failed on
# device" too, and fails the run. The batches in flight beside a faulted one fail with its code
# (their context stopped on it), so they count as injected too.
INJECTED_CODE = 507999


def fault_spec(probability: float) -> str:
    """ACLSERVE_CPU_FAULTS for the server: each execution fails with INJECTED_CODE at `probability`."""
    return f"execute:probability={probability},code={INJECTED_CODE}" if probability > 0 else ""


def injected(raw: bytes) -> bool:
    """Whether an answer's body is a fault the soak injected (its ACL code)."""
    return f"failed with {INJECTED_CODE}".encode() in raw


# what the server answers each bomb: a body over its limits (max_json_bytes, the inflated size),
# README "Limits"; a 503 (the request memory budget in use) is a failure too, as the soak's good
# clients hold a few KB
BOMB_STATUS = 413


class Tally:
    """The counts of one run. Good clients are the closed-loop ones whose answers are checked;
    every request of theirs is answered with a status or counted as a client error."""

    def __init__(self):
        self.status = Counter()  # the good clients' answers by status
        self.unavailable = Counter()  # the 503s by reason (unavailable_reason)
        self.unavailable_said: dict[str, str] = {}  # the first answer of each reason
        self.client_errors = Counter()  # good clients' requests with no answer, by exception
        self.client_error_said: dict[str, str] = {}  # the first of each kind
        self.latency: list[float] = []  # seconds, of the good clients' 200s and (at their timeout) timeouts
        self.timeouts = 0  # good clients' requests with no answer within the timeout: the server stalled
        self.checked = 0  # 200s compared with the reference
        self.wrong = 0  # of them: not the reference's answer, or no answer at all (undecodable)
        self.undecodable = 0
        self.undecodable_said = ""  # the first undecodable answer's error
        self.bombs = Counter()  # (kind, what it got: a status or an exception's name)
        self.tool = Counter()  # what the tool's other parts did: model swaps written, slow clients

    def client_error(self, error: BaseException) -> None:
        kind = type(error).__name__
        self.client_errors[kind] += 1
        self.client_error_said.setdefault(kind, str(error)[:160])

    def timed_out(self, timeout_s: float) -> None:
        """A request with no answer in `timeout_s`: in the latency at that (so that a stall shows in p99)."""
        self.timeouts += 1
        self.latency.append(timeout_s)

    def unavailable_answer(self, raw: bytes) -> None:
        reason, said = unavailable_reason(raw)
        self.unavailable[reason] += 1
        self.unavailable_said.setdefault(reason, said)

    def check(self, want: np.ndarray, header_length: str | None, raw: bytes) -> None:
        """A 200: its answer decoded and compared with the reference's `want`."""
        self.checked += 1
        try:
            got = decode_answer(header_length, raw)
        except Exception as e:  # any body that is not an answer: a wrong one
            self.wrong += 1
            self.undecodable += 1
            self.undecodable_said = self.undecodable_said or f"{type(e).__name__}: {e}"[:160]
            return
        if got.shape != want.shape or not np.allclose(got, want, atol=1e-5):
            self.wrong += 1

    def failures(self, alive: bool) -> list[str]:
        """Why the run failed, a line each (none: it passed)."""
        out = []
        if self.wrong:
            out.append(f"{self.wrong} wrong answers ({self.undecodable} of them undecodable)")
        if not self.checked:
            out.append("no answer was checked (not one 200)")
        if self.status.get(500):
            out.append(f"{self.status[500]} answers 500 that are no injected fault")
        if self.timeouts:
            out.append(f"{self.timeouts} good-client requests timed out (the server stalled)")
        if self.client_errors:
            out.append(f"{sum(self.client_errors.values())} good-client requests got no answer (client errors)")
        missed = {key: n for key, n in self.bombs.items() if key[1] != BOMB_STATUS}
        if missed:
            out.append(f"{sum(missed.values())} bombs not answered {BOMB_STATUS}: "
                       + ", ".join(f"{kind} -> {got}: {n}" for (kind, got), n in sorted(missed.items(), key=str)))
        if not alive:
            out.append("the server died")
        return out

    def print_report(self, alive: bool) -> list[str]:
        """Print what the run saw; returns its failures."""
        lat = np.array(self.latency) * 1000 if self.latency else np.zeros(1)
        answered = sum(self.status.values())
        print(f"requests answered: {answered}; good-client latency p50 {np.percentile(lat, 50):.1f} ms, "
              f"p99 {np.percentile(lat, 99):.1f} ms, max {lat.max():.1f} ms (timed out: {self.timeouts}, "
              f"each counted at its timeout); answers checked: {self.checked}, wrong answers: {self.wrong}"
              + (f" ({self.undecodable} undecodable, the first: {self.undecodable_said})" if self.undecodable else ""))
        for key, count in sorted(self.status.items(), key=lambda kv: str(kv[0])):
            print(f"  {key}: {count}")
            if key == 503:
                for reason, n in self.unavailable.most_common():
                    print(f"    {reason}: {n} (the first: {self.unavailable_said[reason][:160]})")
        for kind, count in sorted(self.client_errors.items()):
            print(f"  client error {kind}: {count} (the first: {self.client_error_said[kind]})")
        for (kind, got), count in sorted(self.bombs.items(), key=str):
            print(f"  {kind} -> {got}: {count}")
        for key, count in sorted(self.tool.items()):
            print(f"  {key}: {count}")
        return self.failures(alive)
