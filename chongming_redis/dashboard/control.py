"""Control routes, mounted only with ``--allow-control``: sign in and out, and stop / pause /
resume / retry a task from its page (a form with a CSRF value) or from a script
(``POST /api/v1/control`` with ``Authorization: Bearer <token>``). Both go through the
``Client``, so a button does what ``chongming-redis stop`` does and reports the same outcome."""

from __future__ import annotations

from urllib.parse import quote

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from chongming_redis.client.client import Client
from chongming_redis.client.flows import CommandTimeout, TaskNotFound
from chongming_redis.dashboard import auth
from chongming_redis.dashboard.listing import task_path
from chongming_redis.dashboard.pages import error_page, render
from chongming_redis.dashboard.state import ControlSettings, DashboardState
from chongming_redis.errors import StoreError

ACTIONS = ("stop", "pause", "resume", "retry")


def _settings(request: Request) -> tuple[DashboardState, ControlSettings]:
    dash: DashboardState = request.app.state.dash
    assert dash.control is not None  # these routes exist only with control on
    return dash, dash.control


def _signed_in_response(settings: ControlSettings, target: str) -> Response:
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(auth.COOKIE, auth.new_session(settings), httponly=True,
                        samesite="strict", path="/")  # fmt: skip
    return response


async def login_form(request: Request) -> Response:
    _, settings = _settings(request)
    token = request.query_params.get("token")
    if token is not None:  # the link printed at start
        if auth.token_ok(settings, token):
            return _signed_in_response(settings, "/")
        return render(request, "login.html", 403, message="That token is not this dashboard's.")
    return render(request, "login.html", message=None)


async def login(request: Request) -> Response:
    _, settings = _settings(request)
    form = await request.form()
    token = form.get("token")
    if not auth.same_origin(request):
        return render(request, "login.html", 403, message="Cross-site sign-in refused.")
    if not isinstance(token, str) or not auth.token_ok(settings, token):
        return render(request, "login.html", 403, message="That token is not this dashboard's.")
    return _signed_in_response(settings, "/")


async def logout(request: Request) -> Response:
    _, settings = _settings(request)
    form = await request.form()
    csrf = form.get("csrf")
    if not isinstance(csrf, str) or not auth.form_ok(settings, request, csrf):
        return error_page(request, 403, "Refused", "This form did not come from this dashboard.")
    auth.end_session(settings, request)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(auth.COOKIE, path="/")
    return response


async def control_form(request: Request) -> Response:
    """A button on a task page: act, then back to the page with the outcome."""
    dash, settings = _settings(request)
    form = await request.form()
    csrf, task_id, action = form.get("csrf"), form.get("task_id"), form.get("action")
    if not isinstance(csrf, str) or not auth.form_ok(settings, request, csrf):
        return error_page(request, 403, "Refused",
                          "Sign in first; this form did not come from this dashboard.")  # fmt: skip
    if not isinstance(task_id, str) or not task_id or action not in ACTIONS:
        return error_page(request, 400, "Bad request", "A control form needs task_id and action.")
    assert isinstance(action, str)
    try:
        outcome = await to_thread.run_sync(act, dash, settings, task_id, action)
    except StoreError as exc:
        return error_page(request, 503, "The store cannot be written", str(exc))
    except (TaskNotFound, ValueError) as exc:
        outcome = f"refused: {exc}"
    note = f"{action}: {outcome}"
    signature = auth.sign_note(settings, note)
    return RedirectResponse(f"{task_path(task_id)}?done={quote(note, safe='')}&sig={signature}",
                            status_code=303)  # fmt: skip


async def control_api(request: Request) -> Response:
    """``POST /api/v1/control`` ``{"task_id": ..., "action": "stop"}`` -> ``{"outcome": ...}``."""
    dash, settings = _settings(request)
    if not auth.bearer_ok(settings, request):
        return JSONResponse({"error": "unauthorized", "message": "send Authorization: Bearer "
                             "<the dashboard's token>"}, status_code=401)  # fmt: skip
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("action") not in ACTIONS:
        return JSONResponse({"error": "bad_request", "message": "the body must be "
                             '{"task_id": "...", "action": "stop|pause|resume|retry"}'},
                            status_code=400)  # fmt: skip
    task_id, action = body.get("task_id"), body["action"]
    if not isinstance(task_id, str) or not task_id:
        return JSONResponse({"error": "bad_request", "message": "task_id must be a non-empty "
                             "string"}, status_code=400)  # fmt: skip
    try:
        outcome = await to_thread.run_sync(act, dash, settings, task_id, action)
    except StoreError as exc:
        return JSONResponse({"error": "store_unavailable", "message": str(exc)}, status_code=503)
    except TaskNotFound as exc:
        return JSONResponse({"error": "no_such_task", "message": str(exc)}, status_code=404)
    except ValueError as exc:
        return JSONResponse({"error": "refused", "message": str(exc)}, status_code=409)
    if outcome == "no-such-task":
        return JSONResponse({"error": "no_such_task", "message": f"no task {task_id!r}"},
                            status_code=404)  # fmt: skip
    return JSONResponse({"task_id": task_id, "action": action, "outcome": outcome})


def act(dash: DashboardState, settings: ControlSettings, task_id: str, action: str) -> str:
    """Do it through the Client and say how it ended (``stopped``, ``no answer yet`` ...)."""
    client = Client(dash.store)
    try:
        if action == "retry":
            client.retry(task_id)
            return "a new attempt is pending"
        control = {"stop": client.stop, "pause": client.pause, "resume": client.resume}[action]
        return control(task_id, wait=True, timeout=settings.command_timeout)
    except CommandTimeout:
        return f"sent; no answer within {settings.command_timeout:g} s"
