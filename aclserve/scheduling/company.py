"""Whether a request alone in the queue should wait for company: read from how requests arrive.

A lone request fills the smallest gear exactly, so by the rule of composition.py it runs at
once. That is right when nobody else is coming: one client that waits for each answer before it
asks again (the usual low-load case) would only lose the batch window. It is wrong when the host
paces the arrivals: then requests reach the batcher one by one while more wait upstream, and
each runs as a batch of one that pays a whole batch's host work (packing, thread hand-offs,
the answer's hop back to the loop). gRPC under load is the case seen: grpc.aio takes one call
of a method at a time off grpc core's queue, a few loop iterations apart, so at 64 clients
96 % of requests arrived with no other call being read and batches averaged 1.15 requests on
the light MLP, while the other calls waited inside grpc core where nothing can count them.

The sign that more are coming is overlap: a request that arrives while others of the batcher
are still pending (queued, or in a batch not yet answered). One client in a closed loop never
overlaps itself; host-paced arrivals overlap often (39 % of them on that gRPC run before any
request waited, more once lone requests wait). `Company` keeps the share of recent arrivals that
overlapped (an exponentially weighted average, weight WEIGHT); at OVERLAP_SHARE or more a
lone request waits for company, at most its batch window (max_queue_delay_ms: with 0 it never
waits). Only a lone request waits: a batch of two or more that fills a gear exactly still runs
at once, since under a closed loop of a few clients the rest may be all there is (holding those
too halved HTTP throughput at 8 clients).

Pure bookkeeping on the event-loop thread, owned by the batcher.
"""
from __future__ import annotations

WEIGHT = 1 / 8  # each arrival's weight in the overlap share
OVERLAP_SHARE = 1 / 4  # the share of overlapping arrivals from which a lone request waits


class Company:
    __slots__ = ("share",)

    def __init__(self):
        self.share = 0.0  # of recent arrivals, the weighted share that found others pending

    def arrived(self, overlapping: bool) -> None:
        """A request arrived; `overlapping`: others of the batcher were pending then."""
        self.share += WEIGHT * ((1.0 if overlapping else 0.0) - self.share)

    @property
    def expected(self) -> bool:
        """Whether a lone request should wait for company (within its batch window)."""
        return self.share >= OVERLAP_SHARE
