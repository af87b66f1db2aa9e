"""ImageStage: the image inputs of one served version, and the step that turns the encoded
images of a request into that version's input tensors.

Built when the version loads (plans checked against the model then); `prepare` runs on the
event loop and hands each image to the decode pool as its own job, so the rows of one request
decode in parallel and the device keeps computing other batches meanwhile. A bad image fails
the request with 400 naming the input and the row.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Mapping, Sequence

import numpy as np

from ..config import ConfigError, ImageInput, TensorOptions
from ..errors import InvalidInput
from ..om.aipp import unit_scale_warning
from ..runtime.types import TensorSpec
from .header import ImageError
from .plan import ImagePlan, PlanError, build_plan

log = logging.getLogger(__name__)


class ImageStage:
    def __init__(self, plans: Mapping[str, ImagePlan]):
        self.plans = dict(plans)

    @classmethod
    def for_model(cls, options: Mapping[str, TensorOptions], inputs: Sequence[TensorSpec],
                  model: str) -> "ImageStage | None":
        """None when the model has no image input. Raises ConfigError at load, naming the setting
        that does not fit by its dotted key (inputs.x.image.mean); `model`: its name, for the lines
        logged. model_defaults' image settings, meant for every model, fail none: an input they do
        not fit (or a model without the input) takes its tensor, and a uint8 input that only their
        mean/std do not fit (an OM's, normalised by its AIPP) takes pictures without them, each
        said in an INFO line."""
        specs = {s.name: s for s in inputs}
        plans = {}
        for name, opt in options.items():
            if opt.image is None:
                continue
            try:
                if name not in specs:
                    raise PlanError(name, f"the model has no input {name!r} (inputs: {', '.join(specs)})")
                plans[name] = build_plan(opt.image, specs[name])
            except PlanError as e:
                if "image" not in opt.from_defaults:
                    raise ConfigError(e.key, e.problem) from None
                plan = _fitted_defaults(opt.image, specs.get(name), e, f"{model}: model_defaults' inputs.{name}")
                if plan is not None:
                    plans[name] = plan
                continue
            units = unit_scale_warning(opt.image.mean, opt.image.std)  # (a float input's: UINT8 has none)
            if units:
                log.warning("%s: image input %r: %s", model, name, units)
        return cls(plans) if plans else None

    def client_inputs(self, inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
        """The inputs as clients see them: an image input is BYTES [N, 1], one image per row."""
        out = []
        for s in inputs:
            plan = self.plans.get(s.name)
            if plan is None:
                out.append(s)
            else:
                out.append(TensorSpec(s.name, "BYTES", np.dtype(object), (plan.rows, 1), "ND", 0))
        return out

    def describe(self) -> dict[str, dict]:
        return {name: plan.describe() for name, plan in self.plans.items()}

    def pictures(self, inputs: Mapping) -> list[tuple[str, ImagePlan, int, bytes]]:
        """(input, plan, row, encoded picture) of every picture the request sent."""
        return [(name, plan, row, data) for name, plan in self.plans.items()
                if isinstance(rows := inputs.get(name), list) for row, data in enumerate(rows)]

    def tensor_bytes(self, inputs: Mapping) -> int:
        """What the input tensors `prepare` makes of the request's pictures hold: a row of the
        model input per picture, in its dtype, whatever the pictures' files hold."""
        return sum(plan.row_bytes * len(rows) for name, plan in self.plans.items()
                   if isinstance(rows := inputs.get(name), list))

    async def prepare(self, inputs: dict, pool, decoder, on_ended=None, wait_s: float = 0.0) -> int:
        """Replace each image input's encoded rows (a list of bytes) by the model's tensor: every
        picture of the request a job of one pool.map (`on_ended`: called when they all ended;
        `wait_s`: its deadline for a thread), which writes its row of the tensor, made whole
        before any decodes (the only copy of the pixels that outlives its decode: a row made per
        picture, then stacked, held every row twice). Returns the ns it waited for a thread."""
        try:
            tensors = {name: np.empty((len(rows),) + plan.row_shape, plan.dtype) for name, plan in self.plans.items()
                       if isinstance(rows := inputs.get(name), list)}
        except MemoryError:  # no decode began: they have all ended
            if on_ended is not None:
                on_ended()
            raise
        jobs = [(name, plan, row, data, tensors[name][row]) for name, plan, row, data in self.pictures(inputs)]
        decoded = await pool.map(functools.partial(_decode_row, decoder), jobs, on_ended, wait_s)
        inputs.update(tensors)
        return decoded.waited_ns


def _fitted_defaults(image: ImageInput, spec: TensorSpec | None, refused: PlanError,
                           said: str) -> ImagePlan | None:
    """The plan of model_defaults' `image` settings, which `refused` says do not fit the input
    `spec`, without their mean and std when only those are at fault and the input takes uint8
    pixels (an OM whose AIPP normalises: the pair goes, a std without its mean would normalise by
    half); None otherwise: a float input given pixels a mean/std was meant for but cannot apply
    would answer wrongly and quietly, so it takes its tensor. Each said in an INFO line after
    `said` ("m:1: model_defaults' inputs.x")."""
    normalising = [key for key in ("mean", "std") if getattr(image, key) is not None]
    if (spec is not None and spec.dtype == np.uint8 and normalising
            and refused.key.rpartition(".")[2] in normalising):
        try:
            plan = build_plan(dataclasses.replace(image, mean=None, std=None), spec)
        except PlanError as e:
            refused = e  # (the reason the input takes no pictures)
        else:
            log.info("%s.image.%s passed over: %s; the input takes its pictures' pixel values, 0-255, as they are",
                     said, " and ".join(normalising), refused.found)
            return plan
    log.info("%s.image passed over: %s", said, refused.found)
    return None


def _decode_row(decoder, job: tuple[str, ImagePlan, int, bytes, np.ndarray]) -> None:
    name, plan, row, data, out = job
    try:
        plan.write_row(decoder(data, plan), out)
    except ImageError as e:
        raise InvalidInput(f"input '{name}' row {row}: {e}") from None
