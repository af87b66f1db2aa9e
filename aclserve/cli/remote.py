"""The running server a client command (`infer`, `profile --url`) talks to: its URL, checked
before anything is sent, the API token it is sent with (ACLSERVE_API_TOKEN, the server's
own variable: kept out of the command line, which other users of the machine can read), and the
words both commands say a failed exchange in, whatever HTTP client failed it (urllib, aiohttp);
the TLS files they use are client_tls.py's."""
from __future__ import annotations

import errno
import json
import os
import ssl
import urllib.parse

from ..cert_dates import out_of_date
from ..secret_env import TOKEN_ENV
from ..server.address import unresolvable
from .usage import UsageError, one_line


# a client command's --timeout at most (infer's, profile's; compile's too: om/compile_error.py)
MAX_TIMEOUT_S = 30 * 24 * 3600


def check_url(url: str) -> None:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # raises on a port that is not a number
    except ValueError as e:
        raise UsageError(f"--url {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    if parts.username is not None or parts.password is not None:  # (not echoed: a password may be in it)
        raise UsageError(f"--url: credentials in the URL are not sent (aclserve takes a bearer token): "
                         f"set {TOKEN_ENV} instead")
    prefix = _without_api_path(parts.path)  # (.../v2 was a 404: POST /v2/v2/models/...)
    if prefix != parts.path.rstrip("/") or parts.query or parts.fragment:
        raise UsageError(f"--url {url!r}: give the server's address alone, {parts.scheme}://{parts.netloc}"
                         f"{prefix} (the command adds /v2/models/... to it)")


# what follows /v2 in the API's paths: a URL ending so names a route, not the server
API_ROUTES = ("models", "health", "repository", "trace", "logging", "systemsharedmemory", "cudasharedmemory")


def _without_api_path(path: str) -> str:
    """`path` (a URL's) without a trailing /v2 or /v2/<one of the API's routes>...: the server's
    address, a reverse proxy's prefix kept (/gw/v2/aclserve is one)."""
    parts = path.rstrip("/").split("/")
    for k in range(len(parts) - 1, 0, -1):
        if parts[k] == "v2" and (k == len(parts) - 1 or parts[k + 1] in API_ROUTES):
            return "/".join(parts[:k])
    return "/".join(parts)


# what both commands say of a connection the server closed without an answer (urllib's words: "Remote end
# closed connection without response"; aiohttp's: "Server disconnected")
CLOSED_UNANSWERED = "the connection closed without an answer"
# how a TLS port met with plain HTTP ends the exchange (a reset when it closes with bytes unread)
_CLOSED_UNANSWERED = (CLOSED_UNANSWERED, "closed connection without response", "Server disconnected",
                      "Connection reset by peer")


# how a TLS server that asks for a client certificate ends a handshake without one (asyncio sends no alert)
_NO_CERTIFICATE_SHOWN = ("EOF occurred in violation of protocol", "UNEXPECTED_EOF", "Connection lost")


# how OpenSSL says a certificate it verified is issued for another host than the URL's
_NAMES_ANOTHER_HOST = ("Hostname mismatch", "IP address mismatch")
# ... and that it is expired or not valid yet
_OUT_OF_DATE = ("certificate has expired", "certificate is not yet valid")


def scheme_hint(url: str, said: str, cert: str | None = None) -> str:
    """What to add to a failed exchange's message when the URL's scheme looks wrong for the
    port, the server's certificate is not trusted here, names another host or is out of date, or
    the server wants a client certificate, or refused `cert` (the --cert shown) as out of date."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "http" and any(words in said for words in _CLOSED_UNANSWERED):
        return " (a TLS port? try https://)"
    if scheme == "https" and "WRONG_VERSION_NUMBER" in said:
        return " (not a TLS port? try http://)"
    if any(words in said for words in _NAMES_ANOTHER_HOST):  # (a CA to trust would not help)
        return (f" (the server's certificate does not name {urllib.parse.urlsplit(url).hostname}, the host in the "
                "URL: use a host name or address it was issued for)")
    if any(words in said for words in _OUT_OF_DATE):  # (trusting its CA would not help either)
        return (" (the server's certificate is outside its dates of validity: the server needs a current one, or "
                "this machine's clock is wrong)")
    if scheme == "https" and any(words in said for words in _CLOSED_UNANSWERED + _NO_CERTIFICATE_SHOWN):
        # (the server ends the handshake without saying why: an expired --cert was taken for one of another CA)
        why = out_of_date(cert) if cert else None
        if why:
            return (f" (the client certificate {cert} {why}: a server asking for one ends the handshake so when "
                    "it is out of date; show a current one, or this machine's clock is wrong)")
        return (" (a server asking for a client certificate ends the handshake so when shown none, or one its CAs "
                "did not sign: --cert FILE [--key FILE] shows one)")
    if "CERTIFICATE_VERIFY_FAILED" in said:
        return " (the server's certificate is not trusted here: SSL_CERT_FILE=<the CA that signed it>)"
    return ""


# what to do next when nothing listens at the URL (a new user's first `aclserve infer`, no server started)
REFUSED_HINT = " (is `aclserve serve` running there? --url names another server)"


def unreachable(url: str, error, cert: str | None = None) -> str:
    """What both commands say of a connection they could not make (refused, no such host, a TLS
    handshake that failed): `error`'s reason (os_reason) and the hint for it."""
    said = os_reason(error)
    hint = REFUSED_HINT if said == os.strerror(errno.ECONNREFUSED) else scheme_hint(url, said, cert)
    return f"cannot reach {url}: {said}{hint}"


def host_unresolvable(url: str) -> str | None:
    """Why no resolver can be asked about the host of `url` (server/address.py's unresolvable: an
    empty label, `a..b`), for `unreachable` to say before anything connects; None when one can. The
    host is checked as aiohttp takes it and as urllib does (unquoted: `a%2e%2eb` is `a..b` to it):
    each raised the codec's UnicodeError (from its resolver, or ssl's SNI), which was a traceback."""
    host = urllib.parse.urlsplit(url).hostname or ""
    return unresolvable(host) or unresolvable(urllib.parse.unquote(host))


def broke_off(url: str, said: str, cert: str | None = None) -> str:
    """What both commands say of an exchange the connection ended before its answer."""
    return f"{url} broke off the exchange: {said}{scheme_hint(url, said, cert)}"


def os_reason(error) -> str:
    """The reason of a failed connection, in the system's words or OpenSSL's: urllib and aiohttp
    wrap it each in their own ("[Errno 111] Connection refused"; "Cannot connect to host
    127.0.0.1:9 ssl:default [Connect call failed ('127.0.0.1', 9)]", and an SSL error's repr)."""
    if isinstance(error, ssl.SSLError):  # (its errno is OpenSSL's, not the system's)
        return one_line(error)
    number = getattr(error, "errno", None)
    if isinstance(number, int) and number > 0:
        return os.strerror(number)
    return one_line(getattr(error, "strerror", None) or error)


def auth_headers() -> dict[str, str]:
    """{"Authorization": "Bearer <token>"} when ACLSERVE_API_TOKEN is set, else {}."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        return {}
    if token != token.strip() or not token.isprintable():  # (the value is a secret: never echoed)
        raise UsageError(f"{TOKEN_ENV} cannot be sent in a header: it has a control character or blanks "
                         "at its ends")
    return {"Authorization": f"Bearer {token}"}


def token_hint(status: int) -> str:
    """What to add to a 401's message: where this command takes the token from."""
    if status != 401:
        return ""
    said = "is not the server's token" if os.environ.get(TOKEN_ENV) else "is not set"
    return f" ({TOKEN_ENV} {said})"


def redirect_refused(url: str, status: int, location: str | None) -> str:
    """What `infer` and `profile --url` say of a redirect, which neither follows: the API token
    would go wherever it points (urllib sent it to a security tester's server on another host)."""
    where = one_line(location or "") or "nowhere said"
    return (f"{url} redirects (HTTP {status}) to {where}: not followed, so that the API token goes to no other "
            "server; give the server's own URL as --url")


def kserve_error(body: bytes | str) -> str | None:
    """The message of a KServe v2 error answer, {"error": "..."}; None when the body is not one
    (a web server's HTML page, say: the URL is no KServe v2 server)."""
    try:
        message = json.loads(body)["error"]
    except (ValueError, RecursionError, KeyError, TypeError):  # (RecursionError: JSON nested past the stack)
        return None
    return message if isinstance(message, str) else None
