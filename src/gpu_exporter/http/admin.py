"""The admin API, mounted only with ``--web.enable-admin-api``: an operator clears a GPU's drain
recommendation after a repair the exporter could not see (a GPU reset that never made it look
lost, a replaced board before the node's reboot).

``POST /-/drain/clear`` with ``{"uuid": "GPU-...", "reason": "hardware_xid"}`` (``reason``
optional: every reason) answers 200 ``{"uuid": ..., "cleared": [reasons]}``; ``cleared`` is empty
when nothing was set. The body must be JSON (``Content-Type: application/json``, else 415): a
browser cannot send that cross-site without a CORS preflight, which the exporter never answers,
so a page an operator visits cannot clear a drain through their browser. The web config's TLS and
credentials apply as on ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web

from ..bodies import BadBody, parse_json, read_text
from ..logs import get_logger
from ..safeyaml import quote
from ..xid.state import REASONS
from .webguard import basic_auth_user

DRAIN_CLEAR_PATH = "/-/drain/clear"
MAX_UUID_CHARS = 128

_log = get_logger("admin")


class DrainClearer(Protocol):
    async def clear_drain(
        self, gpu_uuid: str, reasons: Iterable[str] | None, who: str
    ) -> list[str]: ...


class BadRequest(ValueError):
    """A request the admin API refuses, with the line to answer."""


def admin_routes(xid: DrainClearer, *, credentials_checked: bool) -> list[web.RouteDef]:
    """``credentials_checked``: the web config has basic-auth users, so the request guard has
    verified the user a request names before it gets here."""

    async def clear_drain(request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return _error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send application/json")
        try:
            gpu_uuid, reasons = _parse_clear(await _json(request))
        except BadRequest as exc:
            return _error(HTTPStatus.BAD_REQUEST, str(exc))
        who = _who(request, credentials_checked)
        cleared = await xid.clear_drain(gpu_uuid, reasons, who)
        _log.warning(
            "drain recommendation cleared by an operator",
            uuid=gpu_uuid,
            requested=sorted(reasons) if reasons is not None else "all",
            cleared=cleared,
            by=who,
        )
        return web.json_response({"uuid": gpu_uuid, "cleared": cleared})

    return [web.post(DRAIN_CLEAR_PATH, clear_drain)]


async def _json(request: web.Request) -> Any:
    try:
        return parse_json(await read_text(request))
    except BadBody as exc:  # a bogus charset, invalid UTF-8, not JSON, nested too deeply
        raise BadRequest(str(exc)) from None


def _parse_clear(body: Any) -> tuple[str, list[str] | None]:
    """``{"uuid": "GPU-...", "reason": <one of REASONS>}`` -> (uuid, [reason] or None)."""
    if not isinstance(body, dict):
        raise BadRequest('body must be an object: {"uuid": "GPU-...", "reason": "..."}')
    unknown = sorted(set(body) - {"uuid", "reason"})
    if unknown:
        raise BadRequest(f"unknown key {quote(unknown[0])} (allowed: uuid, reason)")
    gpu_uuid = body.get("uuid")
    if not isinstance(gpu_uuid, str) or not gpu_uuid.startswith("GPU-"):
        raise BadRequest("uuid: a whole GPU's uuid, GPU-... (drains are per GPU, not MIG)")
    if len(gpu_uuid) > MAX_UUID_CHARS:
        raise BadRequest(f"uuid: longer than {MAX_UUID_CHARS} characters")
    reason = body.get("reason")
    if reason is None:
        return gpu_uuid, None
    if reason not in REASONS:
        raise BadRequest(f"reason: {quote(reason)} is not one of {', '.join(REASONS)}")
    return gpu_uuid, [reason]


def _who(request: web.Request, credentials_checked: bool) -> str:
    """Who asked, for the log: the verified basic-auth user, if any, and the peer address."""
    user = basic_auth_user(request.headers.get("Authorization")) if credentials_checked else None
    address = request.remote or "unknown"
    return f"{user}@{address}" if user else address


def _error(status: HTTPStatus, text: str) -> web.Response:
    return web.Response(status=status, text=f"{text}\n")
