"""Who may press the control buttons (``--allow-control``).

A user signs in with the token the dashboard printed at start (``/login``); the session cookie
holds a random id made for that sign-in (``HttpOnly``, ``SameSite=Strict``; never the token),
kept in memory until sign-out, so a copied cookie dies with its session and a restart signs
everyone out. Every control form carries a
CSRF value, an HMAC of the session, and a cross-site ``Origin`` is refused as well. Scripts
send the token as ``Authorization: Bearer <token>`` instead (no cookie, so no CSRF check).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from starlette.requests import Request

from chongming_redis.dashboard.state import ControlSettings, DashboardState

COOKIE = "chongming_session"


#: Sessions kept at most; the oldest is dropped beyond (bounded memory whatever the sign-ins).
MAX_SESSIONS = 10_000


def _sign(settings: ControlSettings, what: str) -> str:
    return hmac.new(settings.secret, what.encode(), hashlib.sha256).hexdigest()


def new_session(settings: ControlSettings) -> str:
    """A random session id for one sign-in (the cookie's value: never the token)."""
    session = secrets.token_urlsafe(32)
    settings.sessions[session] = None
    while len(settings.sessions) > MAX_SESSIONS:
        del settings.sessions[next(iter(settings.sessions))]
    return session


def end_session(settings: ControlSettings, request: Request) -> None:
    settings.sessions.pop(request.cookies.get(COOKIE, ""), None)


def csrf_value(settings: ControlSettings, session: str) -> str:
    return _sign(settings, "csrf:" + session)


def token_ok(settings: ControlSettings, token: str) -> bool:
    return hmac.compare_digest(token.encode(), settings.token.encode())


def bearer_ok(settings: ControlSettings, request: Request) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(token) and token_ok(settings, token.strip())


def session_of(settings: ControlSettings | None, request: Request) -> str | None:
    """The request's session, if it is signed in."""
    if settings is None:
        return None
    session = request.cookies.get(COOKIE, "")
    return session if session and session in settings.sessions else None


def same_origin(request: Request) -> bool:
    """A browser's ``Origin`` (or, without it, ``Referer``) names this dashboard."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return True  # not a browser form post across sites: SameSite and CSRF still apply
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    return origin == own or origin.startswith(own + "/")


def form_ok(settings: ControlSettings, request: Request, csrf: str) -> bool:
    """A control form from a signed-in user's own page."""
    session = session_of(settings, request)
    return (
        session is not None
        and hmac.compare_digest(csrf.encode(), csrf_value(settings, session).encode())
        and same_origin(request)
    )


def sign_note(settings: ControlSettings, note: str) -> str:
    """The signature of a button's outcome, carried in the redirect with it."""
    return _sign(settings, "note:" + note)[:32]


def note_ok(settings: ControlSettings | None, note: str, signature: str) -> bool:
    """An outcome this dashboard wrote (a link cannot put words on a task page)."""
    if settings is None:
        return False
    return hmac.compare_digest(signature.encode(), sign_note(settings, note).encode())


def page_context(dash: DashboardState, request: Request) -> dict[str, Any]:
    """What the layout and the control parts need to know about the user."""
    settings = dash.control
    session = session_of(settings, request)
    if settings is None or session is None:
        return {"signed_in": False, "csrf": ""}
    return {"signed_in": True, "csrf": csrf_value(settings, session)}
