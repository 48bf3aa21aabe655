"""What every CLI command shares: the consoles, the option types, one-line user errors, a
progress bar for long operations, and how a command opens the store and loads the app
(``cli/worker.py``, ``cli/read.py``, ``cli/render.py`` and the other command modules use them)."""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from chongming_redis.cli.log_writer import one_line
from chongming_redis.embedded.redis_server import EmbeddedRedisError
from chongming_redis.env import AUDIT_ENV, CLUSTER_ENV
from chongming_redis.env import REDIS_ENV as REDIS_ENV
from chongming_redis.errors import MissingExtra, StoreError
from chongming_redis.runtime.app import App, InvalidParams, UnknownTask
from chongming_redis.stores.urls import shown_url

if TYPE_CHECKING:
    from rich.console import Console

    from chongming_redis.policy import RetryPolicy

    console: Console  # stdout; ``__getattr__`` makes it
    err: Console  # stderr


def __getattr__(name: str) -> Any:
    """``console`` (stdout) and ``err`` (stderr), made at their first use: rich costs ~20 ms
    to import, and a worker's start prints nothing with it."""
    if name not in ("console", "err"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _console(name)


def _console(name: str) -> Console:
    """The console ``name`` (``console`` or ``err``), made once (the first one made wins a race
    between threads)."""
    if name not in globals():
        from rich.console import Console

        globals().setdefault(name, Console(stderr=name == "err"))
    made: Console = globals()[name]
    return made


#: The width of tables written to a pipe or a file, or with ``--wide``: wide enough that no
#: column (a task id above all) is ever cut or wrapped.
UNLIMITED = 100_000

#: Where ``--store`` is read from when not given.
STORE_ENV = "CHONGMING_STORE_URL"

#: Where ``--durability-replicas`` is read from when not given.
DURABILITY_ENV = "CHONGMING_DURABILITY_REPLICAS"


def _one_store(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """``--redis`` and ``--store`` name the one store a command opens: given both on the
    command line (or both in the environment) is a usage error; one on the command line and
    the other in the environment: the command line wins (an exported CHONGMING_REDIS_URL does
    not stop ``--store sqlite:///...``)."""
    if value is None or param.name is None:
        return value
    source = ctx.get_parameter_source(param.name)
    from_env = getattr(source, "name", None) == "ENVIRONMENT"
    seen: dict[str, bool] = ctx.meta.setdefault("chongming_redis.store_sources", {})
    other = "store_url" if param.name == "redis" else "redis"
    seen[param.name] = from_env
    if other not in seen:
        return value
    if from_env and not seen[other]:
        return None  # the other one came from the command line
    if seen[other] and not from_env:
        ctx.params[other] = None  # this one did
        return value
    both = f"{REDIS_ENV} and {STORE_ENV} are both set" if from_env else "both given"
    raise typer.BadParameter(f"--redis and --store name the same store: give one ({both})")


RedisOpt = Annotated[
    str | None,
    typer.Option("--redis", envvar=REDIS_ENV, callback=_one_store,
                 help="redis://, rediss:// or unix:// URL, or redis+sentinel://host:port,"
                      "host:port/service/db for the primary Sentinel names"),
]  # fmt: skip
StoreOpt = Annotated[
    str | None,
    typer.Option("--store", envvar=STORE_ENV, callback=_one_store,
                 help="any store's URL instead of --redis: redis://..., sqlite:///abs/path "
                      "(or sqlite:relative/path), postgresql://... (the namespace is its "
                      "schema)"),
]  # fmt: skip


def _replica_count(value: int) -> int:
    if value < 0:
        raise typer.BadParameter(f"must be 0 or more, not {value}")
    return value


DurabilityOpt = Annotated[
    int,
    typer.Option("--durability-replicas", envvar=DURABILITY_ENV, metavar="N",
                 callback=_replica_count,
                 help="Redis: a write counts as done only once N replicas confirmed it (WAIT), "
                      "else it fails as the store being unavailable (0: do not wait)"),
]  # fmt: skip
ClusterOpt = Annotated[
    bool,
    typer.Option("--cluster", envvar=CLUSTER_ENV,
                 help="Redis: the URL names a node of a Redis Cluster (the namespace lives in "
                      "one slot; the client finds the other nodes)"),
]  # fmt: skip
NamespaceOpt = Annotated[
    str, typer.Option("--namespace", envvar="CHONGMING_NAMESPACE", help="store namespace")
]
BucketsOpt = Annotated[int, typer.Option("--num-buckets", help="deployment-wide bucket count")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="print JSON instead of tables (keys: see the README)")
]
WideOpt = Annotated[
    bool,
    typer.Option("--wide", help="never cut a column on a terminal (a pipe never cuts them)"),
]


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


def fail(message: str) -> None:
    say_error(message)
    raise typer.Exit(1)


#: Held while a line that must be the last one is printed: an error ends the output (a hint
#: printed by another thread, ``cli/worker.py``'s Ctrl-C line, is not printed after it).
LAST_WORD = threading.Lock()
ERRORED = threading.Event()


def say_error(message: str) -> None:
    """``error: message`` on one line of stderr; the message is plain text, never markup.
    A line break in it (a driver's error quoted: libpq's have them) becomes a space."""
    # soft_wrap: one line whatever the width (rich wraps at 80 columns when not on a terminal)
    from rich.text import Text

    with LAST_WORD:
        ERRORED.set()
        line = Text("error:", style="red") + Text(f" {one_line(message)}")
        _console("err").print(line, highlight=False, soft_wrap=True)


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except (UserError, StoreError, UnknownTask, InvalidParams, ValueError, TypeError,
            EmbeddedRedisError, MissingExtra) as exc:  # fmt: skip
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


def open_store(
    redis_url: str | None,
    namespace: str,
    *,
    store_url: str | None = None,
    check_server: bool = False,
    create: bool = False,
    durability_replicas: int = 0,
    cluster: bool = False,
) -> Any:
    """The namespace's store, from ``--redis`` or ``--store`` (``_one_store`` leaves at most
    one of them); fails with one line when the URL is bad or the server cannot be reached.
    ``check_server``: warn (once per process) about Redis settings that can lose data: the
    worker does (where it matters: it writes every task's progress); every other command skips
    it, so the warning is not repeated on every ``submit``, ``stop``, ``wait`` or ``tasks``.
    ``create``: a SQLite file that is not there yet is created (a worker, a submit); else it is
    refused, so a mistyped path reads as an error, not as an empty database.
    ``durability_replicas`` (``--durability-replicas``, Redis only): writes wait for that
    many replicas (``RedisTaskStore``). ``cluster`` (``--cluster``, Redis only): the URL names a
    node of a Redis Cluster (``RedisTaskStore.from_url(cluster=True)``)."""
    from chongming_redis.stores.urls import open_store_url

    url = store_target(redis_url, store_url, namespace)
    options: dict[str, Any] = {"socket_timeout": 5, "socket_connect_timeout": 2, "retries": 1,
               "check_server": check_server, "audit": os.environ.get(AUDIT_ENV) == "1"}  # fmt: skip
    if durability_replicas:
        if parse_kind(url) not in (None, "redis"):
            raise UserError("--durability-replicas is for Redis (replicas WAIT counts); "
                            f"{shown_url(url)!r} is not a Redis URL")  # fmt: skip
        options["durability_replicas"] = durability_replicas
    if cluster:
        if parse_kind(url) not in (None, "redis"):
            raise UserError(f"--cluster is for Redis Cluster; {shown_url(url)!r} is not a "
                            "Redis URL")  # fmt: skip
        options["cluster"] = True
    if parse_kind(url) == "postgresql":
        # psycopg's pool logs every failed reconnection attempt (a warning each, with a second
        # line): the CLI says an outage once (a command's error line, a worker's outage log).
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    if store_url is None:  # --redis: redis-py judges the URL, as it always did
        from chongming_redis.stores.redis import RedisTaskStore

        store: Any = RedisTaskStore.from_url(url, namespace=namespace, **options)
    else:
        store = open_store_url(url, namespace=namespace, must_exist=not create,
                               redis_options=options)  # fmt: skip
    try:
        store.counts()  # fail now, with one line, if the server cannot be reached
    except BaseException:
        store.close()
        raise
    return store


def store_target(redis_url: str | None, store_url: str | None, namespace: str) -> str:
    """The URL to open, checked without opening anything: a ``UserError`` or ``StoreUrlError``
    for a missing or bad URL, a ``--redis`` that is not Redis, or a namespace the store
    cannot hold; ``MissingExtra`` for a store whose extra is not installed (PostgreSQL)."""
    from chongming_redis.stores.urls import parse_store_url

    if store_url is not None:
        target = parse_store_url(store_url)
        target.check_namespace(namespace)
        target.check_driver()
        return store_url
    if not redis_url:
        raise UserError(f"no Redis given: pass --redis URL or set {REDIS_ENV} (or --store URL / "
                        f"{STORE_ENV} for SQLite or PostgreSQL)")  # fmt: skip
    if parse_kind(redis_url) not in (None, "redis"):
        raise UserError(f"bad Redis URL {shown_url(redis_url)!r}: --redis takes redis://, "
                        "rediss://, unix:// or redis+sentinel://; give other stores with "
                        "--store")  # fmt: skip
    return redis_url


def parse_kind(url: str) -> str | None:
    """The kind of store ``url`` names (``redis``, ``sqlite``, ``postgresql``), ``None`` if
    none (a ``--redis`` value redis-py then judges, as it always did)."""
    from chongming_redis.stores.urls import StoreUrlError, parse_store_url

    try:
        return parse_store_url(url).kind
    except StoreUrlError:
        return None


def where(namespace: str, url: str | None) -> str:
    """``namespace 'default' on redis://host:6379/0``, ``SQLite database /path``."""
    from chongming_redis.stores.urls import StoreUrlError, parse_store_url

    try:
        return parse_store_url(url or "").where(namespace)
    except StoreUrlError:
        return f"namespace {namespace!r} on {shown_url(url or '')}"


def out(*, wide: bool = False) -> Console:
    """The console for tables on stdout: the terminal's width on a terminal, unless ``wide``;
    unlimited in a pipe or file, so that ids are never cut there."""
    if wide or not isatty(sys.stdout):
        from rich.console import Console

        return Console(width=UNLIMITED)
    return _console("console")


def isatty(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (rich's ``is_terminal`` is also true when FORCE_COLOR
    is set, as some CI runners do: tables must not be cut there either)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def print_json(value: Any) -> None:
    """One JSON document on one line of stdout (``feed.wire.dumps``: the change feed's
    encoding)."""
    from chongming_redis.feed.wire import dumps

    sys.stdout.write(dumps(value) + "\n")
    sys.stdout.flush()


def show_progress() -> bool:
    """A progress bar is drawn only on a terminal (stderr), never in a pipe, a file or CI."""
    return isatty(sys.stderr) and not os.environ.get("CI")


@contextmanager
def progress(
    description: str, total: int, *, shown: bool | None = None, to: Console | None = None
) -> Iterator[Callable[[int], None]]:
    """``with progress("submitting", 1000) as advance: ... advance(100)``: a transient bar on
    stderr (``to``) when ``shown`` (default: ``show_progress()``); else ``advance`` does
    nothing. Lines printed to stdout meanwhile still go to stdout (on a terminal they are
    drawn above the bar)."""
    if not (show_progress() if shown is None else shown):
        yield lambda n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=to or _console("err"), transient=True, redirect_stderr=False,
                   redirect_stdout=isatty(sys.stdout))  # fmt: skip
    with bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


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
    except Exception as exc:  # the module itself raised (or has a syntax error): one line
        raise UserError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    found = getattr(module, attribute, None)
    if not isinstance(found, App):
        raise UserError(f"{spec!r} is not a chongming_redis App")
    if not found.types:  # a worker would wait forever, a submit would check nothing
        raise UserError(f"app {spec!r} has no tasks registered (decorate them with @app.task)")
    return found


MaxAttemptsOpt = Annotated[
    int,
    typer.Option(
        help="runs of a task in all, the first one included, for task types "
        "without a retry policy of their own (their lost attempts are retried; "
        "their failures are final)"
    ),
]
RetryBackoffOpt = Annotated[
    float,
    typer.Option(help="seconds before the first retry; doubles per retry, at most "
                 "max(60, this), with jitter"),
]  # fmt: skip


def retry_policy(max_attempts: int, backoff: float) -> RetryPolicy:
    """The worker's default policy (``policy.worker_default``) from ``--max-attempts`` /
    ``--retry-backoff``; a bad value is a ``UserError``. The delay doubles per retry up to
    ``max(60 s, backoff)``, so a long backoff is kept."""
    from chongming_redis.policy import worker_default

    if max_attempts < 1:
        raise UserError(f"--max-attempts must be at least 1, not {max_attempts}")
    if not (math.isfinite(backoff) and 0 <= backoff <= 86400):
        raise UserError(f"--retry-backoff must be a number of seconds from 0 to 86400, "
                        f"not {backoff}")  # fmt: skip
    if max_attempts > 1000:
        raise UserError(f"--max-attempts must be at most 1000, not {max_attempts}")
    return worker_default(max_attempts, backoff)
