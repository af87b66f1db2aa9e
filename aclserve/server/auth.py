"""Bearer-token access control: the repository API and changes of the trace settings (which
write trace files) always, /v2/models/... when asked (HTTP here; the gRPC service makes the
same checks with its `authorization` metadata).

The token comes from ACLSERVE_API_TOKEN or the config's `api_token` and is never logged nor
shown. Requests carry `Authorization: Bearer <token>`; the comparison is constant-time
(hmac.compare_digest). Without a token the repository's load/unload routes and trace setting
changes answer 403 unless the server listens on a loopback address only, so nobody on the
network can unload models or have the server write trace files (Triton leaves trace settings
open; here a client could fill the disk with them); there, those a web page may have sent are
refused 403 too (web_pages.py). In model_control_mode `none`, where no token enables load/unload, a
load/unload refused for want of a token gets that mode's 400 instead (the repository's words).
With auth_inference, /metrics and the trace settings need the token as the model routes do.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import time
from typing import Sequence

from aiohttp import web

from ..config import ConfigConflict, ConfigError
from ..errors import ServeError
from ..repository import check_control_mode
from ..secret_env import TOKEN_ENV
from .address import is_loopback
from .single_header import single_value
from .web_pages import page_refusal

log = logging.getLogger(__name__)

_REPOSITORY = "/v2/repository/"
_MODELS = "/v2/models"
_TRACE_SETTING = "/trace/setting"
# what auth_inference guards beside /v2/models/...: /metrics names every model, version, state and
# failed load; the trace settings say which requests are traced, to which file
_MODEL_READINGS = ("/metrics", "/v2" + _TRACE_SETTING)
_LOAD_UNLOAD = "model load/unload is"  # (as a refusal names it: "... disabled")


class Unauthorized(ServeError):
    """No valid API token (401 with a Bearer challenge, http_errors.py)."""


class Forbidden(ServeError):
    """A control request refused outright (403): an exposed server without an API token, or a web
    page's request to a loopback one."""


REFUSAL_REASONS = ("no_token", "invalid_token", "repeated_header", "no_token_configured", "web_page")  # /metrics
LOG_EVERY_S = 60.0  # at most one line a minute about invalid tokens: a client trying many is not a log flood

MAX_HTTP_TOKEN = 8000  # aiohttp reads header lines of 8190 bytes
MAX_GRPC_TOKEN = 4096  # gRPC's metadata: 8 KB in all, printable ASCII


# a variable's name as a shell (${NAME}, $NAME) or Kubernetes ($(NAME)) would have put its value there
_PLACEHOLDER = re.compile(r"\$(\{[^}]*\}|\([A-Za-z_][A-Za-z0-9_]*\)|[A-Za-z_][A-Za-z0-9_]*)")
_PLACEHOLDER_IN_FILE = (f"is a placeholder such as ${{NAME}} or $NAME, taken as written: the config file is not "
                        f"expanded; give the token in {TOKEN_ENV} (from a Kubernetes Secret: env valueFrom "
                        "secretKeyRef) and leave api_token out, or write the token itself in quotes")
_PLACEHOLDER_FROM_ENVIRONMENT = ("is a placeholder such as ${NAME}, $NAME or $(NAME), not expanded by what set it (a "
                                 "shell's single quotes; a Kubernetes $(NAME) of a variable not defined before it): "
                                 "give the token itself")


def _refuse_unsendable(token: str, from_environment: bool, grpc: bool) -> None:
    """A token a client cannot send is refused at start, not by a 401 (or 400) to every request
    it guards: a header value holds no control character and loses its blanks at its ends, and
    an HTTP header line or (with gRPC on) a metadata value has its limits. The refusal names
    ACLSERVE_API_TOKEN as its source, or the key api_token (its file is added as the config
    loader adds it: cli/serve.py); gRPC's, where grpc_port came from too (a conflict)."""
    # (the value is a secret: never echoed)
    path, source = ("", TOKEN_ENV) if from_environment else ("api_token", None)
    broken = _unsendable(token)
    if broken:
        raise ConfigError(path, f"{broken}: no client could send it", source)
    # (RFC 6750's bearer tokens are ASCII; Python's HTTP clients send other characters as Latin-1,
    # curl as UTF-8: one of them always got 401, a tester found)
    if not token.isascii():
        raise ConfigError(path, "must be ASCII: HTTP clients send other characters in different encodings", source)
    if _PLACEHOLDER.fullmatch(token):  # (a real token of that shape is not worth the 401s a placeholder gets)
        raise ConfigError(path, _PLACEHOLDER_FROM_ENVIRONMENT if from_environment else _PLACEHOLDER_IN_FILE, source)
    if grpc and len(token) > MAX_GRPC_TOKEN:  # the token's and grpc_port's
        raise ConfigConflict("api_token", f"must be at most {MAX_GRPC_TOKEN} characters for gRPC clients to send "
                             "it (metadata), or turn gRPC off (grpc_port: 0)",
                             ("api_token", "grpc_port"), {"api_token": TOKEN_ENV} if from_environment else None)


def _unsendable(token: str) -> str | None:
    """The rule of a header value `token` breaks, said without the token (a secret), or None. One
    rule, the one broken: all three in one line did not say which (a tester, t92)."""
    if token != token.strip():  # (a header value loses its blanks at its ends)
        # (the usual one: a Kubernetes Secret made from a file that ends in a newline, a tester found)
        newline = (" (it ends in a newline, as a Secret made with `kubectl create secret generic --from-file` "
                   "from a file written by echo or an editor does: make it with --from-literal, or write the file "
                   "with printf %s)") if token.endswith(("\n", "\r")) else ""
        return f"must not begin or end with a blank, such as a space, a tab or a newline{newline}"
    if not token.isprintable():
        return "must hold printable characters only, not a control character such as a newline or a tab"
    if len(token) > MAX_HTTP_TOKEN:
        return (f"must be at most {MAX_HTTP_TOKEN} characters, as an HTTP header line holds no more (it has "
                f"{len(token):,})")
    return None


class Access:
    """Owned by the server state; built once from the config and the environment."""

    def __init__(self, config, environ=os.environ):
        from_environment = bool(environ.get(TOKEN_ENV))
        token = environ[TOKEN_ENV] if from_environment else config.api_token
        _refuse_unsendable(token, from_environment, grpc=bool(config.grpc_port))
        if from_environment and config.api_token:  # the file's, replaced, checked as if alone (its gRPC bound aside)
            _refuse_unsendable(config.api_token, False, grpc=False)
        self._token = token.encode()
        if config.auth_inference and not self._token:
            raise ConfigConflict("auth_inference", f"needs a token: set api_token or {TOKEN_ENV}",
                                 ("auth_inference", "api_token"))
        self.inference = config.auth_inference
        self.host = config.host
        self.control_mode = config.model_control_mode  # `none` takes no load/unload, token or not
        self.control_open = bool(self._token) or is_loopback(config.host)
        self.in_clear = not config.tls_cert_file and not is_loopback(config.host)  # tokens readable on the wire
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)  # requests refused, by reason (/metrics)
        self._invalid_unlogged = 0  # invalid tokens since the last line about them
        self._logged_at: float | None = None  # when the last line about them was written

    @property
    def enabled(self) -> bool:
        return bool(self._token)

    def check(self, request: web.BaseRequest) -> None:
        """Raise Unauthorized unless the request carries the token."""
        self.check_value(request.headers.getall("Authorization", ()))

    def check_value(self, sent: Sequence[str]) -> None:
        """The same for the Authorization values a request sent (every HTTP header of that name,
        or every gRPC `authorization` metadata value)."""
        scheme, _, given = self._one(sent).partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            self.refused["no_token"] += 1
            raise Unauthorized("this route needs an API token: send 'authorization: Bearer <token>' (an HTTP "
                               "header, or gRPC metadata, whose keys are lower case)")
        try:  # a header's bytes that are not UTF-8 come as surrogates (aiohttp): compared as sent
            sent = given.strip().encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            sent = None
        if sent is None or not hmac.compare_digest(sent, self._token):
            self._invalid()
            raise Unauthorized("the API token is not valid")

    def _one(self, sent: Sequence[str]) -> str:
        """A request's one Authorization value ("" when it sent none). Two are refused, 400 as RFC
        6750 (3.1) answers a request that repeats a parameter: only the first was read (aiohttp's
        headers.get, the first metadata value), so `Bearer <token>` then `Bearer wrong` passed
        where the other order was a 401 (a tester, t44). Neither value is quoted: one may be the
        token."""
        if len(sent) > 1:
            self.refused["repeated_header"] += 1
        return single_value("Authorization", sent) or ""

    def _invalid(self) -> None:
        """Count a wrong token, and say so in the log at most once every LOG_EVERY_S (never the
        token itself): a misconfigured client, or someone guessing. Those refused meanwhile are
        said when that time is up (on the event loop, where every check runs)."""
        self.refused["invalid_token"] += 1
        self._invalid_unlogged += 1
        if self._logged_at is None:
            self._say_invalid()
        elif self._invalid_unlogged == 1:  # the first one held back: its line comes when the time is up
            wait = self._logged_at + LOG_EVERY_S - time.monotonic()
            try:
                asyncio.get_running_loop().call_later(max(0.0, wait), self._say_invalid)
            except RuntimeError:  # no loop (a check outside the server): close() says them
                pass

    def close(self) -> None:
        """The server stops: the wrong tokens held back are said now (their counter goes with
        the process). Idempotent."""
        if self._invalid_unlogged:
            self._say_invalid()

    def _say_invalid(self) -> None:
        if not self._invalid_unlogged:
            return  # (said by close() before the scheduled line came)
        now = time.monotonic()
        log.warning("refused %d request(s) with an invalid API token%s (/metrics aclserve_auth_refusals_total "
                    "counts them all)", self._invalid_unlogged,
                    "" if self._logged_at is None else f" in the last {now - self._logged_at:.0f} s")
        self._invalid_unlogged, self._logged_at = 0, now

    def check_control(self, sent: Sequence[str], what: str) -> None:
        """A management action (`what` is disabled, e.g. "model load/unload is"): the token when
        one is set; else only on loopback (where check_route refuses a web page's over HTTP too:
        gRPC is no protocol a page can speak). `sent`: the request's Authorization values."""
        if self._token:
            self.check_value(sent)
        elif not self.control_open:
            self.refused["no_token_configured"] += 1
            raise Forbidden(f"{what} disabled: the server listens on {self.host} without "
                            f"an API token (set api_token in the config or {TOKEN_ENV})")

    def check_trace_change(self, sent: Sequence[str]) -> None:
        """A change of trace settings (it decides how many trace files are written)."""
        self.check_control(sent, "trace setting changes are")

    def check_repository_value(self, sent: Sequence[str], action: str | None) -> None:
        """The repository API, `action` "load", "unload" or None (the index): the token when one
        is set (the index too); else load/unload only on loopback."""
        if action is not None:
            self._check_action(action)
        if action is not None or self._token:
            self.check_control(sent, _LOAD_UNLOAD)

    def _check_action(self, action: str) -> None:
        """Off loopback without a token, a load or unload that model_control_mode `none` refuses
        anyway gets that refusal (400, as the repository words it with a token), not a 403 advising
        a token that would not enable it (a tester, t59: every KServe pod runs in that mode)."""
        if not self.control_open:
            check_control_mode(self.control_mode, action)

    def check_route(self, request: web.Request) -> None:
        """What the route `request` matched asks of it: the middleware's check, and the expect
        handlers', which aiohttp runs before the middlewares. Matches the route template, not
        the raw path, so no spelling of a URL reaches a protected route unchecked."""
        resource = request.match_info.route.resource
        template = resource.canonical if resource is not None else ""
        if self.inference and (template.startswith(_MODELS) or template in _MODEL_READINGS):
            self.check(request)  # (a change of trace settings too: a token is set)
            return
        what = _control(template, request.method)
        if what is _LOAD_UNLOAD:
            self._check_action(template.rpartition("/")[2])  # (the template ends in /load or /unload)
        if what is not None:
            self.check_control(request.headers.getall("Authorization", ()), what)
            if not self._token:  # open because the server listens on loopback only
                self._refuse_web_pages(request, what)
        elif self._token and template.startswith(_REPOSITORY):  # the index
            self.check(request)

    def _refuse_web_pages(self, request: web.BaseRequest, what: str) -> None:
        """A control request a browser may have sent for a page of another site (web_pages.py)."""
        reason = page_refusal(request.headers, request.scheme)
        if reason is not None:
            self.refused["web_page"] += 1
            raise Forbidden(f"{what} refused to requests from web pages: {reason}. Without an API token the "
                            "server takes them on loopback from clients that are not browsers only; set api_token "
                            f"in the config or {TOKEN_ENV} to send them from elsewhere")

    def log_startup(self) -> None:
        if self._token:
            also = ", inference, /metrics and the trace settings' reading" if self.inference else ""
            if self.control_mode == "none":  # (a token enables no load/unload there: a tester read it so)
                log.info("API token set: the repository index, trace setting changes%s need it (model "
                         "load/unload stays disabled: model_control_mode is none)", also)
            else:
                log.info("API token set: the repository API, trace setting changes%s need it", also)
            if self.in_clear:
                log.warning("listening on %s without TLS: the API token crosses the network in the clear; "
                            "set tls_cert_file and tls_key_file, or terminate TLS in a proxy in front", self.host)
        elif not self.control_open and self.control_mode == "none":  # (no token enables load/unload there)
            log.warning("listening on %s without an API token: trace setting changes are refused (403); set "
                        "api_token in the config or %s to enable them (model load/unload stays disabled: "
                        "model_control_mode is none)", self.host, TOKEN_ENV)
        elif not self.control_open:
            log.warning("listening on %s without an API token: model load/unload requests and trace setting "
                        "changes are refused (403); set api_token in the config or %s to enable them",
                        self.host, TOKEN_ENV)


def _control(template: str, method: str) -> str | None:
    """The management action of a route (as a refusal names it: "... is disabled"), or None."""
    if template.startswith(_REPOSITORY) and not template.endswith("/index"):
        return _LOAD_UNLOAD
    if method == "POST" and template.endswith(_TRACE_SETTING):
        return "trace setting changes are"
    return None


def access_middleware(access: Access):
    """The app's middleware that checks `access` on every request, infer included (check_route)."""
    @web.middleware
    async def check_access(request: web.Request, handler) -> web.StreamResponse:
        access.check_route(request)
        return await handler(request)
    return check_access
