"""What an ONNX Runtime failure is, in the codes a device would give (and, for a run, in the
message acl.get_recent_err_msg gives the thread: _err_msg.py).

A run ONNX Runtime fails (ORT raises; an injected fault never gets there: faults.py) is one of:
- the host short of memory or threads (host_short): a device's 507011, which may pass;
- outputs its graph computes in other shapes than its OM's header declares at that batch (a Slice
  capping the batch at 2 rows in an OM compiled for 1,2,4: ORT refuses the output buffer bound at
  the header's [4, 3] for the [2, 3] it computes). Found by running it once more with ONNX Runtime
  allocating the outputs, not by ORT's wording. The header and graph disagree as they do where a
  header's sizes are smaller than its graph's (_model.LoadedModel._unrunnable), and it is refused
  the same way, GE's 145000 (a run's parameters invalid): the same run fails the same way on any
  device, so it is no device fault to retry (repository/retry.py), and ATC, which builds each
  gear's shapes, never writes such an OM;
- else the model's own failure on its data (an integer division by zero, an index past its
  table): a device's 507011 (an NPU's AI Core reports such a fault no differently), with ORT's
  reason as its message.
"""
from __future__ import annotations

import errno
import logging

from .. import constants as C
from . import _err_msg

log = logging.getLogger("aclserve.acl.cpu")


def host_short(error: BaseException) -> bool:
    """ONNX Runtime failed for want of host memory (std::bad_alloc; its library not mapped as it
    was imported) or a thread."""
    text = str(error)
    return isinstance(error, MemoryError) or any(
        words in text for words in ("bad_alloc", "can't start new thread", "Resource temporarily unavailable",
                                    "failed to map segment", "Cannot allocate memory"))


def out_of_descriptors(error: BaseException) -> bool:
    """A load failed for want of a descriptor (EMFILE, ENFILE: a Python OSError, or ORT's own
    words for one): where a device's GE cannot open or read the model file, it answers 145002,
    "model file missing or unreadable", and the server looks at the file (runtime/unread_file.py)."""
    if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
        return True
    return "Too many open files" in str(error)


def run_failed(model, batch: int, in_addrs: tuple, error: Exception) -> int:
    """The code of `model`'s run at `batch` (a LoadedModel; its inputs at `in_addrs`) that ONNX
    Runtime failed with `error`; the calling thread's error message says why (not naming the
    model's id, which each load changes: a load failure's reason stays one text, one /metrics
    series, over its retries)."""
    reason = " ".join(str(error).split())[:1000]
    log.error("model %d: execution failed: %s", model.id, reason)
    if not host_short(error):
        declared = [t.shape_at(batch) for t in model.info.outputs]
        computed = _computed_shapes(model, batch, in_addrs)
        if computed is not None and computed != declared:
            name, ours, theirs = next((t.onnx_name, c, d) for t, c, d in zip(model.info.outputs, computed, declared)
                                      if c != d)
            at = f" at batch {batch}" if model.info.gears else ""
            _err_msg.report(f"the model's graph computes output {name!r} as {list(ours)}{at}, where its OM declares "
                            f"{list(theirs)}: the OM's header and its graph disagree (compiled for a batch size it "
                            "does not serve)")
            return C.ACL_ERROR_GE_PARAM_INVALID
    _err_msg.report(f"the model failed in ONNX Runtime: {reason}")
    return C.ACL_ERROR_RT_MODEL_EXECUTE


def _computed_shapes(model, batch: int, in_addrs: tuple) -> list[tuple[int, ...]] | None:
    """The outputs' shapes its graph computes at `batch` on the inputs bound, ONNX Runtime
    allocating the outputs; None when that run fails too."""
    binding = model.inputs_bound(batch, in_addrs)
    for t in model.info.outputs:
        binding.bind_output(t.onnx_name, "cpu")
    try:
        model.session.run_with_iobinding(binding)
        return [tuple(value.shape()) for value in binding.get_outputs()]
    except Exception:  # (the model's failure on its data: said as ORT said it)
        return None
