"""host:port as clients write it: an IPv6 host in brackets ([::1]:8001), which grpc's targets
need and a log line's URL too ("http://::1:8000" is not one); and whether a host is loopback."""
from __future__ import annotations

import ipaddress


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
