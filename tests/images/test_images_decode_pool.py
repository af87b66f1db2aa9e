"""The bounded decode pool: pending images bounded and answers kept in order; a decoding thread
that cannot start is a retry later."""
from __future__ import annotations

import asyncio
import threading

import pytest

from aclserve.errors import Overloaded, PayloadTooLarge, QueueFull
from aclserve.images import DecodePool


def test_pool_bounds_pending_images_and_keeps_order():
    async def main():
        pool = DecodePool(workers=2, max_pending=4)
        try:
            assert (await pool.map(lambda i: i * i, [1, 2, 3, 4])).results == [1, 4, 9, 16]
            gate = threading.Event()
            busy = asyncio.ensure_future(pool.map(lambda i: gate.wait(60), [1, 2, 3]))
            await asyncio.sleep(0)  # its three jobs are in
            with pytest.raises(QueueFull, match="images.max_pending"):  # saturated: retry later
                await pool.map(lambda i: i, [1, 2])
            gate.set()
            assert (await busy).results == [True] * 3
            # more than the pool ever takes at once: no retry can help
            with pytest.raises(PayloadTooLarge, match="holds 5 images, more than are decoded at once"):
                await pool.map(lambda i: i, list(range(5)))
            with pytest.raises(ValueError, match="row 1"):
                await pool.map(lambda i: (_ for _ in ()).throw(ValueError(f"row {i}")) if i else i, [0, 1, 2])
            await asyncio.sleep(0)
            for _ in range(100):  # the done callbacks release through the loop
                if pool.pending == 0:
                    break
                await asyncio.sleep(0.01)
            assert pool.pending == 0
        finally:
            pool.close()
        inline = DecodePool(workers=0, max_pending=1)
        assert (await inline.map(str, [1, 2, 3])).results == ["1", "2", "3"]  # workers 0: on the loop, no bound
        inline.close()
    asyncio.run(main())


def test_a_decoding_thread_that_cannot_start_is_a_retry_later(monkeypatch):
    """At the process's thread limit starting a thread raises "can't start new thread", which
    was taken for a shutdown: a 500 and a traceback (found by running the server under `ulimit -u`)."""
    def no_thread(thread):
        raise RuntimeError("can't start new thread")

    async def main():
        pool = DecodePool(workers=2, max_pending=4)
        try:
            monkeypatch.setattr(threading.Thread, "start", no_thread)
            with pytest.raises(Overloaded, match=r"image decoding cannot start a thread \(can't start new thread\)"):
                await pool.map(lambda i: i, [1, 2])
            assert pool.pending == 0  # nothing was queued for a thread that never came
            monkeypatch.undo()
            assert (await pool.map(lambda i: i * i, [1, 2])).results == [1, 4]
        finally:
            pool.close()
    asyncio.run(main())
