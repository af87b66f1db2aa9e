"""Whether the version that took over may answer a request that raced a retirement.

A request is checked and decoded against the version it looked up when it arrived; that version
may be retired (replaced or unloaded) before the request reaches its batcher. Its successor
takes the request when it would answer it as checked (served.ServedVersion.infer hands it over),
and a request the retired version refused as invalid (its body was still arriving during the
reload, say) is refused as such only when the successor checks requests alike: else it would
name a model that no longer serves, for a request the serving one may take. Either refusal is
the 503 that says what the version was replaced by, and to send the request again.
"""
from __future__ import annotations

from ..errors import ModelUnavailable

_OTHER_TENSORS = "one with other inputs, input value ranges, outputs or batch limit"


def replaced(retired, successor, pinned: bool, refusal: str | None) -> ModelUnavailable | None:
    """The 503 for a request `retired` took that `successor` may not answer: another version while
    the request named `retired`'s (`pinned`), or `refusal` (what it was replaced by, in words);
    None when it may."""
    if successor.version != retired.version and pinned:
        return ModelUnavailable(f"model {retired.name} version {retired.version} was replaced by version "
                                f"{successor.version} while this request arrived; send it again")
    if refusal is not None:
        return ModelUnavailable(f"model {retired.name} version {retired.version} was replaced by {refusal} "
                                f"while this request arrived; send it again")
    return None


def handover_refusal(retired, successor) -> str | None:
    """Why `successor` cannot answer a request decoded for `retired` (what it was replaced by, in
    words), or None when it can: the same tensors, and the same model or the same image and
    labels settings (the request's pictures became tensors, and its answer is named, by
    `retired`'s: with the same model that is what `retired` would have answered)."""
    if successor.tensor_key() != retired.tensor_key():
        return _OTHER_TENSORS
    if successor.model_key() != retired.model_key() and successor.settings_key() != retired.settings_key():
        return "another model file with other image or labels settings"
    return None


def check_refusal(retired, successor) -> str | None:
    """What `successor` is, in words, when it checks requests otherwise than `retired` (one that
    `retired` refused as invalid may pass), or None when it checks them alike (it would refuse
    it too): its tensors, and its image and labels settings (pictures, classification asked)."""
    if successor.tensor_key() != retired.tensor_key():
        return _OTHER_TENSORS
    if successor.settings_key() != retired.settings_key():
        return "one with other image or labels settings"
    return None
