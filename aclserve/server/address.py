"""host:port as clients write it: an IPv6 host in brackets ([::1]:8001), which grpc's targets
need and a log line's URL too ("http://::1:8000" is not one), and as a message names it; whether
a host is loopback, and whether a resolver can be asked about it at all."""
from __future__ import annotations

import ipaddress

from ..quoting import MAX_QUOTED_NAME
from .client_text import printable


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def shown_address(host: str, port: int) -> str:
    """address() as an error message names it: the host cut at MAX_QUOTED_NAME characters, made
    printable (a `host:` of 1 MB was an error line of 1 MB; a host name has 253 characters at most)."""
    return address(printable(host, MAX_QUOTED_NAME), port)


def unresolvable(host: str) -> str | None:
    """Why no resolver can be asked about `host` (a name, or an address with a zone: fe80::1%eth0),
    in the idna codec's words; None when one can (whether it resolves is the resolver's to say).
    Python hands a host to the resolver idna-encoded (getaddrinfo, asyncio's, uvloop's, and so
    aiohttp's; http.client's Host header, ssl's server_hostname), and the codec refuses an empty
    label or one over 63 characters with a UnicodeError, not the OSError of a name that does not
    resolve: `a..b`, `.example` were tracebacks of the server and the clients alike (a tester, t92)."""
    try:
        host.encode("idna")
    except UnicodeError as e:  # (Python 3.11 wraps the codec's own: "encoding with 'idna' codec failed (...)")
        said = e.__cause__ if isinstance(e.__cause__, UnicodeError) else e
        return f"not a valid host name ({getattr(said, 'reason', None) or said})"
    return None


def is_loopback(host: str) -> bool:
    """`host` (a name or an address, an IPv6 one in brackets or not) is loopback: `localhost` or
    a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def host_of(authority: str) -> str:
    """The host of a Host header's `host[:port]` ([v6]:port too), without its port."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority
