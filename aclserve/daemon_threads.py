"""Work started in a daemon thread of its own, or done in the caller's where no thread can be had
(at interpreter exit): the closes of instances, of an Engine and of a shutdown's devices."""
from __future__ import annotations

import threading
from typing import Callable


def run_in_thread(target: Callable[[], None], name: str) -> threading.Thread | None:
    """`target` started in a daemon thread, returned; or, where none can be started, run here (None)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown" (3.12.0-3.12.1), "can't start new thread"
        target()
        return None
    return thread
