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

    async def prepare(self, stage, inputs: dict) -> None:
        await stage.prepare(inputs, self.pool, self.decode)

    def close(self) -> None:
        """Stop the pool (running decodes finish), then the decoder. Safe twice."""
        self.pool.close()
        with self._open_lock:
            if self._decoder is not None:
                self._decoder.close()
