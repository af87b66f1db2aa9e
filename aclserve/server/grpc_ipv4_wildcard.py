"""gRPC on 0.0.0.0 listens on IPv4 only, as HTTP does there.

grpc core reads 0.0.0.0 as "every address": it binds a dual-stack [::] socket, which takes IPv6
connections too (an operator firewalling IPv4 left gRPC open over IPv6), and takes no other form
(grpcio 1.85: "ipv4:0.0.0.0:P" fails to resolve; grpc.expand_wildcard_addrs lists the IPv6
addresses too). When that [::] socket cannot bind, grpc falls back to 0.0.0.0 alone
(ListenerContainerAddWildcardAddresses in grpc's posix listener). So while grpc binds, an
IPv6-only socket of ours holds [::]:P (bound, never listening: a connection to it is refused);
grpc's socket is bound by then and stays IPv4 after ours closes.
"""
from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

IPV4_ANY = "0.0.0.0"


@contextlib.contextmanager
def ipv6_held(host: str, port: int) -> Iterator[int]:
    """Hold [::]:`port` IPv6-only for the block when `host` is 0.0.0.0; yields the port to bind
    (`port`, or the one ours took for port 0). Nothing is held for another host, without IPv6,
    or when [::]:port is taken already (grpc's [::] then fails as ours did: IPv4 alone)."""
    if host != IPV4_ANY or not socket.has_ipv6:
        yield port
        return
    try:
        holder = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:  # IPv6 off in this kernel: grpc binds 0.0.0.0 alone anyway
        yield port
        return
    with holder:
        try:
            holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # the IPv4 port stays free for grpc
            holder.bind(("::", port))
        except OSError:
            yield port
            return
        yield holder.getsockname()[1]
