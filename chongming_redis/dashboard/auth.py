"""Who may press the control buttons (``--allow-control``).

A user signs in with the token the dashboard printed at start (``/login``); the session cookie
is an HMAC of the token under a secret made at start (``HttpOnly``, ``SameSite=Strict``), so
the cookie never holds the token and a restart signs everyone out. Every control form carries a
CSRF value, an HMAC of the session, and a cross-site ``Origin`` is refused as well. Scripts
send the token as ``Authorization: Bearer <token>`` instead (no cookie, so no CSRF check).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from starlette.requests import Request

from chongming_redis.dashboard.state import ControlSettings, DashboardState

COOKIE = "chongming_session"


def _sign(settings: ControlSettings, what: str) -> str:
    return hmac.new(settings.secret, what.encode(), hashlib.sha256).hexdigest()


def session_value(settings: ControlSettings) -> str:
    return _sign(settings, "session:" + settings.token)


def csrf_value(settings: ControlSettings) -> str:
    return _sign(settings, "csrf:" + session_value(settings))


def token_ok(settings: ControlSettings, token: str) -> bool:
    return hmac.compare_digest(token.encode(), settings.token.encode())


def bearer_ok(settings: ControlSettings, request: Request) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(token) and token_ok(settings, token.strip())


def signed_in(settings: ControlSettings | None, request: Request) -> bool:
    if settings is None:
        return False
    cookie = request.cookies.get(COOKIE, "")
    return hmac.compare_digest(cookie.encode(), session_value(settings).encode())


def same_origin(request: Request) -> bool:
    """A browser's ``Origin`` (or, without it, ``Referer``) names this dashboard."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return True  # not a browser form post across sites: SameSite and CSRF still apply
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    return origin == own or origin.startswith(own + "/")


def form_ok(settings: ControlSettings, request: Request, csrf: str) -> bool:
    """A control form from a signed-in user's own page."""
    return (
        signed_in(settings, request)
        and hmac.compare_digest(csrf.encode(), csrf_value(settings).encode())
        and same_origin(request)
    )


def page_context(dash: DashboardState, request: Request) -> dict[str, Any]:
    """What the layout and the control parts need to know about the user."""
    settings = dash.control
    if settings is None or not signed_in(settings, request):
        return {"signed_in": False, "csrf": ""}
    return {"signed_in": True, "csrf": csrf_value(settings)}
