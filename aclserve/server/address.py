"""host:port as clients write it: an IPv6 host in brackets ([::1]:8001), which grpc's targets
need and a log line's URL too ("http://::1:8000" is not one)."""
from __future__ import annotations


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
