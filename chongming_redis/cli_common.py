"""What every CLI command shares: the consoles, the option types, one-line user errors, and
how a command opens the store and loads the app (``cli.py`` and ``cli_worker.py`` use them)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console

from chongming_redis.env import AUDIT_ENV
from chongming_redis.errors import StoreError
from chongming_redis.runtime.app import App, InvalidParams, UnknownTask

console = Console()
err = Console(stderr=True)

RedisOpt = Annotated[
    str | None,
    typer.Option("--redis", envvar="CHONGMING_REDIS_URL", help="redis:// or unix:// URL"),
]
NamespaceOpt = Annotated[
    str, typer.Option("--namespace", envvar="CHONGMING_NAMESPACE", help="store namespace")
]
BucketsOpt = Annotated[int, typer.Option("--num-buckets", help="deployment-wide bucket count")]


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


def fail(message: str) -> None:
    # soft_wrap: one line whatever the width (rich wraps at 80 columns when not on a terminal)
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except (UserError, StoreError, UnknownTask, InvalidParams, ValueError, TypeError) as exc:
        fail(_params_line(str(exc)) if isinstance(exc, InvalidParams) else str(exc))


def _params_line(text: str) -> str:
    """pydantic's multi-line report as one line: ``... for Model: frames: Input should be ...``
    (each error is a location line, an indented message and an indented link)."""
    head, *rest = text.splitlines()
    errors, location = [], ""
    for line in rest:
        if not line.startswith(" "):
            location = line
        elif not line.startswith("    "):
            message = line.strip().split(" [type=", 1)[0]
            errors.append(f"{location}: {message}" if location else message)
            location = ""
    return f"{head}: {'; '.join(errors)}" if errors else head


def open_store(redis_url: str | None, namespace: str) -> Any:
    from chongming_redis.stores.redis import RedisTaskStore

    if not redis_url:
        raise UserError("no Redis given: pass --redis URL or set CHONGMING_REDIS_URL")
    store = RedisTaskStore.from_url(
        redis_url,
        namespace=namespace,
        socket_timeout=5,
        socket_connect_timeout=2,
        retries=1,
        audit=os.environ.get(AUDIT_ENV) == "1",
    )
    store.counts()  # fail now, with one line, if the server cannot be reached
    return store


def load_app(spec: str) -> App:
    """``module:attribute`` naming an ``App``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UserError(f"APP must look like 'package.module:app', not {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import {module_name!r}: {exc}") from None
    found = getattr(module, attribute, None)
    if not isinstance(found, App):
        raise UserError(f"{spec!r} is not a chongming_redis App")
    return found
