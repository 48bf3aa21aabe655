"""A store from a URL: the one place that knows which URL opens which store, and what the
namespace (the unit of isolation on Redis) becomes on each.

=================================  ============================================  ==============
URL                                store                                         the namespace
=================================  ============================================  ==============
``redis://``, ``rediss://``,       ``RedisTaskStore.from_url(url, namespace=NS)``  the keys'
``unix://``, ``redis+sentinel://``                                               prefix
``sqlite:///abs/path``,            ``SqliteTaskStore(path)``                     the file: only
``sqlite:relative/path``                                                         ``default``
``postgresql://``, ``postgres://`` ``PostgresTaskStore(url, schema=NS)``         the schema
=================================  ============================================  ==============

SQLite: three slashes and an absolute path (``sqlite:///var/lib/app/tasks.sqlite3``, the
``file:`` URL form; SQLAlchemy's ``sqlite:///x`` is relative, here it is ``/x``), or no slash
and a path relative to the working directory (``sqlite:tasks.sqlite3``); percent-escapes are
decoded. A SQLite file holds one namespace: another namespace than ``default`` is refused (one
file per namespace), never mixed into the file. No host, no query, and no in-memory database
(``sqlite://``, ``sqlite::memory:``): a private database in one process cannot be shared with
the workers and would lose everything when it exits.

PostgreSQL: the URL goes to libpq as given (its query parameters too: ``sslmode``,
``connect_timeout``...); the namespace is the schema, so two namespaces on one database are two
schemas, as they are two key prefixes on one Redis. A ``schema`` query parameter is refused
(the namespace says it).

Redis through Sentinel: ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``
names the Sentinels, the monitored service and the database; the store follows the primary
across failovers (``stores/_redis/sentinel.py``).

Each store's module is imported only when its URL is opened: a Redis user never imports
``sqlite3`` or psycopg. A bad URL raises ``StoreUrlError`` (a ``ValueError``) before anything
is opened or created; a PostgreSQL URL without the ``[postgres]`` extra (psycopg) raises
``MissingExtra`` naming it (``StoreUrl.check_driver`` says so without importing anything).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from chongming_redis.errors import extra_imports, require_extra
from chongming_redis.stores.protocol import TaskStore

StoreKind = Literal["redis", "sqlite", "postgresql"]

DEFAULT_NAMESPACE = "default"

_KINDS: dict[str, StoreKind] = {
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "redis+sentinel": "redis",
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}
_MODULES: dict[StoreKind, str] = {
    "redis": "chongming_redis.stores.redis",
    "sqlite": "chongming_redis.stores.sqlite",
    "postgresql": "chongming_redis.stores.postgres",
}
FORMS = (
    "redis://, rediss://, unix://, redis+sentinel://, sqlite:///abs/path, "
    "sqlite:relative/path, postgresql://"
)
_MEMORY = ":memory:"
#: What ``MissingExtra`` says is missing when psycopg is.
POSTGRES_PURPOSE = "a PostgreSQL store"


class StoreUrlError(ValueError):
    """A store URL that names no store this package opens, or names one wrongly. The message
    shows the URL with its password replaced by ``***``."""


@dataclass(frozen=True)
class StoreUrl:
    """A parsed store URL: ``kind``, the URL as given, and for SQLite the file's absolute
    ``path``."""

    kind: StoreKind
    url: str
    path: str | None = None

    @property
    def module(self) -> str:
        """The module of the store class (a process that forks workers imports it first)."""
        return _MODULES[self.kind]

    @property
    def has_namespaces(self) -> bool:
        """Whether one URL holds many namespaces (Redis: key prefixes, PostgreSQL: schemas);
        a SQLite file holds one."""
        return self.kind != "sqlite"

    def where(self, namespace: str) -> str:
        """``namespace 'default' on redis://host:6379/0``, ``SQLite database /path`` (for
        messages: the password hidden)."""
        if self.kind == "sqlite":
            return f"SQLite database {self.path}"
        return f"namespace {namespace!r} on {shown_url(self.url)}"

    def check_driver(self) -> None:
        """``MissingExtra`` when this store's driver is not installed (PostgreSQL: the
        ``[postgres]`` extra); found, not imported. Redis and SQLite need no extra."""
        if self.kind == "postgresql":
            require_extra("postgres", POSTGRES_PURPOSE)

    def check_namespace(self, namespace: object) -> str:
        """``namespace`` if this store can hold it: a SQLite file holds only
        ``DEFAULT_NAMESPACE`` (``StoreUrlError`` for another: one file per namespace, never
        two mixed in one); the servers judge the name when they open it."""
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, not {type(namespace).__name__}")
        if not self.has_namespaces and namespace != DEFAULT_NAMESPACE:
            raise StoreUrlError(f"namespace {namespace!r} on SQLite: a SQLite database holds "
                                f"one namespace ({DEFAULT_NAMESPACE!r}); use one file per "
                                "namespace")  # fmt: skip
        return namespace


def parse_store_url(url: object) -> StoreUrl:
    """What ``url`` opens; ``StoreUrlError`` if it opens nothing (``TypeError`` if not a
    ``str``). Reads no file and connects to nothing."""
    if not isinstance(url, str):
        raise TypeError(f"a store URL must be a str, not {type(url).__name__}")
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    kind = _KINDS.get(scheme)
    if kind is None:
        raise StoreUrlError(f"unknown store URL {shown_url(url)!r}: expected {FORMS}")
    if kind == "sqlite":
        return StoreUrl("sqlite", url, _sqlite_path(url))
    if scheme == "redis+sentinel":
        from chongming_redis.stores._redis.sentinel import parse_sentinel_url

        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise StoreUrlError(f"{shown_url(url)!r}: {exc}") from None
    if kind == "postgresql" and any(k == "schema" for k, _ in parse_qsl(urlsplit(url).query)):
        raise StoreUrlError(f"{shown_url(url)!r}: the schema is the namespace, not a URL "
                            "parameter: give the namespace instead")  # fmt: skip
    return StoreUrl(kind, url)


def _sqlite_path(url: str) -> str:
    """The file of ``sqlite:///abs/path`` or ``sqlite:relative/path``, made absolute."""
    parts = urlsplit(url)
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise StoreUrlError(f"{url!r}: a SQLite URL takes no query or fragment (a file path only)")
    if parts.netloc:
        raise StoreUrlError(f"{url!r}: a SQLite URL names a file on this machine, not a host: "
                            "sqlite:///abs/path or sqlite:relative/path")  # fmt: skip
    path = unquote(parts.path)
    if path.startswith("file:"):
        raise StoreUrlError(f"{url!r}: a SQLite URL takes a file path, not a file: URI")
    if not path.strip("/") or path.rsplit("/", 1)[-1] == _MEMORY:
        raise StoreUrlError(f"{url!r}: a SQLite store is a file (sqlite:///abs/path or "
                            "sqlite:relative/path); an in-memory database is private to one "
                            "process and is refused")  # fmt: skip
    if "\x00" in path:
        raise StoreUrlError(f"{url!r}: a file path cannot hold a NUL character")
    return os.path.abspath(path)


def open_store_url(
    url: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    must_exist: bool = False,
    redis_options: Mapping[str, Any] | None = None,
) -> TaskStore:
    """The store ``url`` names (see the module's table), for ``namespace``.

    ``must_exist``: refuse a SQLite file that is not there yet (a reader's typo must not
    create an empty database); the other stores are servers and are never created here.
    ``redis_options`` go to ``RedisTaskStore.from_url`` (timeouts, retries, ``check_server``);
    the other stores take none. A bad URL or namespace is ``StoreUrlError`` before anything is
    opened; a PostgreSQL URL without the ``[postgres]`` extra is ``MissingExtra``."""
    target = parse_store_url(url)
    target.check_namespace(namespace)
    if target.kind == "redis":
        from chongming_redis.stores.redis import RedisTaskStore

        return RedisTaskStore.from_url(url, namespace=namespace, **dict(redis_options or {}))
    if target.kind == "sqlite":
        return _open_sqlite(target.path or "", must_exist=must_exist)
    with extra_imports("postgres", POSTGRES_PURPOSE):
        from chongming_redis.stores.postgres import PostgresTaskStore

    store: TaskStore = PostgresTaskStore(url, schema=namespace)
    return store


def _open_sqlite(path: str, *, must_exist: bool) -> TaskStore:
    if must_exist and not os.path.exists(path):
        raise StoreUrlError(f"no SQLite database at {path} (a worker or a submit creates it)")
    from chongming_redis.stores.sqlite import SqliteTaskStore

    return SqliteTaskStore(path)


def shown_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages."""
    if url.partition(":")[0].lower() == "redis+sentinel":  # several hosts: no single port
        head, sep, rest = url.partition("://")
        userinfo, at, _ = rest.partition("/")[0].rpartition("@")
        if not at or ":" not in userinfo:
            return url
        return f"{head}{sep}{userinfo.partition(':')[0]}:***@{rest[len(userinfo) + 1 :]}"
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # an unparsable port or host: show no more than the scheme
        return url.partition(":")[0] + ":..."
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}{port}"
    return urlunsplit(parts._replace(netloc=netloc))
