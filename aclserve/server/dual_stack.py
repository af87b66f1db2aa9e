"""HTTP on `::` listens dual-stack, taking IPv4 connections too, as gRPC does there.

grpc core binds `[::]` as one dual-stack socket (IPV6_V6ONLY off) and has no IPv6-only form
(when `[::]` cannot bind it falls back to 0.0.0.0: grpc_ipv4_wildcard.py), while asyncio's and
uvloop's create_server set IPV6_V6ONLY on every IPv6 socket: on `::` gRPC took 127.0.0.1 and
HTTP refused it. So `::` is every address of both families, for both transports, as Linux
(net.ipv6.bindv6only=0), Go and Node read it; 0.0.0.0 is IPv4 alone.
"""
from __future__ import annotations

import ipaddress
import socket

IPV6_ANY = ipaddress.IPv6Address("::")


def is_ipv6_any(host: str) -> bool:
    """`host` is the IPv6 wildcard, however spelled (::, 0::0)."""
    try:
        return ipaddress.ip_address(host) == IPV6_ANY
    except ValueError:
        return False


def dual_stack_listener(host: str, port: int, backlog: int) -> socket.socket | None:
    """A socket listening on [::]:`port` for IPv6 and IPv4 alike when `host` is the IPv6
    wildcard (SO_REUSEADDR, as create_server sets it); None for another host, or where the kernel
    has no dual-stack sockets (no IPv6: create_server then says why `::` cannot be listened on).
    OSError (its errno) when it cannot bind."""
    if not is_ipv6_any(host) or not socket.has_dualstack_ipv6():
        return None
    return socket.create_server(("::", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True)
