"""``chongming-redis dashboard``: the web dashboard on uvicorn.

The socket is bound before anything else, so a port in use is one ``error:`` line (not a
uvicorn traceback). It listens on 127.0.0.1 unless ``--host`` says otherwise, and is read-only
unless ``--allow-control``; then it prints the sign-in link with the token once. It needs the
``[dashboard]`` extra: without it, one line naming it, before anything is opened.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import sys
from typing import Annotated

import typer

from chongming_redis.cli.common import (
    ClusterOpt,
    DurabilityOpt,
    NamespaceOpt,
    RedisOpt,
    StoreOpt,
    UserError,
    console,
    err,
    open_store,
    user_errors,
    where,
)
from chongming_redis.cli.registry import Commands
from chongming_redis.errors import require_extra

TOKEN_ENV = "CHONGMING_DASHBOARD_TOKEN"
commands = Commands()


@commands.command(
    epilog="Example: chongming-redis dashboard --redis redis://127.0.0.1:6379/0 --port 8000 "
    "--allow-control"
)
def dashboard(
    ctx: typer.Context,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on (0: any free port)")] = 8000,
    allow_control: Annotated[
        bool, typer.Option("--allow-control", help="show stop/pause/resume/retry buttons to "
                           "users signed in with the token")
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(envvar=TOKEN_ENV, help="the sign-in token for --allow-control (better "
                     f"in {TOKEN_ENV}: a command line is visible to every user of the "
                     "machine; default: a new random one, printed)"),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option("--allowed-host", help="a Host name to answer besides the address "
                     "listened on (repeatable: a proxy's or a DNS name)"),
    ] = None,
) -> None:  # fmt: skip
    """Serve the web dashboard: overview, task list, task pages, live from the change feed.

    Also /api/v1/tasks (the change feed as JSON) and /metrics (Prometheus).
    """
    with user_errors():
        require_extra("dashboard", "the dashboard")
        if token is not None and not allow_control:
            source = ctx.get_parameter_source("token")
            if getattr(source, "name", None) != "ENVIRONMENT":
                raise UserError("--token is for --allow-control (read-only without it)")
            token = None  # an exported token does not turn control on
        if token is not None and len(token) < 16:
            raise UserError("the token must be at least 16 characters")
        if not 0 <= port <= 65535:
            raise UserError(f"--port must be from 0 to 65535, not {port}")
        store = open_store(redis, namespace, store_url=store_url, check_server=False,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        sock = _listen(host, port)
        control_token = (token or secrets.token_urlsafe(24)) if allow_control else None
        hosts = allowed_hosts(host, allowed_host or [])
        # uvicorn shuts down cleanly on Ctrl-C, then re-raises it: that is a normal stop.
        with contextlib.suppress(KeyboardInterrupt):
            serve(store, sock, namespace=namespace, store_url=redis or store_url or "",
                  token=control_token, hosts=hosts)  # fmt: skip
        console.print("dashboard stopped", highlight=False)


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def allowed_hosts(host: str, extra: list[str]) -> list[str]:
    """The ``Host`` headers to answer: the address listened on (every loopback name for a
    loopback address) and ``extra``. A web page that rebinds its own DNS name to this address
    sends its own name and is refused. Listening on every address with no ``--allowed-host``
    answers any name (the start-up warning says so)."""
    if host in ("0.0.0.0", "::", ""):
        return list(extra) or ["*"]
    names = list(LOOPBACK) if host in LOOPBACK else [host, f"[{host}]"]
    return list(dict.fromkeys([*names, *extra]))


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


def serve(store: object, sock: socket.socket, *, namespace: str, store_url: str,
          token: str | None, hosts: list[str]) -> None:  # fmt: skip
    import uvicorn

    from chongming_redis.dashboard import create_app
    from chongming_redis.stores.protocol import TaskStore

    assert isinstance(store, TaskStore)
    app = create_app(store, namespace=namespace, control_token=token, allowed_hosts=hosts)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    console.print(f"dashboard of {where(namespace, store_url)}: {url}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if token is None:
        console.print("read-only (--allow-control adds stop/pause/resume/retry buttons)",
                      highlight=False)  # fmt: skip
    else:
        console.print(f"control on: sign in at {url}login?token={token}", highlight=False,
                      soft_wrap=True)  # fmt: skip
    if host not in ("127.0.0.1", "::1", "localhost"):
        warning = (f"warning: listening on {host}: anyone who reaches this address sees every "
                   "task (and can sign in with the token)")  # fmt: skip
        if hosts == ["*"]:
            warning += "; any Host name is answered (--allowed-host NAME to restrict)"
        err.print(warning, highlight=False, soft_wrap=True)
    # log_config=None: uvicorn's own logging set-up runs logging.config.dictConfig, which
    # closes and re-creates every handler of the process (and once failed in CI releasing a
    # handler lock it did not hold). Its warnings go to stderr through one plain handler.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dashboard: %(levelname)s %(message)s"))
    logging.getLogger("uvicorn").addHandler(handler)
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=2)  # fmt: skip
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        store_close = getattr(store, "close", None)
        if store_close is not None:
            store_close()


register = commands.register
