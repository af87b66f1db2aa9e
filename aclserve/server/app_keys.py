"""Typed keys of the aiohttp application's state."""
from __future__ import annotations

from aiohttp import web

from .state import ServerState

STATE = web.AppKey("aclserve_state", ServerState)
