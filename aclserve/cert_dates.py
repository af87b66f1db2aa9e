"""A PEM file's first certificate's dates of validity and name, and whether it is outside those
dates, in words: the server's own certificate as it starts and as it is renewed (server/tls.py,
server/tls_renewal.py), a client's --cert when a server ends the handshake (cli/remote.py).
Neither side is told why by the peer that refuses it."""
from __future__ import annotations

import ssl
import time
from typing import NamedTuple


# a subject's attributes as OpenSSL writes them (the ssl module gives their long names)
SHORT_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
               "stateOrProvinceName": "ST", "localityName": "L"}


class Validity(NamedTuple):
    """A certificate's dates (Unix times, and as OpenSSL writes them: `Jan  2 00:00:00 2020 GMT`)
    and who it names: its subject and its alternative names (the subject of cert-manager's is often
    empty), `CN=a.example, O=Example (DNS:a.example, DNS:b.example)`."""
    not_before: float
    not_after: float
    not_before_text: str
    not_after_text: str
    name: str


def validity(cert_file: str) -> Validity | None:
    """The dates and name of `cert_file`'s first certificate, or None: no such file, no certificate
    in it, or no decoder (the ssl module's own, private, present from Python 3.3 on)."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        cert = decode(cert_file)
        return Validity(ssl.cert_time_to_seconds(cert["notBefore"]), ssl.cert_time_to_seconds(cert["notAfter"]),
                        cert["notBefore"], cert["notAfter"], _name(cert))
    except (ssl.SSLError, OSError, KeyError, ValueError):
        return None


def out_of_date(cert_file: str, now: float | None = None) -> str | None:
    """"expired on <notAfter>", "is not valid before <notBefore>", or None: within its dates, or
    no dates could be read (validity())."""
    dates = validity(cert_file)
    return said_out_of_date(dates, now) if dates is not None else None


def said_out_of_date(dates: Validity, now: float | None = None) -> str | None:
    """out_of_date() of dates already read."""
    now = time.time() if now is None else now
    if now > dates.not_after:
        return f"expired on {dates.not_after_text}"
    if now < dates.not_before:
        return f"is not valid before {dates.not_before_text}"
    return None


def _name(cert: dict) -> str:
    subject = ", ".join(f"{SHORT_NAMES.get(key, key)}={value}" for rdn in cert.get("subject", ()) for key, value in rdn)
    alternatives = ", ".join(f"{kind}:{value}" for kind, value in cert.get("subjectAltName", ()))
    if subject and alternatives:
        return f"{subject} ({alternatives})"
    return subject or alternatives or "(no name)"
