"""Where a gear model's outputs keep their batch: dimension 0, or the model is refused at load.

The descriptor does not say. aclmdlGetOutputDims reports a dynamic-batch model's outputs at its
largest gear (CANN's aclmdlGetOutputDims page), so [8, 10] may be 8 rows of 10, a sequence-first
[T, N, ...] whose T is 8, or a tensor without a batch; the serving path lays every output out
and splits it along dimension 0 by rows (slot.py, packing.py), which would hand clients other
rows' values with no error. So each gear is set and the outputs' dims read back
(aclmdlGetCurOutputDims reports them at the gear last set): dimension 0 must be the gear and the
others the same at every gear. `aclserve compile` refuses such a model too (om/cpu_compile.py),
but an ATC OM dropped into the models folder never passes through it.
"""
from __future__ import annotations

import contextlib

from ..acl import check, check_handle, release
from ..acl import constants as C
from .device import LoadError


def refuse_outputs_not_batch_first(acl, model) -> None:
    """Raise LoadError naming the first output of `model` (an OmModel with gears, described)
    whose dims do not follow the gears. In the model's context; what it makes is freed."""
    index, size = model.dynamic_index, model.input_sizes[model.dynamic_index]
    with contextlib.ExitStack() as made:
        memory = check("rt.malloc", acl.rt.malloc(size, C.ACL_MEM_MALLOC_HUGE_FIRST))
        made.callback(lambda: release("rt.free", acl.rt.free(memory)))
        # set_dynamic_batch_size writes only the buffer at `index`: the inputs before it share it
        buffers = []
        for _ in range(index + 1):
            buffer = check_handle("create_data_buffer", acl.create_data_buffer(memory, size))
            made.callback(lambda b=buffer: release("destroy_data_buffer", acl.destroy_data_buffer(b)))
            buffers.append(buffer)
        dataset = check_handle("mdl.create_dataset", acl.mdl.create_dataset())
        made.callback(lambda: release("mdl.destroy_dataset", acl.mdl.destroy_dataset(dataset)))
        for buffer in buffers:
            check("mdl.add_dataset_buffer", acl.mdl.add_dataset_buffer(dataset, buffer))
        seen = [[] for _ in model.outputs]
        for gear in model.gears:
            check("mdl.set_dynamic_batch_size", acl.mdl.set_dynamic_batch_size(model.model_id, dataset, index, gear))
            for i, dims in enumerate(seen):
                dims.append(tuple(check("mdl.get_cur_output_dims", acl.mdl.get_cur_output_dims(model.desc, i))["dims"]))
    for spec, shapes in zip(model.outputs, seen):
        if any(not s or s[0] != g for s, g in zip(shapes, model.gears)) or len({s[1:] for s in shapes}) != 1:
            raise LoadError(f"model {model.name}: output {spec.name!r} is not batch-major (dims "
                            f"{[list(s) for s in shapes]} at batch sizes {list(model.gears)}); every output of "
                            "a dynamic-batch model needs the batch first (its dimension 0)")
