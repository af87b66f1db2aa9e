"""gRPC on 0.0.0.0 listens on IPv4 only, as HTTP does there.

grpc core reads 0.0.0.0 as "every address": it binds a dual-stack [::] socket, which takes IPv6
connections too (an operator firewalling IPv4 left gRPC open over IPv6), and takes no other form
(grpcio 1.85: "ipv4:0.0.0.0:P" fails to resolve; grpc.expand_wildcard_addrs lists the IPv6
addresses too). When that [::] socket cannot bind, grpc falls back to 0.0.0.0 alone
(ListenerContainerAddWildcardAddresses in grpc's posix listener). So while grpc binds, an
IPv6-only socket of ours holds [::]:P (bound, never listening: a connection to it is refused);
grpc's socket is bound by then and stays IPv4 after ours closes.

For port 0 the port is chosen on the IPv4 side, where grpc binds: a port the kernel picked for
the IPv6 hold may be taken on 0.0.0.0 (an IPv6-only socket does not clash with IPv4 ones), and
grpc's bind there then failed, though free ports were left.
"""
from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

IPV4_ANY = "0.0.0.0"


@contextlib.contextmanager
def ipv6_held(host: str, port: int) -> Iterator[int]:
    """Hold [::]:`port` IPv6-only for the block when `host` is 0.0.0.0; yields the port to bind
    (`port`, or for port 0 one free on 0.0.0.0, kept for grpc: _ipv4_port_kept). Nothing is held
    for another host, without IPv6, or when [::]:port is taken already (grpc's [::] then fails as
    ours did: IPv4 alone)."""
    if host != IPV4_ANY or not socket.has_ipv6:
        yield port
        return
    with contextlib.ExitStack() as held:
        if not port:
            port = _ipv4_port_kept(held)
        try:
            holder = held.enter_context(socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
            holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # the IPv4 port stays free for grpc
            holder.bind(("::", port))
        except OSError:  # IPv6 off in this kernel, or [::]:port taken: grpc binds 0.0.0.0 alone anyway
            pass
        yield port


def _ipv4_port_kept(held: contextlib.ExitStack) -> int:
    """A port the kernel finds free on 0.0.0.0, bound by a socket of ours for as long as `held`:
    with SO_REUSEADDR, as grpc sets its own (grpc_server.server_options), so grpc's bind and listen
    there share it while nothing else that binds without it can take the port meanwhile. OSError
    when no port is free."""
    keeper = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    keeper.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    keeper.bind((IPV4_ANY, 0))
    return keeper.getsockname()[1]
