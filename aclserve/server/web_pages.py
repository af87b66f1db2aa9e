"""Control requests a web page may have sent to a server that trusts loopback (auth.py).

Without an API token, load/unload and trace setting changes are open on a loopback listener: to
whoever runs on the machine. A browser on the machine runs there too, for the pages of every
site it shows: a page may POST to 127.0.0.1 without asking ("simple" requests, text/plain, need
no CORS preflight, and the server reads a body as JSON whatever its Content-Type), and through
DNS rebinding (a name of its own site resolving to 127.0.0.1) it may read the answers as well.
Browsers say where a request comes from: an Origin header on every POST, the page's host name
in Host. So a control request is refused when its Origin is not the server's own or its Host
names something other than a loopback address or `localhost` (or 0.0.0.0 and ::, which Linux
connects to loopback). Other clients (curl, tritonclient, aiohttp) send no
Origin and name the address they connect to, so they pass.
"""
from __future__ import annotations

import ipaddress
from typing import Mapping

from ..quoting import quoted
from .address import host_of, is_loopback


def page_refusal(headers: Mapping[str, str], scheme: str) -> str | None:
    """Why a request with `headers`, come over `scheme` (http or https), may be a web page's of
    another site, or None. (A loopback listener's configured host is a loopback address or
    `localhost` itself: nothing else opens control without a token.)"""
    host = headers.get("Host")
    if host is not None and not _local(host_of(host).lower()):
        return f"its Host, {quoted(host)}, is not a loopback address or localhost (DNS rebinding)"
    origin = headers.get("Origin")
    if origin is not None and (host is None or origin.lower() != f"{scheme}://{host}".lower()):
        return f"its Origin, {quoted(origin)}, is not this server's"
    return None


def _local(name: str) -> bool:
    """`name` (a Host's, lower case) is one for loopback no web site's DNS answers: a loopback
    address, localhost, or an unspecified address (0.0.0.0, ::), which Linux connects to loopback."""
    if is_loopback(name):
        return True
    try:
        return ipaddress.ip_address(name).is_unspecified
    except ValueError:
        return False
