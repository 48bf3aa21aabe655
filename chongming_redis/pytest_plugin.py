"""A pytest plugin for applications built on chongming-redis (loaded automatically once the
package is installed: the ``pytest11`` entry point).

Fixtures:

* ``chongming_redis_url`` (session): a throwaway Redis started for the test session
  (``redis-server`` from ``PATH``, else the one the ``[embedded]`` extra bundles), on a free
  loopback port, with the settings the store requires; stopped at the end. With
  ``CHONGMING_REDIS_URL`` set, that Redis instead (each test still gets a namespace of its
  own, deleted afterwards).
* ``chongming`` (per test): a fresh namespace on that Redis, and two helpers::

      def test_resize(chongming):
          client = chongming.client(app)          # a Client on the test's namespace
          with chongming.worker(app):             # a real worker runs app's tasks meanwhile
              assert resize.submit(client, width=640).wait(timeout=10) == {"width": 640}

  ``chongming.worker(app, **timings)`` starts the same runtime ``chongming-redis worker``
  runs (a ``Controller`` on its own store connection, in this process's threads) and shuts
  it down when the block ends; ``chongming.run(app)`` runs every task submitted so far and
  returns when none is left. Each test's namespace is deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from chongming_redis.env import REDIS_ENV

if TYPE_CHECKING:
    from chongming_redis.client.client import Client
    from chongming_redis.runtime.app import App
    from chongming_redis.runtime.controller import Controller
    from chongming_redis.stores.redis import RedisTaskStore


@pytest.fixture(scope="session")
def chongming_redis_url() -> Iterator[str]:
    """The URL of a Redis started for this test session (or the one ``CHONGMING_REDIS_URL``
    names)."""
    from chongming_redis.embedded.redis_server import (
        NO_SERVER,
        NO_SERVER_BASE,
        EmbeddedRedis,
        EmbeddedRedisError,
    )

    given = os.environ.get(REDIS_ENV)
    if given:
        yield given
        return
    try:
        server = EmbeddedRedis().start()
    except EmbeddedRedisError as exc:  # the way out a test run has, not the CLI's --redis
        why = str(exc)
        if why == NO_SERVER:
            why = f"{NO_SERVER_BASE}, or set {REDIS_ENV} to the URL of a Redis to use"
        pytest.fail(why, pytrace=False)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def chongming(chongming_redis_url: str) -> Iterator[Harness]:
    """A fresh namespace on the session's Redis, with ``client()``, ``worker()`` and
    ``run()`` (see the module's documentation)."""
    harness = Harness(chongming_redis_url, f"test-{uuid.uuid4().hex[:12]}")
    try:
        yield harness
    finally:
        harness.close()


class Harness:
    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self._opened: list[Any] = []

    @property
    def store(self) -> RedisTaskStore:
        """A store on the test's namespace (for reads the client does not offer)."""
        from chongming_redis.stores.redis import RedisTaskStore

        store = RedisTaskStore.from_url(self.url, namespace=self.namespace)
        self._opened.append(store)
        return store

    def client(self, app: App | None = None, **options: Any) -> Client:
        """A ``Client`` on the test's namespace (``app``: validate against its task types)."""
        from chongming_redis.client.client import Client

        client = Client.from_url(self.url, namespace=self.namespace, app=app, **options)
        self._opened.append(client)
        return client

    @contextlib.contextmanager
    def worker(self, app: App, *, grace: float = 5.0, **timings: Any) -> Iterator[Controller]:
        """A real worker running ``app``'s tasks of the test's namespace until the block
        ends (then a graceful shutdown of ``grace`` seconds). ``timings``: any
        ``ControllerConfig`` field (``concurrency=8``, ``task_lease=5``, ...)."""
        from chongming_redis.runtime.controller import Controller
        from chongming_redis.stores.redis import RedisTaskStore

        store = RedisTaskStore.from_url(self.url, namespace=self.namespace)
        timings.setdefault("start_poll_interval", 0.2)
        timings.setdefault("command_poll_interval", 0.2)
        controller = Controller(store, app=app, owner=f"test-worker-{uuid.uuid4().hex[:6]}",
                                **timings)  # fmt: skip
        controller.start()
        try:
            yield controller
        finally:
            controller.shutdown(grace=grace)
            store.close()

    def run(self, app: App, *, timeout: float = 30.0, **timings: Any) -> None:
        """Run every task of the namespace that is waiting or running until none is left
        (``TimeoutError`` after ``timeout`` seconds)."""
        from chongming_redis.model import TaskStatus

        live = (TaskStatus.PENDING, TaskStatus.RUNNING)
        store = self.store
        deadline = time.monotonic() + timeout
        with self.worker(app, **timings):
            while any(store.counts()[status] for status in live):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tasks still pending or running after {timeout}s")
                time.sleep(0.01)

    def close(self) -> None:
        """Close what the test opened and delete the namespace's keys."""
        from chongming_redis.stores.redis import RedisTaskStore

        for opened in self._opened:
            with contextlib.suppress(Exception):
                opened.close()
        store = RedisTaskStore.from_url(self.url, namespace=self.namespace, check_server=False)
        try:
            store.drop_namespace()
        finally:
            store.close()
