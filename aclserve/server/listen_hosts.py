"""The addresses a `host` setting stands for: resolved once, and listened on by HTTP and gRPC alike.

A name was resolved twice, each transport its own way: asyncio's create_server by getaddrinfo
(127.0.0.1 alone for `localhost` where /etc/hosts has no ::1 line) and grpc core by its own
resolver (c-ares, which reads `localhost` as ::1 and 127.0.0.1 both): `--host localhost` had
gRPC take [::1] where HTTP refused it, and the log named 127.0.0.1 for one and `localhost` for
the other (a tester, t84). So the name is resolved here, by the system's resolver, and each
transport binds every address it gave, on one port. A loopback address of a family this
machine's loopback lacks (::1 where it has no IPv6), or of a family it has none of, is left out
while another is left; any other address no interface here has (a stale record) stops the start
as its bind fails, as it did before (a review, r32: left out, the server was quietly unreachable
where the operator meant it). An address (a wildcard too) is
taken as it is: dual_stack.py and grpc_ipv4_wildcard.py say how 0.0.0.0 and :: are read. A host
no resolver can be asked about (an empty label, `a..b`: address.unresolvable) is refused here too,
in the same line as a name that does not resolve, and so is an address whose zone is such a name
(`fe80::1%a..b`), which asyncio's create_server would have passed to getaddrinfo.
"""
from __future__ import annotations

import errno
import ipaddress
import socket

from .address import address, shown_address, unresolvable


def listen_hosts(host: str, port: int) -> list[str]:
    """The addresses to listen on for `host`, each once, in the resolver's order: `host` alone
    when it is an address; a name's addresses (getaddrinfo, AI_PASSIVE) but those of a family
    this machine lacks (`_not_here`). OSError saying `cannot listen on host:port` and why when no
    resolver can be asked about it, the name does not resolve, or none of its addresses is this machine's."""
    cannot = unresolvable(host)  # (getaddrinfo's UnicodeError, a ValueError: a traceback)
    if cannot:
        raise OSError(f"cannot listen on {shown_address(host, port)}: {cannot}")
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:  # a name lookup's error (a negative errno): as it says itself
        raise OSError(f"cannot listen on {shown_address(host, port)}: {e.strerror or e}") from None
    addresses = list(dict.fromkeys(sockaddr[0] for *_, sockaddr in found))
    usable = [a for a in addresses if not _not_here(a)]
    if not usable:
        reason = _not_here(addresses[0]) if addresses else "no address"
        raise OSError(f"cannot listen on {shown_address(host, port)}: {reason}")
    return usable


def _not_here(host: str) -> str:
    """Why `host` is of a family this machine lacks (an errno's text), or '' when it is not: its
    family off (EAFNOSUPPORT), or a loopback address its loopback has not (EADDRNOTAVAIL)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except OSError as e:
        if e.errno == errno.EAFNOSUPPORT or (e.errno == errno.EADDRNOTAVAIL and _loopback(host)):
            return e.strerror or str(e)
    return ""  # (another error, an address not here or a port taken, is the bind's to say)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def said(hosts: list[str], port: int, scheme: str = "") -> str:
    """The addresses listened on, as a log line names them: `http://127.0.0.1:8000, http://[::1]:8000`."""
    return ", ".join(f"{scheme}{address(host, port)}" for host in hosts)
