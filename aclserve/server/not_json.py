"""What an infer request body refused as JSON is instead, when it is what a vision client tries
first: a picture (`curl --data-binary @cat.jpg`, with or without `Content-Type: image/jpeg`) or a
multipart form (`curl -F x=@cat.jpg`, an HTML form's upload). Both were refused with the JSON
parser's words, "it is not UTF-8 text (binary tensor data goes after the JSON part ...)" or "no
digit after sign", which did not say how to send a picture (an independent tester).

Looked at only once the body has failed to parse as JSON (infer_pipeline.infer_body's error path), by its
first bytes: a multipart body is known by its first boundary and its part's Content-Disposition
(a Content-Type header is not needed, nor read). Pure functions over bytes.
"""
from __future__ import annotations

import re
from typing import Mapping

from ..images.header import image_format
from ..runtime.types import TensorSpec
from .codec import HEADER_LENGTH

RAW_HEADER = f"{HEADER_LENGTH}: 0"
# a multipart body: its first boundary ("--" and 1 to 70 characters, RFC 2046), then its first
# part's header lines, one of which says form-data (RFC 7578)
_FORM = re.compile(rb"--[^\r\n]{1,70}\r\n(?:[^\r\n]*\r\n)*?content-disposition:[ \t]*form-data", re.IGNORECASE)
_FORM_HEAD_BYTES = 1024  # what is looked at for it


def what_it_is(body: bytes | memoryview, inputs: Mapping[str, TensorSpec]) -> str | None:
    """Why `body` is not JSON and how to send what it holds to a model of these `inputs`, when it
    begins with a picture or is a multipart/form-data upload; else None."""
    picture = image_format(body)
    if picture is not None:
        return f"it is a {picture} picture; {how_to_send(inputs, picture)}"
    if _FORM.match(bytes(body[:_FORM_HEAD_BYTES])):
        return ("it is a multipart/form-data upload (curl -F, an HTML form), which this server does not take; "
                + how_to_send(inputs))
    return None


def how_to_send(inputs: Mapping[str, TensorSpec], picture: str | None = None) -> str:
    """How a picture reaches this model: raw as the whole body (a model of one image input, which
    a raw body feeds), else in a JSON body; or that the model takes none."""
    images = [spec.name for spec in inputs.values() if spec.datatype == "BYTES"]  # (image inputs: bytes_codec)
    if not images:
        listed = ", ".join(f"{spec.name} {spec.datatype} {list(spec.shape)}" for spec in inputs.values())
        return (f"this model takes no pictures (its inputs: {listed}): send a KServe v2 JSON body; an input "
                "takes JPEG or PNG files once the model's YAML declares it an image input")
    kind = "" if picture in (None, "JPEG", "PNG") else f" (a JPEG or PNG, not {picture})"
    (spec, *others) = inputs.values()
    if not others and spec.shape[:1] in ((-1,), (1,)):
        return (f"send a picture{kind} as the whole body with the header `{RAW_HEADER}` (curl -H '{RAW_HEADER}' "
                f"--data-binary @picture.jpg), or base64 in a JSON body (input '{spec.name}', datatype BYTES, "
                "shape [1])")
    return (f"send pictures{kind} base64 in a JSON body as input {', '.join(repr(n) for n in images)}, datatype "
            "BYTES, shape [N] (or with the binary tensor extension); a body that is one picture alone is for a "
            "model of one input that takes one picture")
