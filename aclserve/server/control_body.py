"""The body of a control route (the repository API, trace settings): a JSON object of a few
bytes, read whole within body_timeout_s, charged to the memory budget, at most the route's own
limit (or max_body_bytes when that is lower; a 413 names the one that applied).

Its `Expect: 100-continue` is answered only when the read would take the body (its declared length
fits, its Content-Encoding is one it inflates): the routes' common expect handler told the client
to send a body the read then refused, unread, with a 413."""
from __future__ import annotations

import orjson
from aiohttp import web

from ..errors import InvalidInput
from .app_keys import STATE
from .body import body_limit, read_body, refuse_from_head
from .expect import continue_within


class ControlBody:
    def __init__(self, max_bytes: int, limit_name: str):
        self.max_bytes, self.limit_name = max_bytes, limit_name

    def _limit(self, config) -> tuple[int, str]:
        return body_limit(config.max_body_bytes, self.max_bytes, self.limit_name)

    async def expect(self, request: web.Request) -> web.Response | None:
        """The route's expect handler (aiohttp runs it before the middlewares: expect.py)."""
        return await continue_within(request, lambda r, state: refuse_from_head(r, state.budget,
                                                                                *self._limit(state.config)))

    async def read_object(self, request: web.Request) -> dict:
        """The body's JSON object ({} for an empty body); 400 for anything else."""
        state = request.app[STATE]
        with state.budget.lease() as lease:
            limit, name = self._limit(state.config)
            raw = await read_body(request, lease, limit, state.config.body_timeout_s, state.body_reads, name,
                                  state.config.max_inflate_ratio, state.stalled_bodies)
            if not raw.strip():
                return {}
            try:
                doc = orjson.loads(raw)  # depth-limited: deep nesting is a JSONDecodeError, not a RecursionError
            except orjson.JSONDecodeError as e:
                raise InvalidInput(f"request body is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise InvalidInput("request body must be a JSON object")
        return doc
