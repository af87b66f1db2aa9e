"""Review 3 of c824d7f: heads probed for parity, the same bytes to a server with direct_infer
on and one with it off: the same statuses, and the connection kept or closed alike. The
repeated singleton headers and Sec-WebSocket-Key1 failed on c824d7f."""
import asyncio

import pytest

from .test_direct_infer import JSON_BODY
from .test_review_direct import INFER, everything, raw_post, statuses

H = b"Host: t"
CASES = {
    # candidates aiohttp refuses
    "dup Content-Type": raw_post([H, b"Content-Type: application/json", b"Content-Type: application/json"]),
    "dup User-Agent": raw_post([H, b"User-Agent: a", b"User-Agent: b"]),
    "dup Server": raw_post([H, b"Server: a", b"Server: b"]),
    "dup Max-Forwards": raw_post([H, b"Max-Forwards: 1", b"Max-Forwards: 1"]),
    "dup ETag": raw_post([H, b"ETag: a", b"ETag: a"]),
    "Sec-WebSocket-Key1": raw_post([H, b"Sec-WebSocket-Key1: x"]),
    "name with (": raw_post([H, b"X(Foo: bar"]),
    'name with "': raw_post([H, b'X"Foo: bar']),
    "DEL in value": raw_post([H, b"X-Foo: a\x7fb"]),
    "two spaces in request line": raw_post([H], target=INFER.encode() + b" "),
    "lower-case version": raw_post([H]).replace(b"HTTP/1.1", b"http/1.1", 1),
    "CL plus sign": raw_post([H]).replace(b"Content-Length: ", b"Content-Length: +", 1),
    "CL inner space": raw_post([H], body=JSON_BODY).replace(b"Content-Length: ", b"Content-Length: 0 ", 1),
    "fragment in model": raw_post([H], target=b"/v2/models/double#/infer"),
    "dot version": raw_post([H], target=b"/v2/models/double/versions/../infer"),
    "dot model": raw_post([H], target=b"/v2/models/./infer"),
    "dotdot model": raw_post([H], target=b"/v2/models/x/../double/infer"),
    "Host with port": raw_post([b"Host: localhost:8000"]),
    "UTF-8 value": raw_post([H, "X-Foo: é".encode()]),
    "trailing ws": raw_post([b"Host: t  ", b"X-Foo: bar \t"]),
    "empty value": raw_post([H, b"X-Empty:"]),
    "CL trailing ws": raw_post([H]).replace(b"\r\n\r\n", b" \t\r\n\r\n", 1),
    "CL leading zeros": raw_post([H]).replace(b"Content-Length: ", b"Content-Length: 000", 1),
    "TE odd case": raw_post([H, b"TRANSFER-encoding: chunked"]),
    "TE tab": raw_post([H, b"Transfer-Encoding:\tchunked"]),
    "absolute-form": raw_post([H], target=b"http://t/v2/models/double/infer"),
    "128 headers": raw_post([H] + [b"X-H%d: v" % i for i in range(126)]),
    "Connection keep-alive, close": raw_post([H, b"Connection: keep-alive, close"]),
    "Connection: close (upper)": raw_post([H, b"Connection: CLOSE"]),
    "CONNECT then infer": b"CONNECT t:80 HTTP/1.1\r\nHost: t:80\r\n\r\n" + raw_post([H]),
    "unknown method then infer": b"FOO /x HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n" + raw_post([H]),
    "Upgrade h2c then infer": b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n" + raw_post([H]),
}


@pytest.fixture(scope="module")
def answers(pair):
    """name -> (what aiohttp's server wrote, what the direct one wrote) for every case, each
    sent on a connection of its own, all at once: a connection kept open shows only by a quiet
    spell (`everything`: 1.5 s), waited out once here where case by case it was 1.5 s a case
    kept open, most of them (22 s in all)."""
    on, off = pair

    async def every_case():
        written = await asyncio.gather(*(everything(url, data) for data in CASES.values() for url in (off.url, on.url)))
        return {name: (written[2 * i], written[2 * i + 1]) for i, name in enumerate(CASES)}
    return asyncio.run(every_case())


@pytest.mark.parametrize("name", list(CASES))
def test_parity(answers, name):
    via_aiohttp, direct = answers[name]
    a = (statuses(via_aiohttp), via_aiohttp.endswith(b"<open>"))
    d = (statuses(direct), direct.endswith(b"<open>"))
    assert d == a, (name, via_aiohttp[-400:], direct[-400:])
