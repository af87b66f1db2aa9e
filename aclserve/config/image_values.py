"""An image input's mean and std as far as they can be judged without a model: a picture has 1
channel (gray) or 3 (rgb, bgr), and a float input takes at most float32's values. A mean or std
that can fit no model is refused when its config is read (in model_defaults it was passed over
for every model, one at a time); one that fits some models is fitted to each when it loads
(images/plan.py, which takes normalised_extent from here)."""
from __future__ import annotations

import numpy as np

from .checks import key_path
from .schema import ConfigConflict, ConfigError

CHANNEL_COUNTS = (1, 3)  # gray; rgb or bgr
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the largest of the float types an image input may be


def normalised_extent(mean, std) -> float:
    """The largest size (pixel - mean) / std takes for pixels 0-255, as ImagePlan.write_row computes
    it from float32 values; `mean`, `std`: per channel, or one for every channel; None: 0 and 1."""
    with np.errstate(over="ignore", divide="ignore"):  # (a value past float32 is inf there: so here)
        m = np.zeros(1) if mean is None else np.asarray(mean, np.float32).astype(np.float64)
        s = np.ones(1) if std is None else np.asarray(std, np.float32).astype(np.float64)
        return float(np.max(np.maximum(np.abs(m), np.abs(255 - m)) / s))


def check_normalisation(color: str | None, mean, std, path: str) -> None:
    """ConfigError (ConfigConflict for values of two keys, which may come from two files) for a
    mean or std of the image settings at `path` that no model input could take."""
    for what, values in (("mean", mean), ("std", std)):
        if values is None:
            continue
        where = key_path(path, what)
        if len(values) not in CHANNEL_COUNTS:
            raise ConfigError(where, f"has {len(values)} values: a picture has 1 channel (gray) or 3 (rgb, bgr), so "
                                     "give 1 value (for every channel) or 3 (one per channel)")
        if color == "gray" and len(values) != 1:
            raise ConfigConflict(where, f"has {len(values)} values for color gray, which has 1 channel: give 1",
                                 (key_path(path, "color"), where))
    largest = normalised_extent(mean, std)
    if largest > FLOAT32_MAX:
        given = [(what, values) for what, values in (("mean", mean), ("std", std)) if values is not None]
        said = " and ".join(f"{what} [{', '.join(f'{v:g}' for v in values)}]" for what, values in given)
        raise ConfigConflict(key_path(path, given[-1][0]),
                             f"with {said}, pixels 0-255 become values up to {largest:.6g} in size, beyond FP32's "
                             f"largest, {FLOAT32_MAX:g}, that of every input an image may feed; mean and std are in "
                             "pixel units, 0-255", [key_path(path, what) for what, _ in given])
