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
from ..images.dvpp import plan_refusals
from ..images.header import ImageError, check_size, probe
from ..images.peak import decode_peak_bytes
from .contracts import Runtime

log = logging.getLogger(__name__)


class ImageDecoding:
    def __init__(self, settings: ImageSettings, runtime: Runtime):
        self.settings = settings
        self.pool = DecodePool(settings.workers, settings.max_pending)
        self._cpu = CpuDecoder(settings.max_pixels, settings.max_side, settings.max_scan_pixels)
        self._runtime = runtime
        self._decoder = None
        self._open_lock = threading.Lock()

    @property
    def off_loop(self) -> bool:
        """Whether pictures decode in the pool's threads (workers = 0: on the event loop)."""
        return self.pool.workers > 0

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

    def on_repository_event(self, event: str, name: str, version=None, served=None, **info) -> None:
        """Listener for ModelRepository.add_listener: with images.decoder dvpp, one INFO line for
        each image input of a version put in service whose pictures DVPP never takes (its plan
        alone rules them out: dvpp.plan_refusals), saying why; found by an independent tester, to
        whom an ImageNet-style center_crop input decoding on the CPU said nothing."""
        stage = getattr(served, "images", None)
        if event not in ("loaded", "reloaded") or self.settings.decoder != "dvpp" or stage is None:
            return
        for input_name, plan in stage.plans.items():
            why = plan_refusals(plan)
            if why:
                log.info("%s:%s: image input %r never decodes on DVPP (images.decoder: dvpp): %s; its pictures "
                         "decode on the CPU", name, version, input_name, "; ".join(why))

    def dvpp_outcomes(self) -> dict[str, int] | None:
        """Images given to the DVPP decoder by what became of them (images/dvpp.py OUTCOMES), or
        None while no DVPP decoder is open (images.decoder cpu, DVPP unavailable, none decoded yet)."""
        counts = getattr(self._decoder, "outcome_counts", None)
        return counts() if counts is not None else None

    async def prepare(self, stage, inputs: dict, lease=None, wait_s: float = 0.0) -> int:
        """Decode the request's pictures into its image inputs' tensors; with `lease`, first
        charge those tensors (a row of the model input per picture, in its dtype: stage.
        tensor_bytes; before any picture is probed), then what the decodes may hold at their
        peak (decode_charge), both before any is decoded. The peak is held until every decode
        has ended, on a lease of its own: a request cancelled meanwhile (its client gone) ends
        at once, while the decodes it began run on in the pool's threads. The tensors' charge is
        held while either holds them: the decodes, which write their rows, and the request,
        whose lease takes it over once they are decoded (and holds it until the answer is
        built, as other decoded tensors). Uncharged, 32 PNGs of one pixel for a 3x1024x1024
        float input took 683 MB. `wait_s`: the longest wait for a decode thread (the request's
        queue deadline: DecodePool.map); returns the ns waited."""
        if lease is None:
            return await stage.prepare(inputs, self.pool, self.decode, wait_s=wait_s)
        tensors = stage.tensor_bytes(inputs)
        lease.take(tensors, "the input tensors of its images", lambda: _fewer_pictures(stage, inputs))
        charge = self.decode_charge(stage, inputs)
        lease.take(charge, "decoding its images", "send fewer pictures per request, or smaller ones (their "
                   "pixels count, not their files' bytes, and their metadata: ICC profiles, EXIF, comments)")
        decoding = lease.split(charge)
        written = _SharedCharge(lease.split(tensors))

        def decodes_ended() -> None:
            decoding.release()
            written.let_go()
        try:
            waited_ns = await stage.prepare(inputs, self.pool, self.decode, decodes_ended, wait_s)
        except BaseException:
            written.let_go()
            raise
        lease.take_over(written.lease)
        return waited_ns

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


class _SharedCharge:
    """A charge two holders share (a request and its decodes): released when both let go."""

    __slots__ = ("lease", "_holders")

    def __init__(self, lease):
        self.lease = lease
        self._holders = 2

    def let_go(self) -> None:
        self._holders -= 1
        if not self._holders:
            self.lease.release()


def _fewer_pictures(stage, inputs: dict) -> str:
    """The advice of a 413 for the tensors of a request's pictures: their count is what counts."""
    name, plan = max(((name, plan) for name, plan in stage.plans.items() if isinstance(inputs.get(name), list)),
                     key=lambda named: named[1].row_bytes)
    return (f"send fewer pictures per request (each is a row of {plan.row_bytes / 2**20:.1f} MiB of input "
            f"'{name}', whatever the size of its file)")
