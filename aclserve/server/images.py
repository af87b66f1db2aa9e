"""The server's image decoding: one bounded DecodePool and one decoder (Pillow on the CPU, or
DVPP on an Ascend host when images.decoder is dvpp), shared by every model's image inputs.

Owned by ServerState; the app's lifecycle closes it after the repository (no request is left
to decode then). The DVPP decoder needs the started runtime, so it is opened on first use, in
a decode thread (opening makes ACL calls, which the event loop must not wait on).
"""
from __future__ import annotations

import logging
import threading

from ..config import ImageSettings
from ..images import DecodePool
from ..images.decode import CpuDecoder
from ..images.header import ImageError, check_size, probe
from .contracts import Runtime

log = logging.getLogger(__name__)

# What decoding a picture holds at its peak, per pixel its header announces: Pillow's image and
# the copies of mode conversion and resizing (measured: 5-8 bytes for 16-bit PNGs, the worst; a
# JPEG decodes to 3 bytes a pixel at most, less when Pillow scales it down as it decodes)
DECODE_BYTES_PER_PIXEL = {"PNG": 8, "JPEG": 4}


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
        if self.settings.decoder == "dvpp":
            if self._runtime.kind != "npu":
                log.warning("images.decoder is dvpp but the runtime is the CPU one: decoding with Pillow")
            else:
                from ..images.dvpp import DvppDecoder, DvppError
                try:
                    return DvppDecoder(self._runtime, self._cpu)
                except DvppError as e:
                    log.warning("DVPP unavailable (%s): decoding with Pillow", e)
        return self._cpu

    async def prepare(self, stage, inputs: dict, lease=None) -> None:
        """Decode the request's pictures into its image inputs' tensors; with `lease`, first
        charge what the decodes may hold at their peak (decode_charge), given back after."""
        charge = self.decode_charge(stage, inputs) if lease is not None else 0
        if charge:
            lease.take(charge, "decoding its images")
        try:
            await stage.prepare(inputs, self.pool, self.decode)
        finally:
            if charge:
                lease.drop(charge)

    def decode_charge(self, stage, inputs: dict) -> int:
        """Bytes the request's decodes may hold at once: for each image input, its largest
        picture (by the size its header announces) times the pictures decoding at the same time
        (the pool's threads at most). Not charged, pixels came without limit into the pool's
        threads: two 309 KB 16-bit PNGs of 6300x6300 took the RSS to 1 GB."""
        total = 0
        for name in stage.plans:
            rows = inputs.get(name)
            if not isinstance(rows, list) or not rows:
                continue
            largest = 0
            for data in rows:
                try:
                    info = probe(data)
                    check_size(info, self.settings.max_pixels, self.settings.max_side)
                except ImageError:
                    continue  # refused by its decode (400), with the row named
                largest = max(largest, info.width * info.height * DECODE_BYTES_PER_PIXEL[info.format])
            total += largest * min(len(rows), max(1, self.pool.workers))
        return total

    def close(self) -> None:
        """Stop the pool (running decodes finish), then the decoder. Safe twice."""
        self.pool.close()
        with self._open_lock:
            if self._decoder is not None:
                self._decoder.close()
