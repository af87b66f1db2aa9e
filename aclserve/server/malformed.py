"""JSON answers for the requests aiohttp's parser refuses (a line over 8,190 bytes, a bad or
repeated Content-Length, a malformed request line, bytes that are not HTTP): aiohttp answers
those itself, before any request object reaches the app and its middlewares, through its
connection handler's `handle_error` (a plain-text 400 quoting the client's bytes). Each HTTP
connection's handler is aiohttp's public `web.RequestHandler` with that one method given the
server's shape, `{"error": ...}` naming the problem, the status kept, the connection closed
after it as before (a framing error leaves nothing on the connection to trust). The answer
costs what aiohttp's did: the parser refuses at the first bad byte, and the message is its own
words, bounded."""
from __future__ import annotations

import asyncio
import re
from http import HTTPStatus
from typing import Callable

from aiohttp import http_parser, web
from aiohttp.http_exceptions import (BadHttpMethod, BadStatusLine, ContentLengthError, HttpProcessingError,
                                     InvalidHeader, InvalidURLError, LineTooLong, TransferEncodingError)

from .bad_request_log import CLIENT_BYTES, MAX_MESSAGE
from .error_responses import json_error

# aiohttp's pure-Python parser (AIOHTTP_NO_EXTENSIONS, or no C extension for the platform) quotes
# the client's bytes plainly or gives them as the message ("Bad status line 'GET /?token=...'"),
# where the C parser marks them b'...': its refusals of these kinds are called so instead
PURE_PYTHON_PARSER = http_parser.HttpRequestParser is http_parser.HttpRequestParserPy
_PLAIN = ((BadHttpMethod, "bad method"), (BadStatusLine, "bad request line"), (InvalidURLError, "bad request target"),
          (InvalidHeader, "invalid header"), (TransferEncodingError, "bad chunked encoding"),
          (ContentLengthError, "the body ends before its Content-Length"))
# the name of the header a quoted line of the client's begins with (`b'Content-Length: x'`)
_HEADER_NAME = re.compile(r"""^b['"]([!#$%&*+\-.^_`|~0-9A-Za-z]{1,64})[ \t]*:""")


# what aiohttp's C parser (llhttp) says of HTTP/2's connection preface, "PRI * HTTP/2.0": a gRPC client
# (or curl --http2-prior-knowledge) pointed at this port. The pure-Python parser refuses its `*`
# target as any other: no words of its own for it, so it keeps its plain refusal.
_HTTP2_PREFACE = "Pause on PRI/Upgrade"


class JsonErrorHandler(web.RequestHandler):
    """aiohttp's handler of one connection; only its error answers differ (module docstring).
    `grpc_port`: the server's gRPC port (0: off), which an HTTP/2 client is told of."""

    __slots__ = ("grpc_port",)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own first: it logs (bad_request_log.py makes a client's mistake one DEBUG
        # line) and raises when an answer has begun already; its plain-text answer is dropped
        super().handle_error(request, status, exc, message)
        response = json_error(problem(status, exc, grpc_port=self.grpc_port), status)
        response.force_close()
        return response


def handlers(server: web.Server, options: dict, grpc_port: int = 0) -> Callable[[], web.RequestHandler]:
    """The protocol factory for the HTTP listener: a JsonErrorHandler for `server` (the runner's)
    per connection, with aiohttp's handler options (`options`: those the runner was given)."""
    def handler() -> web.RequestHandler:
        made = JsonErrorHandler(server, loop=asyncio.get_running_loop(), **options)
        made.grpc_port = grpc_port
        return made
    return handler


def problem(status: int, exc: BaseException | None, pure_python: bool = PURE_PYTHON_PARSER,
            grpc_port: int = 0) -> str:
    """What a refused request is told: aiohttp's words for what it could not parse, without the
    client's bytes it quotes (it may be a token) but with the header's name when the quote
    gives it; a fault of the server's own is "internal error" (details in the log only); an
    HTTP/2 client, where gRPC is (`grpc_port`, 0: off)."""
    if status == HTTPStatus.INTERNAL_SERVER_ERROR:
        return "internal error"
    if isinstance(exc, HttpProcessingError) and exc.message.startswith(_HTTP2_PREFACE):
        where = f"gRPC is on port {grpc_port}" if grpc_port else "gRPC is off on this server (grpc_port 0)"
        return ("malformed HTTP request: an HTTP/2 connection preface (a gRPC client's?) came to this port, which "
                f"speaks HTTP/1.1; {where}")
    if isinstance(exc, LineTooLong):  # its message quotes only the line's first 100 bytes
        return f"malformed HTTP request: the request line or a header is over {exc.args[1]} bytes"
    if not isinstance(exc, HttpProcessingError):
        return HTTPStatus(status).phrase
    if pure_python and not CLIENT_BYTES.search(exc.message):
        plain = next((words for cls, words in _PLAIN if isinstance(exc, cls)), None)  # (most specific first)
        if plain is not None:
            return f"malformed HTTP request: {plain}"
    names = {m.group(1) for m in map(_HEADER_NAME.match, CLIENT_BYTES.findall(exc.message)) if m}
    words = " ".join(CLIENT_BYTES.sub(" ", exc.message).replace("^", " ").split()).rstrip(" :.")
    # (a request line refused at its end quotes the line after it: `PRI / HTTP/1.1` then `Host: t`)
    if len(names) == 1 and not isinstance(exc, BadStatusLine) and next(iter(names)).lower() not in words.lower():
        words += f" (header '{names.pop()}')"
    return f"malformed HTTP request: {words or 'Bad Request'}"[:MAX_MESSAGE]
