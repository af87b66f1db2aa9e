"""Encoded images in: header probing with limits, CPU (Pillow) and DVPP decoding, per-input
plans (colour, resize policy, layout, host normalisation), the bounded decode pool, and the
per-version stage the infer handler awaits. Imports numpy and Pillow, never aiohttp."""
from .header import ImageError, ImageInfo, probe
from .plan import ImagePlan, PlanError, build_plan
from .pool import DecodePool
from .stage import ImageStage

__all__ = ["DecodePool", "ImageError", "ImageInfo", "ImagePlan", "ImageStage", "PlanError", "build_plan", "probe"]
