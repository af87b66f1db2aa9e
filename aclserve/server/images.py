"""The server's image decoding: one bounded DecodePool and one decoder (Pillow on the CPU, or
DVPP when images.decoder is dvpp: the chip's on an Ascend host, the CPU runtime's emulation of it
otherwise), shared by every model's image inputs.

Owned by ServerState; the app's lifecycle closes it after the repository (no request is left
to decode then). The DVPP decoder needs the started runtime, so it is opened on first use, in
a decode thread (opening makes ACL calls, which the event loop must not wait on).
"""
from __future__ import annotations

import heapq
import logging
import threading

from ..config import ImageSettings
from ..images import DecodePool
from ..images.decode import CpuDecoder
from ..images.header import ImageError, check_size, probe
from ..images.peak import decode_peak_bytes
from .contracts import Runtime

log = logging.getLogger(__name__)


class ImageDecoding:
    def __init__(self, settings: ImageSettings, runtime: Runtime):
        self.settings = settings
        self.pool = DecodePool(settings.workers, settings.max_pending)
        self._cpu = CpuDecoder(settings.max_pixels, settings.max_side)
        self._runtime = runtime
        self._decoder = None
        self._open_lock = threading.Lock()

    def decode(self, data, plan):
        """The decoder's call; runs in a pool thread."""
        decoder = self._decoder
        if decoder is None:
            with self._open_lock:
                if self._decoder is None:
                    self._decoder = self._open_decoder()
                decoder = self._decoder
        return decoder(data, plan)

    def _open_decoder(self):
        if self.settings.decoder == "dvpp":  # the CPU runtime's acl.media emulates DVPP: the same code runs
            from ..images.dvpp import DvppDecoder, DvppError
            try:
                return DvppDecoder(self._runtime, self._cpu, self.settings.dvpp_device)
            except DvppError as e:
                log.warning("DVPP unavailable (%s): decoding with Pillow", e)
        return self._cpu

    def dvpp_outcomes(self) -> dict[str, int] | None:
        """Images given to the DVPP decoder by what became of them (images/dvpp.py OUTCOMES), or
        None while no DVPP decoder is open (images.decoder cpu, DVPP unavailable, none decoded yet)."""
        counts = getattr(self._decoder, "outcome_counts", None)
        return counts() if counts is not None else None

    async def prepare(self, stage, inputs: dict, lease=None) -> None:
        """Decode the request's pictures into its image inputs' tensors; with `lease`, first
        charge what the decodes may hold at their peak (decode_charge). That charge is held
        until every decode has ended, on a lease of its own: a request cancelled meanwhile (its
        client gone) ends at once, while the decodes it began run on in the pool's threads."""
        charge = self.decode_charge(stage, inputs) if lease is not None else 0
        if not charge:
            await stage.prepare(inputs, self.pool, self.decode)
            return
        lease.take(charge, "decoding its images", "send fewer pictures per request, or smaller ones (their "
                   "pixels count, not their files' bytes)")
        decoding = lease.split(charge)
        await stage.prepare(inputs, self.pool, self.decode, on_ended=decoding.release)

    def decode_charge(self, stage, inputs: dict) -> int:
        """Bytes the request's decodes may hold at once: the peaks of its largest pictures (by
        their headers, images/peak.py), as many as the pool decodes at the same time. Not
        charged, pixels came without limit into the pool's threads: two 309 KB 16-bit PNGs of
        6300x6300 took the RSS to 1 GB."""
        peaks = []
        for _, plan, _, data in stage.pictures(inputs):
            try:
                info = probe(data)
                check_size(info, self.settings.max_pixels, self.settings.max_side)
            except ImageError:
                continue  # refused by its decode (400), with the row named
            peaks.append(decode_peak_bytes(info, plan))
        return sum(heapq.nlargest(max(1, self.pool.workers), peaks))

    def close(self) -> None:
        """Stop the pool (running decodes finish), then the decoder. Safe twice."""
        self.pool.close()
        with self._open_lock:
            if self._decoder is not None:
                self._decoder.close()
