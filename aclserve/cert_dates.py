"""Whether a PEM file's first certificate is outside its dates of validity, in words: the server's
own certificate as it starts (server/tls.py), a client's --cert when a server ends the handshake
(cli/remote.py). Neither side is told why by the peer that refuses it."""
from __future__ import annotations

import ssl
import time


def out_of_date(cert_file: str, now: float | None = None) -> str | None:
    """"expired on <notAfter>", "is not valid before <notBefore>", or None: within its dates, or
    no dates could be read (no such file, no certificate in it). The dates come from the ssl
    module's own decoder (private, present from Python 3.3 on; without it None)."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        cert = decode(cert_file)
        not_before, not_after = ssl.cert_time_to_seconds(cert["notBefore"]), ssl.cert_time_to_seconds(cert["notAfter"])
    except (ssl.SSLError, OSError, KeyError, ValueError):
        return None
    now = time.time() if now is None else now
    if now > not_after:
        return f"expired on {cert['notAfter']}"
    if now < not_before:
        return f"is not valid before {cert['notBefore']}"
    return None
