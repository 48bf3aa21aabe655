"""One store for a real-process test, named by a URL as the workers are given it: the same test
on Redis, on a SQLite file and on PostgreSQL (the runtime on any store, issue 15), and a few on
Valkey.

``store_target(request, kind, tmp_path, namespace)`` (a generator for a fixture) gives a
``StoreTarget``: ``url`` and ``namespace`` for the worker command (``cli_args``), ``open()``
for the test process's own store. Redis, Redis Cluster, Valkey and PostgreSQL come from the
session's servers (``redis_proc``, ``redis_cluster``, ``valkey_proc``, ``postgres_proc``: a
missing server fails in CI, skips elsewhere); a SQLite target is a new file in the test's
temporary directory, whose namespace is ``default`` (a file holds one). A PostgreSQL target's
schema and a cluster target's namespace are dropped at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.stores.urls import DEFAULT_NAMESPACE, open_store_url

#: The stores every parameterised real-process test runs on.
STORE_KINDS = ("redis", "sqlite", "postgres")
#: ... and a few representative ones also on Redis Cluster (``redis_cluster``: 3 masters, 3
#: replicas; the namespace's slot lives on one of them), given ``--redis URL --cluster``.
WITH_CLUSTER = (*STORE_KINDS, "cluster")
#: ... and the real-process tests that Valkey (``valkey_proc``, given ``--redis URL``) runs too.
WITH_VALKEY = (*WITH_CLUSTER, "valkey")


@dataclass(frozen=True)
class StoreTarget:
    kind: str
    url: str
    namespace: str

    @property
    def option(self) -> str:
        """The worker command's option for ``url``: ``--redis`` as ever (a cluster's and
        Valkey's too), ``--store`` for the others."""
        return "--redis" if self.kind in ("redis", "cluster", "valkey") else "--store"

    @property
    def flags(self) -> list[str]:
        """What the command line adds for this store: ``--cluster`` on a cluster."""
        return ["--cluster"] if self.kind == "cluster" else []

    def cli_args(self) -> list[str]:
        return [f"{self.option}={self.url}", f"--namespace={self.namespace}", *self.flags]

    def open(self, **redis_options: Any) -> Any:
        """A new store on the target (``redis_options``: timeouts, for Redis only)."""
        if self.kind == "cluster":
            redis_options = {**redis_options, "cluster": True}
        return open_store_url(self.url, namespace=self.namespace, redis_options=redis_options)


def store_target(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path, namespace: str
) -> Iterator[StoreTarget]:
    if kind in ("redis", "valkey"):
        yield StoreTarget(kind, request.getfixturevalue(f"{kind}_proc").url, namespace)
    elif kind == "cluster":
        target = StoreTarget(kind, request.getfixturevalue("redis_cluster").url, namespace)
        yield target
        store = target.open(check_server=False)
        try:
            store.drop_namespace()
        finally:
            store.close()
    elif kind == "sqlite":
        yield StoreTarget(kind, f"sqlite://{tmp_path / 'tasks.sqlite3'}", DEFAULT_NAMESPACE)
    elif kind == "postgres":
        target = StoreTarget(kind, request.getfixturevalue("postgres_proc").dsn, namespace)
        yield target
        store = target.open()
        try:
            store.drop_schema()
        finally:
            store.close()
    else:
        raise ValueError(f"unknown store kind {kind!r}")
